//! The pool as [`Executor`]: evaluating and profiling a candidate on a device's worker.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use async_trait::async_trait;
use serde_json::{Map, Value, json};

use super::budget::Budget;
use super::loss::{Fault, retry_lost};
use super::outcome::{CallError, Failure, FailureKind, Phase, elapsed_ms, failure, with_tail};
use super::pool::WorkerPool;
use super::protocol::{
    CandidateSpec, EvaluateRequest, EvaluateResponse, IntegritySpec, ProfileRequest,
    ProfileResponse, ProfileStatus, RequestBody, ResponseBody,
};
use super::slot::Slot;
use crate::services::{DeviceId, ExecJob, Executor, InputsPlan, Unavailable};
use crate::types::RequestError;
use crate::types::{
    EvalEnv, ExecOutcome, InputsOutcome, Precision, PrepareOutcome, Problem, ProblemKey,
    ProfileOutcome, Verdict,
};

impl WorkerPool {
    pub(super) fn candidate_spec(&self, job: &ExecJob) -> (PathBuf, CandidateSpec) {
        let dir = match &job.build_dir {
            Some(d) => PathBuf::from(d),
            None => self.build_dir_for(&job.code),
        };
        let spec = CandidateSpec {
            source: job.code.clone(),
            build_dir: dir.to_string_lossy().into_owned(),
        };
        (dir, spec)
    }

    pub(super) fn exec_failure(
        &self,
        err: CallError,
        device: &DeviceId,
        hardware: Option<String>,
        started: Instant,
    ) -> ExecOutcome {
        let dev = device.to_string();
        let wall = elapsed_ms(started);
        let Failure {
            kind,
            mut message,
            log_tail,
        } = failure(&err, Phase::Evaluate);
        let (verdict, mut metadata) = match kind {
            FailureKind::Timeout(after) => {
                let mut m = Map::new();
                // KernelBench's batch evaluator records exactly this for a timeout.
                m.insert("error".into(), json!("Evaluation timed out"));
                m.insert("timeout_s".into(), json!(after.as_secs_f64()));
                let mut o = ExecOutcome::failure(Verdict::Timeout, &dev, message, wall);
                o.metadata = m;
                o.compiled = false;
                return self.with_device(o, &dev, hardware);
            }
            FailureKind::Exited(exit) => {
                // SIGKILL that we did not send: almost always the kernel's out-of-memory killer.
                let oom = exit.signal == Some(9);
                if oom {
                    message.push_str(
                        " (killed from outside, most likely by the out-of-memory killer)",
                    );
                }
                let mut m = Map::new();
                if let Some(c) = exit.code {
                    m.insert("exit_code".into(), json!(c));
                }
                if let Some(s) = exit.signal {
                    m.insert("signal".into(), json!(s));
                }
                let verdict = if oom {
                    Verdict::OutOfMemory
                } else {
                    Verdict::Crashed
                };
                (verdict, m)
            }
            FailureKind::Harness(error) => {
                let mut m = Map::new();
                // KernelBench's batch script names escaped exceptions `other_error`.
                m.insert("other_error".into(), json!(error));
                m.insert("other_error_name".into(), json!("krefine.HarnessError"));
                let mut o = ExecOutcome::failure(Verdict::RuntimeError, &dev, message, wall);
                o.metadata = m;
                o.compiled = false;
                return self.with_device(o, &dev, hardware);
            }
            FailureKind::Broken => (Verdict::Crashed, Map::new()),
        };
        let message = with_tail(message, &log_tail);
        metadata.insert("error".into(), json!(message));
        let mut o = ExecOutcome::failure(verdict, &dev, message, wall);
        o.metadata = metadata;
        self.with_device(o, &dev, hardware)
    }

    /// Orchestrator-made outcomes still say which device they concern.
    pub(super) fn with_device(
        &self,
        mut o: ExecOutcome,
        dev: &str,
        hardware: Option<String>,
    ) -> ExecOutcome {
        // KernelBench's metadata always names the hardware and the device.
        if let Some(h) = hardware {
            o.metadata.insert("hardware".into(), json!(h));
            o.env.device_name = h;
        }
        o.metadata.insert("device".into(), json!(dev));
        o.env.driver = self.settings.driver.clone();
        o.env.precision = Some(self.settings.precision.as_str().into());
        o.env.mode = Some(self.settings.mode.as_str().into());
        o.env.sandbox = Some(self.sandbox_level.as_str().into());
        o
    }

