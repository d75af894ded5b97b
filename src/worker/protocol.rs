//! The worker protocol (docs/worker-protocol.md) as serde types.
//!
//! The shapes mirror `src/harness/kb_protocol.py` field for field; `tests/fixtures/protocol/*.json`
//! holds golden messages that both sides test against. Requests are built by the pool and serialized
//! here; responses are parsed with [`parse_response`], which reads the `ok` flag first so that an error
//! response (whose `kind` is free text) never reaches the typed bodies.
//!
//! Unknown response fields are ignored when parsing (the harness may grow first); the fixture tests
//! re-serialize every message and compare, which catches a name mismatch on either side.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

// `ready`'s placement is read by the launcher too, so it lives with the types below both.
pub use crate::types::WorkerPlacement;
use crate::types::{PrepareStep, TimingMethod, Tolerance};

// ------------------------------------------------------------------------------------------- requests

/// The reference problem as the harness sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProblemSpec {
    /// `"<level>/<problem_id>"`.
    pub key: String,
    pub code: String,
    /// Keys the worker's reference cache (outputs, RNG states, timings).
    pub code_hash: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateSpec {
    pub source: String,
    /// Absolute build directory (the content-addressed one the compile step used).
    pub build_dir: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimingSpec {
    pub measure: bool,
    pub warmup: u32,
    pub trials: u32,
    pub discard_first: u32,
    pub l2_flush: bool,
    /// `eval.timing_method`; left off the wire at its default (`cuda_event`).
    #[serde(default, skip_serializing_if = "TimingMethod::is_default")]
    pub method: TimingMethod,
    /// `eval.reference = "compile"`: time the reference under `torch.compile` with this backend and
    /// mode (KernelBench's `use_torch_compile`); absent: eagerly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_compile: Option<ReferenceCompile>,
}

/// `torch.compile(model, backend=..., mode=...)` for the reference's timing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReferenceCompile {
    pub backend: String,
    pub mode: String,
}

/// Timing statistics in milliseconds, as the harness reports them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RuntimeStats {
    pub mean: f64,
    pub median: f64,
    pub std: f64,
    pub min: f64,
    pub max: f64,
    pub num_trials: u32,
}

impl From<RuntimeStats> for crate::types::TimingStats {
    fn from(s: RuntimeStats) -> Self {
        crate::types::TimingStats {
            mean: s.mean,
            median: s.median,
            std: s.std,
            min: s.min,
            max: s.max,
            num_trials: s.num_trials,
        }
    }
}

/// A reference runtime taken from a baseline file instead of being measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineRuntime {
    pub mean: f64,
    pub median: f64,
    pub std: f64,
    pub min: f64,
    pub max: f64,
    pub num_trials: u32,
    /// `baseline:<file name>`.
    pub source: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompileRequest {
    pub source: String,
    pub build_dir: String,
    /// `TORCH_CUDA_ARCH_LIST` for the build; `null` keeps the worker's start-up value.
    pub arch_list: Option<String>,
    pub log_path: String,
    /// `fast` or `plain` (see `eval.build`); absent means `fast`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<String>,
    /// `Some(false)`: the worker starts no background build of a shared precompiled header its
    /// child missed (another worker of the run builds them: [`super::build_cache::Builds`]); absent
    /// means it may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pch_background: Option<bool>,
}

