//! Evaluating and profiling a candidate on a device's worker: jobs of the evaluation room
//! (`eval_room`). The pool as [`Executor`] only builds the room and hands it the job (the input
//! stages go to the inputs room, `inputs`).
//!
//! A correct candidate whose timing is wild (most calls far slower than its fastest, or a few so
//! slow that they make the mean: something else ran on the device) is evaluated again, at most
//! [`WILD_RETIMES`] times, and the steadiest correct evaluation is kept; one that stays wild, or
//! whose reference timing is wild, is flagged: `metadata.timing_unsteady` says what was wild, and its
//! feedback says it too. (Not an integrity finding: those are about the candidate, this is about the
//! machine it was timed on.) The harness applies the same rule to the reference it times
//! (`kb_eval.steadiest`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use async_trait::async_trait;
use serde_json::{Map, Value, json};

use super::budget::Budget;
use super::eval_room::EvalRoom;
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
    ProfileOutcome, TimingStats, Verdict,
};

/// A timing is wild when its median is more than this many times its fastest call, or its mean this
/// many times its median (the harness's `kb_eval.WILD_SPREAD`, the same rule).
pub const WILD_SPREAD: f64 = 3.0;
/// Evaluations of a correct candidate after a wild timing, before it is flagged.
pub const WILD_RETIMES: u32 = 2;
/// The metadata key of a result whose timing stayed wild: what was wild, in words.
pub const UNSTEADY_TIMING: &str = "timing_unsteady";

/// How wild a timing is: the larger of median / fastest call and mean / median (1.0: steady; also
/// for stats without a fastest call or a median, as old logs have).
pub fn timing_spread(t: &TimingStats) -> f64 {
    let median = if t.median > 0.0 { t.median } else { t.mean };
    if t.min <= 0.0 || median <= 0.0 || !t.mean.is_finite() {
        return 1.0;
    }
    (median / t.min).max(t.mean / median)
}

fn wild(t: Option<&TimingStats>) -> bool {
    t.is_some_and(|t| timing_spread(t) > WILD_SPREAD)
}

/// The candidate's spread, for picking the steadiest of its evaluations (an untimed one is the
/// least steady).
fn candidate_spread(o: &ExecOutcome) -> f64 {
    o.runtime_stats
        .as_ref()
        .map_or(f64::INFINITY, timing_spread)
}

/// Whether a finished evaluation is evaluated again for its timing.
fn retime_wanted(o: &ExecOutcome) -> bool {
    o.verdict == Verdict::Correct && wild(o.runtime_stats.as_ref())
}

/// Flag `o` when its timing (or its reference's) is still wild after `retimed` more evaluations:
/// `metadata.timing_unsteady` and a sentence in its feedback; `metadata.timing_retimed` says how
/// many evaluations were made again.
fn flag_unsteady(o: &mut ExecOutcome, retimed: u32) {
    if retimed > 0 {
        o.metadata
            .insert("timing_retimed".into(), serde_json::json!(retimed));
    }
    if o.verdict != Verdict::Correct {
        return;
    }
    let say = |who: &str, t: &TimingStats| {
        format!(
            "the {who}'s timing is unsteady: its median call took {:.4} ms and its mean {:.4} ms \
             against a fastest call of {:.4} ms (more than {WILD_SPREAD}x apart), so something else \
             likely ran on the device while it was timed",
            if t.median > 0.0 { t.median } else { t.mean },
            t.mean,
            t.min
        )
    };
    let mut said = Vec::new();
    if let Some(t) = o
        .runtime_stats
        .as_ref()
        .filter(|t| timing_spread(t) > WILD_SPREAD)
    {
        let again = match retimed {
            0 => String::new(),
            n => format!(" (evaluated {} times, the steadiest kept)", n + 1),
        };
        said.push(format!("{}{again}", say("candidate", t)));
    }
    if let Some(t) = o
        .ref_runtime_stats
        .as_ref()
        .filter(|t| timing_spread(t) > WILD_SPREAD)
    {
        said.push(say("reference", t));
    }
    if said.is_empty() {
        return;
    }
    let message = format!("{}; the speedup may be off by as much", said.join("; "));
    o.feedback.push_str(&format!("\n(Timing note: {message}.)"));
    o.metadata
        .insert(UNSTEADY_TIMING.into(), serde_json::json!(message));
}

