//! Types that cross rooms: identities, settings enums, service results, events, commands.
//!
//! Everything written to `events.jsonl` is defined here, so the log format has one home. Adding a field
//! is fine (give it `#[serde(default)]`); renaming or removing one, or adding an event kind (which an
//! older reader cannot parse), needs a `SCHEMA_VERSION` bump (tests/event_schema.rs pins each
//! version's kinds).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use crate::run_end::EndReason;

/// Version of the event-log schema, written into every record. 2: the kinds `deferred`,
/// `llm_retry_wait`, `reference_prepared`, `inputs_prepared` and `device_retired` (logs of version 1 are
/// read as they are).
pub const SCHEMA_VERSION: u32 = 2;

/// A problem's identity: KernelBench level and problem id (`"1/19"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProblemKey {
    pub level: u32,
    pub problem_id: u32,
}

impl fmt::Display for ProblemKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.level, self.problem_id)
    }
}

impl FromStr for ProblemKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (l, p) = s
            .split_once('/')
            .ok_or_else(|| format!("expected \"<level>/<problem_id>\", got {s:?}"))?;
        let level = l
            .trim()
            .parse()
            .map_err(|_| format!("level in {s:?} is not a non-negative integer"))?;
        let problem_id = p
            .trim()
            .parse()
            .map_err(|_| format!("problem id in {s:?} is not a non-negative integer"))?;
        Ok(ProblemKey { level, problem_id })
    }
}

/// A task is one conversation: a problem and a sample index (`"1/19/0"`). Refinement and one-shot runs
/// have sample 0 only; repeated sampling has samples `0..k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId {
    pub problem: ProblemKey,
    pub sample: u32,
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.problem, self.sample)
    }
}

impl FromStr for TaskId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (p, sample) = s
            .rsplit_once('/')
            .ok_or_else(|| format!("expected \"<level>/<problem_id>/<sample>\", got {s:?}"))?;
        let problem = p.parse()?;
        let sample = sample
            .parse()
            .map_err(|_| format!("sample in {s:?} is not a non-negative integer"))?;
        Ok(TaskId { problem, sample })
    }
}

macro_rules! serde_via_string {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
serde_via_string!(ProblemKey);
serde_via_string!(TaskId);

/// A reference problem in KernelBench format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    pub key: ProblemKey,
    /// File name as KernelBench names it, with `.py` (`19_ReLU.py`); baseline JSON is keyed by it.
    pub name: String,
    pub code: String,
}

impl Problem {
    /// Content hash of the reference source; keys reference caches in the workers.
    pub fn code_hash(&self) -> String {
        blake3::hash(self.code.as_bytes()).to_hex()[..16].to_string()
    }
}

/// What of the previous turn goes into the next prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FeedbackMode {
    /// The previous generation only.
    G,
    /// Generation and execution result.
    GE,
    /// Generation, execution result and profile (profile only for correct candidates).
    GEP,
}

impl FeedbackMode {
    pub fn includes_execution(self) -> bool {
        matches!(self, FeedbackMode::GE | FeedbackMode::GEP)
    }
    pub fn includes_profile(self) -> bool {
        matches!(self, FeedbackMode::GEP)
    }
}

impl fmt::Display for FeedbackMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FeedbackMode::G => "G",
            FeedbackMode::GE => "G+E",
            FeedbackMode::GEP => "G+E+P",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MethodKind {
    OneShot,
    Sampling,
    Refine,
}

impl fmt::Display for MethodKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MethodKind::OneShot => "one_shot",
            MethodKind::Sampling => "sampling",
            MethodKind::Refine => "refine",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    #[default]
    Fp32,
    Fp16,
    Bf16,
}

impl Precision {
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
        }
    }
}

/// `faithful` reproduces KernelBench's checks exactly; `strict` adds the named hardening checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum EvalMode {
    #[default]
    Faithful,
    Strict,
}

impl EvalMode {
    pub fn as_str(self) -> &'static str {
        match self {
            EvalMode::Faithful => "faithful",
            EvalMode::Strict => "strict",
        }
    }
}

