//! The `--plot` SVG: TTFT CDF, per-instance share and hit rate over time, one colour per strategy.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::clairvoyant::CLAIRVOYANT;
use crate::{Report, SimError};

const WIDTH: u32 = 1100;
const PANEL_HEIGHT: u32 = 460;

fn plot_err(e: impl std::fmt::Display) -> SimError {
    SimError::Plot(e.to_string())
}

fn colour(i: usize) -> RGBColor {
    // Colour-blind-safe (Okabe-Ito) picks, then plotters' palette.
    const PICKS: [RGBColor; 7] = [
        RGBColor(230, 159, 0),
        RGBColor(86, 180, 233),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
        RGBColor(0, 114, 178),
        RGBColor(213, 94, 0),
        RGBColor(120, 120, 120),
    ];
    PICKS.get(i).copied().unwrap_or_else(|| {
        let c = Palette99::pick(i).to_rgba();
        RGBColor(c.0, c.1, c.2)
    })
}

/// Writes the three-panel SVG for `report` to `path`.
pub fn write_svg(report: &Report, path: &Path) -> Result<(), SimError> {
    let svg = render_svg(report)?;
    std::fs::write(path, svg).map_err(|e| SimError::Plot(format!("{}: {e}", path.display())))
}

/// Renders the three-panel SVG for `report` into a string.
pub fn render_svg(report: &Report) -> Result<String, SimError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, PANEL_HEIGHT * 3)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let panels = root.split_evenly((3, 1));
        ttft_cdf(report, &panels[0])?;
        instance_share(report, &panels[1])?;
        hit_rate_over_time(report, &panels[2])?;
        root.present().map_err(plot_err)?;
    }
    Ok(svg)
}

type Area<'a, 'b> = DrawingArea<SVGBackend<'a>, Shift>;

/// Panel 1: fraction of requests whose TTFT is at most x (log x axis).
fn ttft_cdf(report: &Report, area: &Area<'_, '_>) -> Result<(), SimError> {
    let all = report
        .results
        .iter()
        .flat_map(|r| r.ttft_percentiles_ms.iter().copied())
        .filter(|v| *v > 0.0);
    let (lo, hi) = all.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo * 0.9, hi * 1.1)
    } else {
        (1.0, 10.0)
    };
    let mut chart = ChartBuilder::on(area)
        .caption(
            "Time to first token: cumulative distribution",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
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
    for (i, r) in report.results.iter().enumerate() {
        let c = colour(i);
        let n = r.ttft_percentiles_ms.len().saturating_sub(1).max(1) as f64;
        let points = r
            .ttft_percentiles_ms
            .iter()
            .enumerate()
            .filter(|(_, v)| **v > 0.0)
            .map(|(p, v)| (*v, p as f64 / n));
        chart
            .draw_series(LineSeries::new(points, c.stroke_width(2)))
            .map_err(plot_err)?
            .label(r.strategy.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}

/// Panel 2: fraction of requests each instance received, one bar per strategy.
fn instance_share(report: &Report, area: &Area<'_, '_>) -> Result<(), SimError> {
    let instances = report
        .results
        .iter()
        .map(|r| r.instance_share.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let top = report
        .results
        .iter()
        .flat_map(|r| r.instance_share.iter().copied())
        .fold(0.0f64, f64::max);
    let top = if top > 0.0 { top * 1.2 } else { 1.0 };
    let ids: Vec<String> = (0..instances).map(crate::members::instance_id).collect();
    let mut chart = ChartBuilder::on(area)
        .caption("Share of requests per instance", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5..instances as f64 - 0.5, 0.0..top)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(instances.min(32))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-6 && i >= 0.0 {
                ids.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("share of requests")
        .y_label_formatter(&|v| format!("{:.0}%", v * 100.0))
        .draw()
        .map_err(plot_err)?;
    let groups = report.results.len().max(1) as f64;
    let bar = 0.8 / groups;
    for (s, r) in report.results.iter().enumerate() {
        let c = colour(s);
        let bars = r.instance_share.iter().enumerate().map(|(i, share)| {
            let x0 = i as f64 - 0.4 + s as f64 * bar;
            Rectangle::new([(x0, 0.0), (x0 + bar * 0.9, *share)], c.filled())
        });
        chart
            .draw_series(bars)
            .map_err(plot_err)?
            .label(r.strategy.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], c.filled()));
    }
    if report.fleet.scale_events.is_empty() && report.fleet.instances > 0 {
        let fair = 1.0 / f64::from(report.fleet.instances);
        chart
            .draw_series(LineSeries::new(
                [(-0.5, fair), (instances as f64 - 0.5, fair)],
                BLACK.mix(0.5).stroke_width(1),
            ))
            .map_err(plot_err)?
            .label("equal share")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.5)));
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)
}

