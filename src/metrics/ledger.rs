//! What a run spent: LLM tokens and USD (per turn, per task, in total), LLM attempts and retries, device
//! lease time and wait, and compile time — all read from the event log.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::types::{CompileStatus, Event, LlmAnswer, LogRecord, MethodKind, TaskId};

use super::attempt_position;

/// LLM spending of a set of answers.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Spend {
    /// Answers counted (`LlmAnswered` events).
    pub answers: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Reasoning tokens as the provider reports them; most providers include them in
    /// `completion_tokens` already, so they are not added to [`Spend::tokens`].
    pub reasoning_tokens: u64,
    /// Sum of the costs that were known.
    pub cost_usd: f64,
    /// Answers without `usage`: their tokens are missing from the sums.
    pub answers_without_usage: u64,
    /// Answers without a cost: their USD is missing from `cost_usd`.
    pub answers_without_cost: u64,
}

impl Spend {
    /// Prompt plus completion tokens.
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }

    /// True when at least one answer carried a cost (so `cost_usd` means something).
    pub fn priced(&self) -> bool {
        self.answers > self.answers_without_cost
    }

    /// The cost as reports show it: `None` when no answer carried a cost, so "free" and "unknown"
    /// are not confused.
    pub fn usd(&self) -> Option<f64> {
        self.priced().then_some(self.cost_usd)
    }

    /// The spending of one answer.
    pub fn of(answer: &LlmAnswer) -> Spend {
        let usage = answer.usage.unwrap_or_default();
        Spend {
            answers: 1,
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            reasoning_tokens: usage.reasoning_tokens,
            cost_usd: answer.cost_usd.unwrap_or(0.0),
            answers_without_usage: u64::from(answer.usage.is_none()),
            answers_without_cost: u64::from(answer.cost_usd.is_none()),
        }
    }

    pub fn add(&mut self, other: &Spend) {
        self.answers += other.answers;
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
        self.cost_usd += other.cost_usd;
        self.answers_without_usage += other.answers_without_usage;
        self.answers_without_cost += other.answers_without_cost;
    }
}

/// Use of one device (a GPU such as `cuda:0`, or `cpu`) through leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct DeviceUse {
    /// Leases granted.
    pub leases: u64,
    /// Time tasks waited for a lease.
    pub wait_ms: u64,
    /// Time leases were held.
    pub held_ms: u64,
    /// Worker time spent inside leases (useful device time).
    pub busy_ms: u64,
    /// The timed trials of the candidates evaluated on it, as measured (`gpu_work_ms`, per device).
    #[serde(skip_serializing_if = "is_zero")]
    pub work_ms: u64,
}

impl DeviceUse {
    fn add(&mut self, other: &DeviceUse) {
        self.leases += other.leases;
        self.wait_ms += other.wait_ms;
        self.held_ms += other.held_ms;
        self.busy_ms += other.busy_ms;
        self.work_ms += other.work_ms;
    }
}

/// Everything a run spent.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Ledger {
    pub total: Spend,
    /// By turn number, over all tasks.
    pub per_turn: BTreeMap<u32, Spend>,
    pub per_task: BTreeMap<TaskId, Spend>,
    pub per_task_turn: BTreeMap<TaskId, BTreeMap<u32, Spend>>,
    /// HTTP attempts against the provider (`LlmAttempt`).
    pub llm_attempts: u64,
    /// Attempts that failed (an error, or a non-2xx status).
    pub llm_failed_attempts: u64,
    /// Attempts beyond the first of each (task, turn) request.
    pub llm_retries: u64,
    /// Turns whose LLM request failed for good (`LlmFailed`).
    pub llm_failures: u64,
    pub devices: BTreeMap<String, DeviceUse>,
    /// Sum over devices.
    pub device_total: DeviceUse,
    /// Builds (`Compiled` events other than static-check rejections), of which `compiles_cached`
    /// reused an identical build.
    pub compiles: u64,
    pub compiles_cached: u64,
    /// Sum of compile durations (CPU pool time, not wall time: builds overlap).
    pub compile_ms: u64,
    /// From the first to the last record (includes pauses between a run and its resumption).
    pub wall_ms: u64,
    /// Workers lost while serving a request (remote launchers: a node, step or connection died),
    /// each retried on another worker.
    #[serde(skip_serializing_if = "is_zero")]
    pub worker_losses: u64,
    /// The GPU's measured work: the timed trials of candidates and (where measured) references, as
    /// their events measured them (mean x trials). A lower bound of the time the device ran work
    /// (correctness forwards are not timed), reported next to the lease-held time, which is not work.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gpu_work_ms: u64,
    /// Hosts drained after losing workers, in the order they were drained.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub drained_hosts: Vec<String>,
    /// Devices lost and retired (`device_retired`), and why, in the order they were.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub devices_lost: Vec<(String, String)>,
}

