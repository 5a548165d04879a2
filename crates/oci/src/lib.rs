//! The OCI registry behind a [`SnapshotStore`]: probe and delete the snapshot tag
//! `<base>/<vm>:hibernate` (H3, H4, W2, W3, G1, G2, S1, S5; metrics O1), and keep the
//! install's owner marker under the base (S10, `owner.rs`), on oci-client's types and one
//! reqwest client (`http.rs`), each operation within one deadline (C2, S1).
//! Secrets never reach logs, errors or `Debug`.
//!
//! cocoon-oci stands alone: the plugin builds a [`RegistryClient`] without the operator, and
//! the operator reports its calls to its metrics through a [`RegistryObserver`].
#![forbid(unsafe_code)]

mod args;
mod client;
mod config;
mod error;
mod http;
mod names;
mod observer;
mod owner;

pub use args::RegistryArgs;
pub use client::RegistryClient;
pub use config::{RegistryConfig, auth_from_docker_config};
pub use error::RegistryError;
pub use names::SNAPSHOT_TAG;
pub use observer::RegistryObserver;
pub use oci_client::secrets::RegistryAuth;
pub use owner::{InstallId, Marker, OWNER_REPOSITORY, Ownership, describe_owners, ownership};

use std::time::Duration;
use tokio::time::Instant;

/// Sent with every registry request, so access logs name us (the operator's own form).
const USER_AGENT: &str = concat!("cocoon-hibernation/", env!("CARGO_PKG_VERSION"));

/// A deadline so far off that it bounds nothing.
const FAR: Duration = Duration::from_secs(365 * 24 * 3600);

/// What a [`SnapshotStore`] call returns: boxed, so the trait is object-safe.
pub type Fut<'a, T> = futures::future::BoxFuture<'a, Result<T, RegistryError>>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// The manifest the caller named was deleted by its digest (S7).
    Deleted,
    /// There was nothing to delete: the tag is gone (a 404 is confirmed by a HEAD, S5).
    Absent,
    /// Other tags share the manifest, which a delete by digest would remove too: nothing
    /// was deleted (S5).
    KeptSharedDigest { other_tags: Vec<String> },
    /// The tag now names another manifest, a newer snapshot: nothing was deleted (S7).
    Moved { found: String },
}

/// Where snapshots live, as the controller sees it; its tests use a fake.
pub trait SnapshotStore: Send + Sync {
    /// The digest `<base>/<vm>:hibernate` resolves to; None when the tag does not exist.
    /// 404 is an answer; transport errors, timeouts, 5xx and refused credentials are
    /// errors (H3, H4).
    fn snapshot_digest<'a>(&'a self, vm: &'a str) -> Fut<'a, Option<String>>;

    /// S7: deletes manifest `digest` of `<vm>` if, and only if, `<vm>:hibernate` still
    /// names it and no other tag shares it; never a DELETE by tag, so a request that lands
    /// late can only remove the snapshot the caller decided about. Every request of it is
    /// sent before min(now + timeout, `not_after`) or not at all, checked before each
    /// request, so a process paused past `not_after` sends nothing when it resumes (S1).
    /// A caller passes its own limit minus a margin: a sent request may still land.
    fn delete_snapshot_before<'a>(
        &'a self,
        vm: &'a str,
        digest: &'a str,
        not_after: Instant,
    ) -> Fut<'a, DeleteOutcome>;

    fn snapshot_exists<'a>(&'a self, vm: &'a str) -> Fut<'a, bool> {
        Box::pin(async move { Ok(self.snapshot_digest(vm).await?.is_some()) })
    }

    /// [`Self::delete_snapshot_before`] bounded by the timeout alone.
    fn delete_snapshot<'a>(&'a self, vm: &'a str, digest: &'a str) -> Fut<'a, DeleteOutcome> {
        self.delete_snapshot_before(vm, digest, Instant::now() + FAR)
    }
}

/// The parsers of registry answers, for the fuzz targets in `fuzz/` (cargo-fuzz builds with
/// `--cfg fuzzing`); product builds leave them out.
#[cfg(fuzzing)]
pub mod fuzzing {
    pub use super::error::{error_codes, excerpt};
    pub use super::http::{bearer_challenge, interpret_delete, next_link, token_from_body};
}
