//! The engine's view of the outside world: the LLM, the compile pool and the device executor.
//!
//! Each is a trait so the engine runs the same against real services (OpenAI-compatible providers,
//! Python workers) and against the scripted and simulated ones used by tests, the quickstart and the
//! scheduler benchmark.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::types::{
    CompileOutcome, Event, ExecOutcome, InputsOutcome, LlmAnswer, LlmRequest, PrepareOutcome,
    PrepareStatus, Problem, ProblemKey, ProfileOutcome, TaskId,
};

/// Room in the informational-event channel. Bounded so that a flood (a fast token stream while the
/// log writer is slow) holds its producers back instead of growing memory without limit.
pub const SINK_CAPACITY: usize = 4096;

/// Where services report informational events (LLM attempts, token streams). The engine appends
/// them to the log and forwards them to subscribers.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::Sender<(Option<TaskId>, Event)>,
}

impl EventSink {
    /// A sink over a bounded channel (see [`SINK_CAPACITY`]).
    pub fn new(tx: mpsc::Sender<(Option<TaskId>, Event)>) -> Self {
        EventSink { tx }
    }

    /// A sink that drops everything (for tools and tests that do not log).
    pub fn discard() -> Self {
        let (tx, _rx) = mpsc::channel(1);
        EventSink { tx }
    }

    /// Record an event that goes into the log (attempts, budget): waits for room in the channel.
    pub async fn record(&self, task: Option<TaskId>, event: Event) {
        // A closed channel means the run is shutting down; informational events may be dropped then.
        let _ = self.tx.send((task, event)).await;
    }

    /// Emit a transient event (streamed tokens) from synchronous code: dropped when the channel is
    /// full, since live views only lose a little text and the answer itself is logged whole.
    pub fn emit(&self, task: Option<TaskId>, event: Event) {
        let _ = self.tx.try_send((task, event));
    }
}

/// Why an LLM request produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The request as sent will not succeed (e.g. a prompt over the context length, no recorded
    /// answer to replay): this turn is spent with an `llm_error` verdict, the run goes on.
    #[error("{0}")]
    Failed(String),
    /// The endpoint did not answer within the retries (5xx, 429, timeouts, refused connections):
    /// not the turn's fault. Nothing is recorded for the turn; the run ends incomplete and a resume
    /// asks again.
    #[error("{0}")]
    Unavailable(String),
    /// The run cannot go on (bad API key, unknown model, budget exhausted): stop early.
    #[error("{0}")]
    Fatal(String),
    /// The run was cancelled while the request was in flight; nothing is recorded.
    #[error("cancelled")]
    Cancelled,
}

#[async_trait]
pub trait Llm: Send + Sync {
    /// Short description for logs and `doctor` (provider, model, endpoint).
    fn describe(&self) -> String;
    async fn complete(&self, req: LlmRequest, sink: &EventSink) -> Result<LlmAnswer, LlmError>;
}

/// A candidate to build.
#[derive(Debug, Clone)]
pub struct CompileJob {
    pub task: TaskId,
    pub turn: u32,
    pub code: String,
    /// Where the full compiler log goes (absolute; inside the run directory).
    pub log_path: std::path::PathBuf,
}

/// The evaluation machinery itself failed (no worker could be started, the pool was shut down):
/// not the candidate's fault, so no verdict. The turn is left unfinished and a resume redoes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

/// Held while the CPU device times a candidate: builds stay paused until it is dropped.
#[allow(dead_code, reason = "held for its Drop only")]
pub struct BuildPause(Box<dyn Send + Sync>);

impl BuildPause {
    pub fn new(guard: impl Send + Sync + 'static) -> Self {
        BuildPause(Box::new(guard))
    }
}

#[async_trait]
pub trait Compiler: Send + Sync {
    async fn compile(&self, job: CompileJob) -> Result<CompileOutcome, Unavailable>;

    /// The outcome of an identical build made earlier (a success, or a failure in the candidate's
    /// own code), found without a compile slot or a share of the CPU budget; `None`: it must be
    /// built (`compile` looks again under the build's lock).
    async fn cached(&self, _job: &CompileJob) -> Option<CompileOutcome> {
        None
    }

    /// Pause the builds running now (and hold new ones back) until the returned guard is dropped,
    /// so a CPU timing runs on quiet cores without waiting for those builds to end. `None`: this
    /// compiler cannot pause; the engine then waits for its compile pool to drain instead.
    async fn pause_builds(&self) -> Option<BuildPause> {
        None
    }