/// `eval.timing_method`: KernelBench's four timers (`src/kernelbench/timing.py`). `cuda_event` (the
/// default) flushes L2 with a 256 MiB buffer before each call and drops the first; `do_bench` is
/// Triton's adaptive `triton.testing.do_bench`; `do_bench_impl` is Triton's loop with explicit counts;
/// `host_time` is the wall clock around a device-wide synchronize.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TimingMethod {
    #[default]
    CudaEvent,
    DoBench,
    DoBenchImpl,
    HostTime,
}

impl TimingMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            TimingMethod::CudaEvent => "cuda_event",
            TimingMethod::DoBench => "do_bench",
            TimingMethod::DoBenchImpl => "do_bench_impl",
            TimingMethod::HostTime => "host_time",
        }
    }

    /// Methods that cannot run without a CUDA device (`cuda_event` and `host_time` have CPU loops).
    pub fn needs_gpu(self) -> bool {
        matches!(self, TimingMethod::DoBench | TimingMethod::DoBenchImpl)
    }

    pub fn is_default(&self) -> bool {
        *self == TimingMethod::CudaEvent
    }
}

/// `eval.tolerance`: whose correctness tolerance. `kernelbench` is KernelBench's current table
/// (fp32 1e-4, fp16/bf16 1e-2); `kernelbench-v0` is what v0/v0.1 and most published numbers used
/// (1e-2 at every precision).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum TolerancePreset {
    #[default]
    #[serde(rename = "kernelbench")]
    KernelBench,
    #[serde(rename = "kernelbench-v0")]
    KernelBenchV0,
}

impl TolerancePreset {
    pub fn as_str(self) -> &'static str {
        match self {
            TolerancePreset::KernelBench => "kernelbench",
            TolerancePreset::KernelBenchV0 => "kernelbench-v0",
        }
    }

    /// atol = rtol of this preset at `precision`.
    pub fn value(self, precision: Precision) -> f64 {
        match (self, precision) {
            (TolerancePreset::KernelBench, Precision::Fp32) => 1e-4,
            _ => 1e-2,
        }
    }
}

/// The correctness tolerance in effect: on the wire to the harness, and recorded in every result's
/// env. `name` is the preset, or `explicit` where `eval.atol`/`eval.rtol` set a bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    pub name: String,
    pub atol: f64,
    pub rtol: f64,
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.atol == self.rtol {
            write!(f, "{} (atol = rtol = {:e})", self.name, self.atol)
        } else {
            write!(
                f,
                "{} (atol {:e}, rtol {:e})",
                self.name, self.atol, self.rtol
            )
        }
    }
}

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
/// needs them (see `src/refprep.rs` and the harness's `kb_prepare.py`).
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
    /// them), `error` (the problem's own code failed), `failed` (the machinery).
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
}

// ---------------------------------------------------------------------------------------------------
// Events and commands

/// Everything that happens in a run. Events with a task drive that task's machine (the `Llm*`,
/// `Compiled`, `Executed`, `Profiled` ones) or are informational (attempts, leases); run-level events
/// have no task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
// Events are built once per service call and then logged and folded; boxing the big outcomes would
// only add indirection to every match.
#[allow(clippy::large_enum_variant)]
pub enum Event {
    /// Written when a run (or a resumed run) starts.
    RunStarted {
        run: String,
        method: MethodKind,
        #[serde(default)]
        feedback: Option<FeedbackMode>,
        /// Every task of the run (the fast_p denominator counts their problems).
        task_ids: Vec<TaskId>,
        /// Turns per task (1 for one-shot and sampling).
        turns: u32,
        /// Samples per problem (k for sampling, else 1).
        samples: u32,
        krefine_version: String,
        resumed: bool,
        #[serde(default)]
        simulated: bool,
        /// Problem file names by problem (`"1/19"` → `"19_ReLU.py"`), for displays; absent in logs
        /// written before it was recorded.
        #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
        problem_names: std::collections::BTreeMap<ProblemKey, String>,
    },
    /// Written when a run ends (finished, cancelled or stopped by a budget).
    RunEnded {
        reason: EndReason,
    },
    /// A cap (USD or tokens) was reached; no new LLM requests are made.
    BudgetExhausted {
        what: String,
    },

