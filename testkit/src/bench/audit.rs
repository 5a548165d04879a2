//! Reading the apiserver audit log (API writes only, JSON lines) incrementally, and
//! tallying writes by who made them and what they touched.

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

/// Follows the audit log from where it ended at creation, keeping the events of one
/// namespace. Lines of other namespaces (other tests share the cluster) are skipped
/// without parsing.
pub struct AuditTail {
    path: PathBuf,
    offset: u64,
    needle: String,
    pub events: Vec<Value>,
}

impl AuditTail {
    pub fn new(path: PathBuf, namespace: &str) -> Self {
        let offset = std::fs::metadata(&path).map_or(0, |m| m.len());
        Self {
            path,
            offset,
            needle: format!("\"namespace\":\"{namespace}\""),
            events: Vec::new(),
        }
    }

    /// Reads what was appended since the last call; returns the number of events kept.
    pub fn poll(&mut self) -> usize {
        let mut file = std::fs::File::open(&self.path)
            .unwrap_or_else(|e| panic!("open audit log {}: {e}", self.path.display()));
        file.seek(SeekFrom::Start(self.offset))
            .expect("seek audit log");
        let mut buf = Vec::new();
        file.read_to_end(&mut buf).expect("read audit log");
        // A line still being written has no newline yet: leave it for the next poll.
        let Some(end) = buf.iter().rposition(|b| *b == b'\n') else {
            return self.events.len();
        };
        self.offset += end as u64 + 1;
        let text = String::from_utf8_lossy(&buf[..end]);
        for line in text.lines() {
            if !line.contains(&self.needle) {
                continue;
            }
            if let Ok(v) = serde_json::from_str::<Value>(line)
                && v["stage"] == "ResponseComplete"
            {
                self.events.push(v);
            }
        }
        self.events.len()
    }

    /// A point in the kept events, for windows.
    pub fn mark(&mut self) -> usize {
        self.poll()
    }

    pub fn window(&self, from: usize, to: usize) -> &[Value] {
        &self.events[from.min(self.events.len())..to.min(self.events.len())]
    }
}

pub fn user(e: &Value) -> &str {
    e["user"]["username"].as_str().unwrap_or_default()
}

pub fn is_write(e: &Value) -> bool {
    matches!(
        e["verb"].as_str(),
        Some("create" | "update" | "patch" | "delete" | "deletecollection")
    )
}

/// `verb resource[/subresource]`.
pub fn key(e: &Value) -> String {
    let verb = e["verb"].as_str().unwrap_or("?");
    let res = e["objectRef"]["resource"].as_str().unwrap_or("?");
    match e["objectRef"]["subresource"].as_str() {
        Some(sub) if !sub.is_empty() => format!("{verb} {res}/{sub}"),
        _ => format!("{verb} {res}"),
    }
}

pub fn code(e: &Value) -> u64 {
    e["responseStatus"]["code"].as_u64().unwrap_or(0)
}

/// Writes of one user in a window.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Tally {
    /// Every write request, events included, whatever its response.
    pub total: usize,
    /// Event creates/patches (events.k8s.io or core).
    pub events: usize,
    /// Writes other than events, by `verb resource[/subresource]`.
    pub by_key: BTreeMap<String, usize>,
    /// Response codes of all writes.
    pub codes: BTreeMap<u64, usize>,
    /// 409 responses.
    pub conflicts: usize,
}

/// CR status writes that did not move the phase: a successful status write of `who` whose
/// `status.phase` equals the phase of that CR's previous successful status write (a write
/// that only changes a condition, such as a `Progressing` reason). Counted over
/// `events[from..to]`, with the phases before `from` taken from the earlier events.
/// `None` when the audit log holds no status bodies (a control plane started before its
/// audit policy logged them: restart it with `cargo xtask cluster-down`).
pub fn same_phase_status_writes(
    events: &[Value],
    from: usize,
    to: usize,
    who: impl Fn(&str) -> bool,
) -> Option<usize> {
    let mut last: std::collections::HashMap<&str, Value> = std::collections::HashMap::new();
    let (mut count, mut bodies, mut writes) = (0, 0, 0);
    for (i, e) in events.iter().enumerate().take(to) {
        let status_write = is_write(e)
            && who(user(e))
            && e["objectRef"]["resource"] == "cocoonhibernations"
            && e["objectRef"]["subresource"] == "status"
            && succeeded(e);
        if !status_write {
            continue;
        }
        if i >= from {
            writes += 1;
        }
        let Some(status) = e["requestObject"].get("status") else {
            continue;
        };
        if i >= from {
            bodies += 1;
        }
        let name = e["objectRef"]["name"].as_str().unwrap_or_default();
        let phase = status["phase"].clone();
        if let Some(before) = last.insert(name, phase.clone())
            && i >= from
            && before == phase
        {
            count += 1;
        }
    }
    (writes == 0 || bodies == writes).then_some(count)
}

