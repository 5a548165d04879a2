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

    /// The call did not finish within the configured timeout.
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
            RegistryError::Protocol { .. } => "registry_protocol",
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
