//! CocoonIdlePolicy (I1–I6): hibernates the pods it selects when their activity record
//! (I2, [`crate::api::activity`]) says nobody used them for `idleAfter`; the wake proxy
//! (Q1–Q8) reads its wake-on-request settings.

pub mod spec;

pub use spec::{CocoonIdlePolicy, CocoonIdlePolicySpec};
