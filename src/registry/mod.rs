//! OCI registry client: probe and delete the `<base>/<vm>:hibernate` snapshot tag
//! (SPEC H3, H4, W2, W3, G1, G2; metrics O1).
//!
//! oci-client does the reads (manifest HEAD, tag listing, its own token handling); the
//! DELETE it lacks goes through reqwest with the same TLS settings and credentials.
//! Secrets never reach logs or `Debug` output.
//!
//! C2: `--registry-timeout` (`RegistryConfig::timeout`) is the budget of one whole
//! operation, not of each request: a probe, or a delete with its whole digest fallback,
//! finishes or fails with `RegistryError::Timeout` within it. `delete_snapshot_before`
//! bounds a delete further by the caller's instant (S1). `RegistryError::is_permanent`
//! tells refusals from outages (S5).

mod challenge;
mod client;
mod config;
mod deadline;
mod delete;
mod error;
mod names;
mod oci_errors;

pub use client::{DeleteOutcome, RegistryClient};
pub use config::{RegistryAuth, RegistryConfig};
pub use error::RegistryError;
pub use names::SNAPSHOT_TAG;
