//! fast_p@N, geomean speedup and correct rate per turn (or per sample count), as pure functions of the
//! folded log.
//!
//! The curve's axis is the method's budget: turns for `refine` (candidates = turns `1..=n` of the
//! problem's sample-0 task), samples for `sampling` (candidates = turn 1 of samples `0..n`), a single
//! point for `one_shot`. At each step a problem's *best* candidate is its fastest correct one so far.
//! The denominator is always every problem of the run, so failed, missing and unfinished candidates
//! count against a method, as in KernelBench's `fastp` (§7.3 of the protocol notes).
//!
//! Every number here is of the run's one fold ([`crate::state::RunState`]): its tasks' turns (through
//! [`TurnSource`]), its ledger and its GPU-seconds per turn.
//!
//! Submodules: [`ledger`] (tokens, USD, LLM attempts, GPU and compile time from the log),
//! [`budget`] (refinement vs. sampling at equal attempts and at equal tokens), [`integrity`]
//! (static and runtime findings, excessive speedups; in strict mode an unverified excessive speedup
//! does not count in fast_p and the geomean), [`attempts`] (a run as attempts with their costs),
//! [`compare`] (any runs at matched budgets along four axes, with [`bootstrap`] intervals), [`extra`]
//! (fast_p at thresholds beyond KernelBench's, and the mean fraction of speed of light).

pub mod attempts;
pub mod bootstrap;
pub mod budget;
pub mod compare;
pub mod extra;
pub mod integrity;
pub mod ledger;

use std::collections::BTreeMap;

use serde::Serialize;
use serde::ser::SerializeMap;

use crate::types::{MethodKind, ProblemKey, TaskId, TurnRecord, Verdict};

pub use attempts::{Attempt, AttemptCost, RunAttempts, run_attempts};
pub use budget::{
    AttemptsRow, TokensRow, cumulative_tokens_per_problem, equal_attempts, equal_tokens,
};
pub use extra::{ExtraMetrics, ExtraStep, extra_metrics};
pub use integrity::{FindingCounts, Integrity, SpeedupCounts, counted_speedup, speedup_excluded};
pub use ledger::{DeviceUse, Ledger, Spend, ledger, step_spend};

/// The speedup thresholds of fast_p, as in KernelBench's `benchmark_eval_analysis.py`.
pub const FAST_P_THRESHOLDS: [f64; 6] = [0.0, 0.5, 0.8, 1.0, 1.5, 2.0];
/// Their names in reports and JSON keys.
pub const FAST_P_LABELS: [&str; 6] = ["0", "0.5", "0.8", "1", "1.5", "2"];

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MetricsError {
    #[error("expected a {expected} run, got a {got} run")]
    Method {
        expected: &'static str,
        got: MethodKind,
    },
    #[error(
        "the runs cover different problems ({only_first} only in the first run, {only_second} only in the second)"
    )]
    DifferentProblems {
        only_first: usize,
        only_second: usize,
    },
}

/// fast_p for each threshold of [`FAST_P_THRESHOLDS`], as shares in `0..=1`. Serialises as a map keyed
/// by [`FAST_P_LABELS`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FastP(pub [f64; 6]);

impl FastP {
    /// fast_p at threshold `p`, when `p` is one of [`FAST_P_THRESHOLDS`].
    pub fn get(&self, p: f64) -> Option<f64> {
        FAST_P_THRESHOLDS
            .iter()
            .position(|&t| t == p)
            .map(|i| self.0[i])
    }
}

impl Serialize for FastP {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(FAST_P_LABELS.len()))?;
        for (label, value) in FAST_P_LABELS.iter().zip(self.0) {
            map.serialize_entry(label, &value)?;
        }
        map.end()
    }
}

/// How a set of problems fared with the candidates they had (at one step, or within one budget).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Summary {
    pub fast_p: FastP,
    /// Geometric mean of the best correct speedups; `None` when no correct candidate was timed.
    /// Failed problems are excluded, not penalised (KernelBench's
    /// `geometric_mean_speed_ratio_correct_only`).
    pub geomean_speedup: Option<f64>,
    /// Share of problems with a correct candidate.
    pub correct_rate: f64,
    /// Share of problems with a candidate that compiled (KernelBench's `compiled` flag).
    pub compiled_rate: f64,
    pub correct: usize,
    pub compiled: usize,
    /// Problems whose best correct candidate has a speedup (the geomean is over these).
    pub timed: usize,
}

/// One point of the curve: everything up to turn `n` (refine) or the first `n` samples (sampling).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepMetrics {
    pub n: u32,
    #[serde(flatten)]
    pub summary: Summary,
    /// Verdicts of this step's candidates alone (turn `n`, or sample `n - 1`), by verdict name.
    pub verdicts: BTreeMap<String, usize>,
    /// Problems whose candidate at this step has no verdict yet (never started, or in progress).
    pub pending: usize,
    /// Findings and excessive-speedup flags of this step's candidates alone.
    #[serde(skip_serializing_if = "Integrity::is_empty")]
    pub integrity: Integrity,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PassAtK {
    pub k: u32,
    pub value: f64,
}