/// The reference data a request works against: the problem, where and how its reference runs, what
/// its check and timing build, and where its inputs come from. Declared once and flattened into every
/// request that reaches the reference (`prepare`, `evaluate`, `profile`), so the fields stay top-level
/// on the wire; the harness mirrors it once (`kb_protocol.ReferenceSpec`) and reads it once
/// (`kb_reference.ReferenceSpec`, whose `key` is the worker's cache key). A new way of preparing
/// reference inputs is a field here, its value in `eval_room::ReferenceRecipe`, and its reading there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReferenceSpec {
    pub problem: ProblemSpec,
    /// `cuda:0` (the worker sees one device) or `cpu`.
    pub device: String,
    pub precision: String,
    pub mode: String,
    /// KernelBench's seed: the trials' seeds derive from it, and it seeds the timing inputs.
    pub seed: u64,
    /// Correctness trials: how many input sets and reference outputs the check reaches.
    pub correct_trials: u32,
    /// Whether (and how) the reference is timed; `measure` also decides whether timing inputs are made.
    pub timing: TimingSpec,
    /// A baseline's reference runtime, used instead of timing the reference (`eval.baseline`).
    pub reference_runtime: Option<BaselineRuntime>,
    /// `eval.cast_integer_inputs`: cast integer and bool inputs to the precision as KernelBench does.
    /// Left off the wire when false (the harness's default: they keep their dtype).
    #[serde(default, skip_serializing_if = "is_false")]
    pub cast_integer_inputs: bool,
    /// `eval.inputs`: `device` draws the inputs on the device; absent: KernelBench's CPU generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<String>,
    /// The store entry holding the problem's CPU-made inputs (`worker::input_store`), when whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_inputs: Option<String>,
    /// `eval.tolerance` resolved to numbers; absent: KernelBench's per-precision table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<Tolerance>,
    /// An earlier run's precision probe of this problem on this kind of device (`worker::probes`):
    /// the worker does not run the probe's float64 forward again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision_probe: Option<ProbeSummary>,
}

/// A reference's own error against float64 above this is no yardstick (`E_REF_MAX` in
/// kb_precision.py): such a probe says `why` instead.
const PROBE_E_REF_MAX: f64 = 1e-2;
const PROBE_WHY_CHARS: usize = 300;

/// A precision probe's summary (kb_precision.py's `Probe.wire`; kept by `worker::probes`): the inputs
/// it used and the reference's own error against float64, or why there is no probe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeSummary {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e_ref: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

impl ProbeSummary {
    /// Whether this is a summary a probe can come from: `signed` or `kernelbench` inputs with a finite
    /// error in [0, PROBE_E_REF_MAX], or a short reason.
    pub fn is_valid(&self) -> bool {
        match (&self.kind, self.e_ref, &self.why) {
            (Some(kind), Some(e), None) => {
                matches!(kind.as_str(), "signed" | "kernelbench")
                    && e.is_finite()
                    && (0.0..=PROBE_E_REF_MAX).contains(&e)
            }
            (None, None, Some(why)) => !why.is_empty() && why.chars().count() <= PROBE_WHY_CHARS,
            _ => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvaluateRequest {
    #[serde(flatten)]
    pub reference: ReferenceSpec,
    pub candidate: CandidateSpec,
    /// The excessive-speedup guard's inputs.
    pub integrity: Option<IntegritySpec>,
}

/// What the harness needs to bound a plausible speedup: `eval.max_speedup`, or the device's peak
/// throughput and bandwidth for the roofline of the reference (from `prompt::gpu_specs`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct IntegritySpec {
    pub max_speedup: Option<f64>,
    /// Peak TFLOP/s at the run's precision.
    pub peak_tflops: Option<f64>,
    pub peak_bandwidth_gbs: Option<f64>,
}

/// Build the reference's cached data ahead of its candidates, under its own timeout: the model, then
/// step by step each trial's inputs and output, the timing inputs and the reference timing (for
/// KernelBench's largest inputs a minute of CPU work that no candidate should wait for).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrepareRequest {
    #[serde(flatten)]
    pub reference: ReferenceSpec,
    /// Build at most this many steps (a trial, the timing inputs, the reference timing); absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
    /// `false`: do not time the reference (the CPU's builds are not paused); absent: true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet: Option<bool>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Profile a candidate against the same reference data its evaluation used (the run's seed, mode,
/// input policy and stored inputs): the profiled forward runs on the timing inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileRequest {
    #[serde(flatten)]
    pub reference: ReferenceSpec,
    pub candidate: CandidateSpec,
    pub row_limit: u32,
    pub ncu: bool,
    /// `eval.profiler`: `torch`, `ncu` or `both`; absent: the torch table, plus ncu where `ncu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profiler: Option<String>,
    /// The GPU's peaks for the roofline line of each kernel (`prompt::gpu_specs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peaks: Option<IntegritySpec>,
}

/// What a request asks for; the `op` field on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum RequestBody {
    Compile(CompileRequest),
    Prepare(PrepareRequest),
    Evaluate(EvaluateRequest),
    Profile(ProfileRequest),
    WarmHeaders(WarmHeadersRequest),
    Shutdown,
}

