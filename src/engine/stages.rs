//! The steps a driver performs for its task's commands: generate (prompt, LLM, code), compile, and
//! execute or profile under a device lease.

use std::sync::atomic::Ordering;

use super::{EngineError, Shared, Step};
use crate::cpu_budget::Claim;
use crate::llm::extract::extract_code;
use crate::refprep::Preparer;
use crate::services::{BuildPause, CompileJob, DeviceId, ExecJob, LlmError, Unavailable};
use crate::store::RunDir;
use crate::types::{Event, LlmRequest, ProblemKey, PromptContext, TaskId, WaitingOn};
use tokio_util::sync::CancellationToken;

/// A task's claim on its problem's reference data: on from the start of its LLM request until its
/// execute (or until the driver stops), so that the data is prepared meanwhile (`crate::refprep`).
pub(super) struct Interest<'a> {
    /// The run's preparation (`None`: off, and the interest is nothing).
    pub(super) prep: Option<&'a Preparer>,
    pub(super) problem: ProblemKey,
    /// Told to the preparation and not yet withdrawn.
    pub(super) on: bool,
}

impl Interest<'_> {
    pub(super) fn start(&mut self) {
        if let (false, Some(prep)) = (self.on, self.prep) {
            prep.coming(self.problem);
            self.on = true;
        }
    }

    pub(super) fn end(&mut self) {
        if let (true, Some(prep)) = (self.on, self.prep) {
            prep.arrived(self.problem);
        }
        self.on = false;
    }
}

impl Drop for Interest<'_> {
    fn drop(&mut self) {
        self.end();
    }
}

/// Generate: render the prompt, ask the LLM (behind its gate), extract and store the code.
pub(super) async fn generate(
    shared: &Shared,
    task: TaskId,
    turn: u32,
    context: &PromptContext,
    interest: &mut Interest<'_>,
) -> Result<Step, EngineError> {
    if shared.llm_stopped.load(Ordering::SeqCst) {
        return Ok(Step::Halt);
    }
    let problem = shared.problem(task)?;
    let messages = shared
        .prompts
        .render(&problem, context, &shared.prompt_settings)
        .map_err(|e| EngineError::Prompt {
            task,
            turn,
            message: e.to_string(),
        })?;
    // The exact messages, for whoever reads the run later (the TUI's detail view); a failure to
    // write them costs the display, not the turn.
    let prompt_file = match shared
        .dir
        .write_prompt(&shared.prompt_files, task, turn, &messages)
        .await
    {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!("cannot store the prompt of task {task} turn {turn}: {e}");
            None
        }
    };
    let Some(result) = cancellable(&shared.cancel, async {
        let _permit = shared.llm_gate.acquire().await;
        if shared.llm_stopped.load(Ordering::SeqCst) {
            return None;
        }
        // The answer is on its way: prepare its problem's reference data meanwhile.
        interest.start();
        // Appended directly (not through the sink) so it always precedes the answer in the log.
        let started = Event::LlmStarted { turn, prompt_file };
        if let Err(e) = shared.append(Some(task), started).await {
            tracing::error!("cannot log an informational event: {e}");
        }
        let req = LlmRequest {
            task,
            turn,
            messages,
        };
        Some(shared.llm.complete(req, &shared.sink).await)
    })
    .await
    .flatten() else {
        return Ok(Step::Halt);
    };
    Ok(match result {
        Ok(answer) => {
            let code = extract_code(&answer.content);
            let code_file = match &code {
                Some(c) => Some(
                    shared
                        .dir
                        .write_kernel(&shared.kernel_files, task, turn, c)
                        .await?,
                ),
                None => None,
            };
            Step::Event(Event::LlmAnswered {
                turn,
                answer,
                code,
                code_file,
            })
        }
        Err(LlmError::Failed(error)) => Step::Event(Event::LlmFailed {
            turn,
            error,
            fatal: false,
        }),
        Err(LlmError::Unavailable(error)) => Step::Defer {
            waiting_on: WaitingOn::Llm,
            error,
        },
        Err(LlmError::Fatal(reason)) => {
            // Nothing is logged for the task: after the cause is fixed, a resume asks again for
            // exactly this turn.
            tracing::error!("LLM requests stopped: {reason}");
            shared.stop(super::StopReason::LlmStopped(reason));
            Step::Halt
        }
        Err(LlmError::Cancelled) => Step::Halt,
    })
}

