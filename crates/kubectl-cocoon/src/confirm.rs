//! The confirmation a delete needs: typed on a terminal, or `--yes` without one.

use super::error::PluginError;
use std::io::{BufRead, IsTerminal, Write};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// `--yes` was given.
    Given,
    /// Ask on the terminal.
    Prompt,
    /// No terminal to ask on, and no `--yes`.
    Refuse,
}

pub fn how(yes: bool, stdin_is_terminal: bool) -> Ask {
    match (yes, stdin_is_terminal) {
        (true, _) => Ask::Given,
        (false, true) => Ask::Prompt,
        (false, false) => Ask::Refuse,
    }
}

/// Only the whole word counts.
pub fn confirmed(answer: &str) -> bool {
    answer.trim() == "yes"
}

/// Hand-written rather than `dialoguer`: its `Confirm` takes one key (`[y/N]`) where a
/// delete needs the whole word `yes`, and its `Input` would bring the `console` crate for
/// one prompt on stderr and one `read_line`.
pub fn confirm(count: usize, yes: bool) -> Result<(), PluginError> {
    match how(yes, std::io::stdin().is_terminal()) {
        Ask::Given => Ok(()),
        Ask::Refuse => Err(PluginError::Refused(
            "nothing deleted: confirmation needed, and stdin is not a terminal; add --yes to delete without asking"
                .into(),
        )),
        Ask::Prompt => {
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "Delete {count} snapshot tag(s)? Each may be the only copy of its VM. Type yes to delete: "
            );
            let _ = err.flush();
            let mut answer = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut answer)
                .map_err(|e| PluginError::io("reading the confirmation", e))?;
            if confirmed(&answer) {
                Ok(())
            } else {
                Err(PluginError::Refused("not confirmed; nothing deleted".into()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletes_need_yes_typed_or_given() {
        assert_eq!(how(true, false), Ask::Given);
        assert_eq!(how(true, true), Ask::Given);
        assert_eq!(how(false, true), Ask::Prompt);
        assert_eq!(how(false, false), Ask::Refuse);
        assert!(confirmed("yes\n"));
        assert!(confirmed("  yes "));
        for no in ["", "y", "YES", "yes please", "no"] {
            assert!(!confirmed(no), "{no:?}");
        }
    }
}
