//! Plots of a run (fast_p@N curves, speedup distribution) and of a comparison (fast_1 against every
//! budget axis with bootstrap bands, correct rate, speedup distributions), drawn with plotters into SVG.
//!
//! SVG needs no fonts (text stays text). PNG renders that SVG with resvg, taking a sans-serif font
//! from the system (fontdb); a machine without any font gets an error that says so, since a PNG
//! without labels would be misleading.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::metrics::FAST_P_LABELS;
use crate::metrics::compare::{BudgetAxis, Comparison};

use super::LoadedRun;
use super::compare::axis_title;

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("cannot draw the plot: {0}")]
    Draw(String),
    #[error("{}: unknown plot format (expected a file name ending in .svg or .png)", path.display())]
    Format { path: PathBuf },
    #[error(
        "{}: PNG output needs a system font and none was found (install one, e.g. `apt-get install fonts-dejavu-core`, or write .svg)",
        path.display()
    )]
    NoFont { path: PathBuf },
    #[error("{}: cannot render the SVG to PNG: {message}", path.display())]
    Render { path: PathBuf, message: String },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn draw_err<E: std::fmt::Debug>(e: E) -> PlotError {
    PlotError::Draw(format!("{e:?}"))
}

/// Distinct colours for up to 10 series (Tableau 10), then repeating.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

const FONT: &str = "sans-serif";

/// Each problem's best correct speedup over all of a run's attempts, sorted from fastest.
pub fn best_speedups(run: &LoadedRun) -> Vec<f64> {
    let mut v: Vec<f64> = run
        .attempts
        .values()
        .filter_map(|attempts| {
            attempts
                .iter()
                .filter_map(|a| a.speedup())
                .fold(None, |b: Option<f64>, s| Some(b.map_or(s, |b| b.max(s))))
        })
        .collect();
    v.sort_by(|a, b| b.total_cmp(a));
    v
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// A panel saying why it is empty.
fn empty_panel(area: &Area<'_>, title: &str, why: &str) -> Result<(), PlotError> {
    let chart = ChartBuilder::on(area)
        .caption(title, (FONT, 18))
        .margin(12)
        .build_cartesian_2d(0f64..1f64, 0f64..1f64)
        .map_err(draw_err)?;
    let area = chart.plotting_area();
    area.draw(&Text::new(
        why.to_string(),
        (0.02, 0.55),
        (FONT, 15).into_font().color(&BLACK),
    ))
    .map_err(draw_err)?;
    Ok(())
}

/// Speedup distributions: one sorted series per run on a log axis, with the reference (1x) dashed.
fn distribution_panel(
    area: &Area<'_>,
    series: &[(String, Vec<f64>, usize)],
    title: &str,
) -> Result<(), PlotError> {
    let all: Vec<f64> = series
        .iter()
        .flat_map(|(_, v, _)| v.iter().copied())
        .collect();
    if all.is_empty() {
        return empty_panel(area, title, "no correct candidate with a measured speedup");
    }
    // The y axis is log2(speedup) on a linear scale, labelled at whole powers of two (0.5x, 1x, 2x,
    // 4x, ...): more readable ticks than a log scale's powers of ten for the usual 0.1x-50x range.
    let lo = (all.iter().copied().fold(f64::INFINITY, f64::min).min(0.5) / 1.3)
        .log2()
        .floor();
    let hi = (all.iter().copied().fold(0.0, f64::max).max(2.0) * 1.3)
        .log2()
        .ceil();
    let n = series.iter().map(|(_, v, _)| v.len()).max().unwrap_or(1);
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 18))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.5f64..(n as f64 + 0.5), lo..hi)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc("problems with a correct candidate, fastest first")
        .y_desc("best speedup (log scale)")
        .axis_desc_style((FONT, 15))
        .label_style((FONT, 13))
        .x_labels(n.clamp(1, 12))
        .x_label_formatter(&|x| {
            // Only whole ranks are problems.
            if (x - x.round()).abs() < 1e-6 {
                format!("{x:.0}")
            } else {
                String::new()
            }
        })
        .y_labels(((hi - lo) as usize + 1).clamp(2, 16))
        .y_label_formatter(&|y| {
            if (y - y.round()).abs() < 1e-6 {
                speedup_label(y.exp2())
            } else {
                String::new()
            }
        })
        .draw()
        .map_err(draw_err)?;
    chart
        .draw_series(DashedLineSeries::new(
            vec![(0.5, 0.0), (n as f64 + 0.5, 0.0)],
            6,
            4,
            BLACK.mix(0.6).stroke_width(1),
        ))
        .map_err(draw_err)?
        .label("reference (1x)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.6)));
    for (i, name) in merge_equal(series, |s| &s.0, |s| &s.1) {
        let (_, values, c) = &series[i];
        let col = color(*c);
        let points: Vec<(f64, f64)> = values
            .iter()
            .enumerate()
            .map(|(i, &s)| (i as f64 + 1.0, s.log2()))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), col.stroke_width(2)))
            .map_err(draw_err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col.stroke_width(2)));
        chart
            .draw_series(points.into_iter().map(|p| Circle::new(p, 3, col.filled())))
            .map_err(draw_err)?;
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.5))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// Name, colour index, points `(x, y%)`, band `(x, lo%, hi%)`.
type Series = (String, usize, Vec<(f64, f64)>, Vec<(f64, f64, f64)>);