/// The metrics of one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunMetrics {
    pub method: MethodKind,
    /// Length of the curve: turns (refine), samples (sampling), 1 (one-shot).
    pub axis: u32,
    /// Every problem of the run, sorted: the denominator.
    pub problems: Vec<ProblemKey>,
    /// Steps `1..=axis`.
    pub steps: Vec<StepMetrics>,
    /// pass@k for `k = 1..=axis` (sampling and one-shot; empty for refinement, whose turns are not
    /// independent samples).
    pub pass_at_k: Vec<PassAtK>,
}

impl RunMetrics {
    /// The last point of the curve (the run's headline numbers).
    pub fn last(&self) -> Option<&StepMetrics> {
        self.steps.last()
    }

    /// Findings and speedup flags of every candidate on the curve (the steps' sum).
    pub fn integrity(&self) -> Integrity {
        let mut total = Integrity::default();
        for s in &self.steps {
            total.merge(&s.integrity);
        }
        total
    }
}

/// What a run's metrics are computed from.
#[derive(Debug, Clone, Copy)]
pub struct RunInput<'a> {
    pub method: MethodKind,
    /// Turns for refine, k for sampling, 1 for one-shot ([`crate::config::MethodSection::budget_axis`]).
    pub axis: u32,
    /// Every problem of the run (duplicates are ignored).
    pub problems: &'a [ProblemKey],
    /// Turn records per task, as folded from the log; tasks may have fewer turns than `axis`.
    pub turns: &'a dyn TurnSource,
}

/// Where a run's turn records are read from: a map of them, or the run's reducer itself (the live
/// displays' curve reads the tasks' machines without copying their turns).
pub trait TurnSource: std::fmt::Debug {
    /// The turns of `task` so far, `None` for a task the run does not have.
    fn turns_of(&self, task: TaskId) -> Option<&[TurnRecord]>;
}

impl TurnSource for BTreeMap<TaskId, Vec<TurnRecord>> {
    fn turns_of(&self, task: TaskId) -> Option<&[TurnRecord]> {
        self.get(&task).map(Vec::as_slice)
    }
}

impl TurnSource for crate::state::RunState {
    fn turns_of(&self, task: TaskId) -> Option<&[TurnRecord]> {
        self.tasks.get(&task).map(|t| t.turns())
    }
}

impl<'a> RunInput<'a> {
    /// The candidate of each attempt `1..=axis` of `problem`, in budget order; `None` where the log
    /// has no record for it.
    pub(crate) fn attempts(&self, problem: ProblemKey) -> Vec<Option<&'a TurnRecord>> {
        (1..=self.axis)
            .map(|a| {
                let (sample, turn) = attempt_position(self.method, a);
                self.turns
                    .turns_of(TaskId { problem, sample })
                    .and_then(|records| records.iter().find(|r| r.turn == turn))
            })
            .collect()
    }

    pub(crate) fn sorted_problems(&self) -> Vec<ProblemKey> {
        let mut problems = self.problems.to_vec();
        problems.sort_unstable();
        problems.dedup();
        problems
    }
}

/// Task sample and turn of attempt `a` (1-based) of a problem.
pub(crate) fn attempt_position(method: MethodKind, a: u32) -> (u32, u32) {
    match method {
        MethodKind::Refine | MethodKind::OneShot => (0, a),
        MethodKind::Sampling => (a - 1, 1),
    }
}

/// The distinct problems of a run's tasks, sorted (from `RunStarted.task_ids`).
pub fn run_problems(task_ids: &[TaskId]) -> Vec<ProblemKey> {
    let mut problems: Vec<ProblemKey> = task_ids.iter().map(|t| t.problem).collect();
    problems.sort_unstable();
    problems.dedup();
    problems
}

/// A problem's standing after some candidates.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Best {
    correct: bool,
    compiled: bool,
    speedup: Option<f64>,
}

impl Best {
    pub(crate) fn add(&mut self, r: &TurnRecord) {
        // Only finished turns count: an in-progress turn has not earned anything yet.
        if r.verdict.is_none() {
            return;
        }
        if r.exec.as_ref().is_some_and(|e| e.compiled) {
            self.compiled = true;
        }
        if r.verdict == Some(Verdict::Correct) {
            self.correct = true;
            // A non-finite or non-positive speedup is a broken measurement; it would poison max and log.
            // In strict mode an unverified excessive speedup does not count (see `integrity`).
            if let Some(s) = counted_speedup(r).filter(|s| s.is_finite() && *s > 0.0) {
                self.speedup = Some(self.speedup.map_or(s, |b| b.max(s)));
            }
        }
    }
}