pub fn tally(events: &[Value], who: impl Fn(&str) -> bool) -> Tally {
    let mut t = Tally::default();
    for e in events.iter().filter(|e| is_write(e) && who(user(e))) {
        t.total += 1;
        *t.codes.entry(code(e)).or_default() += 1;
        if code(e) == 409 {
            t.conflicts += 1;
        }
        if e["objectRef"]["resource"] == "events" {
            t.events += 1;
        } else {
            *t.by_key.entry(key(e)).or_default() += 1;
        }
    }
    t
}

fn stamp(e: &Value, field: &str) -> Option<jiff::Timestamp> {
    e[field]
        .as_str()
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
}

fn named(e: &Value) -> Option<String> {
    e["objectRef"]["name"].as_str().map(str::to_owned)
}

fn succeeded(e: &Value) -> bool {
    (200..300).contains(&code(e))
}

/// The reaction of each CR that reached `phase` in `events`, timed by the apiserver: ms
/// from vk's last write to the CR's pod (V1: the CR's name; any write not `who`'s, as the
/// apiserver finished it) before `who`'s first status write setting `phase` was received,
/// to when that status write finished. Both ends are the apiserver's own clock, so an
/// observer's watch lag (the bench's CR watch carries its own flips) is left out. A CR with
/// no such status write, or no pod write before it, is left out.
pub fn reactions(events: &[Value], who: impl Fn(&str) -> bool, phase: &str) -> Vec<f64> {
    let mut vk_last: BTreeMap<String, Vec<jiff::Timestamp>> = BTreeMap::new();
    let mut terminal: BTreeMap<String, (jiff::Timestamp, jiff::Timestamp)> = BTreeMap::new();
    for e in events.iter().filter(|e| is_write(e) && succeeded(e)) {
        let Some(name) = named(e) else { continue };
        let res = &e["objectRef"]["resource"];
        if res == "pods" && !who(user(e)) {
            if let Some(done) = stamp(e, "stageTimestamp") {
                vk_last.entry(name).or_default().push(done);
            }
            continue;
        }
        let sets_phase = who(user(e))
            && res == "cocoonhibernations"
            && e["objectRef"]["subresource"] == "status"
            && e["requestObject"]["status"]["phase"] == phase;
        if sets_phase
            && let (Some(received), Some(done)) = (
                stamp(e, "requestReceivedTimestamp"),
                stamp(e, "stageTimestamp"),
            )
        {
            terminal.entry(name).or_insert((received, done));
        }
    }
    terminal
        .into_iter()
        .filter_map(|(name, (received, done))| {
            let vk = vk_last
                .get(&name)?
                .iter()
                .filter(|t| **t <= received)
                .max()?;
            Some(done.duration_since(*vk).as_secs_f64().max(0.0) * 1000.0)
        })
        .collect()
}

/// The intake of each CR flipped in `events` (issue 38): ms from the flip of its desire (a
/// create or patch of the CR, not a status write, by someone other than `who`, as the
/// apiserver finished it) to `who`'s first successful patch of the pod it names (V1: the
/// CR's name) received after it: the write that starts the transition. A CR flipped twice
/// counts from its first flip in the window; one with no pod patch after it is left out.
pub fn intakes(events: &[Value], who: impl Fn(&str) -> bool) -> Vec<f64> {
    let mut flips: BTreeMap<String, jiff::Timestamp> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for e in events.iter().filter(|e| is_write(e) && succeeded(e)) {
        let (res, sub) = (&e["objectRef"]["resource"], &e["objectRef"]["subresource"]);
        let flip = !who(user(e))
            && res == "cocoonhibernations"
            && sub.as_str().is_none_or(str::is_empty)
            && matches!(e["verb"].as_str(), Some("create" | "patch" | "update"));
        if flip && let (Some(name), Some(at)) = (named(e), stamp(e, "stageTimestamp")) {
            flips.entry(name).or_insert(at);
            continue;
        }
        let pod_patch = who(user(e))
            && res == "pods"
            && sub.as_str().is_none_or(str::is_empty)
            && e["verb"] == "patch";
        if pod_patch
            && let (Some(name), Some(at)) = (named(e), stamp(e, "requestReceivedTimestamp"))
            && let Some(flipped) = flips.get(&name)
            && !out.contains_key(&name)
        {
            let waited = at.duration_since(*flipped).as_secs_f64().max(0.0);
            out.insert(name, waited * 1000.0);
        }
    }
    out.into_values().collect()
}
