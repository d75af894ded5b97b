//! A loaded run as rows of data rather than text: the curve's steps with the numbers `krefine report`
//! prints (and what each step spent), and one row per finished turn of every task. The Python package
//! (`python/`) turns these into DataFrames; nothing is recomputed there.

use serde::Serialize;

use crate::metrics::{Spend, Summary, counted_speedup};
use crate::types::{TaskId, Verdict};

use super::{LoadedRun, rows};

/// One step of a run's curve (turn `n` for refinement and one-shot, the first `n` samples for
/// sampling): the report's numbers for that step and what it spent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnRow {
    pub turn: u32,
    /// fast_p, geomean speedup and rates of the best candidates up to this step.
    pub summary: Summary,
    /// Problems whose candidate at this step has no verdict yet.
    pub pending: usize,
    /// LLM spending of this step alone, and of steps `1..=turn`.
    pub spend: Spend,
    pub cumulative: Spend,
    /// Seconds of device leases held for this step's candidates (execution and profiling), summed
    /// over the problems in problem order; and the same for steps `1..=turn`.
    pub gpu_s: f64,
    pub cumulative_gpu_s: f64,
}

/// The curve of `run` as rows, one per step; the same rows (and numbers) as `krefine report`.
pub fn turn_rows(run: &LoadedRun) -> Vec<TurnRow> {
    let mut cumulative_gpu_s = 0.0;
    rows(&run.report)
        .iter()
        .map(|row| {
            let index = (row.step.n as usize).saturating_sub(1);
            // `attempts` holds every problem's attempts 1..=axis in budget order: the step's
            // candidates are each problem's attempt `n`.
            let gpu_s: f64 = run
                .attempts
                .values()
                .filter_map(|attempts| attempts.get(index))
                .map(|a| a.cost.gpu_s)
                .sum();
            cumulative_gpu_s += gpu_s;
            TurnRow {
                turn: row.step.n,
                summary: row.step.summary.clone(),
                pending: row.step.pending,
                spend: row.spend,
                cumulative: row.cumulative,
                gpu_s,
                cumulative_gpu_s,
            }
        })
        .collect()
}

/// One finished turn of one task: its candidate (or why it had none), verdict, timings and costs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CandidateRow {
    pub task: TaskId,
    pub turn: u32,
    pub verdict: Verdict,
    /// The candidate compiled (KernelBench's `compiled` flag); false when it never got that far.
    pub compiled: bool,
    /// Speedup over the reference as measured (`None` when not timed).
    pub speedup: Option<f64>,
    /// Whether this candidate's speedup counts in fast_p and the geomean (correct, finite and
    /// positive, and not an unverified excessive speedup in strict mode).
    pub counted: bool,
    /// Candidate and reference mean times in ms (`None` when not measured).
    pub runtime_ms: Option<f64>,
    pub ref_runtime_ms: Option<f64>,
    /// Duration of the compile, of the execution (request to result, in the orchestrator) and of
    /// the profile, in ms; `None` for stages the turn did not reach.
    pub compile_ms: Option<u64>,
    pub execute_ms: Option<u64>,
    pub profile_ms: Option<u64>,
    /// Tokens of the turn's LLM answer; `None` when there was no answer or the provider sent no
    /// usage.
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub tokens: Option<u64>,
    /// Cost of the answer; `None` when unpriced or absent.
    pub usd: Option<f64>,
    /// Seconds of device leases held for this turn.
    pub gpu_s: f64,
    /// Device that measured it (`cpu`, `cuda:0`).
    pub device: Option<String>,
    /// The extracted code; `None` when the answer had none.
    pub code: Option<String>,
}

/// A KernelBench time in ms, `None` for its "not measured" convention (-1).
fn measured(ms: f64) -> Option<f64> {
    (ms >= 0.0).then_some(ms)
}