impl EvalRoom<'_> {
    /// Evaluate a candidate on `device`: lost workers retried, a wild timing taken again.
    async fn execute(&self, job: ExecJob, device: &DeviceId) -> Result<ExecOutcome, Unavailable> {
        let slot = self.eval_slot(device)?;
        let retries = self.retries;
        let retired = || slot.retired.load(Ordering::SeqCst);
        let attempt = || self.execute_once(&job, device, slot);
        let (mut outcome, mut losses) = retry_lost(retries, retired, attempt).await?;
        // A wild timing is taken again (the whole evaluation, through the same request: the
        // harness keeps the reference's timing), and the steadiest correct one kept.
        let mut retimed = 0;
        while retimed < WILD_RETIMES && retime_wanted(&outcome) {
            retimed += 1;
            let (mut again, more) = retry_lost(retries, retired, attempt).await?;
            losses.extend(more);
            if again.verdict == Verdict::Correct
                && candidate_spread(&again) < candidate_spread(&outcome)
            {
                // What the first evaluation found of the candidate stays on record.
                for f in std::mem::take(&mut outcome.findings) {
                    if !again.findings.contains(&f) {
                        again.findings.push(f);
                    }
                }
                outcome = again;
            }
        }
        flag_unsteady(&mut outcome, retimed);
        outcome.worker_losses = losses;
        Ok(outcome)
    }

    /// Profile a candidate on `device` (lost workers retried).
    async fn profile(
        &self,
        job: ExecJob,
        device: &DeviceId,
    ) -> Result<ProfileOutcome, Unavailable> {
        let slot = self.eval_slot(device)?;
        let retired = || slot.retired.load(Ordering::SeqCst);
        let attempt = || self.profile_once(&job, device, slot);
        let (mut outcome, losses) = retry_lost(self.retries, retired, attempt).await?;
        outcome.worker_losses = losses;
        Ok(outcome)
    }

    fn candidate_spec(&self, job: &ExecJob) -> (PathBuf, CandidateSpec) {
        let dir = match &job.build_dir {
            Some(d) => PathBuf::from(d),
            None => self.builds.dir_for(&job.code),
        };
        let spec = CandidateSpec {
            source: job.code.clone(),
            build_dir: dir.to_string_lossy().into_owned(),
        };
        (dir, spec)
    }

    fn exec_failure(
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

    fn exec_outcome(
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
                ..r.env.to_eval_env(self.driver.map(str::to_string))
            },
            device: device.to_string(),
            wall_ms: elapsed_ms(started),
            phases: r.phases.to_map(),
            findings: r.findings,
            speedup_check: r.speedup_check,
        }
    }

    fn profile_outcome(r: ProfileResponse, started: Instant) -> ProfileOutcome {
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

    fn profile_failure(err: CallError, started: Instant) -> ProfileOutcome {
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
    fn integrity_spec(&self, hardware: Option<&str>) -> IntegritySpec {
        integrity_spec(self.max_speedup, self.reference.precision, hardware)
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
        self.eval_room().execute(job, device).await
    }

    async fn profile(
        &self,
        job: ExecJob,
        device: &DeviceId,
    ) -> Result<ProfileOutcome, Unavailable> {
        self.eval_room().profile(job, device).await
    }

    fn prepares_reference(&self) -> bool {
        true
    }

    async fn plan_inputs(
        &self,
        problems: Vec<Arc<Problem>>,
        processes: Option<u32>,
    ) -> HashMap<ProblemKey, InputsPlan> {
        self.inputs.plan(&problems, processes).await
    }

    async fn make_inputs(
        &self,
        problem: Arc<Problem>,
        processes: Option<u32>,
    ) -> Result<Option<InputsOutcome>, Unavailable> {
        self.inputs.make(&problem, processes).await
    }

    fn hold_inputs(&self, problem: &Problem) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        self.inputs.hold(problem)
    }

    async fn prepare_reference(
        &self,
        problem: Arc<Problem>,
        device: &DeviceId,
        quiet: bool,
    ) -> Result<PrepareOutcome, Unavailable> {
        self.eval_room().prepare_step(&problem, device, quiet).await
    }

    fn retired(&self, device: &DeviceId) -> bool {
        self.slots
            .eval(device)
            .is_some_and(|s| s.retired.load(Ordering::SeqCst))
    }
}

