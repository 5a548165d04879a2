//! Errors of the registry client. Messages never carry credentials or tokens.

use std::time::Duration;

/// Longest excerpt of a registry answer kept in an error message.
const MAX_DETAIL: usize = 300;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The VM name cannot be used as an OCI repository path component.
    #[error("invalid VM name {name:?} for an OCI repository: {reason}")]
    InvalidVmName { name: String, reason: &'static str },

    /// The registry configuration (base, CA certificates, HTTP client) is unusable.
    #[error("invalid registry configuration: {0}")]
    InvalidConfig(String),

    /// The docker config.json could not be read.
    #[error("invalid docker config: {0}")]
    DockerConfig(String),

    /// The operation ran out of its budget (C2): `--registry-timeout` for the whole
    /// operation, or less when the caller bounded it. `operation` names the call that was
    /// running or about to start; `after` is the operation's whole budget.
    #[error("registry {operation} timed out after {after:?}")]
    Timeout {
        operation: &'static str,
        after: Duration,
    },

    /// Connection refused, DNS, TLS or another transport failure.
    #[error("registry {operation} failed to reach the registry: {message}")]
    Transport {
        operation: &'static str,
        message: String,
    },

    /// The registry refused our credentials (401/403 or a failed token exchange).
    #[error("registry {operation} not authorized (HTTP {status}): {message}")]
    Unauthorized {
        operation: &'static str,
        status: u16,
        message: String,
    },

    /// The registry refuses to delete manifests (e.g. `storage.delete.enabled: false`).
    #[error("registry refuses to delete {reference} (HTTP {status}): {message}")]
    DeleteRefused {
        reference: String,
        status: u16,
        message: String,
    },

    /// Any other unexpected answer: 5xx, an unexpected 4xx, a malformed body.
    #[error("registry {operation} failed (HTTP {status}): {message}")]
    Server {
        operation: &'static str,
        status: u16,
        message: String,
    },

    /// A 4xx answer with an OCI error body we did not expect (oci-client keeps no status).
    #[error("registry rejected {operation}: {message}")]
    Rejected {
        operation: &'static str,
        message: String,
    },

    /// `<vm>:hibernate` pointed at another manifest when re-checked before the delete by
    /// digest (a fresh push while the other tags were checked); nothing was deleted.
    #[error(
        "{reference} moved from {checked} to {found} while its delete was checked; nothing deleted"
    )]
    SnapshotMoved {
        reference: String,
        checked: String,
        found: String,
    },

    /// The registry answered something we cannot interpret (no status attached).
    #[error("registry {operation} returned an unusable answer: {message}")]
    Protocol {
        operation: &'static str,
        message: String,
    },
}

impl RegistryError {
    /// Low-cardinality label for metrics and reconcile error counters.
    pub fn metric_label(&self) -> &'static str {
        match self {
            RegistryError::InvalidVmName { .. } => "registry_invalid_name",
            RegistryError::InvalidConfig(_) => "registry_config",
            RegistryError::DockerConfig(_) => "registry_docker_config",
            RegistryError::Timeout { .. } => "registry_timeout",
            RegistryError::Transport { .. } => "registry_transport",
            RegistryError::Unauthorized { .. } => "registry_unauthorized",
            RegistryError::DeleteRefused { .. } => "registry_delete_refused",
            RegistryError::Server { .. } => "registry_server",
            RegistryError::Rejected { .. } => "registry_rejected",
            RegistryError::SnapshotMoved { .. } => "registry_snapshot_moved",
            RegistryError::Protocol { .. } => "registry_protocol",
        }
    }

    /// True when repeating the same request cannot succeed until someone changes the
    /// configuration, the credentials or the registry (S5): the controller reports it
    /// instead of retrying as if it were an outage.
    ///
    /// Permanent: an unusable VM name or configuration; credentials refused (401/403,
    /// also a token server refusing them); deletes refused with no workable fallback
    /// (405, delete disabled); any other 4xx; an OCI error code we do not handle; an
    /// answer we cannot interpret. Transient: timeouts, transport failures, 5xx, 408, 429
    /// (also an OCI TOOMANYREQUESTS), and a snapshot tag that moved during the delete.
    ///
    /// oci-client reports a token server's non-200 answer without its status, so a
    /// token server failing with 5xx during a probe reads as a refusal (permanent).
    pub fn is_permanent(&self) -> bool {
        match self {
            RegistryError::InvalidVmName { .. }
            | RegistryError::InvalidConfig(_)
            | RegistryError::DockerConfig(_)
            | RegistryError::Unauthorized { .. }
            | RegistryError::DeleteRefused { .. }
            | RegistryError::Rejected { .. }
            | RegistryError::Protocol { .. } => true,
            RegistryError::Timeout { .. }
            | RegistryError::Transport { .. }
            | RegistryError::SnapshotMoved { .. } => false,
            RegistryError::Server { status, .. } => {
                !(*status >= 500 || *status == 408 || *status == 429)
            }
        }
    }
}