/// Every finished turn of every task, in task then turn order.
pub fn candidate_rows(run: &LoadedRun) -> Vec<CandidateRow> {
    let mut out = Vec::new();
    for (task, records) in &run.turns {
        for r in records {
            let Some(verdict) = r.verdict else {
                continue;
            };
            let exec = r.exec.as_ref();
            let usage = r.answer.as_ref().and_then(|a| a.usage);
            out.push(CandidateRow {
                task: *task,
                turn: r.turn,
                verdict,
                compiled: exec.is_some_and(|e| e.compiled),
                speedup: exec.and_then(|e| e.speedup),
                counted: verdict == Verdict::Correct
                    && counted_speedup(r).is_some_and(|s| s.is_finite() && s > 0.0),
                runtime_ms: exec.and_then(|e| measured(e.runtime_ms)),
                ref_runtime_ms: exec.and_then(|e| measured(e.ref_runtime_ms)),
                compile_ms: r.compile.as_ref().map(|c| c.duration_ms),
                execute_ms: exec.map(|e| e.wall_ms),
                profile_ms: r.profile.as_ref().map(|p| p.duration_ms),
                prompt_tokens: usage.map(|u| u.prompt_tokens),
                completion_tokens: usage.map(|u| u.completion_tokens),
                tokens: usage.map(|u| u.total()),
                usd: r.answer.as_ref().and_then(|a| a.cost_usd),
                gpu_s: run.device_ms.get(&(*task, r.turn)).copied().unwrap_or(0) as f64 / 1000.0,
                device: exec.map(|e| e.device.clone()).filter(|d| !d.is_empty()),
                code: r.code.clone(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::metrics::compare::CompareSettings;
    use crate::report::{CompareError, Format, compare_runs, load_run, render};
    use crate::store::read_log;
    use crate::types::Event;

    /// A simulated quickstart run as krefine wrote it (4 problems, 3 turns, G+E+P).
    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/runs/quickstart-sim")
    }

    /// A copy of the fixture in a temporary directory, so reading it can be checked to write nothing.
    fn copy() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::copy(
            fixture().join("events.jsonl"),
            d.path().join("events.jsonl"),
        )
        .unwrap();
        d
    }

    #[test]
    fn turn_rows_are_the_json_reports_numbers() {
        let d = copy();
        let run = load_run(d.path()).unwrap();
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "reading a run creates nothing in it");
        let json: serde_json::Value =
            serde_json::from_str(&render(std::slice::from_ref(&run.report), Format::Json)).unwrap();
        let rows = turn_rows(&run);
        assert_eq!(rows.len(), 3);
        for (row, t) in rows.iter().zip(json["turns"].as_array().unwrap()) {
            assert_eq!(t["turn"], row.turn);
            assert_eq!(t["fast_p"]["1"], row.summary.fast_p.0[3]);
            assert_eq!(t["correct_rate"], row.summary.correct_rate);
            assert_eq!(t["geomean_speedup"].as_f64(), row.summary.geomean_speedup);
            assert_eq!(t["tokens"]["total"], row.spend.tokens());
            assert_eq!(t["cost_usd"].as_f64(), row.spend.usd());
            assert_eq!(t["cumulative_tokens"], row.cumulative.tokens());
        }
        // Device seconds: the turn's lease time over every task, in problem order.
        let log = read_log(&d.path().join("events.jsonl")).unwrap();
        for row in &rows {
            let mut ms = std::collections::BTreeMap::new();
            for r in &log.records {
                if let (Some(task), Event::LeaseReleased { held_ms, turn, .. }) = (r.task, &r.event)
                    && *turn == row.turn
                {
                    *ms.entry(task).or_insert(0u64) += held_ms;
                }
            }
            let expected: f64 = ms.values().map(|&ms| ms as f64 / 1000.0).sum();
            assert!(expected > 0.0);
            assert_eq!(row.gpu_s, expected);
        }
        let total: f64 = rows.iter().map(|r| r.gpu_s).sum();
        assert_eq!(rows[2].cumulative_gpu_s, total);
    }

    #[test]
    fn candidate_rows_are_the_finished_turns() {
        let d = copy();
        let run = load_run(d.path()).unwrap();
        let rows = candidate_rows(&run);
        let finished: usize = run
            .turns
            .values()
            .flatten()
            .filter(|t| t.verdict.is_some())
            .count();
        assert_eq!(rows.len(), finished);
        assert_eq!(rows.len(), 12);
        for r in &rows {
            assert_eq!(r.code.is_some(), r.verdict != Verdict::NoCode, "{r:?}");
            assert_eq!(
                r.counted,
                r.verdict == Verdict::Correct && r.speedup.is_some(),
                "{r:?}"
            );
            assert_eq!(r.compile_ms.is_some(), r.code.is_some(), "{r:?}");
            assert!(r.tokens.is_some() && r.usd.is_some(), "{r:?}");
        }
        let mut order: Vec<_> = rows.iter().map(|r| (r.task, r.turn)).collect();
        order.sort();
        assert_eq!(
            order,
            rows.iter().map(|r| (r.task, r.turn)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn comparisons_refuse_what_cannot_be_compared() {
        let d = copy();
        let run = load_run(d.path()).unwrap();
        let level = CompareSettings {
            level: 1.5,
            ..CompareSettings::default()
        };
        assert_eq!(
            compare_runs(&[&run], level).unwrap_err(),
            CompareError::Level(1.5)
        );
        let c = compare_runs(&[&run, &run], CompareSettings::default()).unwrap();
        assert_eq!(c.runs, ["quickstart", "quickstart#2"]);
        let c = compare_runs(&[&run], CompareSettings::default()).unwrap();
        assert_eq!(c.shared_problems.len(), 4);
    }
}