    /// The task's LLM request passed the engine's concurrency gate and was sent (informational: the
    /// request is in flight until `LlmAnswered` or `LlmFailed` of the same turn, or the run ends).
    /// `prompt_file` holds the exact messages sent, relative to the run directory.
    LlmStarted {
        turn: u32,
        #[serde(default)]
        prompt_file: Option<String>,
    },
    /// An attempt failed transiently (a 429 rate limit, a 5xx, a dropped connection) and the request
    /// waits `wait_ms` before attempt `attempt + 1` (informational).
    LlmRetryWait {
        turn: u32,
        attempt: u32,
        wait_ms: u64,
        #[serde(default)]
        status: Option<u16>,
    },
    /// The LLM answered (after retries). `code` is the extracted candidate, `None` when no usable code.
    LlmAnswered {
        turn: u32,
        answer: LlmAnswer,
        code: Option<String>,
        /// Candidate file, relative to the run directory.
        #[serde(default)]
        code_file: Option<String>,
    },
    /// The LLM could not answer (retries exhausted or fatal error); the turn is spent.
    LlmFailed {
        turn: u32,
        error: String,
        #[serde(default)]
        fatal: bool,
    },
    Compiled {
        turn: u32,
        outcome: CompileOutcome,
    },
    Executed {
        turn: u32,
        outcome: ExecOutcome,
    },
    Profiled {
        turn: u32,
        outcome: ProfileOutcome,
    },

    /// One HTTP attempt against the LLM provider (informational).
    LlmAttempt {
        turn: u32,
        attempt: u32,
        #[serde(default)]
        status: Option<u16>,
        latency_ms: u64,
        #[serde(default)]
        error: Option<String>,
        #[serde(default)]
        usage: Option<Usage>,
        #[serde(default)]
        cost_usd: Option<f64>,
        /// Why usage or cost is missing from a successful attempt (no `usage` sent, no price).
        #[serde(default)]
        note: Option<String>,
    },
    /// Streamed answer text as it arrives. Transient: broadcast to live views, never written to the log.
    LlmDelta {
        turn: u32,
        delta: String,
    },
    /// A step of a turn could not be done for reasons outside the candidate: the LLM endpoint did not
    /// answer within its retries, or no worker could be started. Informational: the task stays where
    /// it was (no verdict), the run ends incomplete, and `--resume` redoes exactly this step.
    Deferred {
        turn: u32,
        waiting_on: WaitingOn,
        error: String,
    },
    /// A GPU (or CPU) lease was granted after waiting `wait_ms`.
    LeaseGranted {
        device: String,
        wait_ms: u64,
        turn: u32,
    },
    /// The lease was given back after `held_ms`; `busy_ms` is the time the device ran work inside
    /// it, as the worker measured it (its forward phases: reference, correctness, timing, reference
    /// timing; a profile's duration), not the hold. Logs written before this count the worker's
    /// whole time (loading and isolation too).
    LeaseReleased {
        device: String,
        held_ms: u64,
        busy_ms: u64,
        turn: u32,
    },
    /// One step of a problem's reference data was prepared ahead of its candidates, on `device`,
    /// which the preparation held for `held_ms` (run-level: no task; informational). Taken only while
    /// no candidate waited for the device, so it never delays a timing.
    ReferencePrepared {
        problem: ProblemKey,
        device: String,
        held_ms: u64,
        outcome: PrepareOutcome,
    },
    /// A problem's inputs were made on the CPU into the on-disk store (or found there), holding no
    /// device lease (run-level, informational).
    InputsPrepared {
        problem: ProblemKey,
        outcome: InputsOutcome,
    },
    /// `device` is lost (its worker no longer starts on it, or its host was drained) and retired for
    /// the rest of the run: the step that found it lost, and every later one, runs on the
    /// `remaining` devices; with none left, steps are deferred (run-level, informational).
    DeviceRetired {
        device: String,
        error: String,
        remaining: u32,
    },
}

