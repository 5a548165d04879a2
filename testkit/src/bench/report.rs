//! Figures, the comparison with `bench/baseline.json`, and hand-written SVG charts.

use serde_json::{Value, json};
use std::fmt::Write as _;

/// How a figure is compared with its baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Exact count (writes, calls, conflicts): any increase is a regression.
    Count,
    /// Time (a wall time or a median), lower is better: a regression beyond
    /// [`TIME_RATIO`] and [`time_slack`].
    Time,
    /// A tail latency (p99, max), lower is better: a regression beyond [`TAIL_RATIO`] and
    /// [`time_slack`].
    Tail,
    /// Throughput or share, higher is better: a regression below 1/[`TIME_RATIO`].
    Rate,
    /// Memory, lower is better: a regression beyond [`MEMORY_RATIO`].
    Memory,
    /// Shown, never flagged.
    Info,
}

/// Timings on two cores shared with other work (apiserver, etcd, the registry, the
/// simulator and other sessions' builds) move ±30 % between runs of the same build:
/// only a 1.5× change is called a regression.
pub const TIME_RATIO: f64 = 1.5;
/// p99 and max are set by a few slow passes (error backoff doubles from 500 ms), so they
/// move in steps: only a doubling is called a regression.
pub const TAIL_RATIO: f64 = 2.0;
/// RSS after sync moves a few percent between runs (allocator, watch-cache page sizes).
pub const MEMORY_RATIO: f64 = 1.25;

pub struct Figure {
    pub key: &'static str,
    pub value: Option<f64>,
    pub unit: &'static str,
    pub kind: Kind,
}

#[derive(Default)]
pub struct Figures(pub Vec<Figure>);

impl Figures {
    pub fn set(&mut self, key: &'static str, value: Option<f64>, unit: &'static str, kind: Kind) {
        let value = value.filter(|v| v.is_finite());
        if let Some(f) = self.0.iter_mut().find(|f| f.key == key) {
            f.value = value;
        } else {
            self.0.push(Figure {
                key,
                value,
                unit,
                kind,
            });
        }
    }

    pub fn get(&self, key: &str) -> Option<f64> {
        self.0.iter().find(|f| f.key == key).and_then(|f| f.value)
    }

    pub fn to_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        for f in &self.0 {
            m.insert(
                f.key.to_owned(),
                f.value.map_or(Value::Null, |v| json!(round(v))),
            );
        }
        Value::Object(m)
    }
}

pub fn round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

pub fn fmt(v: Option<f64>) -> String {
    match v {
        None => "na".into(),
        Some(v) if v == v.trunc() && v.abs() < 1e12 => format!("{}", v as i64),
        Some(v) if v.abs() >= 100.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.3}"),
    }
}

/// A time must also grow by this much to count: /readyz is polled every 100 ms and a
/// sub-second figure doubles from one poll to the next.
pub fn time_slack(key: &str) -> f64 {
    if key.ends_with("_ms") {
        5.0
    } else if key.ends_with("_s") {
        0.5
    } else {
        0.0
    }
}

/// `None` when not comparable; otherwise (ratio, regressed).
pub fn compare(key: &str, kind: Kind, value: f64, base: f64) -> (Option<f64>, bool) {
    let ratio = if base != 0.0 {
        Some(value / base)
    } else if value == 0.0 {
        Some(1.0)
    } else {
        None
    };
    let regressed = match kind {
        Kind::Count => value > base + 1e-9,
        Kind::Time => ratio.is_none_or(|r| r > TIME_RATIO) && value - base > time_slack(key),
        Kind::Tail => ratio.is_none_or(|r| r > TAIL_RATIO) && value - base > time_slack(key),
        Kind::Memory => ratio.is_none_or(|r| r > MEMORY_RATIO),
        Kind::Rate => ratio.is_some_and(|r| r < 1.0 / TIME_RATIO),
        Kind::Info => false,
    };
    (ratio, regressed)
}

/// Prints the table with baseline ratios; returns the regressed keys.
pub fn print_table(figs: &Figures, baseline: Option<&Value>) -> Vec<String> {
    let mut regressions = Vec::new();
    println!();
    println!(
        "{:<34} {:>12} {:>12} {:>8}  unit / verdict",
        "figure", "value", "baseline", "ratio"
    );
    println!("{}", "-".repeat(86));
    for f in &figs.0 {
        let base = baseline.and_then(|b| b["figures"][f.key].as_f64());
        let (ratio, verdict) = match (f.value, base) {
            (Some(v), Some(b)) => {
                let (ratio, bad) = compare(f.key, f.kind, v, b);
                if bad {
                    regressions.push(f.key.to_owned());
                }
                (ratio, if bad { " REGRESSION" } else { "" })
            }
            _ => (None, ""),
        };
        println!(
            "{:<34} {:>12} {:>12} {:>8}  {}{}",
            f.key,
            fmt(f.value),
            fmt(base),
            ratio.map_or("-".into(), |r| format!("{r:.2}")),
            f.unit,
            verdict
        );
    }
    regressions
}

// ---------------------------------------------------------------------------------------
// SVG.

const COLORS: [&str; 7] = [
    "#9e9e9e", "#ff9800", "#3f51b5", "#00bcd4", "#4caf50", "#f44336", "#cccccc",
];
const NAMES: [&str; 7] = [
    "Pending",
    "Hibernating",
    "Hibernated",
    "Waking",
    "Active",
    "Failed",
    "no phase",
];