    pub(super) fn exec_outcome(
        &self,
        r: EvaluateResponse,
        device: &DeviceId,
        started: Instant,
    ) -> ExecOutcome {
        ExecOutcome {
            worker_losses: Vec::new(),
            verdict: r.status.verdict(),
            compiled: r.compiled,
            correctness: r.correctness,
            metadata: r.metadata,
            runtime_ms: r.runtime,
            runtime_stats: r.runtime_stats.map(Into::into),
            ref_runtime_ms: r.ref_runtime,
            ref_runtime_stats: r.ref_runtime_stats.map(Into::into),
            ref_source: r.ref_runtime_source,
            speedup: r.speedup,
            feedback: r.feedback,
            env: EvalEnv {
                sandbox: Some(self.sandbox_level.as_str().into()),
                ..r.env.to_eval_env(self.settings.driver.clone())
            },
            device: device.to_string(),
            wall_ms: elapsed_ms(started),
            phases: r.phases.to_map(),
            findings: r.findings,
            speedup_check: r.speedup_check,
        }
    }

    pub(super) fn profile_outcome(r: ProfileResponse, started: Instant) -> ProfileOutcome {
        let ok = r.status == ProfileStatus::Ok;
        let error = if ok {
            None
        } else {
            let status = serde_json::to_value(r.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            Some(match &r.note {
                Some(note) => format!("profiling failed ({status}): {note}"),
                None => format!("profiling failed ({status})"),
            })
        };
        if ok && let Some(note) = &r.note {
            // Informational on success (e.g. ncu not installed); `error` stays for failures only.
            tracing::info!("profile note: {note}");
        }
        ProfileOutcome {
            worker_losses: Vec::new(),
            ok,
            table: r.table,
            ncu: r.ncu.and_then(|n| serde_json::to_value(n).ok()),
            error,
            duration_ms: elapsed_ms(started),
        }
    }

    pub(super) fn profile_failure(err: CallError, started: Instant) -> ProfileOutcome {
        let f = failure(&err, Phase::Profile);
        let error = with_tail(f.message, &f.log_tail);
        ProfileOutcome {
            worker_losses: Vec::new(),
            ok: false,
            table: String::new(),
            ncu: None,
            error: Some(error),
            duration_ms: elapsed_ms(started),
        }
    }

    /// The excessive-speedup guard's inputs for this pool's settings ([`integrity_spec`]).
    pub(super) fn integrity_spec(&self, hardware: Option<&str>) -> IntegritySpec {
        integrity_spec(self.settings.max_speedup, self.settings.precision, hardware)
    }
}

/// The excessive-speedup guard's inputs: the configured bound, and the GPU's peak numbers at the
/// run's precision on its plain units (fp32 without TF32) when the GPU is known. The same in both
/// modes: faithful mode only flags, but its bound is no looser than strict mode's (issue 23: a TF32
/// peak there let a side-stream kernel's x5.2 pass under a x9.6 bound).
fn integrity_spec(
    max_speedup: Option<f64>,
    precision: Precision,
    hardware: Option<&str>,
) -> IntegritySpec {
    let spec = hardware.and_then(crate::prompt::gpu_specs::lookup);
    IntegritySpec {
        max_speedup,
        peak_tflops: spec.map(|g| match precision {
            Precision::Fp32 => g.fp32_tflops,
            Precision::Fp16 => g.fp16_tflops,
            Precision::Bf16 => g.bf16_tflops.unwrap_or(g.fp16_tflops),
        }),
        peak_bandwidth_gbs: spec.map(|g| f64::from(g.memory_bandwidth_gbs)),
    }
}

#[async_trait]
impl Executor for WorkerPool {
    async fn execute(&self, job: ExecJob, device: &DeviceId) -> Result<ExecOutcome, Unavailable> {
        let Some(slot) = self.eval_slot(device) else {
            return Err(Unavailable(format!(
                "device {device} is not served by this worker pool"
            )));
        };
        let retries = self.settings.launcher.loss_retries();
        let retired = || slot.retired.load(Ordering::SeqCst);
        let attempt = || self.execute_once(&job, device, slot);
        let (mut outcome, losses) = retry_lost(retries, retired, attempt).await?;
        outcome.worker_losses = losses;
        Ok(outcome)
    }

    async fn profile(
        &self,
        job: ExecJob,
        device: &DeviceId,
    ) -> Result<ProfileOutcome, Unavailable> {
        let Some(slot) = self.eval_slot(device) else {
            return Err(Unavailable(format!(
                "device {device} is not served by this worker pool"
            )));
        };
        let retries = self.settings.launcher.loss_retries();
        let retired = || slot.retired.load(Ordering::SeqCst);
        let attempt = || self.profile_once(&job, device, slot);
        let (mut outcome, losses) = retry_lost(retries, retired, attempt).await?;
        outcome.worker_losses = losses;
        Ok(outcome)
    }

    fn prepares_reference(&self) -> bool {
        true
    }

    async fn plan_inputs(
        &self,
        problems: Vec<Arc<Problem>>,
        processes: Option<u32>,
    ) -> HashMap<ProblemKey, InputsPlan> {
        self.plan_inputs_now(&problems, processes).await
    }

    async fn make_inputs(
        &self,
        problem: Arc<Problem>,
        processes: Option<u32>,
    ) -> Result<Option<InputsOutcome>, Unavailable> {
        self.make_inputs_now(&problem, processes).await
    }

