//! The JSON report: full-precision numbers, fields in a fixed order (serde structs, not maps, so the
//! order is the declaration order below).

use std::collections::BTreeMap;

use serde::Serialize;
use serde::ser::SerializeMap;

use crate::metrics::extra::ExtraFastP;
use crate::metrics::{DeviceUse, FastP, Integrity, Ledger, PassAtK, Spend};
use crate::types::MethodKind;

use super::{Row, RunReport, axis_name, feedback_key, rows};

/// `report.json`'s shape. Every key is described in docs/output-formats.md; the comments here say
/// what is not plain from the name.
#[derive(Serialize)]
struct Run<'a> {
    run: &'a str,
    method: MethodKind,
    feedback: Option<&'static str>,
    model: &'a str,
    /// False while the run is in progress or when it stopped early.
    complete: bool,
    /// `turns` or `samples`: what the `turn` key of each row counts.
    axis: &'static str,
    /// The fast_p denominator: the run's problems.
    problems: usize,
    turns: Vec<Turn<'a>>,
    #[serde(skip_serializing_if = "PassAt::is_empty")]
    pass_at_k: PassAt<'a>,
    /// Findings and excessive speedups over the whole curve; absent when there were none.
    #[serde(skip_serializing_if = "Integrity::is_empty")]
    integrity: Integrity,
    ledger: LedgerTotals<'a>,
    /// What the scores were measured on and how; absent for a report built without a run
    /// directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    provenance: Option<&'a super::provenance::Provenance>,
}

/// One row of the curve: a turn (refinement) or a sample count (sampling), over all problems.
#[derive(Serialize)]
struct Turn<'a> {
    turn: u32,
    fast_p: FastP,
    /// fast_p at the thresholds asked beyond KernelBench's (`--fast-p`), keyed like `fast_p`.
    #[serde(skip_serializing_if = "Option::is_none")]
    fast_p_extra: Option<ExtraFastP<'a>>,
    geomean_speedup: Option<f64>,
    /// Mean fraction of speed of light of the correct candidates so far that have one.
    #[serde(skip_serializing_if = "Option::is_none")]
    sol_mean: Option<Option<f64>>,
    /// How many candidates `sol_mean` is over.
    #[serde(skip_serializing_if = "Option::is_none")]
    sol_candidates: Option<usize>,
    correct_rate: f64,
    compiled_rate: f64,
    correct: usize,
    compiled: usize,
    /// Problems in the geomean: a correct candidate that was timed.
    timed: usize,
    /// Problems whose candidate for this row has no verdict yet.
    pending: usize,
    /// This row's candidates by verdict.
    verdicts: &'a BTreeMap<String, usize>,
    /// The row's own spending (`cost_usd`: `None` when no answer carried a cost), and the running
    /// totals of rows `1..=turn`.
    tokens: Tokens,
    cost_usd: Option<f64>,
    cumulative_tokens: u64,
    cumulative_cost_usd: Option<f64>,
    #[serde(skip_serializing_if = "Integrity::is_empty")]
    integrity: &'a Integrity,
}

#[derive(Serialize)]
struct Tokens {
    prompt: u64,
    completion: u64,
    reasoning: u64,
    total: u64,
}

impl Tokens {
    fn of(s: &Spend) -> Tokens {
        Tokens {
            prompt: s.prompt_tokens,
            completion: s.completion_tokens,
            reasoning: s.reasoning_tokens,
            total: s.tokens(),
        }
    }
}

/// `None` when no answer carried a cost, so "free" and "unknown" are not confused.
fn cost(s: &Spend) -> Option<f64> {
    s.usd()
}

/// pass@k as `{"1": .., "2": ..}` in k order (a BTreeMap would sort "10" before "2").
struct PassAt<'a>(&'a [PassAtK]);

impl PassAt<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for PassAt<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for p in self.0 {
            map.serialize_entry(&p.k.to_string(), &p.value)?;
        }
        map.end()
    }
}