/// A line chart of percentages against a numeric x, one series per entry, optional bands.
struct Lines<'s> {
    title: &'s str,
    x_desc: &'s str,
    y_desc: &'s str,
    x_max: f64,
    /// The x axis counts (turns, samples): whole-number ticks, with half a step of margin.
    integer_x: bool,
    /// Values hold until the next point (a budget between two grid points buys what the lower one
    /// bought), so draw steps instead of slopes.
    steps: bool,
    series: Vec<Series>,
    /// Draw the series' legend: once per figure where several panels show the same series.
    legend: bool,
}

fn lines_panel(area: &Area<'_>, l: &Lines<'_>) -> Result<(), PlotError> {
    let x_lo = if l.integer_x { 0.5 } else { 0.0 };
    let x_hi = if l.integer_x {
        l.x_max + 0.5
    } else {
        l.x_max * 1.04
    };
    let mut chart = ChartBuilder::on(area)
        .caption(l.title, (FONT, 18))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x_lo..x_hi.max(x_lo + 1e-9), 0f64..105f64)
        .map_err(draw_err)?;
    let integer_x = l.integer_x;
    // One number format for the whole axis, from the spacing of its ~8 ticks.
    let thousands = l.x_max >= 10_000.0;
    let step = if thousands {
        l.x_max / 8_000.0
    } else {
        l.x_max / 8.0
    };
    let decimals = if step > 0.0 {
        (-step.log10().floor()).clamp(0.0, 6.0) as usize
    } else {
        0
    };
    chart
        .configure_mesh()
        .x_desc(l.x_desc)
        .y_desc(l.y_desc)
        .axis_desc_style((FONT, 15))
        .label_style((FONT, 13))
        .x_labels(if integer_x {
            (l.x_max as usize).clamp(1, 12)
        } else {
            8
        })
        .x_label_formatter(&move |x| {
            if integer_x {
                format!("{x:.0}")
            } else {
                tick(*x, decimals, thousands)
            }
        })
        .y_label_formatter(&|y| format!("{y:.0}%"))
        .draw()
        .map_err(draw_err)?;
    for (i, name) in merge_equal(&l.series, |s| &s.0, |s| (&s.2, &s.3)) {
        let (_, c, points, band) = &l.series[i];
        let col = color(*c);
        let band = if l.steps {
            step_band(band)
        } else {
            band.clone()
        };
        if band.len() > 1 {
            let mut poly: Vec<(f64, f64)> = band.iter().map(|&(x, lo, _)| (x, lo)).collect();
            poly.extend(band.iter().rev().map(|&(x, _, hi)| (x, hi)));
            chart
                .draw_series(std::iter::once(Polygon::new(poly, col.mix(0.15).filled())))
                .map_err(draw_err)?;
        }
        let line = if l.steps {
            step_points(points)
        } else {
            points.clone()
        };
        chart
            .draw_series(LineSeries::new(line, col.stroke_width(2)))
            .map_err(draw_err)?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col.stroke_width(2)));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 3, col.filled())))
            .map_err(draw_err)?;
    }
    if l.legend {
        chart
            .configure_series_labels()
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.5))
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(draw_err)?;
    }
    Ok(())
}

/// The series to draw and their legend labels: series with equal values (the same curve, the same
/// band) are drawn once, as the first of them, labelled with all their names (`p=0 = p=0.5`), since
/// a curve drawn over an equal one hides it.
fn merge_equal<'s, S, K: PartialEq>(
    series: &'s [S],
    name: impl Fn(&'s S) -> &'s String,
    values: impl Fn(&'s S) -> K,
) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    for (i, s) in series.iter().enumerate() {
        match out
            .iter_mut()
            .find(|(j, _)| values(&series[*j]) == values(s))
        {
            Some((_, label)) => {
                label.push_str(" = ");
                label.push_str(name(s));
            }
            None => out.push((i, name(s).clone())),
        }
    }
    out
}