impl EvalRoom<'_> {
    /// One evaluation attempt: prepare the reference, then evaluate the candidate.
    async fn execute_once(
        &self,
        job: &ExecJob,
        device: &DeviceId,
        slot: &Slot,
    ) -> Result<ExecOutcome, Fault> {
        let started = Instant::now();
        let (build_dir, candidate) = self.candidate_spec(job);
        let _build = self
            .builds
            .lock(&build_dir)
            .await
            .map_err(Fault::Unavailable)?;
        let integrity = self.integrity_spec(slot.hardware().as_deref());
        let (reference, probe_key) = self.reference_spec_keyed(&job.problem, device);
        let request = RequestBody::Evaluate(EvaluateRequest {
            reference,
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
        let (result, reference) = self.calls.call_within(slot, request, budget, true).await;
        let mut outcome = match result {
            Ok(ResponseBody::Evaluate(mut r)) => {
                // The worker's own probe (a field only the worker writes): kept for the next run.
                if let (Some(key), Some(summary)) = (&probe_key, r.precision_probe.take()) {
                    self.probes.record(key, summary).await;
                }
                self.exec_outcome(*r, device, started)
            }
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
        self.calls.check_cow(slot).await;
        outcome.env.ran_on = slot.ran_on();
        Ok(outcome)
    }

    /// One profiling attempt.
    async fn profile_once(
        &self,
        job: &ExecJob,
        device: &DeviceId,
        slot: &Slot,
    ) -> Result<ProfileOutcome, Fault> {
        let started = Instant::now();
        let (build_dir, candidate) = self.candidate_spec(job);
        let _build = self
            .builds
            .lock(&build_dir)
            .await
            .map_err(Fault::Unavailable)?;
        let request = RequestBody::Profile(ProfileRequest {
            reference: self.reference_spec(&job.problem, device),
            candidate,
            row_limit: self.profile_rows,
            ncu: self.ncu,
            profiler: self.profiler.map(|p| p.as_str().to_string()),
            peaks: self
                .ncu
                .then(|| self.integrity_spec(slot.hardware().as_deref())),
        });
        let result = self
            .calls
            .call(slot, request, self.deadlines.profile, true)
            .await;
        self.calls.check_cow(slot).await;
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

    fn stats(min: f64, median: f64, mean: f64) -> TimingStats {
        TimingStats {
            mean,
            median,
            std: 0.0,
            min,
            max: mean * 3.0,
            num_trials: 100,
        }
    }

    #[test]
    fn a_wild_timing_is_flagged_with_its_spread_and_a_steady_one_is_not() {
        // The reference: 0.11 ms at best, 16.1 ms typical.
        assert!(timing_spread(&stats(0.11, 16.1, 14.45)) > WILD_SPREAD);
        // A few very slow calls that make the mean.
        assert!(timing_spread(&stats(1.0, 1.1, 4.0)) > WILD_SPREAD);
        assert!(timing_spread(&stats(1.0, 1.05, 1.2)) <= WILD_SPREAD);
        // Old logs without a median or a fastest call: nothing to say.
        assert_eq!(timing_spread(&stats(0.0, 0.0, 2.0)), 1.0);

        let mut o = ExecOutcome::failure(Verdict::Correct, "cpu", String::new(), 0);
        o.runtime_stats = Some(stats(0.01, 0.5, 0.6));
        o.ref_runtime_stats = Some(stats(0.11, 16.1, 14.45));
        assert!(retime_wanted(&o));
        flag_unsteady(&mut o, 2);
        assert_eq!(o.metadata["timing_retimed"], 2);
        let said = o.metadata[UNSTEADY_TIMING].as_str().unwrap();
        assert!(
            said.contains("the candidate's timing is unsteady"),
            "{said}"
        );
        assert!(
            said.contains("(evaluated 3 times, the steadiest kept)"),
            "{said}"
        );
        assert!(
            said.contains("the reference's timing is unsteady: its median call took 16.1000 ms")
        );
        // Not an integrity finding: those are about the candidate.
        assert!(o.findings.is_empty());
        assert!(o.feedback.contains("(Timing note: "), "{}", o.feedback);

        let mut steady = ExecOutcome::failure(Verdict::Correct, "cpu", String::new(), 0);
        steady.runtime_stats = Some(stats(1.0, 1.02, 1.05));
        assert!(!retime_wanted(&steady));
        flag_unsteady(&mut steady, 0);
        assert!(!steady.metadata.contains_key(UNSTEADY_TIMING));
        assert!(!steady.metadata.contains_key("timing_retimed"));
        // Wrong candidates are neither re-timed nor flagged.
        let mut wrong = ExecOutcome::failure(Verdict::Incorrect, "cpu", String::new(), 0);
        wrong.runtime_stats = Some(stats(0.01, 0.5, 0.6));
        assert!(!retime_wanted(&wrong));
        flag_unsteady(&mut wrong, 0);
        assert!(!wrong.metadata.contains_key(UNSTEADY_TIMING));
    }

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
