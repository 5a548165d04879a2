//! CocoonIdlePolicy (I1–I6): hibernates the pods it selects when their activity record
//! (I2, [`crate::api::activity`]) says nobody used them for `idleAfter`; the wake proxy
//! (Q1–Q8) reads its wake-on-request settings. The API in [`spec`], its checks in
//! [`validate`] and [`admission`].

pub mod admission;
pub mod controller;
pub mod inputs;
pub mod plan;
pub mod validate;
pub mod writes;

// The CRD types live in `cocoon-api` (shared with the wake proxy and the plugin).
pub use cocoon_api::idle as spec;
pub use cocoon_api::idle::{CocoonIdlePolicy, CocoonIdlePolicySpec};