/// A tick label with `decimals` decimals, in thousands (`12k`) when `thousands`.
fn tick(x: f64, decimals: usize, thousands: bool) -> String {
    if x == 0.0 {
        "0".to_string()
    } else if thousands {
        format!("{:.*}k", decimals, x / 1000.0)
    } else {
        format!("{x:.decimals$}")
    }
}

/// A speedup label: `0.25x`, `1x`, `16x`, `0.125x`.
fn speedup_label(y: f64) -> String {
    let text = format!("{y:.4}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}x")
}

/// A step curve through `points`: each value holds until the next point's x.
fn step_points(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2);
    for (i, &p) in points.iter().enumerate() {
        if i > 0 {
            out.push((p.0, points[i - 1].1));
        }
        out.push(p);
    }
    out
}

fn step_band(band: &[(f64, f64, f64)]) -> Vec<(f64, f64, f64)> {
    let mut out = Vec::with_capacity(band.len() * 2);
    for (i, &b) in band.iter().enumerate() {
        if i > 0 {
            out.push((b.0, band[i - 1].1, band[i - 1].2));
        }
        out.push(b);
    }
    out
}

/// `report --plot`: fast_p@N curves (one per threshold) and the speedup distribution of one run.
pub fn run_svg(run: &LoadedRun) -> Result<String, PlotError> {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (1400, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let (left, right) = root.split_horizontally(700);
        let m = &run.report.metrics;
        let axis = super::axis_name(run.report.method);
        let series = FAST_P_LABELS
            .iter()
            .enumerate()
            .map(|(t, label)| {
                let points = m
                    .steps
                    .iter()
                    .map(|s| (f64::from(s.n), 100.0 * s.summary.fast_p.0[t]))
                    .collect();
                (format!("fast_{label}"), t, points, Vec::new())
            })
            .collect();
        let title = format!(
            "{}: fast_p@N ({} problems)",
            run.report.run,
            m.problems.len()
        );
        lines_panel(
            &left,
            &Lines {
                title: &title,
                x_desc: axis,
                y_desc: "problems faster than p x reference",
                x_max: f64::from(m.axis.max(1)),
                integer_x: true,
                steps: false,
                series,
                legend: true,
            },
        )?;
        let speedups = best_speedups(run);
        let title = format!(
            "speedup distribution ({} of {} problems correct and timed)",
            speedups.len(),
            m.problems.len()
        );
        distribution_panel(&right, &[(run.report.run.clone(), speedups, 0)], &title)?;
        root.present().map_err(draw_err)?;
    }
    Ok(buf)
}

/// `compare --plot`: fast_1 against each budget axis (bands: bootstrap intervals), correct rate
/// against LLM calls, and every run's speedup distribution.
pub fn comparison_svg(c: &Comparison, runs: &[LoadedRun]) -> Result<String, PlotError> {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (1500, 1260)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let panels = root.split_evenly((3, 2));
        for (p, axis) in c.axes.iter().enumerate() {
            let title = format!("fast_1 by {}", axis.axis.name());
            if let Some(why) = &axis.unavailable {
                empty_panel(&panels[p], &title, &format!("not comparable: {why}"))?;
                continue;
            }
            if axis.rows.is_empty() {
                empty_panel(&panels[p], &title, "no budgets")?;
                continue;
            }
            let series = (0..c.runs.len())
                .map(|i| {
                    let points = axis
                        .rows
                        .iter()
                        .map(|r| (r.budget, 100.0 * r.runs[i].summary.fast_p.0[3]))
                        .collect();
                    let band = axis
                        .rows
                        .iter()
                        .filter_map(|r| {
                            let ci = r.runs[i].ci.as_ref()?.fast_p.0[3]?;
                            Some((r.budget, 100.0 * ci.lo, 100.0 * ci.hi))
                        })
                        .collect();
                    (c.runs[i].clone(), i, points, band)
                })
                .collect();
            let x_max = axis.rows.last().map_or(1.0, |r| r.budget);
            lines_panel(
                &panels[p],
                &Lines {
                    title: &title,
                    x_desc: axis_title(axis.axis),
                    y_desc: "fast_1 (shared problems)",
                    x_max,
                    integer_x: axis.axis == BudgetAxis::LlmCalls,
                    steps: axis.axis != BudgetAxis::LlmCalls,
                    series,
                    legend: p == 0,
                },
            )?;
        }
        // Correct rate against LLM calls.
        let calls = c.axes.iter().find(|a| a.axis == BudgetAxis::LlmCalls);
        match calls {
            Some(axis) if !axis.rows.is_empty() => {
                let series = (0..c.runs.len())
                    .map(|i| {
                        let points = axis
                            .rows
                            .iter()
                            .map(|r| (r.budget, 100.0 * r.runs[i].summary.correct_rate))
                            .collect();
                        let band = axis
                            .rows
                            .iter()
                            .filter_map(|r| {
                                let ci = r.runs[i].ci.as_ref()?.correct_rate?;
                                Some((r.budget, 100.0 * ci.lo, 100.0 * ci.hi))
                            })
                            .collect();
                        (c.runs[i].clone(), i, points, band)
                    })
                    .collect();
                lines_panel(
                    &panels[4],
                    &Lines {
                        title: "correct rate by llm_calls",
                        x_desc: axis_title(BudgetAxis::LlmCalls),
                        y_desc: "correct (shared problems)",
                        x_max: axis.rows.last().map_or(1.0, |r| r.budget),
                        integer_x: true,
                        steps: false,
                        series,
                        legend: false,
                    },
                )?;
            }
            _ => empty_panel(&panels[4], "correct rate by llm_calls", "no budgets")?,
        }
        let shared = &c.shared_problems;
        let dists: Vec<(String, Vec<f64>, usize)> = runs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut v: Vec<f64> = shared
                    .iter()
                    .filter_map(|p| {
                        r.attempts
                            .get(p)?
                            .iter()
                            .filter_map(|a| a.speedup())
                            .fold(None, |b: Option<f64>, s| Some(b.map_or(s, |b| b.max(s))))
                    })
                    .collect();
                v.sort_by(|a, b| b.total_cmp(a));
                (c.runs[i].clone(), v, i)
            })
            .collect();
        distribution_panel(
            &panels[5],
            &dists,
            &format!(
                "best speedups, all attempts ({} shared problems)",
                shared.len()
            ),
        )?;
        root.present().map_err(draw_err)?;
    }
    Ok(buf)
}

