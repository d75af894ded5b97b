//! Reference preparation through the pool: the `prepare` request, preparing a problem's reference data
//! ahead of its candidates (see `src/refprep/`), and the verdict when preparing ran out of time.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::config::InputsMode;
use super::input_store::{GenerateStatus, InputStore, entry_key};
use super::loss::Fault;
use super::outcome::{CallError, elapsed_ms, secs};
use super::pool::WorkerPool;
use super::protocol::{PrepareRequest, ReferenceSpec, RequestBody, ResponseBody, TimingSpec};
use crate::services::{DeviceId, InputsPlan, Unavailable};
use crate::types::{
    ExecOutcome, INPUTS_DEFERRED, InputsOutcome, PrepareOutcome, Problem, ProblemKey, Verdict,
};

impl WorkerPool {
    /// Build all of `problem`'s reference data on `device` in one request, as every evaluation did
    /// before preparation went step by step (kept for `krefine bench reference`'s "before" figure).
    pub async fn prepare_everything(
        &self,
        problem: &Problem,
        device: &DeviceId,
    ) -> Result<PrepareOutcome, Unavailable> {
        let Some(slot) = self.eval_slot(device) else {
            return Err(Unavailable(format!(
                "device {device} is not served by this worker pool"
            )));
        };
        let request = RequestBody::Prepare(self.prepare_request(problem, device));
        let started = Instant::now();
        let result = self
            .call(slot, request, self.deadlines.reference, false)
            .await;
        Ok(match result {
            Ok(ResponseBody::Prepare(r)) => super::reference::prepare_outcome(r),
            Ok(other) => super::reference::prepare_failed(
                format!("prepare answered with `{}`", other.kind()),
                started,
            ),
            Err(e) => match e.candidate_fault() {
                Ok(e) => {
                    super::reference::prepare_failed(super::reference::call_error_text(&e), started)
                }
                Err(Fault::Unavailable(u)) => return Err(u),
                Err(Fault::Lost(loss)) => super::reference::prepare_failed(
                    format!("worker lost: {}", loss.detail),
                    started,
                ),
            },
        })
    }

    /// The reference data `problem`'s requests on `device` work against (prepare, evaluate and
    /// profile all carry it): the one place the pool's settings become the harness's reference spec.
    pub(super) fn reference_spec(&self, problem: &Problem, device: &DeviceId) -> ReferenceSpec {
        ReferenceSpec {
            problem: Self::problem_spec(problem),
            device: Self::worker_device(device).into(),
            precision: self.settings.precision.as_str().into(),
            mode: self.settings.mode.as_str().into(),
            seed: self.settings.seed,
            correct_trials: self.settings.correct_trials,
            timing: TimingSpec {
                measure: self.settings.timing_trials > 0,
                warmup: self.settings.warmup,
                trials: self.settings.timing_trials,
                // KernelBench's cuda_event defaults: drop the first timed call, flush L2 each time.
                discard_first: 1,
                l2_flush: true,
                method: self.settings.timing_method,
                reference_compile: self.settings.reference_compile.clone(),
            },
            reference_runtime: self
                .settings
                .baseline
                .as_ref()
                .and_then(|b| b.reference_runtime(problem)),
            cast_integer_inputs: self.settings.cast_integer_inputs,
            inputs: (self.settings.inputs == InputsMode::Device)
                .then(|| InputsMode::Device.as_str().into()),
            stored_inputs: self.stored_inputs(problem),
            tolerance: self.settings.tolerance.clone(),
        }
    }

    /// The `prepare` request for `problem` on `device`: everything (no step limit, timed).
    pub(super) fn prepare_request(&self, problem: &Problem, device: &DeviceId) -> PrepareRequest {
        PrepareRequest {
            reference: self.reference_spec(problem, device),
            steps: None,
            quiet: None,
        }
    }

    /// The store key of `problem`'s inputs under this pool's settings.
    fn inputs_key(&self, problem: &Problem) -> String {
        entry_key(
            &problem.code,
            self.settings.seed,
            self.settings.correct_trials,
            self.settings.timing_trials > 0,
            &self.torch,
        )
    }

