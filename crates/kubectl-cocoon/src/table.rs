//! Plain-text tables and ages, laid out as kubectl lays out `kubectl get`.

use comfy_table::{ColumnConstraint, ContentArrangement, Row, Table, TableStyle};
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

/// The fewest columns a fitted table leaves its last column.
const MIN_LAST: usize = 10;

/// How a table is laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Every cell whole, as `kubectl get` prints to a pipe: what scripts read.
    Plain,
    /// A terminal this many columns wide: the last column is cut, with `…`, so that each
    /// row stays one line; the other columns keep their full width. When they alone leave
    /// the last column less than `MIN_LAST` columns, the table is printed as `Plain`
    /// (the terminal wraps it, as it wraps `kubectl get`) rather than cut to nothing.
    Fit(u16),
}

/// A table: a header row and rows of cells, columns three spaces apart, no borders, the
/// last column not padded. Newlines in a cell are flattened so a row stays one line.
/// comfy-table measures cells in terminal columns (unicode-width), so CJK and emoji
/// cells align, and cuts them between characters.
pub fn render(header: &[&str], rows: &[Vec<String>], layout: Layout) -> String {
    let clean = |cell: &str| cell.split_whitespace().collect::<Vec<_>>().join(" ");
    let one_line = |cells: Vec<String>| {
        let mut row = Row::from(cells);
        row.max_height(1);
        row
    };
    let mut table = Table::new();
    // A style that draws nothing: no borders, no lines between columns or rows.
    table.load_style(TableStyle::new());
    table.set_header(one_line(header.iter().map(|h| clean(h)).collect()));
    for r in rows {
        table.add_row(one_line(r.iter().map(|c| clean(c)).collect()));
    }
    let last = header.len().saturating_sub(1);
    // What the columns before the last take, each with its three spaces.
    let fixed: usize = table
        .column_max_content_widths()
        .iter()
        .take(last)
        .map(|w| usize::from(*w) + 3)
        .sum();
    match layout {
        Layout::Fit(width) if fixed + MIN_LAST <= usize::from(width) => {
            table
                .set_content_arrangement(ContentArrangement::Dynamic)
                .set_width(width);
        }
        _ => {}
    }
    for column in table.column_iter_mut() {
        if column.index == last {
            column.set_padding((0, 0));
        } else {
            column.set_padding((0, 3));
            // Only the last column gives way to the terminal's width.
            column.set_constraint(ColumnConstraint::ContentWidth);
        }
    }
    let mut out = table.trim_fmt();
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;
    use unicode_width::UnicodeWidthStr;

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
            Layout::Plain,
        );
        assert_eq!(
            text,
            "NAME    PHASE        MESSAGE\nweb-0   Hibernated   done\na                    two lines\n"
        );
    }

    /// Where each cell of `cells` starts on `line`, in terminal columns (unicode-width,
    /// measured independently of the table's own code).
    fn starts(line: &str, cells: &[&str]) -> Vec<usize> {
        let mut from = 0;
        cells
            .iter()
            .map(|cell| {
                let at = from + line[from..].find(cell).unwrap();
                from = at + cell.len();
                UnicodeWidthStr::width(&line[..at])
            })
            .collect()
    }

    fn wide_rows() -> Vec<Vec<String>> {
        vec![
            vec![
                "東京-0".into(),
                "Hibernated".into(),
                "完了しました ✅".into(),
            ],
            vec!["web-🐱".into(), "Active".into(), "ok".into()],
            vec![
                "a".into(),
                "Waking".into(),
                "待機中 🕒 waiting for vk-cocoon".into(),
            ],
        ]
    }

    #[test]
    fn wide_characters_align_in_terminal_columns() {
        let rows = wide_rows();
        let text = render(&["NAME", "PHASE", "MESSAGE"], &rows, Layout::Plain);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        // NAME is 6 columns wide (東京 and 🐱 take two each), PHASE 10, three apart.
        assert_eq!(starts(lines[0], &["NAME", "PHASE", "MESSAGE"]), [0, 9, 22]);
        for (line, row) in lines[1..].iter().zip(&rows) {
            let cells: Vec<&str> = row.iter().map(String::as_str).collect();
            assert_eq!(starts(line, &cells), [0, 9, 22], "{line:?}");
        }
        // Plain: nothing is cut, whatever the width.
        assert!(text.contains("待機中 🕒 waiting for vk-cocoon"));
        assert!(!text.contains('…'));
    }

    /// At every terminal width, a fitted table keeps each row one line no wider than the
    /// terminal, keeps the first columns whole and aligned, and cuts the last column
    /// between characters: what is shown is a prefix of the cell, then `…`.
    #[test]
    fn fitted_tables_cut_the_last_column_between_characters() {
        let rows = wide_rows();
        for width in 32..=60u16 {
            let text = render(&["NAME", "PHASE", "MESSAGE"], &rows, Layout::Fit(width));
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines.len(), 4, "width {width}:\n{text}");
            for (line, row) in lines[1..].iter().zip(&rows) {
                assert!(
                    UnicodeWidthStr::width(*line) <= usize::from(width),
                    "width {width}: {line:?}"
                );
                assert_eq!(starts(line, &[&row[0], &row[1]]), [0, 9], "{line:?}");
                let shown = line[line.find(row[1].as_str()).unwrap() + row[1].len()..].trim_start();
                match shown.strip_suffix('…') {
                    Some(kept) => {
                        assert!(
                            row[2].starts_with(kept.trim_end()),
                            "width {width}: {shown:?}"
                        );
                        // Cut only where it had to be: the whole cell would not have fit.
                        assert!(22 + UnicodeWidthStr::width(row[2].as_str()) > usize::from(width));
                    }
                    None => assert_eq!(shown, row[2], "width {width}"),
                }
            }
        }
        // Fewer than ten columns left for MESSAGE: printed whole, as to a pipe.
        for width in [20, 30] {
            assert_eq!(
                render(&["NAME", "PHASE", "MESSAGE"], &rows, Layout::Fit(width)),
                render(&["NAME", "PHASE", "MESSAGE"], &rows, Layout::Plain),
                "width {width}"
            );
        }
        // Ten columns left for MESSAGE: し would need two more with the mark, so one stays
        // blank rather than hold half of it; eleven hold it; the mark always fits.
        for (width, first, third) in [
            (32, "完了しま…", "待機中 🕒…"),
            (33, "完了しまし…", "待機中 🕒…"),
            (34, "完了しまし…", "待機中 🕒…"),
        ] {
            let text = render(&["NAME", "PHASE", "MESSAGE"], &rows, Layout::Fit(width));
            let lines: Vec<&str> = text.lines().collect();
            assert!(lines[1].ends_with(&format!("   {first}")), "{text}");
            assert!(lines[3].ends_with(&format!("   {third}")), "{text}");
        }
    }
}
