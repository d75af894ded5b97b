//! What the services answer: verdicts, LLM answers, compile, evaluation, profile and preparation
//! outcomes (a floor of [`super`], below the events that carry them).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::basics::*;

/// How a turn ended. Only `Correct` turns have a speedup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Correct,
    Incorrect,
    NoCode,
    CompileError,
    RuntimeError,
    CudaError,
    OutOfMemory,
    Timeout,
    Crashed,
    ReferenceError,
    LlmError,
    /// Rejected before compiling: a static check on the source found an error (strict mode, or a
    /// category configured as `error`; see `checks`).
    Rejected,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Correct => "correct",
            Verdict::Incorrect => "incorrect",
            Verdict::NoCode => "no_code",
            Verdict::CompileError => "compile_error",
            Verdict::RuntimeError => "runtime_error",
            Verdict::CudaError => "cuda_error",
            Verdict::OutOfMemory => "out_of_memory",
            Verdict::Timeout => "timeout",
            Verdict::Crashed => "crashed",
            Verdict::ReferenceError => "reference_error",
            Verdict::LlmError => "llm_error",
            Verdict::Rejected => "rejected",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// ---------------------------------------------------------------------------------------------------
// LLM

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    System,
    User,
    Assistant,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
}

/// Token counts reported by the provider (`usage`). Absent fields count as 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub reasoning_tokens: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

/// One finished LLM answer, after retries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmAnswer {
    pub content: String,
    /// `None` when the provider sent no `usage`.
    #[serde(default)]
    pub usage: Option<Usage>,
    #[serde(default)]
    pub cost_usd: Option<f64>,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Wall time of the successful attempt.
    #[serde(default)]
    pub latency_ms: u64,
    /// Number of attempts it took (1 = no retry).
    #[serde(default = "one")]
    pub attempts: u32,
}

fn one() -> u32 {
    1
}

/// A request to the LLM layer: the rendered conversation plus enough identity for scripted/replay
/// providers to find the recorded answer.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmRequest {
    pub task: TaskId,
    pub turn: u32,
    pub messages: Vec<ChatMessage>,
}

// ---------------------------------------------------------------------------------------------------
// Compile / execute / profile results

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompileStatus {
    Ok,
    Error,
    Timeout,
    Crashed,
    /// Not compiled: a static check found an error (`findings` says which).
    Rejected,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompileOutcome {
    pub status: CompileStatus,
    /// True when an identical (source, toolchain, arch) build was found and nothing was compiled.
    #[serde(default)]
    pub cached: bool,
    #[serde(default)]
    pub error_name: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
    /// Trimmed diagnostics for the prompt.
    #[serde(default)]
    pub feedback: String,
    /// Full compiler log, relative to the run directory when inside it.
    #[serde(default)]
    pub log_path: Option<String>,
    /// Build directory holding the compiled extension (absolute).
    #[serde(default)]
    pub build_dir: Option<String>,
    #[serde(default)]
    pub duration_ms: u64,
    /// Static checks on the candidate's source, run before compiling (warnings in faithful mode,
    /// errors in strict mode; see `Finding`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
    /// Which build path produced the extension (`fast`, `plain`, `fallback:<why>`); absent for
    /// cached or failed builds made before this was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_path: Option<String>,
    /// Where the build ran (absent for cached builds and logs written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran_on: Option<RanOn>,
    /// Workers lost while this build was in flight (each retried elsewhere).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub worker_losses: Vec<WorkerLoss>,
    /// The cores the build used, as its worker measured them (absent for cached builds, simulated
    /// ones and logs written before it was recorded): the CPU budget's estimate of a build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<BuildCpu>,
}

/// CPU time a build used (the compile worker and its build children, from `getrusage`) over the
/// wall time it took in the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildCpu {
    pub cpu_ms: u64,
    pub wall_ms: u64,
}

/// How serious an integrity finding is: a warning is recorded and shown; an error fails the
/// candidate (strict mode, or a category configured as an error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Warning,
    Error,
}

/// One integrity finding about a candidate: a static check on its source (`code_bypass`,
/// `timing_patch`, `thread_injection`, `lazy_eval`, `stream_injection`, `precision_downgrade`,
/// `pytorch_wrap`, `missing_kernel`) or a runtime check (a setting it changed, a thread or stream it
/// left running, an output that is not a plain dense tensor).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub category: String,
    pub severity: Severity,
    pub message: String,
    /// 1-based line in the candidate's source, for static findings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

/// The excessive-speedup guard's treatment of one result. Faithful mode only flags; strict mode
/// re-times a flagged candidate with fresh inputs in a fresh process before its speedup counts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeedupCheck {
    /// The bound applied (a speedup above it is flagged).
    pub bound: f64,
    /// Where the bound came from: `roofline` (reference FLOPs and bytes on this GPU), `config`, or
    /// `default`.
    pub bound_source: String,
    pub flagged: bool,
    /// Strict mode: `Some(true)` when re-timing confirmed the speedup, `Some(false)` when it did not
    /// (the speedup does not count); `None` when not re-verified.
    #[serde(default)]
    pub verified: Option<bool>,
    #[serde(default)]
    pub reverified_speedup: Option<f64>,
}

