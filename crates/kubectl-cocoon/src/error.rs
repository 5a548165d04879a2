//! The plugin's errors and exit codes. Messages are for a person at a terminal: they say
//! what failed and what to do, never a rule ID or a Rust type name.

use cocoon_oci::RegistryError;
use std::time::Duration;

/// Exit codes, as `--help` documents them.
pub mod exit {
    /// Done: the wait ended at the desire's phase, or the command did what it was asked.
    pub const OK: u8 = 0;
    /// The CocoonHibernation went Failed, or a call failed.
    pub const FAILED: u8 = 1;
    /// Bad flags or arguments, or an unusable kubeconfig or registry setting.
    pub const USAGE: u8 = 2;
    /// `--wait` ran out of `--timeout`.
    pub const TIMED_OUT: u8 = 3;
}

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The kubeconfig, a flag or a registry setting cannot be used.
    #[error("{0}")]
    Config(String),
    /// An apiserver call failed; `action` says which.
    #[error("{action}: {}", describe_kube(.source))]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("{action}: {source}")]
    Registry {
        action: String,
        #[source]
        source: RegistryError,
    },
    /// The command will not go on (a CR being deleted, no confirmation, ...).
    #[error("{0}")]
    Refused(String),
    /// The CocoonHibernation went Failed while we waited. A reason that says no more
    /// than "Failed" is left out.
    #[error("{cr} failed{}: {message}", if reason.is_empty() || reason == cocoon_api::conditions::REASON_FAILED { String::new() } else { format!(" ({reason})") })]
    Failed {
        cr: String,
        reason: String,
        message: String,
    },
    /// The wait ended without an answer: the CR vanished, was replaced or was reversed.
    #[error("{0}")]
    Interrupted(String),
    #[error("timed out after {} waiting for {cr} to be {want}; it is {now}", crate::table::human_duration(*.after))]
    TimedOut {
        cr: String,
        want: String,
        now: String,
        after: Duration,
    },
    #[error("{action}: {source}")]
    Io {
        action: String,
        #[source]
        source: std::io::Error,
    },
}

impl PluginError {
    pub fn api(action: impl Into<String>, source: kube::Error) -> Self {
        Self::Api {
            action: action.into(),
            source,
        }
    }

    pub fn registry(action: impl Into<String>, source: RegistryError) -> Self {
        Self::Registry {
            action: action.into(),
            source,
        }
    }

    pub fn io(action: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            action: action.into(),
            source,
        }
    }

    /// Names the apiserver in an error whose call never got an answer from it
    /// (connection refused, TLS, DNS), so a wrong kubeconfig or context shows.
    pub fn at_server(self, server: &str) -> Self {
        match self {
            Self::Api { action, source } if !matches!(source, kube::Error::Api(_)) => Self::Api {
                action: format!("{action} (apiserver {server})"),
                source,
            },
            other => other,
        }
    }

    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_) => exit::USAGE,
            Self::TimedOut { .. } => exit::TIMED_OUT,
            _ => exit::FAILED,
        }
    }
}

/// The apiserver's own words where it gave some, with a hint for the answers a newcomer
/// meets first.
fn describe_kube(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => {
            let hint = match status.code {
                401 => " (the kubeconfig's credentials were refused; log in again)",
                403 => " (your user may not do this; check its RBAC)",
                404 if status
                    .message
                    .contains("the server could not find the requested resource") =>
                {
                    " (is the CocoonHibernation CRD installed? `kubectl get crd cocoonhibernations.cocoonset.cocoonstack.io`)"
                }
                _ => "",
            };
            format!("{}{hint}", status.message)
        }
        other => {
            // The chain carries the useful part (connection refused, certificate, ...).
            let mut text = other.to_string();
            let mut source = std::error::Error::source(other);
            while let Some(cause) = source {
                let cause_text = cause.to_string();
                if !text.contains(&cause_text) {
                    text.push_str(": ");
                    text.push_str(&cause_text);
                }
                source = cause.source();
            }
            text
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    #[test]
    fn api_errors_say_what_failed_and_hint_at_the_fix() {
        let e = PluginError::api(
            "creating CocoonHibernation ns/web-0",
            kube::Error::Api(
                Status::failure("cocoonhibernations is forbidden", "Forbidden")
                    .with_code(403)
                    .boxed(),
            ),
        );
        let text = e.to_string();
        assert!(
            text.starts_with("creating CocoonHibernation ns/web-0: "),
            "{text}"
        );
        assert!(
            text.contains("forbidden") && text.contains("RBAC"),
            "{text}"
        );
        assert_eq!(e.exit_code(), exit::FAILED);
    }

    #[test]
    fn exit_codes_tell_timeouts_and_usage_apart() {
        let timed_out = PluginError::TimedOut {
            cr: "ns/a".into(),
            want: "Hibernated".into(),
            now: "Hibernating".into(),
            after: Duration::from_secs(90),
        };
        assert_eq!(timed_out.exit_code(), exit::TIMED_OUT);
        assert_eq!(
            timed_out.to_string(),
            "timed out after 90s waiting for ns/a to be Hibernated; it is Hibernating"
        );
        assert_eq!(PluginError::Config("x".into()).exit_code(), exit::USAGE);
        let failed = PluginError::Failed {
            cr: "ns/a".into(),
            reason: "HibernateTimedOut".into(),
            message: "did not complete within 5s".into(),
        };
        assert_eq!(
            failed.to_string(),
            "ns/a failed (HibernateTimedOut): did not complete within 5s"
        );
        assert_eq!(failed.exit_code(), exit::FAILED);
        let plain = PluginError::Failed {
            cr: "ns/a".into(),
            reason: "Failed".into(),
            message: "m".into(),
        };
        assert_eq!(plain.to_string(), "ns/a failed: m");
    }
}