    /// Whether `job`'s build would use the shared headers [`Compiler::warm_headers`] makes, so that
    /// it waits for them rather than compile torch's headers itself (false: this compiler makes none).
    fn uses_warm_headers(&self, _job: &CompileJob) -> bool {
        false
    }

    /// Make the shared precompiled headers that builds with torch's default flags use, before the
    /// first of them asks (on a cold build cache each of a run's first builds otherwise compiles
    /// torch's headers itself). Returns when they are made or `wait` has passed (they are then
    /// stored when done); a header made before costs nothing. Holds one compile worker meanwhile.
    async fn warm_headers(&self, _wait: std::time::Duration) {}
}

/// A compiled candidate to check, time or profile on a leased device.
#[derive(Debug, Clone)]
pub struct ExecJob {
    pub task: TaskId,
    pub turn: u32,
    pub problem: Arc<Problem>,
    pub code: String,
    /// Build directory from the compile step.
    pub build_dir: Option<String>,
}

/// What making a problem's inputs will take, known before they are made ([`Executor::plan_inputs`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputsPlan {
    /// Bytes of the whole entry (every seed); `None` when the problem's `get_inputs()` cannot be sized
    /// without running it.
    pub bytes: Option<u64>,
    /// Processes its maker runs (1: one after another, in its own process).
    pub processes: u32,
}

/// A device the engine leases: `cpu` or a GPU index.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceId {
    Cpu,
    Gpu(u32),
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceId::Cpu => f.write_str("cpu"),
            DeviceId::Gpu(i) => write!(f, "cuda:{i}"),
        }
    }
}

#[async_trait]
pub trait Executor: Send + Sync {
    /// Correctness and timing of one candidate on `device`, which the caller holds a lease for.
    async fn execute(&self, job: ExecJob, device: &DeviceId) -> Result<ExecOutcome, Unavailable>;
    /// Profile of one correct candidate on `device`.
    async fn profile(&self, job: ExecJob, device: &DeviceId)
    -> Result<ProfileOutcome, Unavailable>;
    /// True once `device` can serve nothing more (the host of its worker was drained): the engine
    /// then retires the device and runs the step on another one.
    fn retired(&self, _device: &DeviceId) -> bool {
        false
    }

    /// Keep `problem`'s stored inputs from being evicted while the returned value lives: held by a
    /// candidate from the start of its build until its evaluation ends (and by its device step on
    /// its own, as after a resume). `None`: nothing to hold.
    fn hold_inputs(&self, _problem: &Problem) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        None
    }

    /// Whether [`Executor::prepare_reference`] does anything (the engine then prepares reference
    /// data ahead of candidates, see `crate::refprep`).
    fn prepares_reference(&self) -> bool {
        false
    }

    /// The plans of `problems`' inputs, asked once before any is made (one process sizes them all on
    /// the meta device, nothing is made): their size, so the largest start first, and how many
    /// processes each one's maker runs, at most `processes`, so the CPU stage claims those cores and
    /// no more. Empty: no plans (no store, or the sizing failed); makers then claim their cap.
    async fn plan_inputs(
        &self,
        _problems: Vec<Arc<Problem>>,
        _processes: Option<u32>,
    ) -> HashMap<ProblemKey, InputsPlan> {
        HashMap::new()
    }

    /// Make `problem`'s inputs on the CPU ahead of need (into the on-disk store), in processes of
    /// their own: the caller holds **no** device lease. `None`: this executor has no store (nothing
    /// was done, nothing is logged). `processes`: the most processes that may draw them at once (the
    /// CPU budget's grant); `None`: as many as the maker sees fit.
    async fn make_inputs(
        &self,
        _problem: Arc<Problem>,
        _processes: Option<u32>,
    ) -> Result<Option<InputsOutcome>, Unavailable> {
        Ok(None)
    }

    /// One step of building `problem`'s reference data on `device`, which the caller holds a lease
    /// for: the next correctness trial, the timing inputs or the reference timing. `quiet`: nothing
    /// else runs on the cores (the CPU device's builds are paused), so the reference may be timed.
    async fn prepare_reference(
        &self,
        _problem: Arc<Problem>,
        _device: &DeviceId,
        _quiet: bool,
    ) -> Result<PrepareOutcome, Unavailable> {
        Ok(PrepareOutcome {
            status: PrepareStatus::Ready,
            built: Vec::new(),
            trials_ready: 0,
            done: true,
            next: None,
            duration_ms: 0,
            error: None,
        })
    }
}
