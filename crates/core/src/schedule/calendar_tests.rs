use super::*;
use proptest::prelude::*;

fn cal(zone: &str, windows: &[(u8, &str, &str)], lead_min: i64) -> Calendar {
    let windows = windows
        .iter()
        .map(|&(days, from, to)| Window {
            days,
            from: parse_hhmm(from, false).unwrap(),
            to: parse_hhmm(to, true).unwrap(),
        })
        .collect();
    Calendar::new(
        TimeZone::get(zone).unwrap(),
        windows,
        SignedDuration::from_mins(lead_min),
    )
}

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

const EVERY: u8 = Window::EVERY_DAY;
const WEEKDAYS: u8 = 0b001_1111;

/// K1 K3: every boundary of a year, in five zones: each falls at its window's civil time,
/// they alternate, and on the DST days (the exceptions, written out by hand in UTC) a
/// boundary in a skipped hour is the first instant after the gap and one in a repeated
/// hour its first occurrence. Sao Paulo skipped midnight itself in 2018.
#[rstest::rstest]
#[case::k3_london("Europe/London", 2026, (EVERY, "01:30", "07:00"), 730,
    &[("2026-03-29T01:00:00Z", true), ("2026-10-25T00:30:00Z", true)])]
#[case::k3_new_york("America/New_York", 2026, (EVERY, "02:30", "01:30"), 730,
    &[("2026-03-08T07:00:00Z", true), ("2026-11-01T05:30:00Z", false)])]
#[case::k3_sao_paulo_midnight_gap("America/Sao_Paulo", 2018, (EVERY, "00:00", "08:00"), 730,
    &[("2018-11-04T03:00:00Z", true)])]
#[case::k3_sao_paulo_24_00_end("America/Sao_Paulo", 2018, (EVERY, "12:00", "24:00"), 730,
    &[("2018-11-04T03:00:00Z", false)])]
#[case::k3_sao_paulo_fold("America/Sao_Paulo", 2018, (EVERY, "12:00", "23:30"), 730,
    &[("2018-02-18T01:30:00Z", false)])]
#[case::k3_lord_howe_half_hour("Australia/Lord_Howe", 2026, (EVERY, "02:15", "01:45"), 730,
    &[("2026-10-03T15:30:00Z", true), ("2026-04-04T14:45:00Z", false)])]
#[case::k1_kolkata_weekdays("Asia/Kolkata", 2026, (WEEKDAYS, "09:00", "17:30"), 522, &[])]
fn k3_every_boundary_of_a_year(
    #[case] zone: &str,
    #[case] year: i16,
    #[case] window: (u8, &str, &str),
    #[case] count: usize,
    #[case] exceptions: &[(&str, bool)],
) {
    let c = cal(zone, &[window], 0);
    let tz = TimeZone::get(zone).unwrap();
    let start = jiff::civil::date(year, 1, 1).to_zoned(tz.clone()).unwrap();
    let end = jiff::civil::date(year + 1, 1, 1)
        .to_zoned(tz.clone())
        .unwrap();
    let all = c.boundaries(start.timestamp(), end.timestamp());
    assert_eq!(all.len(), count, "{zone}");
    let mut seen = 0;
    for pair in all.windows(2) {
        assert_ne!(
            pair[0].wake, pair[1].wake,
            "{zone}: {pair:?} do not alternate"
        );
    }
    for b in &all {
        if let Some(&(_, wake)) = exceptions.iter().find(|(at, _)| ts(at) == b.at) {
            assert_eq!(b.wake, wake, "{zone} {b:?}");
            seen += 1;
            continue;
        }
        let local = b.at.to_zoned(tz.clone());
        let minute =
            u16::try_from(local.hour()).unwrap() * 60 + u16::try_from(local.minute()).unwrap();
        let want = if b.wake { window.1 } else { window.2 };
        assert_eq!(
            minute % DAY_MINUTES,
            parse_hhmm(want, true).unwrap() % DAY_MINUTES,
            "{zone}: {b:?} at local {local}"
        );
        // Outside the transitions, the civil time is unambiguous: one instant only.
        let again = local.datetime().to_zoned(tz.clone()).unwrap();
        assert_eq!(again.timestamp(), b.at, "{zone}: {local}");
    }
    assert_eq!(
        seen,
        exceptions.len(),
        "{zone}: a DST boundary is missing or wrong"
    );
}

