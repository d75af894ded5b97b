//! A run as a list of attempts per problem, each with what it achieved and what it cost along every
//! budget axis (LLM calls, tokens, USD, device seconds): the input of [`super::compare`].

use std::collections::BTreeMap;

use serde::Serialize;

use crate::types::{Event, LogRecord, ProblemKey, TaskId};

use super::{Best, Ledger, RunInput};

/// One attempt of a problem (a refinement turn, or one sample): its outcome alone and its cost.
#[derive(Debug, Clone, Copy, Default)]
pub struct Attempt {
    /// The outcome, counted as the metrics count it (unfinished attempts count as nothing).
    pub(crate) outcome: Best,
    pub cost: AttemptCost,
}

/// What one attempt spent.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct AttemptCost {
    /// Prompt + completion tokens of its LLM answer (0 when the provider sent no usage).
    pub tokens: u64,
    /// USD of its LLM answer (0 when unpriced).
    pub usd: f64,
    /// Seconds of device leases held for it (execution and profiling): GPU-seconds on a GPU run,
    /// CPU-device seconds on a CPU run.
    pub gpu_s: f64,
}

impl Attempt {
    /// An attempt with a given outcome; `speedup` counts only when `correct` (and is finite, > 0).
    pub fn new(
        finished: bool,
        compiled: bool,
        correct: bool,
        speedup: Option<f64>,
        cost: AttemptCost,
    ) -> Attempt {
        let outcome = if finished {
            Best {
                correct,
                compiled: compiled || correct,
                speedup: speedup.filter(|s| correct && s.is_finite() && *s > 0.0),
            }
        } else {
            Best::default()
        };
        Attempt { outcome, cost }
    }

    pub fn correct(&self) -> bool {
        self.outcome.correct
    }

    pub fn speedup(&self) -> Option<f64> {
        self.outcome.speedup
    }
}

/// The attempts of each problem of a run, in budget order.
pub type RunAttempts = BTreeMap<ProblemKey, Vec<Attempt>>;

/// Milliseconds of device leases held per (task, turn), from `lease_released` records.
pub fn device_ms_per_turn(records: &[LogRecord]) -> BTreeMap<(TaskId, u32), u64> {
    let mut out = BTreeMap::new();
    for rec in records {
        if let (Some(task), Event::LeaseReleased { held_ms, turn, .. }) = (rec.task, &rec.event) {
            let e: &mut u64 = out.entry((task, *turn)).or_insert(0);
            *e = e.saturating_add(*held_ms);
        }
    }
    out
}

/// Every problem's attempts `1..=axis` with outcome (as [`Best::add`] counts a record) and cost.
pub fn run_attempts(
    run: &RunInput<'_>,
    ledger: &Ledger,
    device_ms: &BTreeMap<(TaskId, u32), u64>,
) -> RunAttempts {
    run.sorted_problems()
        .into_iter()
        .map(|problem| {
            let attempts = run
                .attempts(problem)
                .into_iter()
                .enumerate()
                .map(|(i, record)| {
                    let (sample, turn) = super::attempt_position(run.method, i as u32 + 1);
                    let task = TaskId { problem, sample };
                    let spend = ledger
                        .per_task_turn
                        .get(&task)
                        .and_then(|t| t.get(&turn))
                        .copied()
                        .unwrap_or_default();
                    let mut outcome = Best::default();
                    if let Some(r) = record {
                        outcome.add(r);
                    }
                    Attempt {
                        outcome,
                        cost: AttemptCost {
                            tokens: spend.tokens(),
                            usd: spend.cost_usd,
                            gpu_s: device_ms.get(&(task, turn)).copied().unwrap_or(0) as f64
                                / 1000.0,
                        },
                    }
                })
                .collect();
            (problem, attempts)
        })
        .collect()
}
