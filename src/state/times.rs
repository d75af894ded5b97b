//! Where a run's time went, as its records measured it, kept by the reducer ([`super::RunState`])
//! beside the ledger: the stages' totals (builds made, inputs made on the CPU, the evaluations'
//! measured phases), when the first result came, and when leases were waited for and held. The
//! benchmarks read it (`bench throughput`: time per stage; `bench scheduler`: GPU occupancy while
//! executions waited).

use std::collections::BTreeMap;

use crate::types::{Event, LogRecord};

/// A run's time by stage and its leases' spans, from the records applied so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Times {
    /// When the first evaluation's result was logged (the first `executed` record), unix ms.
    pub first_result_ts: Option<u64>,
    /// Evaluations that reached a device (one `executed` record each), by the device named in
    /// their outcome.
    pub evaluations: BTreeMap<String, u32>,
    /// Compile time of the builds made, cache hits excluded (they built nothing).
    pub build_ms: u64,
    /// Inputs made on the CPU with no lease held (`inputs_prepared`).
    pub inputs_ms: u64,
    /// The evaluations' measured phases (`ExecOutcome::phases`: `load_s`, `timing_s`, ...), each
    /// summed over the run, in seconds as the worker wrote them.
    pub phases_s: BTreeMap<String, f64>,
    /// Waits for a lease, each (asked, granted) in unix ms, in log order; waits of no time left
    /// out. With `lease_holds`, what GPU occupancy while executions queued is measured from.
    pub lease_waits: Vec<(u64, u64)>,
    /// Leases held, each (granted, released) in unix ms as the release measured it, in log order.
    pub lease_holds: Vec<(u64, u64)>,
}

impl Times {
    /// Count one (persisted) record.
    pub fn apply(&mut self, rec: &LogRecord) {
        match &rec.event {
            Event::Executed { outcome, .. } => {
                self.first_result_ts.get_or_insert(rec.ts_ms);
                *self.evaluations.entry(outcome.device.clone()).or_default() += 1;
                for (phase, value) in &outcome.phases {
                    if let Some(s) = value.as_f64() {
                        *self.phases_s.entry(phase.clone()).or_default() += s;
                    }
                }
            }
            Event::Compiled { outcome, .. } if !outcome.cached => {
                self.build_ms = self.build_ms.saturating_add(outcome.duration_ms);
            }
            Event::InputsPrepared { outcome, .. } => {
                self.inputs_ms = self.inputs_ms.saturating_add(outcome.duration_ms);
            }
            Event::LeaseGranted { wait_ms, .. } if *wait_ms > 0 => {
                self.lease_waits
                    .push((rec.ts_ms.saturating_sub(*wait_ms), rec.ts_ms));
            }
            Event::LeaseReleased { held_ms, .. } => {
                self.lease_holds
                    .push((rec.ts_ms.saturating_sub(*held_ms), rec.ts_ms));
            }
            _ => {}
        }
    }

    /// Evaluations over all devices.
    pub fn evaluated(&self) -> u32 {
        self.evaluations.values().sum()
    }

    /// One measured phase summed over the run, in seconds (0 where no evaluation measured it).
    pub fn phase_s(&self, phase: &str) -> f64 {
        self.phases_s.get(phase).copied().unwrap_or(0.0)
    }
}
