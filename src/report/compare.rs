//! `krefine compare` output: the matched-budget [`Comparison`] of several runs as text, Markdown, JSON
//! or CSV, headed by what differs between the runs and by a warning for each problem whose reference
//! time differs between them ([`super::reference_times`]). docs/output-formats.md describes the
//! formats.

use serde::Serialize;

use crate::metrics::FAST_P_LABELS;
use crate::metrics::bootstrap::Interval;
use crate::metrics::compare::{AxisComparison, BudgetAxis, Comparison, RunAtBudget};
use crate::metrics::extra::threshold_label;

use super::Format;
use super::load::{RunInfo, differences};
use super::reference_times::ReferenceTimeWarning;

/// Render a comparison of runs described by `infos` (same order as `c.runs`), with `warnings`
/// about problems whose reference time differs between them (CSV has no place for them: the
/// caller says them elsewhere).
pub fn render_comparison(
    c: &Comparison,
    infos: &[RunInfo],
    warnings: &[ReferenceTimeWarning],
    format: Format,
) -> String {
    match format {
        Format::Text => text(c, infos, warnings, false),
        Format::Md => text(c, infos, warnings, true),
        Format::Json => json(c, infos, warnings),
        Format::Csv => csv(c),
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

fn ci_pct(i: Option<Interval>) -> String {
    i.map_or(String::new(), |i| {
        format!(" [{:.1}, {:.1}]", 100.0 * i.lo, 100.0 * i.hi)
    })
}

fn signed_pct(x: f64) -> String {
    format!("{:+.1}", 100.0 * x)
}

fn ci_signed(i: Option<Interval>) -> String {
    i.map_or(String::new(), |i| {
        format!(" [{:+.1}, {:+.1}]", 100.0 * i.lo, 100.0 * i.hi)
    })
}

/// A budget in its axis's unit.
pub fn budget_text(axis: BudgetAxis, b: f64) -> String {
    match axis {
        BudgetAxis::LlmCalls => format!("{b:.0}"),
        BudgetAxis::Tokens => format!("{b:.0}"),
        BudgetAxis::Usd => format!("{b:.4}"),
        BudgetAxis::GpuS => format!("{b:.2}"),
    }
}

/// The title of an axis's table.
pub fn axis_title(axis: BudgetAxis) -> &'static str {
    match axis {
        BudgetAxis::LlmCalls => "LLM calls per problem (refinement turn N against sampling k = N)",
        BudgetAxis::Tokens => "tokens per problem (prompt + completion)",
        BudgetAxis::Usd => "USD per problem",
        BudgetAxis::GpuS => "device seconds per problem (leases held for execution and profiling)",
    }
}

fn cells(r: &RunAtBudget, budget: String) -> Vec<String> {
    let ci = r.ci.as_ref();
    let geo = match r.summary.geomean_speedup {
        Some(g) => format!(
            "{g:.3}{}",
            ci.and_then(|c| c.geomean_speedup)
                .map_or(String::new(), |i| format!(" [{:.3}, {:.3}]", i.lo, i.hi))
        ),
        None => "-".into(),
    };
    let delta = match &r.vs_first {
        Some(d) => format!(
            "{}{}",
            signed_pct(d.fast_p.0[3]),
            ci_signed(d.fast_p_ci.0[3])
        ),
        None => "-".into(),
    };
    let mut c = vec![
        budget,
        r.run.clone(),
        format!("{:.2}{}", r.attempts, if r.exhausted { "*" } else { "" }),
        pct(r.summary.fast_p.0[0]),
        format!(
            "{}{}",
            pct(r.summary.fast_p.0[3]),
            ci_pct(ci.and_then(|c| c.fast_p.0[3]))
        ),
        pct(r.summary.fast_p.0[5]),
    ];
    c.extend(r.fast_p_extra.0.iter().map(|(_, v)| pct(*v)));
    c.extend([
        format!(
            "{}{}",
            pct(r.summary.correct_rate),
            ci_pct(ci.and_then(|c| c.correct_rate))
        ),
        geo,
        delta,
    ]);
    c
}

/// The extra thresholds of a comparison (every row has the same ones).
fn extra_thresholds(axis: &AxisComparison) -> Vec<f64> {
    axis.rows
        .iter()
        .flat_map(|row| row.runs.first())
        .map(|r| r.fast_p_extra.0.iter().map(|(p, _)| *p).collect())
        .next()
        .unwrap_or_default()
}

fn header(extra: &[f64]) -> Vec<String> {
    let mut h: Vec<String> = ["budget", "run", "attempts", "fast_0", "fast_1", "fast_2"]
        .map(String::from)
        .to_vec();
    h.extend(
        extra
            .iter()
            .map(|&p| format!("fast_{}", threshold_label(p))),
    );
    h.extend(["correct", "geomean", "Δfast_1"].map(String::from));
    h
}

fn table(axis: &AxisComparison, md: bool, out: &mut String) {
    let header = header(&extra_thresholds(axis));
    let rows: Vec<Vec<String>> = axis
        .rows
        .iter()
        .flat_map(|row| {
            row.runs
                .iter()
                .map(move |r| cells(r, budget_text(axis.axis, row.budget)))
        })
        .collect();
    if md {
        out.push_str(&format!("| {} |\n", header.join(" | ")));
        out.push_str(&format!("|{}\n", "---|".repeat(header.len())));
        for r in &rows {
            out.push_str(&format!("| {} |\n", r.join(" | ")));
        }
        return;
    }
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                let pad = w.saturating_sub(c.chars().count());
                // The run name is left-aligned, numbers right-aligned.
                if i == 1 {
                    format!("{c}{}", " ".repeat(pad))
                } else {
                    format!("{}{c}", " ".repeat(pad))
                }
            })
            .collect();
        format!("{}\n", parts.join("  ").trim_end())
    };
    out.push_str(&line(header.iter().map(String::as_str).collect()));
    for r in &rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
}