fn tick(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

#[allow(clippy::too_many_arguments)]
fn axes(
    svg: &mut String,
    x0: f64,
    y0: f64,
    w: f64,
    h: f64,
    xmax: f64,
    ymax: f64,
    xl: &str,
    yl: &str,
) {
    let _ = write!(
        svg,
        r##"<line x1="{x0}" y1="{y0}" x2="{}" y2="{y0}" stroke="#333"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{}" stroke="#333"/>"##,
        x0 + w,
        y0 - h
    );
    for i in 0..=5 {
        let fx = x0 + w * i as f64 / 5.0;
        let fy = y0 - h * i as f64 / 5.0;
        let _ = write!(
            svg,
            r##"<text x="{fx}" y="{}" font-size="11" text-anchor="middle">{}</text><text x="{}" y="{}" font-size="11" text-anchor="end">{}</text><line x1="{x0}" y1="{fy}" x2="{}" y2="{fy}" stroke="#eee"/>"##,
            y0 + 14.0,
            tick(xmax * i as f64 / 5.0),
            x0 - 4.0,
            fy + 4.0,
            tick(ymax * i as f64 / 5.0),
            x0 + w
        );
    }
    let _ = write!(
        svg,
        r##"<text x="{}" y="{}" font-size="12" text-anchor="middle">{xl}</text><text x="{}" y="{}" font-size="12" transform="rotate(-90 {} {})" text-anchor="middle">{yl}</text>"##,
        x0 + w / 2.0,
        y0 + 32.0,
        x0 - 42.0,
        y0 - h / 2.0,
        x0 - 42.0,
        y0 - h / 2.0
    );
}

/// Phase counts over time: one line per phase.
pub fn phases_svg(title: &str, timeline: &[(f64, [usize; 7])], marks: &[(f64, &str)]) -> String {
    let (w, h, x0, y0) = (720.0, 300.0, 70.0, 350.0);
    let xmax = timeline.last().map_or(1.0, |t| t.0 / 1000.0).max(1.0);
    let ymax = timeline
        .iter()
        .flat_map(|(_, c)| c.iter().copied())
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="820" height="420" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/><text x="410" y="24" font-size="15" text-anchor="middle">{title}</text>"##
    );
    axes(&mut svg, x0, y0, w, h, xmax, ymax, "seconds", "CRs");
    for (t, label) in marks {
        let x = x0 + w * (t / 1000.0) / xmax;
        let _ = write!(
            svg,
            r##"<line x1="{x}" y1="{y0}" x2="{x}" y2="{}" stroke="#999" stroke-dasharray="4 3"/><text x="{}" y="{}" font-size="11">{label}</text>"##,
            y0 - h,
            x + 3.0,
            y0 - h + 12.0
        );
    }
    for (p, color) in COLORS.iter().enumerate() {
        if timeline.iter().all(|(_, c)| c[p] == 0) {
            continue;
        }
        let points: Vec<String> = timeline
            .iter()
            .map(|(t, c)| {
                format!(
                    "{:.1},{:.1}",
                    x0 + w * (t / 1000.0) / xmax,
                    y0 - h * c[p] as f64 / ymax
                )
            })
            .collect();
        let _ = write!(
            svg,
            r##"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"##,
            points.join(" ")
        );
    }
    for (i, name) in NAMES.iter().enumerate() {
        let _ = write!(
            svg,
            r##"<rect x="{}" y="392" width="12" height="12" fill="{}"/><text x="{}" y="402" font-size="11">{name}</text>"##,
            70 + i * 105,
            COLORS[i],
            86 + i * 105
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Histogram of reaction latencies (ms), hibernate and wake side by side.
pub fn histogram_svg(title: &str, series: &[(&str, &str, &[f64])]) -> String {
    let (w, h, x0, y0) = (720.0, 300.0, 70.0, 350.0);
    let max = series
        .iter()
        .flat_map(|(_, _, v)| v.iter().copied())
        .fold(0.0f64, f64::max)
        .max(1.0);
    let bins = 30usize;
    let width = max / bins as f64;
    let counts: Vec<Vec<usize>> = series
        .iter()
        .map(|(_, _, v)| {
            let mut c = vec![0; bins];
            for x in v.iter() {
                c[((x / width) as usize).min(bins - 1)] += 1;
            }
            c
        })
        .collect();
    let ymax = counts.iter().flatten().copied().max().unwrap_or(1).max(1) as f64;
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="820" height="420" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/><text x="410" y="24" font-size="15" text-anchor="middle">{title}</text>"##
    );
    axes(
        &mut svg,
        x0,
        y0,
        w,
        h,
        max,
        ymax,
        "ms from vk's completion write to the CR's terminal phase",
        "CRs",
    );
    let bw = w / bins as f64 / series.len().max(1) as f64;
    for (s, (name, color, _)) in series.iter().enumerate() {
        for (b, c) in counts[s].iter().enumerate() {
            let bh = h * *c as f64 / ymax;
            let _ = write!(
                svg,
                r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}"/>"##,
                x0 + w * b as f64 / bins as f64 + bw * s as f64,
                y0 - bh,
                bw.max(1.0) - 0.5,
                bh
            );
        }
        let _ = write!(
            svg,
            r##"<rect x="{}" y="392" width="12" height="12" fill="{color}"/><text x="{}" y="402" font-size="11">{name}</text>"##,
            70 + s * 160,
            86 + s * 160
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Percentile (nearest rank) of an unsorted sample.
pub fn pct(v: &[f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let i = ((s.len() as f64 * p).ceil() as usize).clamp(1, s.len()) - 1;
    Some(s[i])
}
