//! The engine's view of the outside world: the LLM, the compile pool and the device executor.
//!
//! Each is a trait so the engine runs the same against real services (OpenAI-compatible providers,
//! Python workers) and against the scripted and simulated ones used by tests, the quickstart and the
//! scheduler benchmark.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::types::{
    CompileOutcome, Event, ExecOutcome, LlmAnswer, LlmRequest, Problem, ProfileOutcome, TaskId,
};

/// Where services report informational events (LLM attempts, token streams). The engine appends
/// them to the log and forwards them to subscribers.
#[derive(Clone)]
pub struct EventSink {
    tx: mpsc::UnboundedSender<(Option<TaskId>, Event)>,
}

impl EventSink {
    pub fn new(tx: mpsc::UnboundedSender<(Option<TaskId>, Event)>) -> Self {
        EventSink { tx }
    }

    /// A sink that drops everything (for tools and tests that do not log).
    pub fn discard() -> Self {
        let (tx, _rx) = mpsc::unbounded_channel();
        EventSink { tx }
    }

    pub fn emit(&self, task: Option<TaskId>, event: Event) {
        // A closed channel means the run is shutting down; informational events may be dropped then.
        let _ = self.tx.send((task, event));
    }
}

/// Why an LLM request produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// Retries exhausted or an unusable response; this turn is spent, the run goes on.
    #[error("{0}")]
    Failed(String),
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

#[async_trait]
pub trait Compiler: Send + Sync {
    async fn compile(&self, job: CompileJob) -> CompileOutcome;
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
    async fn execute(&self, job: ExecJob, device: &DeviceId) -> ExecOutcome;
    /// Profile of one correct candidate on `device`.
    async fn profile(&self, job: ExecJob, device: &DeviceId) -> ProfileOutcome;
}
