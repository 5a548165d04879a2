//! A schedule's spec read into a [`Calendar`] (K1, K9): every reason it is not one, so
//! admission can show them all.

use super::calendar::{Calendar, MAX_LEAD, Window, parse_hhmm};
use cocoon_api::schedule::{CocoonHibernationScheduleSpec, Day};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// The spec as a calendar, or every reason it is not one (admission shows them all).
pub fn calendar(spec: &CocoonHibernationScheduleSpec) -> Result<Calendar, Vec<String>> {
    let mut errors = Vec::new();
    let tz = jiff::tz::TimeZone::get(&spec.time_zone)
        .map_err(|_| {
            errors.push(format!(
                "spec.timeZone: {:?} is not an IANA time zone name",
                spec.time_zone
            ))
        })
        .ok();
    let mut windows = Vec::new();
    for (i, w) in spec.awake.iter().enumerate() {
        let from = parse_hhmm(&w.from, false);
        let to = parse_hhmm(&w.to, true);
        match (from, to) {
            (Ok(from), Ok(to)) => windows.push(Window {
                days: days(&w.days),
                from,
                to,
            }),
            (from, to) => {
                for e in [from.err(), to.err()].into_iter().flatten() {
                    errors.push(format!("spec.awake[{i}]: {e}"));
                }
            }
        }
    }
    let lead = match spec.wake_lead.as_deref().map(cocoon_api::parse_duration) {
        None => jiff::SignedDuration::ZERO,
        Some(Ok(d)) => match jiff::SignedDuration::try_from(d) {
            Ok(d) if d <= MAX_LEAD => d,
            _ => {
                errors.push("spec.wakeLead: must be at most 24h".into());
                jiff::SignedDuration::ZERO
            }
        },
        Some(Err(e)) => {
            errors.push(format!("spec.wakeLead: {e}"));
            jiff::SignedDuration::ZERO
        }
    };
    if let Err(e) = kube::core::Selector::try_from(spec.selector.clone()) {
        errors.push(format!("spec.selector: {e}"));
    }
    errors.extend(never_awake(spec));
    match tz {
        Some(tz) if errors.is_empty() => Ok(Calendar::new(tz, windows, lead)),
        _ => Err(errors),
    }
}

fn days(list: &[Day]) -> u8 {
    if list.is_empty() {
        Window::EVERY_DAY
    } else {
        list.iter().fold(0, |acc, d| acc | bit(*d))
    }
}

/// K9: a schedule without a window hibernates its pods for ever (with an empty selector,
/// every VM pod of the namespace), so it must say so; `alwaysAsleep` with a window is a
/// contradiction, refused rather than guessed.
fn never_awake(spec: &CocoonHibernationScheduleSpec) -> Option<String> {
    match (spec.awake.is_empty(), spec.always_asleep) {
        (true, false) => Some(format!(
            "spec.awake is empty: {} would hibernate for ever; set spec.alwaysAsleep: true if that is meant",
            if selects_all(&spec.selector) {
                "every VM pod of this namespace (the selector is empty)"
            } else {
                "the selected pods"
            }
        )),
        (false, true) => Some(
            "spec.alwaysAsleep: true keeps pods asleep for ever, but spec.awake has windows; leave one of them out".into(),
        ),
        _ => None,
    }
}

fn selects_all(selector: &LabelSelector) -> bool {
    selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && selector
            .match_expressions
            .as_ref()
            .is_none_or(|e| e.is_empty())
}

/// A day's bit in [`Window::days`]: Monday is bit 0, as the CRD lists the days.
fn bit(day: Day) -> u8 {
    1 << (day as u8)
}
