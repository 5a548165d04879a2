//! S1 seen from the registry: its access log names the client address and the second of
//! every request, so a DELETE a killed leader sent after its fence shows there.

use std::path::Path;

use crate::world::Result;

/// DELETE requests from `ip` logged in a second after `fence_end`'s. Fails when the log
/// holds no DELETE from anyone, so a log this cannot read never passes as a clean one.
pub fn deletes_after(log: &Path, ip: &str, fence_end: jiff::Timestamp) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let (mut late, mut deletes) = (Vec::new(), 0);
    for line in text.lines() {
        let Some((from, at, method)) = access_entry(line) else {
            continue;
        };
        if method != "DELETE" {
            continue;
        }
        deletes += 1;
        // The log has whole seconds: only a later second is surely after the fence.
        if from == ip && at.as_second() > fence_end.as_second() {
            late.push(line.to_owned());
        }
    }
    if deletes == 0 {
        return Err(format!(
            "{}: no DELETE read from the registry's access log",
            log.display()
        )
        .into());
    }
    Ok(late)
}

/// (client, time, method) of a combined-log-format line:
/// `10.77.0.5 - - [04/Dec/2026:18:29:16 +0000] "DELETE /v2/... HTTP/1.1" 202 ...`
fn access_entry(line: &str) -> Option<(&str, jiff::Timestamp, String)> {
    let (from, rest) = line.split_once(' ')?;
    let (_, rest) = rest.split_once('[')?;
    let (stamp, rest) = rest.split_once(']')?;
    let at = jiff::fmt::strtime::parse("%d/%b/%Y:%H:%M:%S %z", stamp)
        .ok()?
        .to_timestamp()
        .ok()?;
    let method = rest
        .trim_start()
        .strip_prefix('"')?
        .split(' ')
        .next()?
        .to_owned();
    Some((from, at, method))
}
