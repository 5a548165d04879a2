//! The wake proxy (Q1–Q8), `cocoon-hibernation proxy`: in front of the VM pods of idle
//! policies, it forwards HTTP by host and path and raw TCP by listening port; a request for
//! a sleeping pod flips its CocoonHibernation to `Wake` once and waits for it.
//!
//! One job per module: [`routes`] (policies → route table, pure), [`decide`] (pod and CR →
//! verdict, pure), [`hold`] (one wake per VM, bounded wait and queue), [`http`] and
//! [`tcp`] (forwarding), [`activity`] (coalesced Lease reports), [`metrics`], [`world`]
//! (the informers and the desire flip).
//!
//! Q8: it reads pods, CocoonHibernations, idle policies and Leases, and writes Leases and
//! CR desires; it deletes nothing and never talks to the registry.

pub mod activity;
pub mod decide;
pub mod hold;
pub mod http;
pub mod metrics;
pub mod routes;
pub mod tcp;
pub mod world;

use crate::config::ProxyArgs;
use crate::{Error, Result};
use activity::Reporter;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use hold::{Holds, VmKey};
use metrics::ProxyMetrics;
use parking_lot::Mutex;
use routes::Namespaces;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use world::Cluster;

pub use cocoon_api::idle::IDLE_DESIRE;
/// Timeout of the proxy's own apiserver writes.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What every connection shares.
pub struct Proxy {
    pub cluster: Arc<Cluster>,
    pub holds: Arc<Holds>,
    pub metrics: ProxyMetrics,
    pub reporter: Reporter,
    upstreams: Mutex<HashMap<VmKey, http::Upstream>>,
}

/// Runs the proxy until SIGTERM.
pub async fn run(args: ProxyArgs) -> Result<()> {
    let mut config = kube::Config::infer()
        .await
        .map_err(|e| Error::Kube(kube::Error::InferConfig(e)))?;
    config.headers.push((
        ::http::header::USER_AGENT,
        ::http::HeaderValue::from_static(crate::USER_AGENT),
    ));
    let watch_client = kube::Client::try_from(config.clone())?;
    config.connect_timeout = Some(WRITE_TIMEOUT);
    config.read_timeout = Some(WRITE_TIMEOUT);
    config.write_timeout = Some(WRITE_TIMEOUT);
    let write_client = kube::Client::try_from(config)?;

    let namespaces = Namespaces::from_flag(&args.namespaces);
    let metrics = ProxyMetrics::new();
    let cluster = Cluster::start_with(watch_client, write_client.clone(), namespaces);
    let reporter = Reporter::new(write_client, args.identity.clone(), metrics.clone());
    let proxy = Arc::new(Proxy {
        cluster: cluster.clone(),
        holds: Arc::new(Holds::default()),
        metrics: metrics.clone(),
        reporter: reporter.clone(),
        upstreams: Mutex::new(HashMap::new()),
    });

    let bind = |addr| async move {
        TcpListener::bind(addr).await.map_err(|source| Error::Io {
            what: format!("bind {addr}"),
            source,
        })
    };
    let admin = bind(args.admin_addr).await?;
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let admin_router = admin_router(metrics, ready.clone());
    tokio::spawn(async move { axum::serve(admin, admin_router).await });

    // Nothing is accepted before the informers have listed: a request then sees the
    // cluster as it is, and the proxy wakes nothing by itself (Q6).
    cluster.wait_synced().await;
    ready.store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::spawn(reporter.flush_forever());
    let http_listener = bind(args.http_addr).await?;
    tokio::spawn(http::serve(http_listener, proxy.clone()));
    for addr in &args.tcp_addrs {
        let l = bind(*addr).await?;
        tokio::spawn(tcp::serve(l, proxy.clone()));
    }
    tracing::info!(http = %args.http_addr, tcp = ?args.tcp_addrs, "wake proxy serving");
    crate::server::wait_for_signal().await;
    tracing::info!("SIGTERM: writing owed activity reports, exiting");
    proxy.reporter.flush_all().await;
    Ok(())
}

#[derive(Clone)]
struct AdminState {
    metrics: ProxyMetrics,
    ready: Arc<std::sync::atomic::AtomicBool>,
}

fn admin_router(metrics: ProxyMetrics, ready: Arc<std::sync::atomic::AtomicBool>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState { metrics, ready })
}

async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    if s.ready.load(std::sync::atomic::Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "informers not synced")
    }
}

async fn metrics_text(State(s): State<AdminState>) -> impl IntoResponse {
    match s.metrics.encode() {
        Ok(text) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}
