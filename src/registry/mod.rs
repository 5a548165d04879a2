//! OCI registry client: probe and delete the `<vm>:hibernate` snapshot tag.
//! Temporary interface stub; replaced by the real client.
use crate::metrics::Metrics;
use std::time::Duration;

pub struct RegistryConfig {
    pub base: String,
    pub plain_http: bool,
    pub auth: RegistryAuth,
    pub extra_ca_pems: Vec<Vec<u8>>,
    pub timeout: Duration,
}
pub enum RegistryAuth {
    Anonymous,
    Basic { username: String, password: String },
    Bearer { token: String },
}
impl RegistryAuth {
    pub fn from_docker_config(
        _json: &[u8],
        _registry_host: &str,
    ) -> Result<RegistryAuth, RegistryError> {
        Ok(RegistryAuth::Anonymous)
    }
}
#[derive(Clone)]
pub struct RegistryClient;
#[derive(Debug)]
pub enum DeleteOutcome {
    Deleted,
    Absent,
    DeletedByDigest,
    KeptSharedDigest { other_tags: Vec<String> },
}
#[derive(Debug, thiserror::Error)]
#[error("registry error: {0}")]
pub struct RegistryError(String);
impl RegistryError {
    pub fn metric_label(&self) -> &'static str {
        "error"
    }
}
impl RegistryClient {
    pub fn new(_config: RegistryConfig, _metrics: Metrics) -> Result<Self, RegistryError> {
        Ok(Self)
    }
    pub async fn snapshot_exists(&self, _vm: &str) -> Result<bool, RegistryError> {
        Err(RegistryError("stub".into()))
    }
    pub async fn delete_snapshot(&self, _vm: &str) -> Result<DeleteOutcome, RegistryError> {
        Err(RegistryError("stub".into()))
    }
}