/// Build the shared precompiled headers of torch's default flags on a compile worker before the run's
/// candidates ask for them (`kb_pch.warm_requests`; no candidate code runs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmHeadersRequest {
    /// A build dir of the run's cache: the headers go to its `pch/` folder.
    pub build_dir: String,
    /// How long the worker waits for them before it answers; the builds go on after it.
    pub wait_s: f64,
}

/// What a `warm_headers` request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WarmHeadersResponse {
    /// Header builds started (0: made before, or none can be made on this worker).
    pub started: u32,
    /// Of those, still building when the worker answered.
    pub pending: u32,
}

impl RequestBody {
    /// The `op` name, which is also the `kind` of the matching response.
    pub fn op(&self) -> &'static str {
        match self {
            RequestBody::Compile(_) => "compile",
            RequestBody::Prepare(_) => "prepare",
            RequestBody::Evaluate(_) => "evaluate",
            RequestBody::Profile(_) => "profile",
            RequestBody::WarmHeaders(_) => "warm_headers",
            RequestBody::Shutdown => "shutdown",
        }
    }
}

/// One request line: `{"id": 7, "op": "compile", ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    #[serde(flatten)]
    pub body: RequestBody,
}

// ------------------------------------------------------------------------------------------ responses

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerRole {
    /// Builds candidates on CPU.
    Compile,
    /// Evaluates and profiles on one device (a GPU, or the CPU when no GPU is used).
    Gpu,
}

impl WorkerRole {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerRole::Compile => "compile",
            WorkerRole::Gpu => "gpu",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    /// Compute capability `[major, minor]`.
    pub capability: Vec<u32>,
    pub total_memory_bytes: u64,
}

