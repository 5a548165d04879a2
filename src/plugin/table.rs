//! Plain-text tables and ages, laid out as kubectl lays out `kubectl get`.

use std::time::Duration;

/// kubectl's short human durations (`45s`, `3m12s`, `5h3m`, `2d4h`, `400d`).
/// Hand-written: kubectl drops the smaller unit past a threshold (`3h`, not `3h0m59s`),
/// which `humantime::format_duration` (every unit, space separated) does not do, and an
/// AGE column should read as `kubectl get` prints it.
pub fn human_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let (m, h, day, year) = (60, 3600, 86_400, 365 * 86_400);
    match secs {
        s if s < 2 * m => format!("{s}s"),
        s if s < 10 * m => match s % m {
            0 => format!("{}m", s / m),
            rest => format!("{}m{rest}s", s / m),
        },
        s if s < 3 * h => format!("{}m", s / m),
        s if s < 8 * h => match (s % h) / m {
            0 => format!("{}h", s / h),
            rest => format!("{}h{rest}m", s / h),
        },
        s if s < 48 * h => format!("{}h", s / h),
        s if s < 8 * day => match (s % day) / h {
            0 => format!("{}d", s / day),
            rest => format!("{}d{rest}h", s / day),
        },
        s if s < 2 * year => format!("{}d", s / day),
        s if s < 8 * year => match (s % year) / day {
            0 => format!("{}y", s / year),
            rest => format!("{}y{rest}d", s / year),
        },
        s => format!("{}y", s / year),
    }
}

/// The age of `since` at `now`; `<unknown>` without a time, as kubectl prints it.
pub fn age(since: Option<jiff::Timestamp>, now: jiff::Timestamp) -> String {
    since
        .and_then(|t| Duration::try_from(now.duration_since(t)).ok())
        .map_or_else(|| "<unknown>".to_string(), human_duration)
}

/// A table: a header row and rows of cells, columns three spaces apart, the last column
/// not padded. Newlines in a cell are flattened so a row stays one line.
/// Hand-written: kubectl's layout is these thirty lines; `comfy-table` or `tabled` would
/// need their borders, padding and wrapping turned off one by one to print the same, for
/// a dependency tree larger than the plugin.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let clean = |cell: &str| cell.split_whitespace().collect::<Vec<_>>().join(" ");
    let rows: Vec<Vec<String>> = std::iter::once(header.iter().map(|h| h.to_string()).collect())
        .chain(rows.iter().map(|r| r.iter().map(|c| clean(c)).collect()))
        .collect();
    let columns = header.len();
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, width) in widths.iter().enumerate() {
            let cell = row.get(i).map_or("", String::as_str);
            if i + 1 == columns {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(width - cell.chars().count() + 3));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(0, "0s")]
    #[case(119, "119s")]
    #[case(120, "2m")]
    #[case(192, "3m12s")]
    #[case(600, "10m")]
    #[case(3 * 3600 + 59, "3h")]
    #[case(5 * 3600 + 3 * 60, "5h3m")]
    #[case(30 * 3600, "30h")]
    #[case(2 * 86_400 + 4 * 3600, "2d4h")]
    #[case(400 * 86_400, "400d")]
    #[case(3 * 365 * 86_400 + 86_400, "3y1d")]
    #[case(9 * 365 * 86_400, "9y")]
    fn durations_read_like_kubectl(#[case] secs: u64, #[case] want: &str) {
        assert_eq!(human_duration(Duration::from_secs(secs)), want);
    }

    #[test]
    fn ages_of_unknown_or_future_times_say_unknown() {
        let now: jiff::Timestamp = "2026-01-01T00:10:00Z".parse().unwrap();
        let then: jiff::Timestamp = "2026-01-01T00:07:00Z".parse().unwrap();
        assert_eq!(age(Some(then), now), "3m");
        assert_eq!(age(None, now), "<unknown>");
        assert_eq!(age(Some(now), then), "<unknown>");
    }

    #[test]
    fn columns_align_and_cells_stay_on_one_line() {
        let text = render(
            &["NAME", "PHASE", "MESSAGE"],
            &[
                vec!["web-0".into(), "Hibernated".into(), "done".into()],
                vec!["a".into(), "".into(), "two\nlines".into()],
            ],
        );
        assert_eq!(
            text,
            "NAME    PHASE        MESSAGE\nweb-0   Hibernated   done\na                    two lines\n"
        );
    }
}
