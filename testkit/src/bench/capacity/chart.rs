//! capacity.svg: per step of the ladder, CPU by process, the product's RSS, and the
//! latencies, each panel with its saturation bound dashed.

use super::saturation::{self, APISERVER_P99_MS, CPU_CORES, PRODUCT_RSS_MIB};
use super::step::Step;
use std::fmt::Write as _;

const W: f64 = 900.0;
const X0: f64 = 80.0;
const PLOT_W: f64 = 640.0;
const PANEL_H: f64 = 170.0;

/// One series: its legend name, colour, and value per step.
type Series<'a> = (&'a str, &'a str, Vec<Option<f64>>);

fn short(n: usize) -> String {
    if n >= 1000 && n.is_multiple_of(1000) {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// One panel: `y_top` is its top edge; `log` plots log10 between `lo` and `hi`.
#[allow(clippy::too_many_arguments)]
fn panel(
    svg: &mut String,
    y_top: f64,
    title: &str,
    (lo, hi): (f64, f64),
    log: bool,
    bound: (f64, &str),
    series: &[Series],
    steps: usize,
) {
    let y0 = y_top + PANEL_H;
    let y_of = |v: f64| {
        let f = if log {
            (v.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10())
        } else {
            (v - lo) / (hi - lo)
        };
        y0 - PANEL_H * f.clamp(0.0, 1.0)
    };
    let x_of = |i: usize| X0 + PLOT_W * (i as f64 + 0.5) / steps.max(1) as f64;
    let _ = write!(
        svg,
        r##"<text x="{X0}" y="{}" font-size="13">{title}</text><line x1="{X0}" y1="{y0}" x2="{}" y2="{y0}" stroke="#333"/><line x1="{X0}" y1="{y0}" x2="{X0}" y2="{y_top}" stroke="#333"/>"##,
        y_top - 6.0,
        X0 + PLOT_W
    );
    let ticks: Vec<f64> = if log {
        let mut t = Vec::new();
        let mut v = lo;
        while v <= hi * 1.001 {
            t.push(v);
            v *= 10.0;
        }
        t
    } else {
        (0..=4).map(|i| lo + (hi - lo) * i as f64 / 4.0).collect()
    };
    for t in ticks {
        let y = y_of(t);
        let label = if t >= 10.0 {
            format!("{t:.0}")
        } else {
            format!("{t:.1}")
        };
        let _ = write!(
            svg,
            r##"<line x1="{X0}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#eee"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{label}</text>"##,
            X0 + PLOT_W,
            X0 - 4.0,
            y + 4.0
        );
    }
    let yb = y_of(bound.0);
    let _ = write!(
        svg,
        r##"<line x1="{X0}" y1="{yb:.1}" x2="{}" y2="{yb:.1}" stroke="#d32f2f" stroke-dasharray="5 4"/><text x="{}" y="{:.1}" font-size="10" fill="#d32f2f" text-anchor="end">{}</text>"##,
        X0 + PLOT_W,
        X0 + PLOT_W - 2.0,
        yb - 3.0,
        bound.1
    );
    for (k, (name, color, values)) in series.iter().enumerate() {
        let points: Vec<String> = values
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some(format!("{:.1},{:.1}", x_of(i), y_of((*v)?))))
            .collect();
        let _ = write!(
            svg,
            r##"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"##,
            points.join(" ")
        );
        for p in &points {
            let (x, y) = p.split_once(',').unwrap_or_default();
            let _ = write!(svg, r##"<circle cx="{x}" cy="{y}" r="3" fill="{color}"/>"##);
        }
        let ly = y_top + 14.0 + 16.0 * k as f64;
        let _ = write!(
            svg,
            r##"<rect x="{}" y="{}" width="12" height="3" fill="{color}"/><text x="{}" y="{}" font-size="11">{name}</text>"##,
            X0 + PLOT_W + 14.0,
            ly - 4.0,
            X0 + PLOT_W + 30.0,
            ly
        );
    }
}

pub(super) fn svg(steps: &[Step], cores: usize) -> String {
    let n = steps.len();
    let h = 3.0 * (PANEL_H + 40.0) + 110.0;
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/><text x="{}" y="22" font-size="15" text-anchor="middle">Capacity of one leader: population (CRs) × burst (transitions at once)</text>"##,
        W / 2.0
    );
    let col = |f: &dyn Fn(&Step) -> Option<f64>| steps.iter().map(f).collect::<Vec<_>>();
    let cpu_max = steps
        .iter()
        .flat_map(|s| s.cores.values().copied())
        .fold(cores as f64, f64::max);
    panel(
        &mut svg,
        50.0,
        "CPU, cores (average over the burst)",
        (0.0, cpu_max),
        false,
        (CPU_CORES, "0.9 core"),
        &[
            ("product", "#3f51b5", col(&|s| s.core("product"))),
            ("kube-apiserver", "#f44336", col(&|s| s.core("apiserver"))),
            ("etcd", "#ff9800", col(&|s| s.core("etcd"))),
            ("registry", "#795548", col(&|s| s.core("registry"))),
            ("bench + simulator", "#9e9e9e", col(&|s| s.core("bench"))),
            ("whole machine", "#000000", col(&|s| s.core("host"))),
        ],
        n,
    );
    let rss_max = steps
        .iter()
        .map(|s| s.product_rss_mib)
        .fold(PRODUCT_RSS_MIB * 1.2, f64::max);
    panel(
        &mut svg,
        50.0 + PANEL_H + 40.0,
        "product RSS, MiB (after the burst)",
        (0.0, rss_max),
        false,
        (PRODUCT_RSS_MIB, "chart limit 256 MiB"),
        &[("product RSS", "#3f51b5", col(&|s| Some(s.product_rss_mib)))],
        n,
    );
    let lat_max = steps
        .iter()
        .flat_map(|s| [s.reaction_p99_ms, s.apiserver_p99_ms])
        .flatten()
        .fold(10_000.0, f64::max);
    let hi = 10f64.powf(lat_max.log10().ceil());
    let y3 = 50.0 + 2.0 * (PANEL_H + 40.0);
    panel(
        &mut svg,
        y3,
        "latency, ms (log scale)",
        (10.0, hi),
        true,
        (APISERVER_P99_MS, "1 s"),
        &[
            ("reaction p50", "#4caf50", col(&|s| s.reaction_p50_ms)),
            ("reaction p99", "#00bcd4", col(&|s| s.reaction_p99_ms)),
            ("apiserver p99", "#f44336", col(&|s| s.apiserver_p99_ms)),
        ],
        n,
    );
    let y_axis = y3 + PANEL_H;
    for (i, s) in steps.iter().enumerate() {
        let x = X0 + PLOT_W * (i as f64 + 0.5) / n.max(1) as f64;
        let sat = saturation::saturated(s);
        let sat = sat.first().map_or("", |(r, _)| r);
        let _ = write!(
            svg,
            r##"<text x="{x:.1}" y="{}" font-size="11" text-anchor="middle">{}·{}</text><text x="{x:.1}" y="{}" font-size="9" fill="#d32f2f" text-anchor="middle">{sat}</text>"##,
            y_axis + 16.0,
            short(s.crs),
            short(s.burst),
            y_axis + 30.0
        );
    }
    let _ = write!(
        svg,
        r##"<text x="{}" y="{}" font-size="11" text-anchor="middle">step: CRs · burst; red: the most loaded saturated resource</text>"##,
        X0 + PLOT_W / 2.0,
        y_axis + 50.0
    );
    svg.push_str("</svg>\n");
    svg
}