/// Milliseconds of timed work in one evaluation: the candidate's timed trials, and the reference's
/// when this evaluation measured it.
pub fn measured_work_ms(o: &crate::types::ExecOutcome) -> u64 {
    let work = |s: &Option<crate::types::TimingStats>| {
        s.as_ref()
            .map_or(0.0, |s| s.mean.max(0.0) * f64::from(s.num_trials))
    };
    let mut ms = work(&o.runtime_stats);
    if o.ref_source.as_deref() == Some("measured") {
        ms += work(&o.ref_runtime_stats);
    }
    ms.round() as u64
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Ledger {
    fn note_losses(&mut self, losses: &[crate::types::WorkerLoss]) {
        self.worker_losses += losses.len() as u64;
        for loss in losses.iter().filter(|l| l.drained) {
            let host = loss.host.clone().unwrap_or_else(|| "?".into());
            if !self.drained_hosts.contains(&host) {
                self.drained_hosts.push(host);
            }
        }
    }
}

/// Fold a run's log into its [`Ledger`]. Pure; records may come in any order.
pub fn ledger(records: &[LogRecord]) -> Ledger {
    let mut l = Ledger::default();
    let mut requests: BTreeSet<(Option<TaskId>, u32)> = BTreeSet::new();
    let mut first_ts = u64::MAX;
    let mut last_ts = 0;
    for rec in records {
        first_ts = first_ts.min(rec.ts_ms);
        last_ts = last_ts.max(rec.ts_ms);
        match &rec.event {
            Event::LlmAnswered { turn, answer, .. } => {
                let spend = Spend::of(answer);
                l.total.add(&spend);
                l.per_turn.entry(*turn).or_default().add(&spend);
                if let Some(task) = rec.task {
                    l.per_task.entry(task).or_default().add(&spend);
                    l.per_task_turn
                        .entry(task)
                        .or_default()
                        .entry(*turn)
                        .or_default()
                        .add(&spend);
                }
            }
            Event::LlmFailed { .. } => l.llm_failures += 1,
            Event::LlmAttempt {
                turn,
                status,
                error,
                ..
            } => {
                l.llm_attempts += 1;
                let ok_status = status.is_none_or(|s| (200..300).contains(&s));
                if error.is_some() || !ok_status {
                    l.llm_failed_attempts += 1;
                }
                requests.insert((rec.task, *turn));
            }
            Event::LeaseGranted {
                device, wait_ms, ..
            } => {
                let d = l.devices.entry(device.clone()).or_default();
                d.leases += 1;
                d.wait_ms += wait_ms;
            }
            Event::LeaseReleased {
                device,
                held_ms,
                busy_ms,
                ..
            } => {
                let d = l.devices.entry(device.clone()).or_default();
                d.held_ms += held_ms;
                d.busy_ms += busy_ms;
            }
            Event::DeviceRetired { device, error, .. } => {
                l.devices_lost.push((device.clone(), error.clone()));
            }
            // A candidate rejected by static checks was never built.
            Event::Compiled { outcome, .. } if outcome.status != CompileStatus::Rejected => {
                l.compiles += 1;
                l.compiles_cached += u64::from(outcome.cached);
                l.compile_ms += outcome.duration_ms;
                l.note_losses(&outcome.worker_losses);
            }
            Event::Executed { outcome, .. } => {
                l.note_losses(&outcome.worker_losses);
                let work = measured_work_ms(outcome);
                l.gpu_work_ms += work;
                if work > 0 {
                    l.devices.entry(outcome.device.clone()).or_default().work_ms += work;
                }
            }
            Event::Profiled { outcome, .. } => l.note_losses(&outcome.worker_losses),
            _ => {}
        }
    }
    l.llm_retries = l.llm_attempts.saturating_sub(requests.len() as u64);
    for d in l.devices.values() {
        l.device_total.add(d);
    }
    l.wall_ms = last_ts.saturating_sub(first_ts);
    l
}

/// LLM spending of each step `1..=axis` of the curve: turn `n` of the sample-0 tasks (refine,
/// one-shot), or sample `n - 1` (sampling), over all problems.
pub fn step_spend(method: MethodKind, axis: u32, ledger: &Ledger) -> Vec<Spend> {
    (1..=axis)
        .map(|n| {
            let (sample, turn) = attempt_position(method, n);
            let mut spend = Spend::default();
            for (task, turns) in &ledger.per_task_turn {
                if task.sample == sample
                    && let Some(s) = turns.get(&turn)
                {
                    spend.add(s);
                }
            }
            spend
        })
        .collect()
}
