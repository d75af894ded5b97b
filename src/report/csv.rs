//! The CSV report: one header, one row per (run, turn), full-precision numbers, empty cells for
//! numbers that do not exist. Quoting follows RFC 4180.

use crate::metrics::FAST_P_LABELS;

use crate::metrics::extra::threshold_label;
use crate::metrics::{ExtraMetrics, Integrity};

use super::{RunReport, axis_name, feedback_key, rows};

/// Per-category findings of a row in one cell: `static.<category>:<warned>/<errors>` items
/// separated by spaces (`static.code_bypass:2/0 runtime.tf32_changed:1/0`); empty when none.
fn findings_cell(i: &Integrity) -> String {
    let items = [("static", &i.static_checks), ("runtime", &i.runtime_checks)]
        .into_iter()
        .flat_map(|(kind, counts)| {
            counts
                .iter()
                .map(move |(c, n)| format!("{kind}.{c}:{}/{}", n.warnings, n.errors))
        });
    items.collect::<Vec<_>>().join(" ")
}

pub(super) fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn opt(x: Option<f64>) -> String {
    x.map_or(String::new(), |x| x.to_string())
}

fn header(extra: &ExtraMetrics) -> String {
    let mut h: Vec<String> = [
        "run", "method", "feedback", "model", "complete", "axis", "turn", "problems",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    h.extend(FAST_P_LABELS.iter().map(|l| format!("fast_{l}")));
    h.extend(
        extra
            .thresholds
            .iter()
            .map(|&p| format!("fast_{}", threshold_label(p))),
    );
    h.extend(
        [
            "geomean_speedup",
            "correct_rate",
            "compiled_rate",
            "correct",
            "compiled",
            "pending",
            "prompt_tokens",
            "completion_tokens",
            "reasoning_tokens",
            "tokens",
            "cost_usd",
            "cumulative_tokens",
            "cumulative_cost_usd",
            "rejected",
            "speedups_flagged",
            "speedups_verified",
            "speedups_unverified",
            "speedups_excluded",
            "findings",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    if !extra.steps.is_empty() {
        h.extend(["sol_mean".to_string(), "sol_candidates".to_string()]);
    }
    h.join(",")
}

/// One header for every run: the extra columns are those of the first run that has them (the CLI
/// computes every run's with the same thresholds).
pub(super) fn render(runs: &[RunReport]) -> String {
    let extra = runs
        .iter()
        .map(|r| &r.extra)
        .find(|e| !e.steps.is_empty())
        .cloned()
        .unwrap_or_default();
    let mut out = header(&extra);
    out.push('\n');
    for r in runs {
        for row in rows(r) {
            let step_extra = r.extra.steps.get(row.step.n as usize - 1);
            let s = &row.step.summary;
            let mut c = vec![
                field(&r.run),
                r.method.to_string(),
                r.feedback.map_or("", feedback_key).to_string(),
                field(&r.model),
                r.complete.to_string(),
                axis_name(r.method).to_string(),
                row.step.n.to_string(),
                r.metrics.problems.len().to_string(),
            ];
            c.extend(s.fast_p.0.iter().map(f64::to_string));
            for (t, _) in extra.thresholds.iter().enumerate() {
                c.push(opt(step_extra.and_then(|e| e.fast_p.get(t).copied())));
            }
            c.extend([
                opt(s.geomean_speedup),
                s.correct_rate.to_string(),
                s.compiled_rate.to_string(),
                s.correct.to_string(),
                s.compiled.to_string(),
                row.step.pending.to_string(),
                row.spend.prompt_tokens.to_string(),
                row.spend.completion_tokens.to_string(),
                row.spend.reasoning_tokens.to_string(),
                row.spend.tokens().to_string(),
                opt(row.spend.usd()),
                row.cumulative.tokens().to_string(),
                opt(row.cumulative.usd()),
            ]);
            let i = &row.step.integrity;
            c.extend([
                i.rejected.to_string(),
                i.speedups.flagged.to_string(),
                i.speedups.verified.to_string(),
                i.speedups.unverified.to_string(),
                i.speedups.excluded.to_string(),
                field(&findings_cell(i)),
            ]);
            if !extra.steps.is_empty() {
                c.push(opt(step_extra.and_then(|e| e.sol_mean)));
                c.push(step_extra.map_or(String::new(), |e| e.sol_candidates.to_string()));
            }
            out.push_str(&c.join(","));
            out.push('\n');
        }
    }
    out
}
