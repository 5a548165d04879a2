//! The schedule's pure parts (K1–K7): the weekly [`calendar`], a spec read into one
//! ([`spec`]), and one pass's decisions ([`plan`]).

pub mod calendar;
pub mod plan;
pub mod spec;