/// The unasked first line of a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ready {
    pub role: WorkerRole,
    pub python: String,
    pub torch: String,
    pub cuda: Option<String>,
    pub cuda_available: bool,
    pub device: Option<DeviceInfo>,
    pub pid: u32,
    /// Where the worker runs (absent from workers older than the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<Box<WorkerPlacement>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompileStatusWire {
    Ok,
    CompileError,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompileResponse {
    pub status: CompileStatusWire,
    /// KernelBench's `get_error_name` (`module.ClassName`), or `SyntaxError`.
    pub error_name: Option<String>,
    pub error: Option<String>,
    /// Trimmed diagnostics for a prompt.
    pub feedback: String,
    pub log_path: String,
    pub duration_s: f64,
    /// How the extensions were built: `fast`, `plain`, `fallback:<why>`; null when none was built
    /// (absent from workers older than the field).
    #[serde(default)]
    pub build_path: Option<String>,
    /// CPU seconds the build used: the worker's and its build children's (`getrusage`), so a
    /// build's real core use is cpu_s / duration_s (absent from workers older than the field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_s: Option<f64>,
    /// The worker started a background build of a shared precompiled header its child missed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pch_started: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrepareStatus {
    Ready,
    ReferenceError,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrepareResponse {
    pub status: PrepareStatus,
    /// Seconds spent; near zero when everything was cached already.
    pub seconds: f64,
    /// Where each trial's data lives: `device`, `device_inputs`, `host` or `recompute`.
    pub tiers: Vec<String>,
    pub device_bytes: u64,
    pub host_bytes: u64,
    /// How many input sets were made at once in parallel processes (large problems only).
    pub parallel_inputs: u32,
    /// What failed when the reference did (the evaluate that follows reports it in full).
    pub feedback: String,
    /// Nothing is left to build (everything cached, or the reference failed).
    pub done: bool,
    /// What the next request would build first (`None` when done).
    pub next: Option<PrepareStep>,
    /// Correctness trials built so far.
    pub trials_ready: u32,
    /// What this request built (`trial 3`, `timing inputs`, `reference timing`).
    pub built: Vec<String>,
}

/// Sent during an evaluate, before its response and with its id: the worker starts or ends reference
/// work (building trial data or timing inputs the candidate asked for, timing the reference). That
/// time counts against `eval.timeouts.reference_s`, not the candidate's `execute_s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressNotice {
    pub reference: ReferencePhase,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReferencePhase {
    Start,
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvalStatus {
    Correct,
    Incorrect,
    CompileError,
    RuntimeError,
    CudaError,
    OutOfMemory,
    ReferenceError,
}

impl EvalStatus {
    pub fn verdict(self) -> crate::types::Verdict {
        use crate::types::Verdict;
        match self {
            EvalStatus::Correct => Verdict::Correct,
            EvalStatus::Incorrect => Verdict::Incorrect,
            EvalStatus::CompileError => Verdict::CompileError,
            EvalStatus::RuntimeError => Verdict::RuntimeError,
            EvalStatus::CudaError => Verdict::CudaError,
            EvalStatus::OutOfMemory => Verdict::OutOfMemory,
            EvalStatus::ReferenceError => Verdict::ReferenceError,
        }
    }
}

/// Where and how a result was measured, as the harness reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireEnv {
    pub device_name: String,
    pub torch: String,
    pub cuda: Option<String>,
    pub precision: String,
    pub mode: String,
    /// `cuda_event`, `do_bench`, `do_bench_impl`, `host_time`, or `cpu_perf_counter` (`cuda_event`
    /// on a CPU).
    pub timing_method: String,
    /// The correctness tolerance the check used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<Tolerance>,
    /// `eager` or `compile (backend, mode)`: how the reference was timed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_mode: Option<String>,
    pub grad_mode: String,
    pub tf32_matmul: bool,
    pub tf32_cudnn: bool,
    /// The settings krefine set in the candidate's process before importing it.
    #[serde(default)]
    pub settings: Option<Value>,
    /// What the sandbox applied in the candidate's process.
    #[serde(default)]
    pub sandbox: Option<Value>,
    /// `process` (a single-use process per candidate) or `in_worker`.
    #[serde(default)]
    pub isolation: Option<String>,
    /// `kept` (integer and bool inputs keep their dtype) or `cast` (KernelBench's cast).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integer_inputs: Option<String>,
    /// `eval.inputs`: `kernelbench` or `device`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs: Option<String>,
    /// The installed `transformers` version, null when it is not installed.
    #[serde(default)]
    pub transformers: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
}

impl WireEnv {
    pub fn to_eval_env(&self, driver: Option<String>) -> crate::types::EvalEnv {
        crate::types::EvalEnv {
            ran_on: None,
            device_name: self.device_name.clone(),
            torch: Some(self.torch.clone()),
            cuda: self.cuda.clone(),
            driver,
            precision: Some(self.precision.clone()),
            mode: Some(self.mode.clone()),
            timing_method: Some(self.timing_method.clone()),
            tolerance: self.tolerance.clone(),
            reference_mode: self.reference_mode.clone(),
            grad_mode: Some(self.grad_mode.clone()),
            tf32_matmul: Some(self.tf32_matmul),
            tf32_cudnn: Some(self.tf32_cudnn),
            settings: self.settings.clone(),
            candidate_sandbox: self.sandbox.clone(),
            isolation: self.isolation.clone(),
            integer_inputs: self.integer_inputs.clone(),
            inputs: self.inputs.clone(),
            transformers: self.transformers.clone(),
            python: self.python.clone(),
            sandbox: None,
        }
    }
}

/// Seconds the worker spent in each phase of an evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EvalPhases {
    pub load_s: f64,
    pub reference_s: f64,
    pub correctness_s: f64,
    pub timing_s: f64,
    pub ref_timing_s: f64,
    /// Handing the job and the reference data to the candidate's process, and its exit.
    #[serde(default)]
    pub isolation_s: f64,
    /// Waiting for a warm candidate process.
    #[serde(default)]
    pub spawn_wait_s: f64,
}