/// K1: the union of windows is awake; `to` before `from` spans midnight; a lead wakes early.
#[rstest::rstest]
#[case::k1_inside(&[(EVERY, "09:00", "17:00")], 0, "2026-06-10T12:00:00Z", true)]
#[case::k1_at_open(&[(EVERY, "09:00", "17:00")], 0, "2026-06-10T09:00:00Z", true)]
#[case::k1_at_close(&[(EVERY, "09:00", "17:00")], 0, "2026-06-10T17:00:00Z", false)]
#[case::k1_span_midnight(&[(EVERY, "22:00", "06:00")], 0, "2026-06-10T03:00:00Z", true)]
#[case::k1_span_midnight_day_of_open(&[(0b000_0001, "22:00", "06:00")], 0, "2026-06-09T03:00:00Z", true)]
#[case::k1_span_not_the_next_night(&[(0b000_0001, "22:00", "06:00")], 0, "2026-06-10T03:00:00Z", false)]
#[case::k1_24_00_end(&[(EVERY, "20:00", "24:00")], 0, "2026-06-10T23:59:59Z", true)]
#[case::k1_union(&[(EVERY, "08:00", "10:00"), (EVERY, "09:00", "12:00")], 0, "2026-06-10T11:00:00Z", true)]
#[case::k1_lead(&[(EVERY, "09:00", "17:00")], 30, "2026-06-10T08:45:00Z", true)]
#[case::k1_before_lead(&[(EVERY, "09:00", "17:00")], 30, "2026-06-10T08:29:00Z", false)]
#[case::k1_weekend_off(&[(WEEKDAYS, "00:00", "24:00")], 0, "2026-06-13T12:00:00Z", false)]
fn k1_awake_windows(
    #[case] windows: &[(u8, &str, &str)],
    #[case] lead: i64,
    #[case] at: &str,
    #[case] awake: bool,
) {
    // 2026-06-09 is a Tuesday; UTC keeps the civil times readable.
    assert_eq!(cal("UTC", windows, lead).awake(ts(at)), awake);
}

/// K1: windows that together cover every minute never produce a boundary.
#[test]
fn k1_always_awake_has_no_boundary() {
    let c = cal("Europe/London", &[(EVERY, "00:00", "24:00")], 0);
    let t = ts("2026-03-29T00:30:00Z");
    assert!(c.awake(t));
    assert_eq!(c.next_boundary(t), None);
    assert_eq!(c.latest_boundary(t), None);
    assert_eq!(cal("UTC", &[], 0).next_boundary(t), None);
}

#[rstest::rstest]
#[case::k1_time("09:30", false, Ok(570))]
#[case::k1_end_of_day("24:00", true, Ok(1440))]
#[case::k1_24_only_as_end("24:00", false, Err(()))]
#[case::k1_25("25:00", true, Err(()))]
#[case::k1_minutes("09:60", false, Err(()))]
#[case::k1_short("9:30", false, Err(()))]
fn k1_parse_hhmm(#[case] raw: &str, #[case] end: bool, #[case] want: Result<u16, ()>) {
    assert_eq!(parse_hhmm(raw, end).map_err(|_| ()), want);
}