fn text(c: &Comparison, infos: &[RunInfo], warnings: &[ReferenceTimeWarning], md: bool) -> String {
    let mut s = String::new();
    let h = if md { "### " } else { "" };
    let dropped: Vec<String> = c
        .runs
        .iter()
        .zip(&c.dropped)
        .map(|(r, d)| format!("{r} {d}"))
        .collect();
    s.push_str(&format!(
        "{h}compare: {} ({} shared problems; dropped because not in every run: {})\n",
        c.runs.join(" vs "),
        c.shared_problems.len(),
        dropped.join(", ")
    ));
    if md {
        s.push('\n');
    }
    let (differ, same) = differences(infos);
    let bullet = if md { "- " } else { "" };
    if differ.is_empty() {
        s.push_str(&format!("{bullet}differs: nothing recorded\n"));
    } else {
        let parts: Vec<String> = differ
            .iter()
            .map(|(k, v)| format!("{k} {}", v.join(" | ")))
            .collect();
        s.push_str(&format!("{bullet}differs: {}\n", parts.join("; ")));
    }
    let parts: Vec<String> = same.iter().map(|(k, v)| format!("{k} {v}")).collect();
    s.push_str(&format!("{bullet}same: {}\n", parts.join("; ")));
    for w in warnings {
        s.push_str(&format!("{bullet}WARNING: {}\n", w.message()));
    }
    let st = &c.settings;
    if st.resamples > 0 {
        s.push_str(&format!(
            "{bullet}intervals: {:.0}% percentile bootstrap over the shared problems, {} resamples, seed {}; Δfast_1 = run − {} in points, paired\n",
            100.0 * st.level,
            st.resamples,
            st.seed,
            c.runs.first().map_or("", String::as_str)
        ));
    } else {
        s.push_str(&format!("{bullet}intervals: none (0 resamples)\n"));
    }
    s.push_str(&format!(
        "{bullet}attempts: mean attempts per problem within the budget; * = every attempt fit (more budget buys that run nothing)\n"
    ));
    for axis in &c.axes {
        s.push_str(&format!(
            "\n{}{}: {}\n",
            if md { "#### " } else { "" },
            axis.axis.name(),
            axis_title(axis.axis)
        ));
        if md {
            s.push('\n');
        }
        match &axis.unavailable {
            Some(why) => s.push_str(&format!("not comparable: {why}\n")),
            None if axis.rows.is_empty() => s.push_str("no budgets (no attempts)\n"),
            None => table(axis, md, &mut s),
        }
    }
    s
}

