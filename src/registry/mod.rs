//! The operator's side of the registry. The OCI client itself (probe, delete, owner
//! marker, credentials) is the crate cocoon-oci, which the plugin uses alone; re-exported
//! here under its old path. The operator adds its metrics (`crate::metrics` is the
//! client's [`RegistryObserver`]) and, in the controller, the leadership fence on every
//! delete (`tag_delete.rs`).

pub use cocoon_oci::*;

#[cfg(test)]
pub(crate) mod fake;
