//! OCI registry client: probe and delete the `<base>/<vm>:hibernate` snapshot tag
//! (SPEC H3, H4, W2, W3, G1, G2; metrics O1).
//!
//! oci-client does the reads (manifest HEAD, tag listing, its own token handling); the
//! DELETE it lacks goes through reqwest with the same TLS settings and credentials.
//! Secrets never reach logs or `Debug` output.

mod challenge;
mod client;
mod config;
mod delete;
mod error;
mod names;
mod oci_errors;

pub use client::{DeleteOutcome, RegistryClient};
pub use config::{RegistryAuth, RegistryConfig};
pub use error::RegistryError;
pub use names::SNAPSHOT_TAG;