    /// The store entry of `problem`'s inputs when it is whole (made by this run or any other), on
    /// disk or in the in-memory tier.
    fn stored_inputs(&self, problem: &Problem) -> Option<String> {
        let key = self.inputs_key(problem);
        let dir = [&self.input_store, &self.ram_store]
            .into_iter()
            .flatten()
            .find_map(|store| store.usable(&key))?;
        Some(dir.to_string_lossy().into_owned())
    }

    /// Hold `problem`'s entry in both tiers (see `InputStore::hold`); `None` without a store.
    pub(super) fn hold_inputs_of(
        &self,
        problem: &Problem,
    ) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        let key = self.inputs_key(problem);
        let holds: Vec<_> = [&self.input_store, &self.ram_store]
            .into_iter()
            .flatten()
            .map(|store| store.hold(&key))
            .collect();
        (!holds.is_empty()).then(|| Box::new(holds) as Box<dyn std::any::Any + Send + Sync>)
    }

    async fn ensure_in(
        &self,
        store: &InputStore,
        processes: Option<u32>,
        key: &str,
        problem: &Problem,
    ) -> Result<super::input_store::GenerateAnswer, String> {
        store
            .ensure_with(
                processes,
                key,
                &problem.code,
                self.settings.seed,
                self.settings.correct_trials,
                self.settings.timing_trials > 0,
                &self.torch,
            )
            .await
    }

    /// The plans of `problems`' inputs under this pool's settings (see [`Executor::plan_inputs`]):
    /// one planner process for all of them; empty without a store or when planning fails (logged).
    ///
    /// [`Executor::plan_inputs`]: crate::services::Executor::plan_inputs
    pub(super) async fn plan_inputs_now(
        &self,
        problems: &[Arc<Problem>],
        processes: Option<u32>,
    ) -> HashMap<ProblemKey, InputsPlan> {
        let Some(store) = &self.input_store else {
            return HashMap::new();
        };
        let seeds = self.settings.correct_trials + u32::from(self.settings.timing_trials > 0);
        let codes: Vec<&str> = problems.iter().map(|p| p.code.as_str()).collect();
        match store.plan_entries(&codes, seeds, processes).await {
            Ok(plans) => problems
                .iter()
                .zip(plans)
                .map(|(p, e)| {
                    let plan = InputsPlan {
                        bytes: e.bytes,
                        processes: e.processes.max(1),
                    };
                    (p.key, plan)
                })
                .collect(),
            Err(e) => {
                tracing::warn!("could not plan the problems' inputs (made in arrival order): {e}");
                HashMap::new()
            }
        }
    }

    /// The CPU stage of `problem` (see `crate::refprep`): its inputs made into the store by a
    /// process of their own, while no device lease is held. `None` without a store.
    pub(super) async fn make_inputs_now(
        &self,
        problem: &Problem,
        processes: Option<u32>,
    ) -> Result<Option<InputsOutcome>, Unavailable> {
        let Some(store) = &self.input_store else {
            return Ok(None);
        };
        let started = Instant::now();
        let key = self.inputs_key(problem);
        let tiers: Vec<&InputStore> = [Some(store), self.ram_store.as_ref()]
            .into_iter()
            .flatten()
            .collect();
        // Deferred before (and not made since): no generator is started (it would import torch only
        // to be refused again) until one tier would take the entry now.
        let known = tiers.iter().find_map(|t| t.refused_for_now(&key));
        if let Some(planned) = known
            && self.stored_inputs(problem).is_none()
            && !admits_now(&tiers, &key, planned).await
        {
            return Ok(Some(deferred(planned, elapsed_ms(started))));
        }
        let mut answer = self.ensure_in(store, processes, &key, problem).await;
        // Too large for the disk store: the in-memory tier, still off the lease (the worker would
        // otherwise draw these inputs inside a candidate's lease).
        if let (Ok(disk), Some(ram)) = (&answer, &self.ram_store)
            && disk.status == GenerateStatus::OverBudget
        {
            let refused = disk.detail.clone();
            answer = self
                .ensure_in(ram, processes, &key, problem)
                .await
                .map(|mut a| {
                    a.detail = match a.status {
                        GenerateStatus::OverBudget => format!("{refused}; {}", a.detail),
                        _ => format!("in memory ({refused})"),
                    };
                    a
                });
        }
        // Refused by every tier, but one of them has room once queued candidates are done with
        // their entries: made later (see `crate::refprep`), not inside a lease now.
        if let Ok(a) = &mut answer
            && a.status == GenerateStatus::OverBudget
            && tiers.iter().any(|t| t.refused_for_now(&key).is_some())
        {
            a.status = GenerateStatus::Deferred;
        }
        let duration_ms = elapsed_ms(started);
        Ok(Some(match answer {
            Ok(a) => InputsOutcome {
                status: serde_json::to_value(a.status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
                bytes: a.bytes,
                duration_ms,
                parallel: a.parallel,
                detail: (!a.detail.is_empty()).then_some(a.detail),
            },
            Err(e) => InputsOutcome {
                status: "failed".into(),
                bytes: 0,
                duration_ms,
                parallel: 0,
                detail: Some(e),
            },
        }))
    }

    /// Preparing the reference ran out of time: not the candidate's fault, and no candidate code ran.
    pub(super) fn reference_timeout(
        &self,
        after: Duration,
        device: &DeviceId,
        hardware: Option<String>,
        started: Instant,
    ) -> ExecOutcome {
        let dev = device.to_string();
        let message = format!(
            "preparing the reference (its inputs, outputs and timing) exceeded {} s, so the candidate \
             was not evaluated; the worker was killed. Raise eval.timeouts.reference_s for problems \
             this large",
            secs(after)
        );
        let mut o = ExecOutcome::failure(
            Verdict::ReferenceError,
            &dev,
            message.clone(),
            elapsed_ms(started),
        );
        o.metadata.insert("error".into(), json!(message));
        o.metadata
            .insert("reference_timeout_s".into(), json!(after.as_secs_f64()));
        o.compiled = false;
        self.with_device(o, &dev, hardware)
    }

    pub(super) async fn prepare_step(
        &self,
        problem: Arc<Problem>,
        device: &DeviceId,
        quiet: bool,
    ) -> Result<PrepareOutcome, Unavailable> {
        let Some(slot) = self.eval_slot(device) else {
            return Err(Unavailable(format!(
                "device {device} is not served by this worker pool"
            )));
        };
        let mut request = self.prepare_request(&problem, device);
        request.steps = Some(1);
        request.quiet = Some(quiet);
        let started = Instant::now();
        // Not a candidate's request: it does not count towards recycling the worker.
        let result = self
            .call(
                slot,
                RequestBody::Prepare(request),
                self.deadlines.reference,
                false,
            )
            .await;
        Ok(match result {
            Ok(ResponseBody::Prepare(r)) => super::reference::prepare_outcome(r),
            Ok(other) => super::reference::prepare_failed(
                format!("prepare answered with `{}`", other.kind()),
                started,
            ),
            // A lost worker only delays the preparation: the candidate's own evaluation builds
            // what it needs, retried on another worker.
            Err(CallError::Lost(loss)) => {
                super::reference::prepare_failed(format!("worker lost: {}", loss.detail), started)
            }
            Err(e) => match e.candidate_fault() {
                Ok(e) => {
                    super::reference::prepare_failed(super::reference::call_error_text(&e), started)
                }
                Err(Fault::Unavailable(u)) => return Err(u),
                Err(Fault::Lost(loss)) => super::reference::prepare_failed(
                    format!("worker lost: {}", loss.detail),
                    started,
                ),
            },
        })
    }
}

/// The CPU stage's outcome for an entry no tier takes yet (see [`GenerateStatus::Deferred`]).
fn deferred(planned: u64, duration_ms: u64) -> InputsOutcome {
    InputsOutcome {
        status: INPUTS_DEFERRED.into(),
        bytes: 0,
        duration_ms,
        parallel: 0,
        detail: Some(format!(
            "{planned} bytes wait for room that queued candidates' entries give back"
        )),
    }
}

/// Would any of `tiers` admit `key`'s entry of `planned` bytes now? Each asks under its admission
/// lock (a file lock, and a scan of its folder): off the runtime's threads.
async fn admits_now(tiers: &[&InputStore], key: &str, planned: u64) -> bool {
    for tier in tiers {
        let (tier, key) = ((*tier).clone(), key.to_string());
        let yes = tokio::task::spawn_blocking(move || tier.would_admit(&key, planned))
            .await
            .unwrap_or(false);
        if yes {
            return true;
        }
    }
    false
}
