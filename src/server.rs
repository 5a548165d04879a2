//! Wiring of the one process (P1): cache, webhook, admin endpoints, election, controller.

use crate::cache::consistent::ConsistentListLayer;
use crate::cache::liveness::{self, Progress, ProgressLayer, Verdict};
use crate::cache::pod_wire::{PodWatchEncoding, PodWireLayer};
use crate::cache::{self, CacheScope, SharedCache};
use crate::config::ServerArgs;
use crate::controller::{self, plan::Settings};
use crate::error::{Error, Result};
use crate::leader::Election;
use crate::leader::decide::Readiness;
use crate::metrics::Metrics;
use crate::registry::RegistryClient;
use crate::webhook::{self, tls};
use axum_server::tls_rustls::RustlsConfig;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a terminating replica answers with `Connection: close` before it closes its
/// connections: long enough for the apiserver to use, and drop, each one it pooled.
const WEBHOOK_DRAIN: Duration = Duration::from_secs(3);

pub async fn run(args: ServerArgs) -> Result<()> {
    args.validate()?;
    let metrics = Metrics::new();
    let registry = RegistryClient::observed(args.registry.config()?, Arc::new(metrics.clone()))?;
    let progress = Progress::new();
    let stall_limit = args.informer_stall_limit;
    let (watch_client, client) = kube_clients(
        args.apiserver_timeout,
        stall_limit,
        progress.clone(),
        args.controller.pod_watch_encoding,
    )
    .await?;
    let shutdown = CancellationToken::new();

    let scope = CacheScope {
        namespace: args.controller.watch_namespace.clone(),
        pod_selector: args.controller.pod_selector.clone(),
        list: args.controller.initial_list,
    };
    let (cache, cache_driver) = cache::start_tracked(
        watch_client.clone(),
        &scope,
        progress,
        Some(liveness::watch_timeout(stall_limit)),
    );
    // Subscribed before the driver runs: no change is missed.
    let trigger_rx = crate::runtime::trigger::subscribe(&cache, controller::CrPolicy);
    let mut cache_task = tokio::spawn(cache_driver);

    // Webhook: fail fast on a bad certificate, then reload on change (V6).
    let tls_config = RustlsConfig::from_config(Arc::new(tls::server_config(
        &args.webhook.tls_cert_file,
        &args.webhook.tls_key_file,
    )?));
    tokio::spawn(tls::reload_on_change(
        tls_config.clone(),
        args.webhook.tls_cert_file.clone(),
        args.webhook.tls_key_file.clone(),
        args.webhook.tls_reload_interval,
        shutdown.clone(),
    ));
    let webhook_handle = axum_server::Handle::new();
    let drain = webhook::drain::Drain::default();
    let webhook_app = drain.closing(webhook::cache_router(cache.clone(), metrics.clone()));
    let webhook_server = tokio::spawn(
        axum_server::bind_rustls(args.webhook.webhook_addr, tls_config)
            .handle(webhook_handle.clone())
            .serve(webhook_app.into_make_service()),
    );

    let admin_listener = tokio::net::TcpListener::bind(args.admin_addr)
        .await
        .map_err(|source| Error::Io {
            what: format!("binding --admin-addr {}", args.admin_addr),
            source,
        })?;
    let admin_app = crate::admin::router(cache.clone(), metrics.clone(), stall_limit);
    let admin_stop = shutdown.clone();
    let admin_server = tokio::spawn(async move {
        axum::serve(admin_listener, admin_app)
            .with_graceful_shutdown(async move { admin_stop.cancelled().await })
            .await
    });
    tracing::info!(webhook = %args.webhook.webhook_addr, admin = %args.admin_addr, "serving");

    // S8: validate() refused election without an identity of our own.
    let identity = args
        .election
        .identity
        .clone()
        .filter(|id| !id.trim().is_empty());
    let readiness = {
        let cache = cache.clone();
        let reported = std::sync::atomic::AtomicBool::new(false);
        move || readiness(&cache, stall_limit, &reported)
    };
    let election = match (&identity, args.election.leader_election) {
        (Some(identity), true) => {
            Election::start(
                client.clone(),
                &args.election.lease(),
                identity.clone(),
                args.apiserver_timeout,
                readiness,
            )
            .await?
        }
        (None, true) => {
            return Err(Error::Config(crate::config::ConfigError(
                "leader election needs --identity or POD_NAME".into(),
            )));
        }
        (_, false) => Election::always_while(readiness, Duration::from_secs(1)),
    };
    let settings = Settings {
        hibernate_timeout: args.controller.hibernate_timeout,
        wake_timeout: args.controller.wake_timeout,
        refused_delete_backoff: args.controller.refused_delete_backoff,
        watch_namespace: args.controller.watch_namespace.clone(),
        pod_selector: args.controller.pod_selector.clone(),
        registry_slots: usize::try_from(args.controller.concurrency - 1)
            .unwrap_or(1)
            .max(1),
        ..Settings::default()
    };
    // P2: both controllers write only through this gate: while this replica leads.
    let gate = crate::runtime::gate::Gate::new(election.leading.clone(), cache.clone());
    // K1: schedules run in this process, on this cache, while this replica leads; their
    // watch is on the watch client, ended by the apiserver like the cache's (S8).
    let wiring = crate::runtime::wiring::Wiring {
        watch_client,
        client: client.clone(),
        cache: cache.clone(),
        metrics: metrics.clone(),
        clock: crate::schedule::Clock {
            offset: args.schedule_clock_offset,
        },
        gate: gate.clone(),
        namespace: args.controller.watch_namespace.clone(),
        watch_timeout: liveness::watch_timeout(stall_limit),
    };
    let schedules = crate::schedule::controller::run(wiring.clone(), shutdown.clone());
    // I3: idle policies likewise, on the same clock (the testing offset moves both).
    let idle = crate::idle::controller::run(wiring, shutdown.clone());
    // One task for both: either ending ends it, and S8 notices.
    let mut schedule_task = tokio::spawn(async move {
        tokio::select! {
            () = schedules => {}
            () = idle => {}
        }
    });
    // S10: the owner marker; it never holds up start-up or a pass.
    let owner_task = match args.install_name() {
        Some(name) => Some(tokio::spawn(crate::ownership::keep(
            client.clone(),
            registry.clone(),
            name,
            metrics.clone(),
            shutdown.clone(),
        ))),
        None => {
            tracing::info!(
                "no --install-name: the registry base gets no owner marker, so the orphan audit will not delete on it"
            );
            None
        }
    };
    let ctx = controller::context(
        client,
        cache,
        registry,
        metrics,
        settings,
        identity,
        election.fence.clone(),
    );
    let census_task = tokio::spawn(controller::report_census(ctx.clone(), shutdown.clone()));

    let concurrency = u16::try_from(args.controller.concurrency).unwrap_or(u16::MAX);
    let mut controller_task = tokio::spawn(controller::run(
        ctx,
        trigger_rx,
        gate,
        concurrency,
        shutdown.clone(),
    ));

    let mut webhook_server = webhook_server;
    let outcome = tokio::select! {
        _ = wait_for_signal() => Ok(()),
        res = &mut webhook_server => Err(Error::TaskEnded(format!("the webhook server stopped: {}", flatten(res)))),
        ended = until_a_task_ends(&mut cache_task, &mut controller_task, &mut schedule_task) => Err(ended),
    };
    if let Err(e) = &outcome {
        tracing::error!(error = %e, "a part of the process stopped: releasing the lease and exiting");
    }

    // P4: answer reviews with `Connection: close` for a moment (webhook::drain), stop
    // reconciling, release the lease (only after the controller stopped, so no
    // leader-only effect follows the release), then stop accepting and finish in-flight
    // reviews.
    tracing::info!("shutting down");
    drain.start();
    let drain_until = tokio::time::Instant::now() + WEBHOOK_DRAIN.min(args.shutdown_grace);
    shutdown.cancel();
    if !controller_task.is_finished() {
        let _ = controller_task.await;
    }
    census_task.abort();
    if let Some(task) = owner_task {
        task.abort();
    }
    if !schedule_task.is_finished() {
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut schedule_task).await;
    }
    election.stop.cancel();
    if let Some(task) = election.task {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    tokio::time::sleep_until(drain_until).await;
    webhook_handle.graceful_shutdown(Some(args.shutdown_grace));
    if !webhook_server.is_finished() {
        let _ = tokio::time::timeout(
            args.shutdown_grace + Duration::from_secs(1),
            &mut webhook_server,
        )
        .await;
    }
    let _ = admin_server.await;
    cache_task.abort();
    tracing::info!("stopped");
    outcome
}