/// Timing statistics in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimingStats {
    pub mean: f64,
    #[serde(default)]
    pub median: f64,
    #[serde(default)]
    pub std: f64,
    #[serde(default)]
    pub min: f64,
    #[serde(default)]
    pub max: f64,
    #[serde(default)]
    pub num_trials: u32,
}

/// Where and how a result was measured; every result carries it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct EvalEnv {
    #[serde(default)]
    pub device_name: String,
    #[serde(default)]
    pub torch: Option<String>,
    #[serde(default)]
    pub cuda: Option<String>,
    #[serde(default)]
    pub driver: Option<String>,
    #[serde(default)]
    pub precision: Option<String>,
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default)]
    pub timing_method: Option<String>,
    /// The correctness tolerance (`eval.tolerance`, `eval.atol`/`eval.rtol`); absent in logs written
    /// before it was recorded (they used KernelBench's per-precision table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<Tolerance>,
    /// `eager` or `compile (backend, mode)` (`eval.reference`): how the reference was timed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_mode: Option<String>,
    #[serde(default)]
    pub grad_mode: Option<String>,
    #[serde(default)]
    pub tf32_matmul: Option<bool>,
    #[serde(default)]
    pub tf32_cudnn: Option<bool>,
    /// The settings krefine set in the candidate's process before importing it (the reference's:
    /// TF32, cuDNN flags, threads, default dtype).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<serde_json::Value>,
    /// What the per-candidate confinement applied inside the candidate's process
    /// (`kb_sandbox.enter_candidate`: `{"layers": ["no_new_privs", "landlock-fs(abi 7)", ...]}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_sandbox: Option<serde_json::Value>,
    /// `process`: the candidate ran in its own single-use process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
    /// `kept` (integer and bool inputs keep their dtype, the default) or `cast` (KernelBench's cast,
    /// `eval.cast_integer_inputs`); absent in logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integer_inputs: Option<String>,
    /// `eval.inputs`: `kernelbench` (made on the CPU, KernelBench's bits) or `device` (drawn on the
    /// GPU); absent in logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<String>,
    /// The worker's `transformers` version (level 4 builds Hugging Face models with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transformers: Option<String>,
    /// The worker's Python version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    /// The sandbox the candidate's worker ran in: `namespaces`, `off`, or `none` (unavailable here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// Where the worker ran (launcher, host, Slurm job and step, GPU UUID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran_on: Option<RanOn>,
}

/// Where a worker ran: recorded with every result a worker produced.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RanOn {
    /// `local`, `slurm` or `ssh` (`resources.launcher`).
    pub launcher: String,
    /// The host name the worker reported (`socket.gethostname()`).
    #[serde(default)]
    pub host: String,
    /// The worker's Slurm job id (`SLURM_JOB_ID`), with the slurm launcher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_job: Option<String>,
    /// The worker's Slurm job step id (`SLURM_STEP_ID`), with the slurm launcher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_step: Option<String>,
    /// The GPU's UUID as the CUDA driver reports it (GPU workers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_uuid: Option<String>,
}

/// A worker that was lost (its node, Slurm step or SSH connection died) while it served a request:
/// not the candidate's fault, so the request was retried on another worker. Recorded with the
/// result that the retry produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerLoss {
    /// The worker slot (`gpu-0`, `compile-1`).
    pub worker: String,
    /// The node or SSH host it ran on, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// What was seen (`*** STEP 12.3 ON node1 CANCELLED ...`, `ssh exited with 255 ...`).
    pub detail: String,
    /// True when this loss drained the host: no worker is started there again in this run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drained: bool,
}

/// Result of evaluating one compiled candidate on a device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecOutcome {
    pub verdict: Verdict,
    pub compiled: bool,
    pub correctness: bool,
    /// KernelBench-compatible metadata (keys and string formats as KernelBench writes them).
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// Candidate mean in ms, -1.0 when not measured (KernelBench's convention).
    #[serde(default = "minus_one")]
    pub runtime_ms: f64,
    #[serde(default)]
    pub runtime_stats: Option<TimingStats>,
    #[serde(default = "minus_one")]
    pub ref_runtime_ms: f64,
    #[serde(default)]
    pub ref_runtime_stats: Option<TimingStats>,
    /// `measured`, `cached` or `baseline:<name>`.
    #[serde(default)]
    pub ref_source: Option<String>,
    #[serde(default)]
    pub speedup: Option<f64>,
    /// The execution feedback (E) text for the next prompt.
    #[serde(default)]
    pub feedback: String,
    #[serde(default)]
    pub env: EvalEnv,
    /// Device the result was measured on (`cuda:0`, `cpu`).
    #[serde(default)]
    pub device: String,
    /// Wall time from execute request to result, in the orchestrator.
    #[serde(default)]
    pub wall_ms: u64,
    /// Time the worker spent in each phase (load, correctness, timing, ...), in seconds.
    #[serde(default)]
    pub phases: serde_json::Map<String, serde_json::Value>,
    /// Runtime integrity findings (settings changed, leftover threads/streams, non-dense outputs,
    /// ...). Strict mode fails a candidate with an error finding; faithful mode records warnings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
    /// The excessive-speedup guard, when a speedup was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup_check: Option<SpeedupCheck>,
    /// Workers lost while this evaluation was in flight (each retried elsewhere).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub worker_losses: Vec<WorkerLoss>,
}