/// Shortens a registry answer for an error message, on a char boundary.
pub(crate) fn excerpt(text: &str) -> String {
    let text = text.trim();
    if text.len() <= MAX_DETAIL {
        return text.to_string();
    }
    let mut end = MAX_DETAIL;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// What a registry answered, for an error message: the body's start, or, for an empty
/// body, the status's name, so no message ends in a bare colon.
pub(crate) fn answer_detail(status: http::StatusCode, body: &str) -> String {
    if body.trim().is_empty() {
        let name = status.canonical_reason().unwrap_or("unknown status");
        return format!("{name}, empty body");
    }
    excerpt(body)
}

/// Describes an error with its chain of causes (reqwest hides the useful part, e.g.
/// "connection refused", in a source). URLs in it never carry credentials.
pub(crate) fn describe_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    excerpt(&message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_cuts_long_bodies_on_char_boundaries() {
        let long = "é".repeat(400);
        let cut = excerpt(&long);
        assert!(cut.len() <= MAX_DETAIL + '…'.len_utf8());
        assert!(cut.ends_with('…'));
        assert_eq!(excerpt("  short  "), "short");
    }

    /// O4: an empty answer still says what the registry answered.
    #[test]
    fn o4_empty_answers_name_the_status() {
        let e = RegistryError::Server {
            operation: "delete",
            status: 503,
            message: answer_detail(http::StatusCode::SERVICE_UNAVAILABLE, ""),
        };
        assert_eq!(
            e.to_string(),
            "registry delete failed (HTTP 503): Service Unavailable, empty body"
        );
        assert_eq!(answer_detail(http::StatusCode::OK, " x "), "x");
    }

    /// SPEC S5: a refusal for good is told apart from a failure worth retrying.
    #[test]
    fn s5_permanent_and_transient_errors() {
        let server = |status| RegistryError::Server {
            operation: "delete",
            status,
            message: String::new(),
        };
        let permanent = [
            RegistryError::InvalidVmName {
                name: "X".into(),
                reason: "r",
            },
            RegistryError::InvalidConfig("c".into()),
            RegistryError::Unauthorized {
                operation: "delete",
                status: 401,
                message: String::new(),
            },
            RegistryError::Unauthorized {
                operation: "token",
                status: 403,
                message: String::new(),
            },
            RegistryError::DeleteRefused {
                reference: "r".into(),
                status: 405,
                message: String::new(),
            },
            server(400),
            server(404),
            RegistryError::Rejected {
                operation: "probe",
                message: "NAME_INVALID".into(),
            },
            RegistryError::Protocol {
                operation: "token",
                message: "not JSON".into(),
            },
        ];
        for e in &permanent {
            assert!(e.is_permanent(), "{e:?}");
        }
        let transient = [
            RegistryError::Timeout {
                operation: "delete",
                after: Duration::from_secs(1),
            },
            RegistryError::Transport {
                operation: "probe",
                message: "refused".into(),
            },
            server(500),
            server(503),
            server(429),
            server(408),
            RegistryError::SnapshotMoved {
                reference: "r".into(),
                checked: "a".into(),
                found: "b".into(),
            },
        ];
        for e in &transient {
            assert!(!e.is_permanent(), "{e:?}");
        }
    }

    #[test]
    fn o1_metric_labels_are_static_and_distinct() {
        let errors = [
            RegistryError::InvalidVmName {
                name: "X".into(),
                reason: "r",
            },
            RegistryError::Timeout {
                operation: "probe",
                after: Duration::from_secs(1),
            },
            RegistryError::Unauthorized {
                operation: "probe",
                status: 401,
                message: String::new(),
            },
        ];
        let labels: Vec<_> = errors.iter().map(RegistryError::metric_label).collect();
        assert_eq!(
            labels,
            [
                "registry_invalid_name",
                "registry_timeout",
                "registry_unauthorized"
            ]
        );
    }
}
