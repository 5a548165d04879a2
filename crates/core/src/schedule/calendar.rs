//! The schedule's calendar (K1–K3): when pods should be awake, as a pure function of the
//! instant, and the boundaries where that changes.

use jiff::civil::{Date, DateTime, Weekday};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{SignedDuration, Timestamp, ToSpan};

/// Minutes in a civil day; `24:00` as a window's end.
pub const DAY_MINUTES: u16 = 24 * 60;

/// Longest `wakeLead` (validated at admission); also bounds how far back the calendar looks.
pub const MAX_LEAD: SignedDuration = SignedDuration::from_hours(24);

/// One awake window: on each of `days` (bit 0 = Monday), from `from` to `to`, in minutes
/// after midnight. `to <= from` spans midnight into the next day.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub days: u8,
    pub from: u16,
    pub to: u16,
}

impl Window {
    pub const EVERY_DAY: u8 = 0b111_1111;

    fn opens_on(&self, weekday: Weekday) -> bool {
        self.days & (1 << weekday.to_monday_zero_offset()) != 0
    }
}

/// A change of the desired state: at `at`, pods should be woken (`wake`) or hibernated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Boundary {
    pub at: Timestamp,
    pub wake: bool,
}

/// Windows in one zone, with the lead that starts a wake early.
#[derive(Clone, Debug)]
pub struct Calendar {
    tz: TimeZone,
    windows: Vec<Window>,
    lead: SignedDuration,
}

impl Calendar {
    /// `lead` is clamped to `0..=MAX_LEAD`.
    pub fn new(tz: TimeZone, windows: Vec<Window>, lead: SignedDuration) -> Self {
        let lead = lead.clamp(SignedDuration::ZERO, MAX_LEAD);
        Self { tz, windows, lead }
    }

    pub fn time_zone(&self) -> &TimeZone {
        &self.tz
    }

    /// K2: whether pods should be awake at `t`; depends on nothing but `t`.
    pub fn awake(&self, t: Timestamp) -> bool {
        let date = self.date(t);
        self.intervals(date, date)
            .iter()
            .any(|&(a, b)| a <= t && t < b)
    }

    /// Boundaries in `(after, until]`, in order.
    pub fn boundaries(&self, after: Timestamp, until: Timestamp) -> Vec<Boundary> {
        if until <= after {
            return Vec::new();
        }
        let intervals = self.intervals(self.date(after), self.date(until));
        let awake = |t: Timestamp| intervals.iter().any(|&(a, b)| a <= t && t < b);
        let mut edges: Vec<Timestamp> = intervals
            .iter()
            .flat_map(|&(a, b)| [a, b])
            .filter(|&t| after < t && t <= until)
            .collect();
        edges.sort();
        edges.dedup();
        edges
            .into_iter()
            .filter_map(|at| {
                let before = at.checked_sub(SignedDuration::from_nanos(1)).ok()?;
                let wake = awake(at);
                (wake != awake(before)).then_some(Boundary { at, wake })
            })
            .collect()
    }

    /// The first boundary after `t`; `None` when the desired state never changes.
    pub fn next_boundary(&self, t: Timestamp) -> Option<Boundary> {
        let until = t.checked_add(SignedDuration::from_hours(8 * 24)).ok()?;
        self.boundaries(t, until).first().copied()
    }

    /// K2: the latest boundary at or before `t`: the one a pass at `t` must have applied.
    pub fn latest_boundary(&self, t: Timestamp) -> Option<Boundary> {
        let since = t.checked_sub(SignedDuration::from_hours(8 * 24)).ok()?;
        self.boundaries(since, t).last().copied()
    }

    /// K8: the next hibernate and the next wake after `t` (within a week and a day).
    pub fn next_sleep_and_wake(&self, t: Timestamp) -> (Option<Timestamp>, Option<Timestamp>) {
        let Ok(until) = t.checked_add(SignedDuration::from_hours(8 * 24)) else {
            return (None, None);
        };
        let all = self.boundaries(t, until);
        let first = |wake: bool| all.iter().find(|b| b.wake == wake).map(|b| b.at);
        (first(false), first(true))
    }

