//! The `--wait` line ([`WaitLine`]): on a terminal one line, redrawn in place as the
//! phase, the reason or the time in it changes; elsewhere (a pipe, a CI log) one plain
//! line per change. Also the plugin's other terminal output (`say`, `warn`, tables).

use super::table::{Layout, age};
use super::view::CrView;
use console::Term;
use jiff::Timestamp;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// What a progress line shows; a new line is printed only when this changes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct State {
    phase: String,
    reason: String,
    message: String,
}

impl State {
    fn of(cr: &CrView) -> Self {
        Self {
            phase: cr
                .phase
                .clone()
                .unwrap_or_else(|| "(no status yet)".to_string()),
            reason: cr.reason().to_string(),
            message: cr.message().to_string(),
        }
    }
}

/// `web-0: Hibernating (WaitingForLifecycle) 12s: waiting for vk-cocoon …`
fn live_line(cr: &CrView, now: Timestamp) -> String {
    let state = State::of(cr);
    let mut line = format!("{}: {}", cr.name, state.phase);
    if !state.reason.is_empty() {
        line.push_str(&format!(" ({})", state.reason));
    }
    line.push_str(&format!(" {}", age(cr.since(), now)));
    if !state.message.is_empty() {
        line.push_str(": ");
        line.push_str(&state.message);
    }
    line
}

/// `12:00:03Z  web-0  Hibernating  WaitingForLifecycle  waiting for vk-cocoon …`
fn plain_line(cr: &CrView, now: Timestamp) -> String {
    let state = State::of(cr);
    let clock = now.strftime("%H:%M:%SZ");
    let mut line = format!("{clock}  {}  {}", cr.name, state.phase);
    if !state.reason.is_empty() {
        line.push_str(&format!("  {}", state.reason));
    }
    if !state.message.is_empty() {
        line.push_str(&format!("  {}", state.message));
    }
    line
}

/// Cuts `line` to `width` terminal columns, marking the cut, so a redraw never wraps.
/// console measures wide characters (CJK, emoji) as two columns and cuts between
/// characters.
fn fit(line: &str, width: usize) -> String {
    let flat: String = line.split_whitespace().collect::<Vec<_>>().join(" ");
    console::truncate_str(&flat, width, "…").into_owned()
}

/// The terminal's width in columns: what the terminal says, else `$COLUMNS`, else 80.
/// terminal_size is not used: console asks the same ioctl of the stream it writes to.
fn width(term: &Term) -> u16 {
    let columns = || std::env::var("COLUMNS").ok()?.parse::<u16>().ok();
    term.size_checked()
        .map(|(_, w)| w)
        .or_else(columns)
        .filter(|w| *w >= 20)
        .unwrap_or(80)
}

/// How a table goes to stdout: fitted to a terminal, whole to a pipe (scripts).
pub fn table_layout() -> Layout {
    let term = Term::stdout();
    if term.is_term() {
        Layout::Fit(width(&term))
    } else {
        Layout::Plain
    }
}

/// Set by a program that runs commands in process many times (`make bench` reports
/// activity a thousand times): their lines on stdout would bury its own.
static QUIET: AtomicBool = AtomicBool::new(false);

/// From now on, commands run in this process print no report lines; errors are still
/// returned to the caller.
pub fn quiet_reports() {
    QUIET.store(true, Ordering::Relaxed);
}