/// K2: a pass applies the latest boundary not yet applied, once.
#[test]
fn k2_due_is_the_latest_unapplied_boundary() {
    let c = cal("UTC", &[(EVERY, "09:00", "17:00")], 0);
    let now = ts("2026-06-10T18:00:00Z");
    let b = c.due(now, None).unwrap();
    assert_eq!((b.at, b.wake), (ts("2026-06-10T17:00:00Z"), false));
    assert_eq!(c.due(now, Some(b.at)), None);
    // Down from before 09:00 to after 17:00: only the 17:00 boundary is applied.
    assert_eq!(c.due(now, Some(ts("2026-06-09T17:00:00Z"))), Some(b));
}

/// K8: what `kubectl cocoon schedule` shows: the next sleep and the next wake.
#[test]
fn k8_next_sleep_and_wake() {
    let c = cal("UTC", &[(WEEKDAYS, "09:00", "17:00")], 0);
    // Friday 18:00: asleep over the weekend, awake Monday 09:00, asleep again at 17:00.
    let (sleep, wake) = c.next_sleep_and_wake(ts("2026-06-12T18:00:00Z"));
    assert_eq!(wake, Some(ts("2026-06-15T09:00:00Z")));
    assert_eq!(sleep, Some(ts("2026-06-15T17:00:00Z")));
    assert_eq!(
        cal("UTC", &[], 0).next_sleep_and_wake(ts("2026-06-12T18:00:00Z")),
        (None, None)
    );
}

const ZONES: [&str; 6] = [
    "Europe/London",
    "America/New_York",
    "America/Sao_Paulo",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "UTC",
];

fn arb_window() -> impl Strategy<Value = Window> {
    (1u8..=127, 0u16..96, 0u16..=96).prop_map(|(days, f, t)| Window {
        days,
        from: f * 15,
        to: t * 15,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// K2 K3: the desired state is a function of the instant alone (walking the
    /// boundaries from any earlier instant gives it), and with the controller down for
    /// random stretches every boundary is applied at most once: exactly once when a pass
    /// ran before the next boundary, and the latest one on return otherwise.
    #[test]
    fn k2_boundaries_applied_exactly_once_with_downtime(
        zone in 0usize..ZONES.len(),
        windows in proptest::collection::vec(arb_window(), 0..4),
        lead in 0i64..4,
        start in 1_514_764_800i64..1_798_761_600,
        gaps in proptest::collection::vec(60i64..(3 * 86_400), 1..40),
    ) {
        let c = Calendar::new(
            TimeZone::get(ZONES[zone]).unwrap(),
            windows,
            SignedDuration::from_mins(lead * 30),
        );
        let t0 = Timestamp::from_second(start).unwrap();
        let mut passes = vec![t0];
        for g in &gaps {
            let last = *passes.last().unwrap();
            passes.push(last.checked_add(SignedDuration::from_secs(*g)).unwrap());
        }
        let end = *passes.last().unwrap();
        let all = c.boundaries(t0, end);
        // Function of the instant: the state walked from t0 equals the direct answer.
        let mut state = c.awake(t0);
        let mut bi = 0;
        let mut last_applied: Option<Timestamp> = c.latest_boundary(t0).map(|b| b.at);
        let mut applied: Vec<Timestamp> = Vec::new();
        for &now in &passes[1..] {
            while bi < all.len() && all[bi].at <= now {
                prop_assert_ne!(all[bi].wake, state);
                state = all[bi].wake;
                bi += 1;
            }
            prop_assert_eq!(c.awake(now), state);
            if let Some(b) = c.due(now, last_applied) {
                prop_assert_eq!(b.wake, c.awake(now));
                prop_assert!(!applied.contains(&b.at), "applied twice: {:?}", b);
                applied.push(b.at);
                last_applied = Some(b.at);
            }
        }
        for (i, b) in all.iter().enumerate() {
            let seen_before_next = passes.iter().any(|&p| {
                p >= b.at && all.get(i + 1).is_none_or(|n| p < n.at)
            });
            prop_assert_eq!(applied.contains(&b.at), seen_before_next, "{:?}", b);
        }
    }
}
