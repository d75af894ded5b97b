//! The run's tallies of what it spent, kept by the reducer ([`super::RunState`]) as records are
//! applied: LLM tokens and USD (per turn, per task, in total), LLM attempts and retries, device lease
//! time and wait (also per task and turn: GPU-seconds), and compile time. [`Ledger`] is what reports
//! show of them.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::spend::Spend;
use crate::types::{CompileStatus, Event, LogRecord, TaskId};

/// Use of one device (a GPU such as `cuda:0`, or `cpu`) through leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct DeviceUse {
    /// Leases granted.
    pub leases: u64,
    /// Time tasks waited for a lease.
    pub wait_ms: u64,
    /// Time leases were held.
    pub held_ms: u64,
    /// Time the device ran work inside leases, as the worker measured it (see
    /// `Event::LeaseReleased`), next to `held_ms`.
    pub busy_ms: u64,
    /// The timed trials of the candidates evaluated on it, as measured (`gpu_work_ms`, per device).
    #[serde(skip_serializing_if = "is_zero")]
    pub work_ms: u64,
}

impl DeviceUse {
    fn add(&mut self, other: &DeviceUse) {
        self.leases += other.leases;
        self.wait_ms = self.wait_ms.saturating_add(other.wait_ms);
        self.held_ms = self.held_ms.saturating_add(other.held_ms);
        self.busy_ms = self.busy_ms.saturating_add(other.busy_ms);
        self.work_ms = self.work_ms.saturating_add(other.work_ms);
    }
}

/// Everything a run spent.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Ledger {
    /// LLM spending over the run.
    pub total: Spend,
    /// By turn number, over all tasks.
    pub per_turn: BTreeMap<u32, Spend>,
    /// By task, and by task and turn (what a candidate cost).
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
    /// Lease use by device name (`cpu`, `cuda:0`).
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

/// The ledger as records are applied, with what it needs to finish its derived numbers.
#[derive(Debug, Clone, Default)]
pub struct LedgerTally {
    /// The counts so far; the derived figures (retries, device totals, wall time) are filled in
    /// when the ledger is asked for ([`LedgerTally::ledger`]).
    ledger: Ledger,
    /// (task, turn) of every LLM request that made an attempt: attempts beyond one per request are
    /// retries.
    requests: BTreeSet<(Option<TaskId>, u32)>,
    /// The earliest and latest record's time (unix ms): the ledger's wall time.
    first_ts: Option<u64>,
    last_ts: u64,
    /// Milliseconds of device leases held per (task, turn), from `lease_released` records.
    device_ms: BTreeMap<(TaskId, u32), u64>,
}

impl LedgerTally {
    /// Count one (persisted) record.
    pub fn apply(&mut self, rec: &LogRecord) {
        let l = &mut self.ledger;
        self.first_ts = Some(self.first_ts.map_or(rec.ts_ms, |f| f.min(rec.ts_ms)));
        self.last_ts = self.last_ts.max(rec.ts_ms);
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
                self.requests.insert((rec.task, *turn));
            }
            Event::LeaseGranted {
                device, wait_ms, ..
            } => {
                let d = l.devices.entry(device.clone()).or_default();
                d.leases += 1;
                d.wait_ms = d.wait_ms.saturating_add(*wait_ms);
            }
            Event::LeaseReleased {
                device,
                held_ms,
                busy_ms,
                turn,
            } => {
                let d = l.devices.entry(device.clone()).or_default();
                d.held_ms = d.held_ms.saturating_add(*held_ms);
                d.busy_ms = d.busy_ms.saturating_add(*busy_ms);
                if let Some(task) = rec.task {
                    let e = self.device_ms.entry((task, *turn)).or_insert(0);
                    *e = e.saturating_add(*held_ms);
                }
            }
            // A candidate rejected by static checks was never built.
            Event::Compiled { outcome, .. } if outcome.status != CompileStatus::Rejected => {
                l.compiles += 1;
                l.compiles_cached += u64::from(outcome.cached);
                l.compile_ms = l.compile_ms.saturating_add(outcome.duration_ms);
                l.note_losses(&outcome.worker_losses);
            }
            Event::DeviceRetired { device, error, .. } => {
                l.devices_lost.push((device.clone(), error.clone()));
            }
            Event::Executed { outcome, .. } => {
                l.note_losses(&outcome.worker_losses);
                let work = measured_work_ms(outcome);
                l.gpu_work_ms = l.gpu_work_ms.saturating_add(work);
                if work > 0 {
                    let d = l.devices.entry(outcome.device.clone()).or_default();
                    d.work_ms = d.work_ms.saturating_add(work);
                }
            }
            Event::Profiled { outcome, .. } => l.note_losses(&outcome.worker_losses),
            _ => {}
        }
    }

    /// All LLM spending so far.
    pub fn total(&self) -> &Spend {
        &self.ledger.total
    }

    /// One device's use so far.
    pub fn device(&self, name: &str) -> Option<&DeviceUse> {
        self.ledger.devices.get(name)
    }

    /// Milliseconds of device leases held per (task, turn) (execution and profiling).
    pub fn device_ms(&self) -> &BTreeMap<(TaskId, u32), u64> {
        &self.device_ms
    }

    /// The ledger of the records applied so far.
    pub fn ledger(&self) -> Ledger {
        let mut l = self.ledger.clone();
        l.llm_retries = l.llm_attempts.saturating_sub(self.requests.len() as u64);
        for d in l.devices.values() {
            l.device_total.add(d);
        }
        l.wall_ms = self
            .first_ts
            .map_or(0, |first| self.last_ts.saturating_sub(first));
        l
    }
}