/// S8: the cache's fitness to lead on, for the elector; logs each stall once.
fn readiness(
    cache: &SharedCache,
    stall_limit: Duration,
    reported: &std::sync::atomic::AtomicBool,
) -> Readiness {
    use std::sync::atomic::Ordering;
    let verdict = cache.verdict(stall_limit);
    let stalled = matches!(verdict, Verdict::Stalled { .. });
    if reported.swap(stalled, Ordering::Relaxed) != stalled {
        match verdict {
            Verdict::Stalled { informer, silent } => tracing::error!(
                informer = informer.name(),
                silent_s = silent.as_secs(),
                "informer made no progress for longer than --informer-stall-limit: not leading"
            ),
            _ => tracing::info!("informers progressing again"),
        }
    }
    match verdict {
        Verdict::Ready => Readiness::Ready,
        Verdict::Syncing(_) => Readiness::Syncing,
        Verdict::Stalled { .. } => Readiness::Stalled,
    }
}

/// S8 K9: resolves when the cache, the controller or the schedule task ends, which none
/// does while the process is healthy: a process without one serves a frozen view or
/// leaves some of its work undone while it holds the Lease.
async fn until_a_task_ends(
    cache: &mut JoinHandle<()>,
    controller: &mut JoinHandle<()>,
    schedule: &mut JoinHandle<()>,
) -> Error {
    let (what, res) = tokio::select! {
        res = cache => ("informer cache", res),
        res = controller => ("controller", res),
        res = schedule => ("schedule", res),
    };
    let how = match res {
        Ok(()) => "returned".to_owned(),
        Err(e) if e.is_panic() => "panicked".to_owned(),
        Err(e) => e.to_string(),
    };
    Error::TaskEnded(format!("the {what} task {how}"))
}

