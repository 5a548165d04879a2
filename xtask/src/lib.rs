//! The repository's harness as a library: `cargo xtask` (src/main.rs) is one caller, the
//! test kit and the soak (which start control planes themselves) are the others.
#![forbid(unsafe_code)]

pub mod chart;
pub mod cluster;
pub mod cmd;
pub mod lanes;
pub mod tools;
