//! The analysis as an SVG: the sweep (each setting's hit rate against its TTFT at each rate)
//! and the TTFT CDFs of the recommended setting, today's and the cache-blind baselines.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::{Analysis, AnalyzeError};

const WIDTH: u32 = 1100;
const PANEL_HEIGHT: u32 = 520;

fn plot_err(e: impl std::fmt::Display) -> AnalyzeError {
    AnalyzeError::Plot(e.to_string())
}

// Colour-blind-safe (Okabe-Ito) picks.
const COLOURS: [RGBColor; 6] = [
    RGBColor(0, 114, 178),
    RGBColor(230, 159, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(213, 94, 0),
];

type Area<'a, 'b> = DrawingArea<SVGBackend<'a>, Shift>;

/// Writes the two-panel SVG to `path`.
pub fn write_svg(a: &Analysis, path: &Path) -> Result<(), AnalyzeError> {
    let svg = render_svg(a)?;
    std::fs::write(path, svg).map_err(|e| AnalyzeError::Plot(format!("{}: {e}", path.display())))
}

/// Renders the two-panel SVG into a string.
pub fn render_svg(a: &Analysis) -> Result<String, AnalyzeError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, PANEL_HEIGHT * 2)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let panels = root.split_evenly((2, 1));
        sweep(a, &panels[0])?;
        cdfs(a, &panels[1])?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

fn log_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo.is_finite() && hi > lo {
        (lo * 0.8, hi * 1.25)
    } else {
        (1.0, 10.0)
    }
}

/// Panel 1: every setting at every rate, hit rate against the objective's TTFT.
fn sweep(a: &Analysis, area: &Area<'_, '_>) -> Result<(), AnalyzeError> {
    let value = |o: &crate::Outcome| a.objective.of(o);
    let (lo, hi) = log_range(a.outcomes.iter().map(value));
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "The sweep: hit rate against TTFT {} (one point per setting and rate)",
                a.objective.name()
            ),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..1.0, (lo..hi).log_scale())
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("hit rate")
        .x_label_formatter(&|v| format!("{:.0}%", v * 100.0))
        .y_desc(format!("TTFT {} (ms, log scale)", a.objective.name()))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(plot_err)?;
    for (i, factor) in a.rate_factors.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let points: Vec<(f64, f64)> = a
            .outcomes
            .iter()
            .filter(|o| o.rate_factor == *factor)
            .map(|o| (o.hit_rate, value(o)))
            .collect();
        chart
            .draw_series(points.into_iter().map(|p| Circle::new(p, 4, c.filled())))
            .map_err(plot_err)?
            .label(format!("{factor}x the trace's rate"))
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, c.filled()));
    }
    // Rings around the two settings that matter, named in the legend (labels beside the
    // points would overlap: the two are often neighbours).
    let rings = [
        (a.recommended, "recommended", BLACK),
        (a.current, "today", RGBColor(213, 94, 0)),
    ];
    for (s, name, c) in rings {
        if s == a.current && name == "today" && a.current == a.recommended {
            continue;
        }
        let points: Vec<(f64, f64)> = a
            .outcomes
            .iter()
            .filter(|o| o.setting == s)
            .map(|o| (o.hit_rate, value(o)))
            .collect();
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 8, c.stroke_width(2))),
            )
            .map_err(plot_err)?
            .label(format!("{name}: {}", a.settings[s].label()))
            .legend(move |(x, y)| Circle::new((x + 10, y), 7, c.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(plot_err)
}

/// Panel 2: TTFT CDFs at the first (lowest) rate.
fn cdfs(a: &Analysis, area: &Area<'_, '_>) -> Result<(), AnalyzeError> {
    let mut picks: Vec<(String, usize)> = vec![(
        format!("recommended: {}", a.settings[a.recommended].label()),
        a.recommended,
    )];
    if a.current != a.recommended {
        picks.push((
            format!("today: {}", a.settings[a.current].label()),
            a.current,
        ));
    }
    for name in ["random", "least-outstanding"] {
        if let Some(s) = a.settings.iter().position(|s| s.strategy == name) {
            if s != a.recommended && s != a.current {
                picks.push((name.to_string(), s));
            }
        }
    }
    let curves: Vec<(String, &Vec<f64>)> = picks
        .into_iter()
        .filter_map(|(label, s)| a.outcome(s, 0).map(|o| (label, &o.ttft_percentiles_ms)))
        .collect();
    let (lo, hi) = log_range(curves.iter().flat_map(|(_, c)| c.iter().copied()));
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "Time to first token at {}x the trace's rate: cumulative distribution",
                a.rate_factors.first().copied().unwrap_or(1.0)
            ),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("TTFT (ms, log scale)")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_desc("fraction of requests")
        .y_label_formatter(&|v| format!("{:.0}%", v * 100.0))
        .draw()
        .map_err(plot_err)?;
    for (i, (label, curve)) in curves.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let n = curve.len().saturating_sub(1).max(1) as f64;
        let points = curve
            .iter()
            .enumerate()
            .filter(|(_, v)| **v > 0.0)
            .map(|(p, v)| (*v, p as f64 / n));
        chart
            .draw_series(LineSeries::new(points, c.stroke_width(2)))
            .map_err(plot_err)?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(plot_err)
}
