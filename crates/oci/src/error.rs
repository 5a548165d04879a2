//! Registry errors, and which of them are permanent (S5). Messages never carry secrets.

use oci_client::errors::{OciEnvelope, OciErrorCode as Code};
use std::time::Duration;

/// Longest excerpt of a registry answer kept in an error message.
const MAX_DETAIL: usize = 300;

/// The operation an error or a `registry_calls_total` count is about.
pub(crate) type Op = &'static str;

pub(crate) type Result<T, E = RegistryError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("invalid VM name {name:?} for an OCI repository: {reason}")]
    InvalidVmName { name: String, reason: &'static str },
    #[error("invalid registry configuration: {0}")]
    InvalidConfig(String),
    /// The operation ran out of its budget (C2); `after` is that whole budget.
    #[error("registry {operation} timed out after {after:?}")]
    Timeout { operation: Op, after: Duration },
    /// Connection refused, DNS, TLS or another transport failure.
    #[error("registry {operation} failed to reach the registry: {message}")]
    Transport { operation: Op, message: String },
    /// Credentials refused: 401/403, or by the token server.
    #[error("registry {operation} not authorized (HTTP {status}): {message}")]
    Unauthorized {
        operation: Op,
        status: u16,
        message: String,
    },
    /// Deletes are disabled (e.g. `storage.delete.enabled: false`).
    #[error("registry refuses to delete {reference} (HTTP {status}): {message}")]
    DeleteRefused {
        reference: String,
        status: u16,
        message: String,
    },
    #[error("registry {operation} failed (HTTP {status}): {message}")]
    Server {
        operation: Op,
        status: u16,
        message: String,
    },
    #[error("registry {operation} returned an unusable answer: {message}")]
    Protocol { operation: Op, message: String },
}

impl RegistryError {
    /// Low-cardinality label for metrics and reconcile error counters.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::InvalidVmName { .. } => "registry_invalid_name",
            Self::InvalidConfig(_) => "registry_config",
            Self::Timeout { .. } => "registry_timeout",
            Self::Transport { .. } => "registry_transport",
            Self::Unauthorized { .. } => "registry_unauthorized",
            Self::DeleteRefused { .. } => "registry_delete_refused",
            Self::Server { .. } => "registry_server",
            Self::Protocol { .. } => "registry_protocol",
        }
    }

    /// True when a retry cannot succeed until someone changes the configuration, the
    /// credentials or the registry (S5). Transient: timeouts, transport failures, 5xx,
    /// 408, 429 (and TOOMANYREQUESTS), a snapshot that moved.
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::Timeout { .. } | Self::Transport { .. } => false,
            Self::Server { status, .. } => *status < 500 && !matches!(status, 408 | 429),
            _ => true,
        }
    }

    pub(crate) fn protocol(operation: Op, message: impl Into<String>) -> Self {
        let message = message.into();
        Self::Protocol { operation, message }
    }

    /// An HTTP answer nobody expected: 401/403 refuse the credentials, and an OCI error
    /// body saying TOOMANYREQUESTS is throttling under any other status.
    pub(crate) fn from_status(operation: Op, status: u16, body: &str) -> Self {
        let message = answer_detail(status, body);
        if matches!(status, 401 | 403) {
            return Self::Unauthorized {
                operation,
                status,
                message,
            };
        }
        let throttled = error_codes(body).contains(&Code::Toomanyrequests);
        let status = if throttled { 429 } else { status };
        Self::Server {
            operation,
            status,
            message,
        }
    }

    pub(crate) fn transport(operation: Op, err: &reqwest::Error) -> Self {
        let message = describe_chain(err);
        Self::Transport { operation, message }
    }
}

/// The codes of an OCI error body (`{"errors":[{"code":…}]}`); none if it is not one.
pub fn error_codes(body: &str) -> Vec<Code> {
    let envelope = serde_json::from_str::<OciEnvelope>(body).ok();
    envelope.map_or_else(Vec::new, |e| e.errors.into_iter().map(|e| e.code).collect())
}

/// Shortens a registry answer for an error message, on a char boundary.
pub fn excerpt(text: &str) -> String {
    let text = text.trim();
    let end = text.floor_char_boundary(MAX_DETAIL);
    let more = if end < text.len() { "…" } else { "" };
    format!("{}{more}", &text[..end])
}

/// An answer for an error message: the body's start, or for an empty body the status's
/// name, so no message ends in a bare colon.
pub(crate) fn answer_detail(status: u16, body: &str) -> String {
    if !body.trim().is_empty() {
        return excerpt(body);
    }
    let name = http::StatusCode::from_u16(status).ok();
    let name = name.and_then(|s| s.canonical_reason());
    format!("{}, empty body", name.unwrap_or("unknown status"))
}

/// An error with its chain of causes (reqwest hides e.g. "connection refused" in a
/// source). URLs in it never carry credentials.
pub(crate) fn describe_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let chain = std::iter::successors(Some(err), |e| e.source()).map(ToString::to_string);
    excerpt(&chain.collect::<Vec<_>>().join(": "))
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
            message: answer_detail(503, ""),
        };
        assert_eq!(
            e.to_string(),
            "registry delete failed (HTTP 503): Service Unavailable, empty body"
        );
        assert_eq!(answer_detail(200, " x "), "x");
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

    fn codes(code: &str) -> String {
        serde_json::json!({ "errors": [{ "code": code, "message": "m" }] }).to_string()
    }

    #[test]
    fn h4_auth_server_and_other_failures_are_errors() {
        let error = |status, body: &str| RegistryError::from_status("probe", status, body);
        assert!(matches!(
            error(401, ""),
            RegistryError::Unauthorized { status: 401, .. }
        ));
        assert!(matches!(
            error(403, &codes("DENIED")),
            RegistryError::Unauthorized { status: 403, .. }
        ));
        assert!(matches!(
            error(503, "down"),
            RegistryError::Server { status: 503, .. }
        ));
        let invalid = error(400, &codes("NAME_INVALID"));
        assert!(matches!(invalid, RegistryError::Server { status: 400, .. }));
        assert!(invalid.is_permanent());
        // S5: throttling is transient, as a 429 is.
        let throttled = error(400, &codes("TOOMANYREQUESTS"));
        assert!(
            matches!(throttled, RegistryError::Server { status: 429, .. }),
            "{throttled:?}"
        );
        assert!(!throttled.is_permanent());
        assert_eq!(error_codes("not json"), []);
    }
}
