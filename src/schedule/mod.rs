//! CocoonHibernationSchedule (K1–K9): flips the CocoonHibernations of the pods it selects
//! on a weekly calendar. Pure calendar in [`calendar`], the API in [`spec`], decisions in
//! [`plan`]; [`controller`] fetches and executes.

pub mod admission;
pub mod controller;
pub mod inputs;
pub mod status;
pub mod wakeup;
pub mod writes;

// The pure parts live in cocoon-core, the CRD in cocoon-api; re-exported under their old
// paths so callers and tests did not change.
pub use cocoon_core::schedule::{calendar, plan};

/// The schedule's CRD types (cocoon-api) and their reading into a calendar (cocoon-core).
pub mod spec {
    pub use cocoon_api::schedule::*;
    pub use cocoon_core::schedule::spec::calendar;
}

pub use spec::{CocoonHibernationSchedule, CocoonHibernationScheduleSpec};

use jiff::{SignedDuration, Timestamp};

/// The schedule's notion of now: real time plus an offset that only tests set
/// (`--schedule-clock-offset`), so an e2e reaches a boundary without waiting for it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Clock {
    pub offset: SignedDuration,
}

impl Clock {
    pub fn now(&self) -> Timestamp {
        let real = Timestamp::now();
        real.checked_add(self.offset).unwrap_or(real)
    }
}

/// `--schedule-clock-offset`: a duration (humantime), negative with a leading `-`.
pub fn parse_offset(raw: &str) -> Result<SignedDuration, String> {
    let (sign, rest) = match raw.trim().strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, raw.trim()),
    };
    let d = crate::api::parse_duration(rest)?;
    let d = SignedDuration::try_from(d).map_err(|e| e.to_string())?;
    Ok(if sign < 0 { -d } else { d })
}

#[cfg(test)]
mod tests {
    /// K2: the testing clock offset reads both signs.
    #[test]
    fn k2_clock_offset_parses_both_signs() {
        assert_eq!(
            super::parse_offset("90m"),
            Ok(jiff::SignedDuration::from_mins(90))
        );
        assert_eq!(
            super::parse_offset("-2h"),
            Ok(jiff::SignedDuration::from_hours(-2))
        );
        assert!(super::parse_offset("soon").is_err());
    }
}
