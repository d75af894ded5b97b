//! Types that cross rooms: identities, settings enums, service results, what a worker process reports
//! of itself, events, commands.
//!
//! Everything written to `events.jsonl` is defined here, so the log format has one home. Adding a field
//! is fine (give it `#[serde(default)]`); renaming or removing one, or adding an event kind (which an
//! older reader cannot parse), needs a `SCHEMA_VERSION` bump (tests/event_schema.rs pins each
//! version's kinds).

mod basics;
mod results;
mod workers;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use basics::*;
pub use results::*;
pub use workers::*;

pub use crate::run_end::EndReason;

/// Version of the event-log schema, written into every record. 2: the kinds `deferred`,
/// `llm_retry_wait`, `reference_prepared`, `inputs_prepared` and `device_retired` (logs of version 1 are
/// read as they are).
pub const SCHEMA_VERSION: u32 = 2;

/// Everything that happens in a run. Events with a task drive that task's machine (the `Llm*`,
/// `Compiled`, `Executed`, `Profiled` ones) or are informational (attempts, leases); run-level events
/// have no task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[allow(
    clippy::large_enum_variant,
    reason = "events are built once per service call, then logged and folded; boxing the big \
              outcomes would only add indirection to every match"
)]
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
    /// The record's place in the log, from 0 with no gap: a reader that saw a `seq` has seen
    /// every record before it.
    pub seq: u64,
    /// Unix time in milliseconds.
    pub ts_ms: u64,
    /// The task the event belongs to; `None` for the run's own events (start, end, budget,
    /// reference preparation, devices).
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