/// Panel 3: hit rate of requests by the time of their first token; scale events as vertical lines.
fn hit_rate_over_time(report: &Report, area: &Area<'_, '_>) -> Result<(), SimError> {
    let horizon = report
        .results
        .iter()
        .filter_map(|r| r.hit_rate_over_time.last().map(|b| b.end_s))
        .fold(0.0f64, f64::max)
        .max(
            report
                .fleet
                .scale_events
                .iter()
                .map(|e| e.at_s)
                .fold(0.0, f64::max),
        )
        .max(1e-3);
    let mut chart = ChartBuilder::on(area)
        .caption("Prefix-cache hit rate over time", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..horizon * 1.02, 0.0..1.05)
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("time since start (s)")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_desc("hit rate (cached / prompt tokens)")
        .y_label_formatter(&|v| format!("{:.0}%", v * 100.0))
        .draw()
        .map_err(plot_err)?;
    for (i, r) in report.results.iter().enumerate() {
        let c = colour(i);
        let points = r
            .hit_rate_over_time
            .iter()
            .filter_map(|b| b.hit_rate.map(|h| ((b.start_s + b.end_s) / 2.0, h)));
        chart
            .draw_series(LineSeries::new(points, c.stroke_width(2)))
            .map_err(plot_err)?
            .label(r.strategy.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
    }
    for e in &report.fleet.scale_events {
        let grey = BLACK.mix(0.6);
        chart
            .draw_series(LineSeries::new(
                [(e.at_s, 0.0), (e.at_s, 1.05)],
                grey.stroke_width(1),
            ))
            .map_err(plot_err)?;
        chart
            .draw_series(std::iter::once(Text::new(
                format!("{:+} instance(s)", e.delta),
                (e.at_s, 1.02),
                ("sans-serif", 14).into_font().color(&BLACK),
            )))
            .map_err(plot_err)?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}

fn legend<'a, X, Y>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>,
    position: SeriesLabelPosition,
) -> Result<(), SimError>
where
    X: plotters::coord::ranged1d::Ranged,
    Y: plotters::coord::ranged1d::Ranged,
{
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(plot_err)
}

/// Writes the load sweep's SVG (P90 TTFT against load, one line per strategy) to `path`.
pub fn write_load_svg(sweep: &crate::sweep::LoadSweep, path: &Path) -> Result<(), SimError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, PANEL_HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        p90_against_load(sweep, &root)?;
        root.present().map_err(plot_err)?;
    }
    std::fs::write(path, svg).map_err(|e| SimError::Plot(format!("{}: {e}", path.display())))
}

fn p90_against_load(sweep: &crate::sweep::LoadSweep, area: &Area<'_, '_>) -> Result<(), SimError> {
    let loads = sweep.points.iter().map(|p| p.load);
    let (x_lo, x_hi) = loads.fold((f64::INFINITY, 0.0f64), |(lo, hi), l| {
        (lo.min(l), hi.max(l))
    });
    let (x_lo, x_hi) = if x_hi > x_lo {
        (x_lo, x_hi)
    } else {
        (x_lo - 0.1, x_lo + 0.1)
    };
    let y_hi = sweep
        .points
        .iter()
        .flat_map(|p| p.report.results.iter().map(|r| r.ttft_ms.p90))
        .fold(1.0f64, f64::max);
    let pad = (x_hi - x_lo) * 0.05;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "TTFT P90 against load (1.0 = {:.2} req/s, measured capacity)",
                sweep.capacity_rps
            ),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x_lo - pad)..(x_hi + pad), 0.0..(y_hi * 1.1))
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("load (fraction of capacity)")
        .y_desc("TTFT P90 (ms)")
        .draw()
        .map_err(plot_err)?;
    let names: Vec<&str> = sweep
        .points
        .first()
        .map(|p| {
            p.report
                .results
                .iter()
                .map(|r| r.strategy.as_str())
                .collect()
        })
        .unwrap_or_default();
    for (i, name) in names.iter().enumerate() {
        let line: Vec<(f64, f64)> = sweep
            .points
            .iter()
            .filter_map(|p| {
                p.report
                    .results
                    .iter()
                    .find(|r| r.strategy == *name)
                    .map(|r| (p.load, r.ttft_ms.p90))
            })
            .collect();
        if *name == CLAIRVOYANT {
            // Not a router: dashed, so it reads as a reference beside the strategies.
            dashed(&mut chart, line, BLACK, name)?;
            continue;
        }
        let c = colour(i);
        chart
            .draw_series(LineSeries::new(line.clone(), c.stroke_width(2)))
            .map_err(plot_err)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart
            .draw_series(line.into_iter().map(|pt| Circle::new(pt, 4, c.filled())))
            .map_err(plot_err)?;
    }
    let floor: Option<Vec<(f64, f64)>> = sweep
        .points
        .iter()
        .map(|p| p.report.ttft_floor_ms.map(|f| (p.load, f.p90)))
        .collect();
    if let Some(floor) = floor {
        dashed(
            &mut chart,
            floor,
            RGBColor(150, 150, 150),
            "floor (any router)",
        )?;
    }
    legend(&mut chart, SeriesLabelPosition::UpperLeft)
}

/// A dashed line with its legend entry: a reference, not a strategy.
fn dashed(
    chart: &mut ChartContext<
        '_,
        SVGBackend<'_>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    line: Vec<(f64, f64)>,
    c: RGBColor,
    label: &str,
) -> Result<(), SimError> {
    chart
        .draw_series(DashedLineSeries::new(line, 6, 4, c.stroke_width(2)))
        .map_err(plot_err)?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
    Ok(())
}