impl Event {
    /// True for the events that move a task's state machine forward (and so must be folded on resume).
    pub fn drives_machine(&self) -> bool {
        matches!(
            self,
            Event::LlmAnswered { .. }
                | Event::LlmFailed { .. }
                | Event::Compiled { .. }
                | Event::Executed { .. }
                | Event::Profiled { .. }
        )
    }

    /// Transient events are broadcast but not persisted.
    pub fn is_transient(&self) -> bool {
        matches!(self, Event::LlmDelta { .. })
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Event::RunStarted { .. } => "run_started",
            Event::RunEnded { .. } => "run_ended",
            Event::BudgetExhausted { .. } => "budget_exhausted",
            Event::LlmStarted { .. } => "llm_started",
            Event::LlmRetryWait { .. } => "llm_retry_wait",
            Event::LlmAnswered { .. } => "llm_answered",
            Event::LlmFailed { .. } => "llm_failed",
            Event::Compiled { .. } => "compiled",
            Event::Executed { .. } => "executed",
            Event::Profiled { .. } => "profiled",
            Event::LlmAttempt { .. } => "llm_attempt",
            Event::LlmDelta { .. } => "llm_delta",
            Event::Deferred { .. } => "deferred",
            Event::LeaseGranted { .. } => "lease_granted",
            Event::LeaseReleased { .. } => "lease_released",
            Event::ReferencePrepared { .. } => "reference_prepared",
            Event::InputsPrepared { .. } => "inputs_prepared",
            Event::DeviceRetired { .. } => "device_retired",
        }
    }
}

/// What a deferred task waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitingOn {
    /// The LLM endpoint (down, overloaded, unreachable beyond the retries).
    Llm,
    /// The worker machinery (a worker that cannot start, a pool that was shut down).
    Workers,
}

impl fmt::Display for WaitingOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WaitingOn::Llm => "the LLM",
            WaitingOn::Workers => "workers",
        })
    }
}

/// One line of `events.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogRecord {
    /// Schema version.
    pub v: u32,
    pub seq: u64,
    /// Unix time in milliseconds.
    pub ts_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskId>,
    pub event: Event,
}

/// What the prompt of a turn may show of one earlier turn; the machine fills only what the feedback
/// mode allows (G: `code`; G+E: also `execution`; G+E+P: also `profile`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnFeedback {
    pub turn: u32,
    /// The assistant's whole answer, for chat history (`full` policy).
    pub answer: Option<String>,
    /// The extracted candidate code (G).
    pub code: Option<String>,
    /// Execution result in words (E).
    pub execution: Option<String>,
    /// Profiler output (P).
    pub profile: Option<String>,
}

/// Everything a prompt for a turn is made from, besides the problem and the templates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptContext {
    pub turn: u32,
    pub feedback: FeedbackMode,
    /// Earlier turns, oldest first.
    pub history: Vec<TurnFeedback>,
}

/// What a task's machine asks the engine to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    CallLlm {
        turn: u32,
        context: PromptContext,
    },
    Compile {
        turn: u32,
        code: String,
    },
    Execute {
        turn: u32,
        code: String,
    },
    Profile {
        turn: u32,
        code: String,
    },
    /// The task has used all its turns.
    Finish,
}

/// One finished (or in-progress) turn of a task, as folded from the log.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TurnRecord {
    pub turn: u32,
    pub answer: Option<LlmAnswer>,
    pub code: Option<String>,
    pub llm_error: Option<String>,
    pub compile: Option<CompileOutcome>,
    pub exec: Option<ExecOutcome>,
    pub profile: Option<ProfileOutcome>,
    /// Set when the turn is over.
    pub verdict: Option<Verdict>,
}

impl TurnRecord {
    /// Speedup of this turn's candidate when it is correct.
    pub fn correct_speedup(&self) -> Option<f64> {
        match (&self.verdict, &self.exec) {
            (Some(Verdict::Correct), Some(e)) => e.speedup,
            _ => None,
        }
    }
}