/// Precompile: build the candidate in the CPU compile pool.
pub(super) async fn compile(shared: &Shared, task: TaskId, turn: u32, code: String) -> Step {
    let job = CompileJob {
        task,
        turn,
        code,
        log_path: shared.dir.compile_log_path(task, turn),
    };
    let result = cancellable(&shared.cancel, async {
        // A build made before (or a failure cached) answers at once: no compile slot, no cores.
        if let Some(outcome) = shared.compiler.cached(&job).await {
            return Ok(outcome);
        }
        // A build that would use the run's shared headers waits for them while they are made.
        let _permit = shared.header_warm.gate(shared, &job).await;
        // The build's share of the CPU budget: what builds were measured to use.
        let _cores = match &shared.cpu {
            Some(cpu) => Some(cpu.build().await),
            None => None,
        };
        let outcome = shared.compiler.compile(job).await;
        if let (Some(cpu), Ok(o)) = (&shared.cpu, &outcome)
            && let Some(used) = o.cpu
        {
            cpu.measured_build(used.cpu_ms, used.wall_ms);
        }
        outcome
    })
    .await;
    match result {
        None => Step::Halt,
        Some(Err(Unavailable(error))) => Step::Defer {
            waiting_on: WaitingOn::Workers,
            error,
        },
        Some(Ok(mut outcome)) => {
            outcome.log_path = outcome.log_path.map(|p| relative_to(&shared.dir, &p));
            Step::Event(Event::Compiled { turn, outcome })
        }
    }
}

/// What keeps the cores quiet while the CPU device times a candidate.
#[allow(dead_code, reason = "the fields are held for their Drop only")]
enum Quiet<'a> {
    /// The compiler paused its running builds (and holds new ones back).
    Paused(BuildPause),
    /// The compiler cannot pause: every compile slot is held, so no build runs.
    Drained(tokio::sync::SemaphorePermit<'a>),
}

/// Execute or profile the turn's candidate under a device lease; the lease's wait, hold and busy
/// times are logged around it.
pub(super) async fn on_device(
    shared: &Shared,
    task: TaskId,
    turn: u32,
    code: String,
    build_dir: Option<String>,
    profile: bool,
) -> Result<Step, EngineError> {
    let job = ExecJob {
        task,
        turn,
        problem: shared.problem(task)?,
        code,
        build_dir,
    };
    // Its stored inputs stay in the store until this evaluation ends (another problem's entry is
    // refused room rather than evicting them while this candidate waits for the device).
    let _inputs = shared.executor.hold_inputs(&job.problem);
    // The problem's inputs are made on the CPU off the lease (`crate::refprep`): wait for them
    // here, holding nothing, rather than making them again on the device.
    if let Some(prep) = shared.prep.as_deref()
        && cancellable(&shared.cancel, prep.inputs_ready(job.problem.key))
            .await
            .is_none()
    {
        return Ok(Step::Halt);
    }
    // A lost device (its worker no longer starts there, or its host was drained) is retired and
    // the step goes to another device; queued steps never name a device, so they take the others.
    loop {
        let asked = std::time::Instant::now();
        let lease = match cancellable(
            &shared.cancel,
            shared.devices.acquire_for(Some(job.problem.key)),
        )
        .await
        {
            None => return Ok(Step::Halt),
            Some(Some(lease)) => lease,
            Some(None) => {
                return Ok(Step::Defer {
                    waiting_on: WaitingOn::Workers,
                    error: format!("every device was lost: {}", shared.devices.lost_summary()),
                });
            }
        };
        let (step, retired) = leased(shared, lease, asked, &job, task, turn, profile).await?;
        if !retired {
            return Ok(step);
        }
    }
}

