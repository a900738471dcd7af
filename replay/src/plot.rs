//! An SVG of a timed replay, one line per policy: GPUs allocated (% of the cluster), jobs
//! queued, and the wait of each job at its start. No fonts or scripts from outside.

use std::fmt::Write;

use crate::timed::Outcome;

const WIDTH: f64 = 960.0;
const PANEL_HEIGHT: f64 = 180.0;
const MARGIN: f64 = 60.0;
const POINTS_MAX: usize = 1_500;
const LEGEND_HEIGHT: f64 = 20.0;
const COLOURS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

struct Panel {
    title: &'static str,
    /// Per policy: (t_s, value) points.
    series: Vec<Vec<(f64, f64)>>,
    dots: bool,
}

fn thin(points: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    let step = points.len().div_ceil(POINTS_MAX).max(1);
    points.into_iter().step_by(step).collect()
}

/// The plot of `runs` (policy name, outcome) as an SVG document.
pub fn svg(title: &str, runs: &[(String, &Outcome)]) -> String {
    let panels = [
        Panel {
            title: "GPUs allocated (%)",
            series: runs
                .iter()
                .map(|(_, o)| {
                    thin(
                        o.samples
                            .iter()
                            .map(|s| (s.at_ms as f64 / 1000.0, 100.0 * f64::from(s.gpus_busy) / f64::from(o.gpus_total.max(1))))
                            .collect(),
                    )
                })
                .collect(),
            dots: false,
        },
        Panel {
            title: "jobs queued",
            series: runs
                .iter()
                .map(|(_, o)| thin(o.samples.iter().map(|s| (s.at_ms as f64 / 1000.0, f64::from(s.queued))).collect()))
                .collect(),
            dots: false,
        },
        Panel {
            title: "wait at start (h)",
            series: runs
                .iter()
                .map(|(_, o)| {
                    thin(
                        o.jobs
                            .iter()
                            .filter_map(|j| Some((j.start_ms? as f64 / 1000.0, j.start_ms?.saturating_sub(j.submit_ms) as f64 / 3.6e6)))
                            .collect(),
                    )
                })
                .collect(),
            dots: true,
        },
    ];
    let t_max = panels.iter().flat_map(|p| p.series.iter().flatten()).map(|p| p.0).fold(1.0, f64::max);
    let top0 = MARGIN + LEGEND_HEIGHT;
    let height = top0 + panels.len() as f64 * (PANEL_HEIGHT + MARGIN);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ =
        writeln!(s, r#"<rect width="100%" height="100%" fill="white"/><text x="{MARGIN}" y="24" font-size="15">{}</text>"#, escape(title));
    for (k, (name, _)) in runs.iter().enumerate() {
        let x = MARGIN + 240.0 * k as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="38" width="14" height="10" fill="{}"/><text x="{}" y="48">{}</text>"#,
            COLOURS[k % COLOURS.len()],
            x + 18.0,
            escape(name)
        );
    }
    for (p, panel) in panels.iter().enumerate() {
        let top = top0 + p as f64 * (PANEL_HEIGHT + MARGIN);
        let v_max = panel.series.iter().flatten().map(|p| p.1).fold(1e-9, f64::max) * 1.05;
        let plot_w = WIDTH - 2.0 * MARGIN;
        let _ = writeln!(s, r##"<rect x="{MARGIN}" y="{top}" width="{plot_w}" height="{PANEL_HEIGHT}" fill="none" stroke="#999"/>"##);
        let _ = writeln!(s, r#"<text x="{MARGIN}" y="{}">{} (max {:.1})</text>"#, top - 6.0, panel.title, v_max / 1.05);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end">{:.1} h</text>"#,
            WIDTH - MARGIN,
            top + PANEL_HEIGHT + 14.0,
            t_max / 3600.0
        );
        for (k, series) in panel.series.iter().enumerate() {
            let colour = COLOURS[k % COLOURS.len()];
            let xy = |(t, v): &(f64, f64)| (MARGIN + t / t_max * plot_w, top + PANEL_HEIGHT - v / v_max * PANEL_HEIGHT);
            if panel.dots {
                for pt in series {
                    let (x, y) = xy(pt);
                    let _ = writeln!(s, r#"<circle cx="{x:.1}" cy="{y:.1}" r="1.2" fill="{colour}" fill-opacity="0.5"/>"#);
                }
            } else {
                // Steps: each value holds until the next sample.
                let mut pts: Vec<String> = Vec::with_capacity(series.len() * 2);
                let mut last_y = None;
                for (x, y) in series.iter().map(xy) {
                    if let Some(ly) = last_y {
                        pts.push(format!("{x:.1},{ly:.1}"));
                    }
                    pts.push(format!("{x:.1},{y:.1}"));
                    last_y = Some(y);
                }
                let _ = writeln!(s, r#"<polyline fill="none" stroke="{colour}" stroke-width="1" points="{}"/>"#, pts.join(" "));
            }
        }
    }
    s.push_str("</svg>\n");
    s
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
