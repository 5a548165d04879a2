//! `--wait`: a watch on the one CocoonHibernation (no polling), each change judged by
//! `wait_verdict::judge` and shown by `terminal::WaitLine`, until a verdict or the timeout.

use super::error::PluginError;
use super::resources;
use super::terminal::WaitLine;
use super::view::CrView;
use super::wait_verdict::{Step, Target, judge};
use futures::StreamExt as _;
use jiff::Timestamp;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use std::time::Duration;

/// Waits until the CR `namespace/name` reaches `target`; returns it as last seen.
pub async fn wait(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    target: &Target,
    timeout: Duration,
) -> Result<CrView, PluginError> {
    let key = format!("{namespace}/{name}");
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(resources::crs(client, namespace), config)
        .default_backoff()
        .boxed();
    let mut line = WaitLine::new();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let expiry = tokio::time::sleep(timeout);
    tokio::pin!(expiry);
    let mut latest: Option<CrView> = None;
    // Whether the current (re)list has shown the CR; a list without it means it is gone.
    let mut listed = false;
    let mut last_error = String::new();
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            _ = ticker.tick(), if line.is_tty() => {
                line.tick(Timestamp::now());
                continue;
            }
            () = &mut expiry => {
                line.close();
                return Err(PluginError::TimedOut {
                    cr: key,
                    want: target.want.terminal_phase().to_string(),
                    now: describe(latest.as_ref()),
                    after: timeout,
                });
            }
        };
        let seen = match event {
            None => {
                line.close();
                return Err(PluginError::Interrupted(format!(
                    "the watch on {key} ended unexpectedly"
                )));
            }
            Some(Ok(Event::Apply(object))) => Some(Some(resources::view(&object))),
            Some(Ok(Event::InitApply(object))) => {
                listed = true;
                Some(Some(resources::view(&object)))
            }
            Some(Ok(Event::Delete(_))) => Some(None),
            Some(Ok(Event::Init)) => {
                listed = false;
                None
            }
            Some(Ok(Event::InitDone)) => (!listed).then_some(None),
            Some(Err(e)) => {
                if let Some(fatal) = fatal(&e) {
                    line.close();
                    return Err(PluginError::api(format!("watching {key}"), fatal));
                }
                // The watcher retries with backoff; say so once per distinct error.
                let text = e.to_string();
                if text != last_error {
                    line.note(&format!("warning: watching {key}: {text} (retrying)"));
                    last_error = text;
                }
                None
            }
        };
        let Some(cr) = seen else { continue };
        last_error.clear();
        if let Some(cr) = &cr {
            line.show(cr, Timestamp::now());
        }
        latest = cr.clone();
        match judge(target, cr.as_ref()) {
            Step::Waiting => {}
            Step::Done => {
                line.close();
                return latest.ok_or_else(|| PluginError::Interrupted(format!("{key} vanished")));
            }
            Step::Failed { reason, message } => {
                line.close();
                return Err(PluginError::Failed {
                    cr: key,
                    reason,
                    message,
                });
            }
            Step::Gone(why) => {
                line.close();
                return Err(PluginError::Interrupted(format!(
                    "stopped waiting for {key}: {why}"
                )));
            }
            Step::Reversed(desire) => {
                line.close();
                return Err(PluginError::Interrupted(format!(
                    "stopped waiting for {key}: its desire was changed to {desire} meanwhile"
                )));
            }
        }
    }
}

/// `Hibernating (WaitingForLifecycle)`, or what is known.
fn describe(cr: Option<&CrView>) -> String {
    match cr {
        None => "gone".to_string(),
        Some(cr) => {
            let phase = cr.phase.as_deref().unwrap_or("without a status");
            match cr.reason() {
                "" => phase.to_string(),
                reason => format!("{phase} ({reason})"),
            }
        }
    }
}

/// Errors no retry can fix: refused credentials or rights, or no such resource.
fn fatal(e: &watcher::Error) -> Option<kube::Error> {
    let source = match e {
        watcher::Error::InitialListFailed(source)
        | watcher::Error::WatchStartFailed(source)
        | watcher::Error::WatchFailed(source) => source,
        _ => return None,
    };
    match source {
        kube::Error::Api(status) if matches!(status.code, 401 | 403 | 404) => {
            Some(kube::Error::Api(status.clone()))
        }
        _ => None,
    }
}