/// Write `svg` to `path` as SVG or PNG, by the file's extension.
/// Whether a plot can be written to `path`: its format (`.svg`, `.png`), its folder, and for PNG a
/// system font. Commands check before they print anything, so a wrong file name costs nothing.
pub fn check_target(path: &Path) -> Result<(), PlotError> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    if !matches!(ext.as_deref(), Some("svg" | "png")) {
        return Err(PlotError::Format {
            path: path.to_path_buf(),
        });
    }
    let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(folder) = folder
        && !folder.is_dir()
    {
        return Err(PlotError::Write {
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("no folder {}", folder.display()),
            ),
        });
    }
    if ext.as_deref() == Some("png") {
        let mut db = resvg::usvg::fontdb::Database::new();
        db.load_system_fonts();
        sans_family(&db).ok_or_else(|| PlotError::NoFont {
            path: path.to_path_buf(),
        })?;
    }
    Ok(())
}

/// The sans-serif family PNGs are drawn with: a common one, else any the system has.
fn sans_family(db: &resvg::usvg::fontdb::Database) -> Option<String> {
    [
        "DejaVu Sans",
        "Liberation Sans",
        "Arial",
        "Helvetica",
        "Noto Sans",
    ]
    .into_iter()
    .find(|f| {
        db.faces()
            .any(|face| face.families.iter().any(|(n, _)| n == f))
    })
    .map(str::to_string)
    .or_else(|| {
        db.faces()
            .next()
            .and_then(|f| f.families.first().map(|(n, _)| n.clone()))
    })
}

pub fn write_plot(path: &Path, svg: &str) -> Result<(), PlotError> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    let bytes = match ext.as_deref() {
        Some("svg") => svg.as_bytes().to_vec(),
        Some("png") => svg_to_png(path, svg)?,
        _ => {
            return Err(PlotError::Format {
                path: path.to_path_buf(),
            });
        }
    };
    std::fs::write(path, bytes).map_err(|source| PlotError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// Render SVG to PNG with the system's fonts.
fn svg_to_png(path: &Path, svg: &str) -> Result<Vec<u8>, PlotError> {
    use resvg::{tiny_skia, usvg};
    let mut db = usvg::fontdb::Database::new();
    db.load_system_fonts();
    let family = sans_family(&db).ok_or_else(|| PlotError::NoFont {
        path: path.to_path_buf(),
    })?;
    db.set_sans_serif_family(family);
    let render = |message: String| PlotError::Render {
        path: path.to_path_buf(),
        message,
    };
    let mut opt = usvg::Options {
        font_family: "sans-serif".into(),
        ..usvg::Options::default()
    };
    *opt.fontdb_mut() = db;
    let tree = usvg::Tree::from_str(svg, &opt).map_err(|e| render(e.to_string()))?;
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| render("empty image".into()))?;
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap.encode_png().map_err(|e| render(e.to_string()))
}