    fn hold_inputs(&self, problem: &Problem) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        self.hold_inputs_of(problem)
    }

    async fn prepare_reference(
        &self,
        problem: Arc<Problem>,
        device: &DeviceId,
        quiet: bool,
    ) -> Result<PrepareOutcome, Unavailable> {
        self.prepare_step(problem, device, quiet).await
    }

    fn retired(&self, device: &DeviceId) -> bool {
        self.eval_slot(device)
            .is_some_and(|s| s.retired.load(Ordering::SeqCst))
    }
}

impl WorkerPool {
    /// One evaluation attempt: prepare the reference, then evaluate the candidate.
    pub(super) async fn execute_once(
        &self,
        job: &ExecJob,
        device: &DeviceId,
        slot: &Slot,
    ) -> Result<ExecOutcome, Fault> {
        let started = Instant::now();
        let (build_dir, candidate) = self.candidate_spec(job);
        let _build = self
            .lock_build(&build_dir)
            .await
            .map_err(Fault::Unavailable)?;
        let integrity = self.integrity_spec(slot.hardware().as_deref());
        let request = RequestBody::Evaluate(EvaluateRequest {
            reference: self.reference_spec(&job.problem, device),
            candidate,
            integrity: Some(integrity),
        });
        // The reference data the candidate's check reaches is built on demand, trial by trial, if
        // no background preparation (src/refprep/) built it already: that time runs on the
        // reference's allowance, never on the candidate's `execute_s`.
        let budget = Budget {
            own: self.deadlines.execute,
            reference: Some(self.deadlines.reference),
        };
        let (result, reference) = self.call_within(slot, request, budget, true).await;
        let mut outcome = match result {
            Ok(ResponseBody::Evaluate(r)) => self.exec_outcome(*r, device, started),
            Ok(other) => {
                let err = CallError::Request(RequestError::Protocol {
                    detail: format!("evaluate answered with `{}`", other.kind()),
                    log_tail: String::new(),
                });
                self.exec_failure(err, device, slot.hardware(), started)
            }
            Err(CallError::Request(RequestError::ReferenceTimeout { after })) => {
                self.reference_timeout(after, device, slot.hardware(), started)
            }
            Err(e) => {
                let e = e.candidate_fault()?;
                self.exec_failure(e, device, slot.hardware(), started)
            }
        };
        // A failure's wall time may be mostly the reference's (a fresh worker builds it again).
        if !outcome.phases.contains_key("reference_s")
            && let Some(n) = serde_json::Number::from_f64(reference.as_secs_f64())
        {
            outcome
                .phases
                .insert("reference_s".into(), Value::Number(n));
        }
        self.check_cow(slot).await;
        outcome.env.ran_on = slot.ran_on();
        Ok(outcome)
    }

    /// One profiling attempt.
    pub(super) async fn profile_once(
        &self,
        job: &ExecJob,
        device: &DeviceId,
        slot: &Slot,
    ) -> Result<ProfileOutcome, Fault> {
        let started = Instant::now();
        let (build_dir, candidate) = self.candidate_spec(job);
        let _build = self
            .lock_build(&build_dir)
            .await
            .map_err(Fault::Unavailable)?;
        let request = RequestBody::Profile(ProfileRequest {
            reference: self.reference_spec(&job.problem, device),
            candidate,
            row_limit: self.settings.profile_rows,
            ncu: self.settings.ncu,
            profiler: self.settings.profiler.map(|p| p.as_str().to_string()),
            peaks: self
                .settings
                .ncu
                .then(|| self.integrity_spec(slot.hardware().as_deref())),
        });
        let result = self.call(slot, request, self.deadlines.profile, true).await;
        self.check_cow(slot).await;
        match result {
            Ok(ResponseBody::Profile(r)) => Ok(Self::profile_outcome(r, started)),
            Ok(other) => Ok(Self::profile_failure(
                CallError::Request(RequestError::Protocol {
                    detail: format!("profile answered with `{}`", other.kind()),
                    log_tail: String::new(),
                }),
                started,
            )),
            Err(e) => Ok(Self::profile_failure(e.candidate_fault()?, started)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_assumes_plain_fp32_for_fp32_problems() {
        let h100 = crate::prompt::gpu_specs::lookup("NVIDIA H100 80GB HBM3").expect("a known GPU");
        assert!(h100.tf32_tflops.is_some_and(|t| t > h100.fp32_tflops));
        let spec = integrity_spec(None, Precision::Fp32, Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(spec.peak_tflops, Some(h100.fp32_tflops));
        assert_eq!(
            spec.peak_bandwidth_gbs,
            Some(f64::from(h100.memory_bandwidth_gbs))
        );
        assert_eq!(
            integrity_spec(None, Precision::Fp32, None).peak_tflops,
            None
        );
    }
}