/// The run's spending and resource use (the ledger), as `report.json` shows it.
#[derive(Serialize)]
struct LedgerTotals<'a> {
    /// Generations served as they were (`krefine eval`; no LLM was called), when the run's
    /// answers were such.
    #[serde(skip_serializing_if = "Option::is_none")]
    served_generations: Option<u64>,
    tokens: Tokens,
    cost_usd: Option<f64>,
    llm_answers: u64,
    answers_without_usage: u64,
    answers_without_cost: u64,
    llm_attempts: u64,
    llm_failed_attempts: u64,
    llm_retries: u64,
    llm_failures: u64,
    /// Lease use over all devices, and by device.
    device_time: DeviceUse,
    devices: &'a BTreeMap<String, DeviceUse>,
    compiles: u64,
    compiles_cached: u64,
    compile_ms: u64,
    wall_ms: u64,
}

fn turn<'a>(r: &'a RunReport, row: &Row<'a>) -> Turn<'a> {
    let s = &row.step.summary;
    let extra = r.extra.steps.get(row.step.n as usize - 1);
    Turn {
        turn: row.step.n,
        fast_p: s.fast_p,
        fast_p_extra: extra.map(|e| ExtraFastP(&r.extra.thresholds, &e.fast_p)),
        geomean_speedup: s.geomean_speedup,
        sol_mean: extra.map(|e| e.sol_mean),
        sol_candidates: extra.map(|e| e.sol_candidates),
        correct_rate: s.correct_rate,
        compiled_rate: s.compiled_rate,
        correct: s.correct,
        compiled: s.compiled,
        timed: s.timed,
        pending: row.step.pending,
        verdicts: &row.step.verdicts,
        tokens: Tokens::of(&row.spend),
        cost_usd: cost(&row.spend),
        cumulative_tokens: row.cumulative.tokens(),
        cumulative_cost_usd: cost(&row.cumulative),
        integrity: &row.step.integrity,
    }
}

fn totals(l: &Ledger, served: Option<u64>) -> LedgerTotals<'_> {
    LedgerTotals {
        served_generations: served,
        tokens: Tokens::of(&l.total),
        cost_usd: cost(&l.total),
        llm_answers: l.total.answers,
        answers_without_usage: l.total.answers_without_usage,
        answers_without_cost: l.total.answers_without_cost,
        llm_attempts: l.llm_attempts,
        llm_failed_attempts: l.llm_failed_attempts,
        llm_retries: l.llm_retries,
        llm_failures: l.llm_failures,
        device_time: l.device_total,
        devices: &l.devices,
        compiles: l.compiles,
        compiles_cached: l.compiles_cached,
        compile_ms: l.compile_ms,
        wall_ms: l.wall_ms,
    }
}

fn run(r: &RunReport) -> Run<'_> {
    Run {
        run: &r.run,
        method: r.method,
        feedback: r.feedback.map(feedback_key),
        model: &r.model,
        complete: r.complete,
        axis: axis_name(r.method),
        problems: r.metrics.problems.len(),
        turns: rows(r).iter().map(|row| turn(r, row)).collect(),
        pass_at_k: PassAt(&r.metrics.pass_at_k),
        integrity: r.metrics.integrity(),
        ledger: totals(&r.ledger, r.served),
        provenance: r.provenance.as_ref(),
    }
}

pub(super) fn render(runs: &[RunReport]) -> String {
    let runs: Vec<Run<'_>> = runs.iter().map(run).collect();
    let text = match runs.as_slice() {
        [one] => serde_json::to_string_pretty(one),
        many => serde_json::to_string_pretty(many),
    };
    // Serialising these structs cannot fail: every map key is a string and no Serialize impl errors.
    // Non-finite floats become `null` in serde_json rather than an error.
    let mut out = text.unwrap_or_else(|e| format!("{{\"error\": {:?}}}", e.to_string()));
    out.push('\n');
    out
}
