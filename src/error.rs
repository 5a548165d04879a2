//! The crate's one error type.

use crate::registry::RegistryError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("registry: {0}")]
    Registry(#[from] RegistryError),
    /// H4: the snapshot probe failed; the pass is retried and the clock keeps running.
    #[error("snapshot probe failed: {0}")]
    Probe(String),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("TLS: {0}")]
    Tls(String),
    /// `what` names the operation and its object, such as the address a bind failed on.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// S8: a task the process cannot run without (cache, controller) ended.
    #[error("{0}")]
    TaskEnded(String),
    /// S1: a leader-only effect was refused because this replica's lease is not fresh.
    #[error("not acting as leader: {0}")]
    Fenced(String),
}

impl Error {
    /// A write lost a race with another writer (409 conflict, or 422 from a JSON patch
    /// `test` op): the next pass reads again at once instead of backing off.
    pub fn is_lost_race(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(s)) if s.code == 409 || s.code == 422)
    }

    /// A stable, low-cardinality name for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) if s.code == 409 => "conflict",
            Error::Kube(kube::Error::Api(s)) if s.code == 422 => "precondition",
            Error::Kube(_) => "kube",
            Error::Registry(_) => "registry",
            Error::Probe(_) => "probe",
            Error::Config(_) => "config",
            Error::Tls(_) => "tls",
            Error::Io { .. } => "io",
            Error::Fenced(_) => "fenced",
            Error::TaskEnded(_) => "task_ended",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