    /// K2: the boundary a pass at `now` must apply, given the last one applied: the latest
    /// one not yet applied, so a boundary missed while down is applied once on return and
    /// none is applied twice.
    pub fn due(&self, now: Timestamp, last_applied: Option<Timestamp>) -> Option<Boundary> {
        let b = self.latest_boundary(now)?;
        match last_applied {
            Some(last) if last >= b.at => None,
            _ => Some(b),
        }
    }

    fn date(&self, t: Timestamp) -> Date {
        t.to_zoned(self.tz.clone()).date()
    }

    /// Awake intervals `[open - lead, close)` of windows opening between two days before
    /// `first` and one day after `last`: every interval that can touch those dates.
    fn intervals(&self, first: Date, last: Date) -> Vec<(Timestamp, Timestamp)> {
        let (Ok(start), Ok(end)) = (first.checked_sub(2.days()), last.checked_add(2.days())) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut day = start;
        while day <= end {
            for w in self.windows.iter().filter(|w| w.opens_on(day.weekday())) {
                let close_day = if w.to <= w.from {
                    day.tomorrow().ok()
                } else {
                    Some(day)
                };
                let open = self.instant(day, w.from);
                let close = close_day.and_then(|d| self.instant(d, w.to));
                if let (Some(open), Some(close)) = (open, close) {
                    let open = open.checked_sub(self.lead).unwrap_or(open);
                    if open < close {
                        out.push((open, close));
                    }
                }
            }
            match day.tomorrow() {
                Ok(next) => day = next,
                Err(_) => break,
            }
        }
        out
    }

    /// K3: the instant of a civil time on `day`. In a skipped hour: the first instant after
    /// the gap (the transition itself); in a repeated hour: its first occurrence.
    pub fn instant(&self, day: Date, minute: u16) -> Option<Timestamp> {
        let (day, minute) = if minute >= DAY_MINUTES {
            (day.tomorrow().ok()?, minute - DAY_MINUTES)
        } else {
            (day, minute)
        };
        let hour = i8::try_from(minute / 60).ok()?;
        let min = i8::try_from(minute % 60).ok()?;
        let dt: DateTime = day.at(hour, min, 0, 0);
        match self.tz.to_ambiguous_timestamp(dt).offset() {
            AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(dt).ok(),
            AmbiguousOffset::Gap { after, .. } => {
                // Read with the later offset, the civil time is an instant before the
                // transition; the transition that follows it is the end of the gap.
                let inside = after.to_timestamp(dt).ok()?;
                let transition = self.tz.following(inside).next()?;
                Some(transition.timestamp())
            }
            AmbiguousOffset::Fold { before, .. } => before.to_timestamp(dt).ok(),
        }
    }
}

/// Parses `HH:MM` (00:00–23:59; also `24:00` when `end`) into minutes after midnight.
/// Hand-written: jiff's civil time parser has no `24:00`, which windows need as an end.
pub fn parse_hhmm(raw: &str, end: bool) -> Result<u16, String> {
    let bad = || format!("{raw:?} is not a time of day HH:MM");
    let (h, m) = raw.split_once(':').ok_or_else(bad)?;
    if h.len() != 2 || m.len() != 2 {
        return Err(bad());
    }
    let h: u16 = h.parse().map_err(|_| bad())?;
    let m: u16 = m.parse().map_err(|_| bad())?;
    match (h, m) {
        (24, 0) if end => Ok(DAY_MINUTES),
        (0..=23, 0..=59) => Ok(h * 60 + m),
        _ => Err(bad()),
    }
}

#[cfg(test)]
#[path = "calendar_tests.rs"]
mod tests;