/// fast_p, geomean and rates over `bests` (one per problem; the slice length is the denominator).
pub(crate) fn summarize(bests: &[Best]) -> Summary {
    let total = bests.len();
    let share = |count: usize| {
        if total == 0 {
            0.0
        } else {
            count as f64 / total as f64
        }
    };
    let mut fast = [0usize; 6];
    let mut log_sum = 0.0;
    let mut timed = 0;
    for b in bests {
        if let Some(s) = b.speedup {
            timed += 1;
            log_sum += s.ln();
            for (count, p) in fast.iter_mut().zip(FAST_P_THRESHOLDS) {
                // Strict, as KernelBench: a candidate exactly as fast as the reference is not fast_1.
                if s > p {
                    *count += 1;
                }
            }
        }
    }
    let correct = bests.iter().filter(|b| b.correct).count();
    let compiled = bests.iter().filter(|b| b.compiled).count();
    Summary {
        fast_p: FastP(fast.map(share)),
        geomean_speedup: (timed > 0).then(|| (log_sum / timed as f64).exp()),
        correct_rate: share(correct),
        compiled_rate: share(compiled),
        correct,
        compiled,
        timed,
    }
}

/// fast_p of the whole run (every finished candidate) at any `thresholds`, as shares in `0..=1`, with
/// the same rules as [`FastP`] (strict `>`, unverified strict-mode speedups left out). For thresholds
/// beyond KernelBench's fixed set, such as Fast@1.2.
pub fn fast_p_at(run: &RunInput<'_>, thresholds: &[f64]) -> Vec<f64> {
    let problems = run.sorted_problems();
    let mut fast = vec![0usize; thresholds.len()];
    for &problem in &problems {
        let mut best = Best::default();
        for r in run.attempts(problem).into_iter().flatten() {
            best.add(r);
        }
        if let Some(s) = best.speedup {
            for (count, p) in fast.iter_mut().zip(thresholds) {
                if s > *p {
                    *count += 1;
                }
            }
        }
    }
    let total = problems.len();
    fast.into_iter()
        .map(|c| {
            if total == 0 {
                0.0
            } else {
                c as f64 / total as f64
            }
        })
        .collect()
}

/// The metrics of a run: one [`StepMetrics`] per step `1..=axis`, and pass@k where it applies.
pub fn run_metrics(run: &RunInput<'_>) -> RunMetrics {
    let problems = run.sorted_problems();
    let attempts: Vec<Vec<Option<&TurnRecord>>> =
        problems.iter().map(|&p| run.attempts(p)).collect();
    let mut bests = vec![Best::default(); problems.len()];
    let mut steps = Vec::with_capacity(run.axis as usize);
    for n in 1..=run.axis {
        let idx = (n - 1) as usize;
        let mut verdicts = BTreeMap::new();
        let mut pending = 0;
        let mut integrity = Integrity::default();
        for (best, list) in bests.iter_mut().zip(&attempts) {
            let record = list.get(idx).copied().flatten();
            match record.and_then(|r| r.verdict) {
                Some(v) => *verdicts.entry(v.as_str().to_string()).or_insert(0) += 1,
                None => pending += 1,
            }
            if let Some(r) = record {
                best.add(r);
                integrity.add(r);
            }
        }
        steps.push(StepMetrics {
            n,
            summary: summarize(&bests),
            verdicts,
            pending,
            integrity,
        });
    }
    let pass_at_k = match run.method {
        MethodKind::Refine => Vec::new(),
        MethodKind::Sampling | MethodKind::OneShot => (1..=run.axis)
            .map(|k| PassAtK {
                k,
                value: mean_pass_at_k(&attempts, k),
            })
            .collect(),
    };
    RunMetrics {
        method: run.method,
        axis: run.axis,
        problems,
        steps,
        pass_at_k,
    }
}

/// pass@k averaged over problems; per problem n = finished samples, c = correct ones. A problem with
/// no finished sample counts as 0 (it stays in the denominator, like fast_p).
fn mean_pass_at_k(attempts: &[Vec<Option<&TurnRecord>>], k: u32) -> f64 {
    if attempts.is_empty() {
        return 0.0;
    }
    let sum: f64 = attempts
        .iter()
        .map(|list| {
            let finished = list.iter().flatten().filter(|r| r.verdict.is_some());
            let (n, c) = finished.fold((0u64, 0u64), |(n, c), r| {
                (n + 1, c + u64::from(r.verdict == Some(Verdict::Correct)))
            });
            pass_at_k(n, c, u64::from(k))
        })
        .sum();
    sum / attempts.len() as f64
}

/// The unbiased pass@k estimator (Chen et al. 2021, as KernelBench computes it):
/// `1 − Π_{i=n−c+1..=n} (1 − k/i)`, and 1 when `n − c < k`.
///
/// `k` is capped at `n` as KernelBench does; with no correct sample (or no sample) the result is 0,
/// which the plain formula gets wrong when `k > n`. `c` above `n` is treated as `n`.
pub fn pass_at_k(n: u64, c: u64, k: u64) -> f64 {
    let c = c.min(n);
    if c == 0 {
        return 0.0;
    }
    let k = k.min(n);
    if n - c < k {
        return 1.0;
    }
    // The product form avoids the huge binomials of C(n−c, k) / C(n, k).
    let miss: f64 = (n - c + 1..=n).map(|i| 1.0 - k as f64 / i as f64).product();
    1.0 - miss
}