/// One attempt of [`on_device`] under `lease`; true when the device was lost (and retired) on the
/// way.
async fn leased(
    shared: &Shared,
    lease: crate::gpu::Lease,
    asked: std::time::Instant,
    job: &ExecJob,
    task: TaskId,
    turn: u32,
    profile: bool,
) -> Result<(Step, bool), EngineError> {
    let job = job.clone();
    // On the CPU device, builds would run on the cores being timed. The compiler pauses the builds
    // in flight (a build that hangs must not hold timing back for its whole timeout) and holds new
    // ones back until the lease ends. A compiler that cannot pause is drained instead: every
    // compile slot is taken (FIFO, so builds queue behind, not starve).
    let _quiet = if lease.device.id == DeviceId::Cpu {
        let quiet = async {
            match shared.compiler.pause_builds().await {
                Some(p) => Ok(Quiet::Paused(p)),
                None => shared
                    .compile_gate
                    .acquire_many(shared.compile_slots)
                    .await
                    .map(Quiet::Drained),
            }
        };
        let quiet = match cancellable(&shared.cancel, quiet).await {
            Some(Ok(q)) => q,
            // Cancelled, or the gate closed (it never is).
            Some(Err(_)) | None => return Ok((Step::Halt, false)),
        };
        // Nothing else of the CPU budget starts, and the input makers (which cannot pause) end.
        let cores = match &shared.cpu {
            Some(cpu) => match cancellable(&shared.cancel, cpu.claim(Claim::Quiet, 0)).await {
                Some(g) => Some(g),
                None => return Ok((Step::Halt, false)),
            },
            None => None,
        };
        Some((quiet, cores))
    } else {
        None
    };
    let device = lease.device.id.clone();
    let granted = std::time::Instant::now();
    shared
        .append(
            Some(task),
            Event::LeaseGranted {
                device: device.to_string(),
                // Waiting for the compile pool to pause counts as waiting, not holding.
                wait_ms: asked.elapsed().as_millis() as u64,
                turn,
            },
        )
        .await?;
    let step = if profile {
        match cancellable(&shared.cancel, shared.executor.profile(job, &device)).await {
            None => Step::Halt,
            Some(Ok(outcome)) => Step::Event(Event::Profiled { turn, outcome }),
            Some(Err(Unavailable(error))) => Step::Defer {
                waiting_on: WaitingOn::Workers,
                error,
            },
        }
    } else {
        match cancellable(&shared.cancel, shared.executor.execute(job, &device)).await {
            None => Step::Halt,
            Some(Ok(outcome)) => Step::Event(Event::Executed { turn, outcome }),
            Some(Err(Unavailable(error))) => Step::Defer {
                waiting_on: WaitingOn::Workers,
                error,
            },
        }
    };
    let held_ms = granted.elapsed().as_millis() as u64;
    let lost = match &step {
        Step::Defer { error, .. } if shared.executor.retired(&device) => Some(error.clone()),
        _ => None,
    };
    let remaining = match &lost {
        Some(why) => {
            tracing::warn!("device {device} is lost and retired: {why}");
            Some(lease.retire(why))
        }
        None => {
            drop(lease);
            None
        }
    };
    // Busy = the time the device ran work, as the worker measured it; the rest of the hold is
    // loading the candidate, isolation, the orchestrator and the protocol.
    let busy_ms = match &step {
        Step::Event(Event::Executed { outcome, .. }) => gpu_work_ms(&outcome.phases).min(held_ms),
        Step::Event(Event::Profiled { outcome, .. }) => outcome.duration_ms.min(held_ms),
        // Nothing measured: no work is claimed.
        _ => 0,
    };
    shared
        .append(
            Some(task),
            Event::LeaseReleased {
                device: device.to_string(),
                held_ms,
                busy_ms,
                turn,
            },
        )
        .await?;
    if let (Some(error), Some(remaining)) = (lost, remaining) {
        let event = Event::DeviceRetired {
            device: device.to_string(),
            error,
            remaining: remaining as u32,
        };
        shared.append(None, event).await?;
        return Ok((step, true));
    }
    Ok((step, false))
}

/// The worker's phases in which the device runs work: the reference's forwards, the candidate's
/// correctness trials and both timings. Loading the candidate (an import, on the CPU), isolation and
/// waiting for a spare process are not.
pub const DEVICE_PHASES: [&str; 4] = ["reference_s", "correctness_s", "timing_s", "ref_timing_s"];

/// Milliseconds of device work in an evaluation's `phases` (see [`DEVICE_PHASES`]).
pub fn gpu_work_ms(phases: &serde_json::Map<String, serde_json::Value>) -> u64 {
    let secs: f64 = DEVICE_PHASES
        .iter()
        .filter_map(|k| phases.get(*k)?.as_f64())
        .filter(|s| s.is_finite() && *s > 0.0)
        .sum();
    (secs * 1000.0).round() as u64
}

/// Run `fut` unless the run is cancelled first.
pub(super) async fn cancellable<F: std::future::Future>(
    cancel: &CancellationToken,
    fut: F,
) -> Option<F::Output> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => None,
        out = fut => Some(out),
    }
}

pub(super) fn relative_to(dir: &RunDir, p: &str) -> String {
    std::path::Path::new(p)
        .strip_prefix(dir.root())
        .map(|r| r.to_string_lossy().into_owned())
        .unwrap_or_else(|_| p.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_work_is_the_forward_phases_only() {
        let phases = serde_json::json!({
            "load_s": 2.0, "isolation_s": 0.5, "spawn_wait_s": 1.0,
            "reference_s": 0.25, "correctness_s": 0.125, "timing_s": 1.5, "ref_timing_s": 0.0625,
        });
        assert_eq!(gpu_work_ms(phases.as_object().unwrap()), 1938);
        let odd = serde_json::json!({"timing_s": -1.0, "correctness_s": "x", "reference_s": 0.001});
        assert_eq!(gpu_work_ms(odd.as_object().unwrap()), 1);
        assert_eq!(gpu_work_ms(&serde_json::Map::new()), 0);
    }
}