/// Slack of the watch client's read timeout over the server-side watch timeout: past
/// kube-runtime's own 5 s idle margin, so a healthy watch the apiserver ends on time is
/// never cut by it.
const WATCH_READ_SLACK: Duration = Duration::from_secs(15);

/// Two clients on the same kubeconfig (S1): one for the cache's lists and watches, and
/// one whose every request (reads, writes, events, the Lease) fails after `timeout` of
/// silence, so a dead connection cannot hold a reconcile pass or a lease renewal forever.
async fn kube_clients(
    timeout: Duration,
    stall_limit: Duration,
    progress: Progress,
    pod_watch_encoding: PodWatchEncoding,
) -> Result<(kube::Client, kube::Client)> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| Error::Kube(kube::Error::InferConfig(e)))?;
    let (watch, timed) = client_configs(config, timeout, stall_limit);
    let watch = kube::client::ClientBuilder::try_from(watch)?
        .with_layer(&ProgressLayer(progress))
        .with_layer(&PodWireLayer::new(pod_watch_encoding))
        // S4: a streamed list is a consistent read, never older than the cache.
        .with_layer(&ConsistentListLayer)
        .build();
    Ok((watch, kube::Client::try_from(timed)?))
}

/// (watch config, timed config) from one inferred config.
fn client_configs(
    mut config: kube::Config,
    timeout: Duration,
    stall_limit: Duration,
) -> (kube::Config, kube::Config) {
    // The apiserver's audit log then tells our calls from everyone else's.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(crate::USER_AGENT),
    ));
    let mut watch = config.clone();
    // S8: a half-open connection during a list or a watch's open would otherwise hang
    // the informer forever (kube-runtime's idle timeout covers only an open stream).
    // Longer than the server-side watch timeout, within which the apiserver sends a
    // bookmark or ends the watch, so a healthy idle watch is never cut.
    watch.read_timeout = Some(
        Duration::from_secs(u64::from(liveness::watch_timeout(stall_limit))) + WATCH_READ_SLACK,
    );
    watch.connect_timeout = Some(timeout);
    watch.reset_reader_on_write = true;
    let mut timed = config;
    timed.connect_timeout = Some(timeout);
    timed.read_timeout = Some(timeout);
    timed.write_timeout = Some(timeout);
    // Count the read timeout from when a request is sent, not from when its pooled
    // connection went idle.
    timed.reset_reader_on_write = true;
    (watch, timed)
}

fn flatten(res: std::result::Result<std::io::Result<()>, tokio::task::JoinError>) -> String {
    match res {
        Ok(Ok(())) => "closed".into(),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    }
}