impl EvalPhases {
    pub fn to_map(&self) -> Map<String, Value> {
        let mut m = Map::new();
        for (k, v) in [
            ("load_s", self.load_s),
            ("reference_s", self.reference_s),
            ("correctness_s", self.correctness_s),
            ("timing_s", self.timing_s),
            ("ref_timing_s", self.ref_timing_s),
            ("isolation_s", self.isolation_s),
            ("spawn_wait_s", self.spawn_wait_s),
        ] {
            // A non-finite duration cannot be JSON; leave it out rather than lie.
            if let Some(n) = serde_json::Number::from_f64(v) {
                m.insert(k.to_string(), Value::Number(n));
            }
        }
        m
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvaluateResponse {
    pub status: EvalStatus,
    pub compiled: bool,
    pub correctness: bool,
    /// KernelBench's metadata keys and string formats.
    pub metadata: Map<String, Value>,
    /// Candidate mean in ms, -1.0 when not measured.
    pub runtime: f64,
    /// `{}` on the wire when not measured.
    #[serde(with = "stats_or_empty")]
    pub runtime_stats: Option<RuntimeStats>,
    pub ref_runtime: f64,
    #[serde(with = "stats_or_empty")]
    pub ref_runtime_stats: Option<RuntimeStats>,
    /// `measured`, `cached`, `baseline:<name>`, or null.
    pub ref_runtime_source: Option<String>,
    pub speedup: Option<f64>,
    pub feedback: String,
    pub env: WireEnv,
    pub phases: EvalPhases,
    /// The CUDA context is poisoned: the worker must be replaced.
    pub sticky: bool,
    /// Runtime integrity findings from the candidate's process.
    #[serde(default)]
    pub findings: Vec<crate::types::Finding>,
    /// The excessive-speedup guard, when a speedup was measured.
    #[serde(default)]
    pub speedup_check: Option<crate::types::SpeedupCheck>,
    /// The worker's own precision probe of the problem, when it made one here (`worker::probes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision_probe: Option<ProbeSummary>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProfileStatus {
    Ok,
    CompileError,
    RuntimeError,
    CudaError,
    OutOfMemory,
    ReferenceError,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NcuMetrics {
    pub duration_ns: f64,
    pub achieved_occupancy: Option<f64>,
    pub dram_throughput_pct: Option<f64>,
    pub sm_throughput_pct: Option<f64>,
    pub num_kernels: u32,
    /// The forward's fraction of speed of light: each kernel's fraction of the roof it sits under,
    /// weighted by its duration, over the kernels whose roofline is known (`kb_ncu.sol_fraction`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sol_fraction: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileResponse {
    pub status: ProfileStatus,
    pub table: String,
    pub ncu: Option<NcuMetrics>,
    /// Why something is missing (no ncu, profiler unavailable, ...).
    pub note: Option<String>,
    pub duration_s: f64,
    pub sticky: bool,
}

/// The typed part of a successful response; the `kind` field on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ResponseBody {
    Ready(Ready),
    Compile(CompileResponse),
    Prepare(PrepareResponse),
    /// Not a response: a notice read while waiting for one (see [`ProgressNotice`]).
    Progress(ProgressNotice),
    Evaluate(Box<EvaluateResponse>),
    Profile(ProfileResponse),
    WarmHeaders(WarmHeadersResponse),
    Shutdown,
}

impl ResponseBody {
    pub fn kind(&self) -> &'static str {
        match self {
            ResponseBody::Ready(_) => "ready",
            ResponseBody::Compile(_) => "compile",
            ResponseBody::Prepare(_) => "prepare",
            ResponseBody::Progress(_) => "progress",
            ResponseBody::Evaluate(_) => "evaluate",
            ResponseBody::Profile(_) => "profile",
            ResponseBody::WarmHeaders(_) => "warm_headers",
            ResponseBody::Shutdown => "shutdown",
        }
    }

    /// True when the worker says its CUDA context is poisoned.
    pub fn sticky(&self) -> bool {
        match self {
            ResponseBody::Evaluate(e) => e.sticky,
            ResponseBody::Profile(p) => p.sticky,
            _ => false,
        }
    }
}

/// `{"id": .., "ok": true, "kind": .., ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OkResponse {
    pub id: u64,
    pub ok: bool,
    #[serde(flatten)]
    pub body: ResponseBody,
}