/// A line on stdout. A closed pipe (`| head`) is not an error worth a panic.
pub fn say(line: &str) {
    if QUIET.load(Ordering::Relaxed) {
        return;
    }
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// A line on stderr.
pub fn warn(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// On console's `Term` rather than `indicatif`: one line, cleared and rewritten, and plain
/// lines when stdout is not a terminal. indicatif's spinner would bring its own draw
/// thread and rate limits to a line that changes only on a watch event or a one-second
/// tick, and its non-terminal mode prints nothing, where a CI log needs lines.
pub struct WaitLine {
    term: Term,
    tty: bool,
    shown: Option<State>,
    latest: Option<CrView>,
    /// A redrawable line is on screen (tty only).
    open: bool,
}

impl WaitLine {
    pub fn new() -> Self {
        let term = Term::stdout();
        Self {
            tty: term.is_term(),
            term,
            shown: None,
            latest: None,
            open: false,
        }
    }

    pub fn is_tty(&self) -> bool {
        self.tty
    }

    /// The CR as it is now: redrawn on a terminal, a new line elsewhere if it changed.
    pub fn show(&mut self, cr: &CrView, now: Timestamp) {
        let state = State::of(cr);
        let changed = self.shown.as_ref() != Some(&state);
        self.latest = Some(cr.clone());
        if self.tty {
            self.draw(now);
        } else if changed {
            say(&plain_line(cr, now));
        }
        self.shown = Some(state);
    }

    /// Redraws the time in the current state (tty only).
    pub fn tick(&mut self, now: Timestamp) {
        if self.tty && self.latest.is_some() {
            self.draw(now);
        }
    }

    fn draw(&mut self, now: Timestamp) {
        if let Some(cr) = &self.latest {
            // Read at every draw: the terminal may be resized during a wait. One column
            // short: a line filling the last column wraps on some terminals.
            let columns = usize::from(width(&self.term)).saturating_sub(1);
            // Cleared and rewritten in place; a closed terminal is not worth a panic.
            let _ = self.term.clear_line();
            let _ = self.term.write_str(&fit(&live_line(cr, now), columns));
            let _ = self.term.flush();
            self.open = true;
        }
    }

    /// A line of its own (a warning), above the progress line.
    pub fn note(&mut self, text: &str) {
        self.close();
        warn(text);
        if self.tty {
            let now = Timestamp::now();
            self.draw(now);
        }
    }

    /// Ends the progress line, leaving the last state on screen.
    pub fn close(&mut self) {
        if self.open {
            say("");
            self.open = false;
        }
    }
}

impl Default for WaitLine {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cr() -> CrView {
        CrView::from_json(&json!({
            "metadata": {"name": "web-0", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": "Hibernating", "conditions": [
                {"type": "Progressing", "status": "True", "reason": "WaitingForLifecycle",
                 "message": "waiting for vk-cocoon", "lastTransitionTime": "2026-01-01T00:00:03Z"}
            ]}
        }))
    }

    #[test]
    fn lines_name_the_phase_the_reason_and_the_time_in_it() {
        let now: Timestamp = "2026-01-01T00:00:15Z".parse().unwrap();
        assert_eq!(
            live_line(&cr(), now),
            "web-0: Hibernating (WaitingForLifecycle) 12s: waiting for vk-cocoon"
        );
        assert_eq!(
            plain_line(&cr(), now),
            "00:00:15Z  web-0  Hibernating  WaitingForLifecycle  waiting for vk-cocoon"
        );
        let bare = CrView::from_json(&json!({"metadata": {"name": "w"}}));
        assert_eq!(live_line(&bare, now), "w: (no status yet) <unknown>");
    }

    #[test]
    fn a_redrawn_line_never_wraps() {
        assert_eq!(fit("short", 10), "short");
        assert_eq!(fit("a\nb", 10), "a b");
        assert_eq!(fit("0123456789abc", 10), "012345678…");
        assert_eq!(fit("0123456789abc", 10).chars().count(), 10);
    }

    /// Wide characters count two columns, and a cut never leaves half of one: a 2-column
    /// character that does not fit whole is left out.
    #[rstest::rstest]
    #[case("東京-0: Hibernating 完了", 10, "東京-0: H…")]
    #[case("東京-0: Hibernating 完了", 7, "東京-0…")]
    #[case("東京東京東京", 6, "東京…")]
    #[case("東京東京東京", 7, "東京東…")]
    #[case("web-🐱: 待機中 🕒", 20, "web-🐱: 待機中 🕒")]
    #[case("🐱🐱🐱🐱", 6, "🐱🐱…")]
    fn a_redrawn_line_is_cut_by_terminal_columns(
        #[case] line: &str,
        #[case] width: usize,
        #[case] want: &str,
    ) {
        let got = fit(line, width);
        assert_eq!(got, want);
        assert!(unicode_width::UnicodeWidthStr::width(got.as_str()) <= width);
    }
}