pub(crate) async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// O4: both kube clients name us to the apiserver, whose audit log records it.
    #[test]
    fn o4_kube_clients_send_our_user_agent() {
        let config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        let (watch, timed) =
            client_configs(config, Duration::from_secs(3), Duration::from_secs(300));
        for c in [watch, timed] {
            let ua = c
                .headers
                .iter()
                .find(|(k, _)| k == http::header::USER_AGENT);
            assert_eq!(
                ua.map(|(_, v)| v.to_str().unwrap().to_owned()),
                Some(format!("cocoon-hibernation/{}", env!("CARGO_PKG_VERSION")))
            );
        }
    }

    /// SPEC S1 S8: every non-watch call has connect, read and write timeouts; the watch
    /// client has a read timeout too (a list or a watch's open on a half-open connection
    /// ends), longer than the watch the apiserver is asked to end (plus kube-runtime's own
    /// 5 s idle margin), so a healthy idle watch is never cut, and longer than the
    /// apiserver's one-minute bookmark cadence at the default stall limit.
    #[rstest::rstest]
    #[case::default_limit(300, 115)]
    #[case::short_limit(9, 18)]
    #[case::long_limit(3600, 305)]
    fn s8_the_watch_client_has_a_read_timeout_beyond_its_watches(
        #[case] stall_limit: u64,
        #[case] want_read: u64,
    ) {
        let base = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        let t = Duration::from_secs(7);
        let limit = Duration::from_secs(stall_limit);
        let (watch, timed) = client_configs(base, t, limit);
        let read = watch
            .read_timeout
            .expect("the watch client has a read timeout");
        assert_eq!(read, Duration::from_secs(want_read));
        let server_side = Duration::from_secs(u64::from(liveness::watch_timeout(limit)));
        assert!(read > server_side + Duration::from_secs(5), "{read:?}");
        if stall_limit >= 300 {
            assert!(
                read > Duration::from_secs(60),
                "beyond the bookmark cadence"
            );
        }
        assert!(watch.reset_reader_on_write);
        assert_eq!(watch.connect_timeout, Some(t));
        assert_eq!(timed.read_timeout, Some(t));
        assert_eq!(timed.write_timeout, Some(t));
        assert_eq!(timed.connect_timeout, Some(t));
        assert!(timed.reset_reader_on_write);
    }

    /// SPEC S8 K9: the process notices when its cache, controller or schedule task ends,
    /// by return or by panic, and says which (bounded, so a missing arm fails rather than
    /// hangs).
    #[rstest::rstest]
    #[case::s8_cache_returns(0, false, "the informer cache task returned")]
    #[case::s8_cache_panics(0, true, "the informer cache task panicked")]
    #[case::s8_controller_returns(1, false, "the controller task returned")]
    #[case::s8_controller_panics(1, true, "the controller task panicked")]
    #[case::k9_s8_schedule_returns(2, false, "the schedule task returned")]
    #[case::k9_s8_schedule_panics(2, true, "the schedule task panicked")]
    #[tokio::test]
    async fn s8_a_dead_cache_controller_or_schedule_task_is_noticed(
        #[case] dies: usize,
        #[case] panics: bool,
        #[case] want: &str,
    ) {
        let mut tasks: Vec<JoinHandle<()>> = (0..3)
            .map(|i| {
                if i == dies {
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        assert!(!panics, "the driver panicked");
                    })
                } else {
                    tokio::spawn(std::future::pending::<()>())
                }
            })
            .collect();
        let [cache, controller, schedule] = &mut tasks[..] else {
            unreachable!()
        };
        let e = tokio::time::timeout(
            Duration::from_secs(5),
            until_a_task_ends(cache, controller, schedule),
        )
        .await
        .expect("the ending is noticed");
        assert!(matches!(e, Error::TaskEnded(_)));
        assert_eq!(e.to_string(), want);
    }

    /// SPEC S8 K9: the schedule watch asks the apiserver to end it within the watch
    /// client's read timeout plus kube-runtime's 5 s idle margin, so a quiet healthy
    /// watch is ended on time and never cut by the client.
    #[rstest::rstest]
    #[case::k9_default_limit(300)]
    #[case::k9_short_limit(9)]
    #[case::k9_long_limit(3600)]
    fn k9_s8_the_schedule_watch_ends_before_its_read_timeout(#[case] stall_limit: u64) {
        let base = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        let limit = Duration::from_secs(stall_limit);
        let (watch, _) = client_configs(base, Duration::from_secs(7), limit);
        let read = watch.read_timeout.expect("a read timeout");
        let asked = crate::runtime::wiring::watch_config(liveness::watch_timeout(limit))
            .timeout
            .expect("the schedule watch asks the apiserver to end it");
        assert!(
            Duration::from_secs(u64::from(asked)) + Duration::from_secs(5) < read,
            "{asked} s against {read:?}"
        );
    }
}