fn minus_one() -> f64 {
    -1.0
}

impl ExecOutcome {
    /// An outcome produced by the orchestrator itself (timeouts, crashes), not by a worker.
    pub fn failure(verdict: Verdict, device: &str, feedback: String, wall_ms: u64) -> Self {
        let mut metadata = serde_json::Map::new();
        metadata.insert("error".into(), serde_json::Value::String(feedback.clone()));
        ExecOutcome {
            worker_losses: Vec::new(),
            verdict,
            compiled: !matches!(verdict, Verdict::CompileError),
            correctness: false,
            metadata,
            runtime_ms: -1.0,
            runtime_stats: None,
            ref_runtime_ms: -1.0,
            ref_runtime_stats: None,
            ref_source: None,
            speedup: None,
            feedback,
            env: EvalEnv::default(),
            device: device.to_string(),
            wall_ms,
            phases: serde_json::Map::new(),
            findings: Vec::new(),
            speedup_check: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileOutcome {
    pub ok: bool,
    /// Profiler table (P) trimmed for a prompt; empty when profiling failed.
    #[serde(default)]
    pub table: String,
    #[serde(default)]
    pub ncu: Option<serde_json::Value>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub duration_ms: u64,
    /// Workers lost while profiling (each retried elsewhere).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub worker_losses: Vec<WorkerLoss>,
}

/// One step of preparing a problem's reference data ahead of its candidates, in the order a candidate
/// needs them (see `src/refprep/` and the harness's `kb_prepare.py`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrepareStep {
    /// The next correctness trial: its inputs, the reference forward, its place in the cache.
    Trial,
    /// The seeded inputs every timed call uses.
    TimingInputs,
    /// Timing the reference (needs quiet cores on the CPU device).
    ReferenceTiming,
}

/// How a preparation step went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrepareStatus {
    /// Built (or found cached).
    Ready,
    /// The reference itself failed (its load, construction or forward): a candidate's evaluation
    /// reports it in full; nothing more is prepared.
    ReferenceError,
    /// The step failed for reasons outside the reference's code (timeout, a crashed worker); the
    /// worker was replaced, and the problem is left to its candidates' own evaluations.
    Failed,
}

/// What one preparation step did (the executor's answer; logged as [`Event::ReferencePrepared`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrepareOutcome {
    pub status: PrepareStatus,
    /// What this step built (`trial 3`, `timing inputs`, `reference timing`); empty when everything
    /// was cached already.
    #[serde(default)]
    pub built: Vec<String>,
    /// Correctness trials ready on the worker after the step.
    #[serde(default)]
    pub trials_ready: u32,
    /// Nothing is left to prepare.
    pub done: bool,
    /// What the next step would build (`None` when done).
    #[serde(default)]
    pub next: Option<PrepareStep>,
    /// The worker's own time for the step, in milliseconds.
    #[serde(default)]
    pub duration_ms: u64,
    /// Why it failed (`ReferenceError`, `Failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What making a problem's inputs on the CPU did (logged as [`Event::InputsPrepared`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputsOutcome {
    /// `hit` (stored already), `generated`, `rebuilt` (a corrupt entry replaced), `unstorable` (the
    /// worker makes them), `over_budget` (the entry does not fit the store's cap: the worker makes
    /// them), `deferred` (no tier has room now, but one will once queued candidates are done with
    /// their entries: made later, still off the lease), `error` (the problem's own code failed),
    /// `failed` (the machinery).
    pub status: String,
    /// Bytes of inputs in the store entry.
    #[serde(default)]
    pub bytes: u64,
    /// Wall time of the CPU stage (no lease held), in milliseconds.
    #[serde(default)]
    pub duration_ms: u64,
    /// Processes that made seeds in parallel (0: one after another).
    #[serde(default)]
    pub parallel: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The store tier holding the entry ([`INPUTS_TIER_DISK`] or [`INPUTS_TIER_MEMORY`]); for
    /// `deferred`, the only tier whose room it waits for (absent: either, or not known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
}

/// [`InputsOutcome::status`] of inputs that wait for room in the store.
pub const INPUTS_DEFERRED: &str = "deferred";
/// [`InputsOutcome::tier`]: the on-disk store.
pub const INPUTS_TIER_DISK: &str = "disk";
/// [`InputsOutcome::tier`]: the in-memory tier (`/dev/shm`).
pub const INPUTS_TIER_MEMORY: &str = "memory";

impl InputsOutcome {
    /// No tier had room yet: the CPU stage tries again later.
    pub fn is_deferred(&self) -> bool {
        self.status == INPUTS_DEFERRED
    }
}

// ---------------------------------------------------------------------------------------------------
// Events and commands
