//! `krefine report` and `krefine compare`: metrics of one or more run directories as text, Markdown,
//! JSON or CSV, matched-budget comparisons, plots, and the KernelBench `eval_results.json` export.
//!
//! Rendering is a pure function of [`RunReport`]s (and [`crate::metrics::compare::Comparison`]s);
//! [`load`] reads run directories (through the store's one log reader) and folds their logs (through
//! the run's one reducer, [`crate::state::RunState`]: the report does not depend on the engine);
//! [`turn_rows`], [`candidate_rows`] and [`compare_runs`] give the same numbers as data (for the Python
//! package). docs/output-formats.md describes every format for users; keep it in step.

mod compare;
mod comparison;
mod csv;
mod equal;
mod json;
mod kernelbench;
pub mod load;
pub mod plot;
pub mod provenance;
mod reference_times;
mod tables;
mod text;

use std::fmt;
use std::str::FromStr;

use crate::metrics::{
    ExtraMetrics, FindingCounts, Integrity, Ledger, RunMetrics, Spend, StepMetrics, step_spend,
};
use crate::types::{FeedbackMode, MethodKind};

pub use compare::{axis_title, budget_text, render_comparison};
pub use comparison::{CompareError, compare_runs, compare_runs_at, run_labels};
pub use equal::equal_attempts_table;
pub use kernelbench::{Pick, kernelbench_eval_results, pick};
pub use load::{
    LoadError, LoadedRun, RunInfo, differences, frozen_config, load_run, load_run_with_log,
};
pub use reference_times::{REFERENCE_TIME_SPREAD, ReferenceTimeWarning, reference_time_warnings};
pub use tables::{CandidateRow, TurnRow, candidate_rows, turn_rows};

/// Everything a report shows of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    /// Run name (the run directory's name).
    pub run: String,
    pub method: MethodKind,
    /// `None` for methods without feedback (one-shot, sampling).
    pub feedback: Option<FeedbackMode>,
    pub model: String,
    pub metrics: RunMetrics,
    pub ledger: Ledger,
    /// False while the run is in progress or when it stopped early (cancelled, budget).
    pub complete: bool,
    /// What the scores were measured on and how; `None` only for reports built without a run
    /// directory.
    pub provenance: Option<provenance::Provenance>,
    /// `Some(n)`: the run's answers were `n` generations served as they were (`krefine eval`), not
    /// LLM calls; its ledger holds no LLM spending.
    pub served: Option<u64>,
    /// fast_p beyond KernelBench's thresholds and the mean fraction of speed of light, per step;
    /// empty unless asked for ([`LoadedRun::with_extra`]): the tables show their columns only then.
    pub extra: ExtraMetrics,
}

/// Output format of `krefine report` (`--format text|md|json|csv`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Text,
    Md,
    Json,
    Csv,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown report format {0:?} (expected text, md, json or csv)")]
pub struct UnknownFormat(pub String);

impl FromStr for Format {
    type Err = UnknownFormat;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" | "txt" => Ok(Format::Text),
            "md" | "markdown" => Ok(Format::Md),
            "json" => Ok(Format::Json),
            "csv" => Ok(Format::Csv),
            _ => Err(UnknownFormat(s.to_string())),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Text => "text",
            Format::Md => "md",
            Format::Json => "json",
            Format::Csv => "csv",
        })
    }
}

/// Render `runs` in `format`. JSON prints one object for one run and an array otherwise.
pub fn render(runs: &[RunReport], format: Format) -> String {
    match format {
        Format::Text => text::render(runs, false),
        Format::Md => text::render(runs, true),
        Format::Json => json::render(runs),
        Format::Csv => csv::render(runs),
    }
}

/// One row of a run's table: the curve's point and what that step spent.
pub(crate) struct Row<'a> {
    pub step: &'a StepMetrics,
    /// LLM spending of this step alone (turn `n`, or sample `n - 1`).
    pub spend: Spend,
    /// LLM spending of steps `1..=n`.
    pub cumulative: Spend,
}

pub(crate) fn rows(r: &RunReport) -> Vec<Row<'_>> {
    let spends = step_spend(r.method, r.metrics.axis, &r.ledger);
    let mut cumulative = Spend::default();
    r.metrics
        .steps
        .iter()
        .zip(spends)
        .map(|(step, spend)| {
            cumulative.add(&spend);
            Row {
                step,
                spend,
                cumulative,
            }
        })
        .collect()
}

/// What the curve's steps count: `turns` or `samples`.
pub(crate) fn axis_name(method: MethodKind) -> &'static str {
    match method {
        MethodKind::Sampling => "samples",
        MethodKind::Refine | MethodKind::OneShot => "turns",
    }
}

/// The feedback mode as the config and the event log spell it (`G`, `GE`, `GEP`).
pub(crate) fn feedback_key(f: FeedbackMode) -> &'static str {
    match f {
        FeedbackMode::G => "G",
        FeedbackMode::GE => "GE",
        FeedbackMode::GEP => "GEP",
    }
}

/// Per-category counts as the text report and the CSV `findings` cell write them:
/// `timing_patch (1 rejected)`, `code_bypass (2 warned, 1 rejected)`; `error_word` names what an
/// error did (`rejected` for static checks, `failed` for runtime ones).
pub(crate) fn category_counts(
    counts: &std::collections::BTreeMap<String, FindingCounts>,
    error_word: &str,
) -> Vec<String> {
    counts
        .iter()
        .map(|(category, n)| {
            let mut parts = Vec::new();
            if n.warnings > 0 {
                parts.push(format!("{} warned", n.warnings));
            }
            if n.errors > 0 {
                parts.push(format!("{} {error_word}", n.errors));
            }
            format!("{category} ({})", parts.join(", "))
        })
        .collect()
}

/// The integrity lines of a run (label, text): findings per category and excessive speedups.
/// Empty when no candidate had either.
pub(crate) fn integrity_lines(i: &Integrity) -> Vec<(&'static str, String)> {
    let mut lines = Vec::new();
    let mut checks = Vec::new();
    if !i.static_checks.is_empty() {
        checks.push(format!(
            "static: {}",
            category_counts(&i.static_checks, "rejected").join(", ")
        ));
    }
    if !i.runtime_checks.is_empty() {
        checks.push(format!(
            "runtime: {}",
            category_counts(&i.runtime_checks, "failed").join(", ")
        ));
    }
    if !checks.is_empty() {
        lines.push(("checks", checks.join("; ")));
    }
    let s = &i.speedups;
    if s.flagged > 0 {
        let mut text = format!(
            "{} flagged as excessive: {} re-verified, {} unverified",
            s.flagged, s.verified, s.unverified
        );
        if s.unverified > 0 {
            let counted = s.unverified - s.excluded.min(s.unverified);
            text.push_str(&match (s.excluded, counted) {
                (0, _) => "; counted in fast_p and geomean (faithful mode only flags them)".into(),
                (_, 0) => "; not counted in fast_p and geomean (strict mode)".into(),
                (e, c) => {
                    format!("; {e} not counted in fast_p and geomean (strict mode), {c} counted")
                }
            });
        }
        lines.push(("speedups", text));
    }
    lines
}
