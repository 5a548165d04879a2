//! OCI registry client: probe and delete the `<base>/<vm>:hibernate` snapshot tag
//! (SPEC H3, H4, W2, W3, G1, G2; metrics O1).
//!
//! oci-client does the probe (manifest HEAD, its own token handling). A delete goes
//! through reqwest with the same TLS settings and credentials, all its requests on one
//! token fetched when the registry asks for one (`request.rs`). Secrets never reach logs
//! or `Debug` output.
//!
//! Registry calls at the floor (issue 8): a registry that refused a DELETE by tag is
//! remembered for the life of the client, and later deletes there go straight to the
//! digest path: HEAD, `tags/list`, DELETE by digest (three requests when the snapshot
//! tag is alone in its repository).
//!
//! C2: `--registry-timeout` (`RegistryConfig::timeout`) is the budget of one whole
//! operation, not of each request: a probe, or a delete with its whole digest fallback,
//! finishes or fails with `RegistryError::Timeout` within it. `delete_snapshot_before`
//! bounds a delete further by the caller's instant (S1). `RegistryError::is_permanent`
//! tells refusals from outages (S5).

mod catalog;
mod challenge;
mod client;
mod config;
mod deadline;
mod delete;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod lookup;
mod names;
mod oci_errors;
mod request;

pub use client::{DeleteOutcome, RegistryClient};
pub use config::{RegistryAuth, RegistryConfig};
pub use error::RegistryError;
pub use names::SNAPSHOT_TAG;
