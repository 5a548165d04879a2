//! cocoon-hibernation: hibernates and wakes VM-backed pods.
//!
//! One process holds an admission webhook ([`webhook`]), a controller ([`controller`]) and
//! the one informer cache both read ([`cache`]); [`registry`] talks to the OCI registry.
//! The CocoonHibernation and schedule controllers share their gate, error policy and
//! finalizer patches ([`runtime`]).
#![forbid(unsafe_code)]

// The contracts and the pure decisions are crates of their own (crates/api, crates/core);
// re-exported under their old module names so the operator's paths and tests did not change.
pub use cocoon_api as api;
pub use cocoon_api::flags;
pub mod cache;
pub mod config;
pub mod controller;
pub mod error;
pub mod idle;
pub mod metrics;
pub mod ownership;
pub mod proxy;
pub mod registry;
pub mod runtime;
pub mod schedule;

pub use error::{Error, Result};
pub mod admin;
pub mod leader;
pub mod server;
pub mod webhook;

/// Sent by every client (apiserver and registry), so audit and access logs name us.
pub const USER_AGENT: &str = concat!("cocoon-hibernation/", env!("CARGO_PKG_VERSION"));