/// `{"id": .., "ok": false, "kind": .., "error": ..}`: the request was malformed or the harness failed
/// internally. A failing candidate is never reported this way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub id: u64,
    pub ok: bool,
    pub kind: String,
    pub error: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    Ok(OkResponse),
    Error(ErrorResponse),
}

impl Response {
    pub fn id(&self) -> u64 {
        match self {
            Response::Ok(r) => r.id,
            Response::Error(r) => r.id,
        }
    }

    pub fn to_value(&self) -> Result<Value, serde_json::Error> {
        match self {
            Response::Ok(r) => serde_json::to_value(r),
            Response::Error(r) => serde_json::to_value(r),
        }
    }
}

/// Parse one response line. The error says what was wrong, for the worker log and the verdict.
pub fn parse_response(line: &str) -> Result<Response, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not JSON ({e})"))?;
    parse_response_value(value)
}

pub fn parse_response_value(value: Value) -> Result<Response, String> {
    let ok = match value.get("ok") {
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(format!("`ok` is not a boolean: {other}")),
        None => return Err("missing field `ok`".into()),
    };
    if ok {
        serde_json::from_value(value)
            .map(Response::Ok)
            .map_err(|e| format!("bad response: {e}"))
    } else {
        serde_json::from_value(value)
            .map(Response::Error)
            .map_err(|e| format!("bad error response: {e}"))
    }
}

/// Serde adapter for "stats, or `{}` when not measured".
mod stats_or_empty {
    use super::*;

    pub fn serialize<S: Serializer>(v: &Option<RuntimeStats>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(stats) => stats.serialize(s),
            None => Map::new().serialize(s),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RuntimeStats>, D::Error> {
        let value = Value::deserialize(d)?;
        match &value {
            Value::Object(m) if m.is_empty() => Ok(None),
            Value::Null => Ok(None),
            _ => RuntimeStats::deserialize(value)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shutdown_request_is_op_and_id_only() {
        let r = Request {
            id: 10,
            body: RequestBody::Shutdown,
        };
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            serde_json::json!({"id": 10, "op": "shutdown"})
        );
    }

    #[test]
    fn error_response_with_free_kind_parses() {
        let r =
            parse_response(r#"{"id": 3, "ok": false, "kind": "bogus", "error": "boom"}"#).unwrap();
        assert!(matches!(r, Response::Error(ref e) if e.error == "boom" && e.id == 3));
    }

    #[test]
    fn empty_stats_are_none() {
        let v: RuntimeStats = serde_json::from_value(serde_json::json!({
            "mean": 1.0, "median": 1.0, "std": 0.0, "min": 1.0, "max": 1.0, "num_trials": 3
        }))
        .unwrap();
        assert_eq!(v.num_trials, 3);
        assert!(parse_response("not json").is_err());
        assert!(parse_response(r#"{"id": 1}"#).is_err());
    }
}