#[derive(Serialize)]
struct JsonOut<'a> {
    runs: &'a [RunInfo],
    differs: Vec<Differs>,
    /// Problems whose reference time differs between the runs by more than 2x.
    reference_time_warnings: Vec<JsonWarning<'a>>,
    // The comparison's fields but its run names (`runs` above describes the runs, names included;
    // flattening the whole comparison wrote a second `runs` key).
    shared_problems: &'a [crate::types::ProblemKey],
    dropped: &'a [usize],
    settings: &'a crate::metrics::compare::CompareSettings,
    axes: &'a [crate::metrics::compare::AxisComparison],
}

#[derive(Serialize)]
struct JsonWarning<'a> {
    #[serde(flatten)]
    warning: &'a ReferenceTimeWarning,
    message: String,
}

#[derive(Serialize)]
struct Differs {
    field: &'static str,
    values: Vec<String>,
}

fn json(c: &Comparison, infos: &[RunInfo], warnings: &[ReferenceTimeWarning]) -> String {
    let (differ, _) = differences(infos);
    let out = JsonOut {
        runs: infos,
        differs: differ
            .into_iter()
            .map(|(field, values)| Differs { field, values })
            .collect(),
        reference_time_warnings: warnings
            .iter()
            .map(|w| JsonWarning {
                warning: w,
                message: w.message(),
            })
            .collect(),
        shared_problems: &c.shared_problems,
        dropped: &c.dropped,
        settings: &c.settings,
        axes: &c.axes,
    };
    // Serialising plain structs of numbers and strings cannot fail.
    serde_json::to_string_pretty(&out).unwrap_or_default()
}

fn csv(c: &Comparison) -> String {
    let mut s = String::from("axis,budget,run,problems,attempts,exhausted");
    let metrics: Vec<String> = FAST_P_LABELS
        .iter()
        .map(|l| format!("fast_{l}"))
        .chain(["correct_rate".into(), "geomean_speedup".into()])
        .collect();
    for m in &metrics {
        s.push_str(&format!(",{m},{m}_lo,{m}_hi"));
    }
    let extra = c
        .axes
        .iter()
        .map(extra_thresholds)
        .find(|e| !e.is_empty())
        .unwrap_or_default();
    s.push_str(",delta_fast_1,delta_fast_1_lo,delta_fast_1_hi,delta_correct_rate,delta_correct_rate_lo,delta_correct_rate_hi");
    for p in &extra {
        s.push_str(&format!(",fast_{}", threshold_label(*p)));
    }
    s.push('\n');
    let num = |x: Option<f64>| x.map_or(String::new(), |x| x.to_string());
    for axis in &c.axes {
        for row in &axis.rows {
            for r in &row.runs {
                s.push_str(&format!(
                    "{},{},{},{},{},{}",
                    axis.axis.name(),
                    row.budget,
                    super::csv::field(&r.run),
                    c.shared_problems.len(),
                    r.attempts,
                    r.exhausted
                ));
                let ci = r.ci.as_ref();
                let mut push = |v: Option<f64>, i: Option<Interval>| {
                    s.push_str(&format!(
                        ",{},{},{}",
                        num(v),
                        num(i.map(|i| i.lo)),
                        num(i.map(|i| i.hi))
                    ));
                };
                for t in 0..6 {
                    push(Some(r.summary.fast_p.0[t]), ci.and_then(|c| c.fast_p.0[t]));
                }
                push(
                    Some(r.summary.correct_rate),
                    ci.and_then(|c| c.correct_rate),
                );
                push(
                    r.summary.geomean_speedup,
                    ci.and_then(|c| c.geomean_speedup),
                );
                match &r.vs_first {
                    Some(d) => {
                        push(Some(d.fast_p.0[3]), d.fast_p_ci.0[3]);
                        push(Some(d.correct_rate), d.correct_rate_ci);
                    }
                    None => s.push_str(",,,,,,"),
                }
                for (t, _) in extra.iter().enumerate() {
                    s.push(',');
                    s.push_str(&num(r.fast_p_extra.0.get(t).map(|(_, v)| *v)));
                }
                s.push('\n');
            }
        }
    }
    s
}
