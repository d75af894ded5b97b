//! `RunState`: a run as folded from its log records, once, for every consumer of it.
//!
//! The one reducer of the event log. Each record is applied once and answers the terminal UI (live,
//! `watch`, `replay`) and the progress line (through [`crate::view::RunView`], which adds the fast_p
//! curve), the report's tables and the Python package (through [`crate::report::load`]), the ledger
//! (lease and spend tallies: [`ledger::LedgerTally`]), GPU-seconds per turn, the benchmarks (time per
//! stage and the leases' spans: [`times::Times`]), `--replay-llm` (each turn's recorded answer), the
//! budget spent before a resume and the engine's resume itself (its machines, folded keeping only
//! what later prompts need: [`RunState::resuming`]). Each task is folded through the engine's own
//! task machine ([`TaskRunner`]), so no consumer can disagree with what the engine did. Pure: no I/O,
//! no clock, no terminal; records that were already applied (same or older `seq`) are ignored, so a
//! source may hand the same record twice (a live view rebuilt from the log after its broadcast
//! lagged, a watched file read again).

pub mod ledger;
pub mod times;

use std::collections::{BTreeMap, BTreeSet};

pub use crate::machine::Stage;
use crate::machine::{MachineError, Retention, TaskRunner, TaskSpec, TaskTurns};
use crate::spend::Spend;
use crate::types::{
    Command, EndReason, Event, FeedbackMode, LogRecord, MethodKind, ProblemKey, TaskId, TurnRecord,
    Verdict, WaitingOn,
};

use ledger::{DeviceUse, Ledger, LedgerTally};
use times::Times;

/// What applying a record did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Already applied (same or older `seq`).
    Ignored,
    /// Folded; `turn_ended` when a task finished a turn (or the run's plan arrived).
    Folded { turn_ended: bool },
}

/// What the first `RunStarted` says about the run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    /// The run's name.
    pub run: String,
    pub method: MethodKind,
    /// The feedback mode tasks fold with (`GE` when the log names none).
    pub feedback: FeedbackMode,
    /// The feedback mode as logged.
    pub logged_feedback: Option<FeedbackMode>,
    /// The run's plan: every task, in the logged order.
    pub task_ids: Vec<TaskId>,
    /// Turns per task (1 for one-shot and sampling).
    pub turns: u32,
    /// Tasks per problem (k for sampling, else 1).
    pub samples: u32,
    /// The results came from simulated services (displays and reports say so).
    pub simulated: bool,
    /// Problem file names, for displays (empty in logs older than the field).
    pub problem_names: BTreeMap<ProblemKey, String>,
    /// Sorted, distinct: the fast_p denominator.
    pub problems: Vec<ProblemKey>,
}

impl RunInfo {
    /// Length of the fast_p curve: turns (refine), samples (sampling), 1 (one-shot).
    pub fn axis(&self) -> u32 {
        match self.method {
            MethodKind::Refine => self.turns,
            MethodKind::Sampling => self.samples,
            MethodKind::OneShot => 1,
        }
    }
}

/// One task: its machine, and what displays show beside the machine's turns.
pub struct TaskView {
    pub id: TaskId,
    /// The engine's own machine for the task, fed this task's events: its turns are the task's.
    runner: TaskRunner,
    /// The command the machine issued last, which no record applied so far answers: what an engine
    /// that goes on from this fold performs first ([`RunState::into_runners`]).
    pending: Command,
    /// Where the machine is, as displays name it (kept beside the machine for them to read).
    pub stage: Stage,
    /// The turn the task is in (its last turn when done; 0 before its first event for a done task).
    pub turn: u32,
    /// The task's turns in all (the plan's; unbounded for a task the log names without a plan).
    pub max_turns: u32,
    /// Answer text streamed so far, by turn, until the answer is logged (live runs only: streamed
    /// text is never written to the log).
    pub streaming: BTreeMap<u32, String>,
    /// The prompt file of each turn whose request was sent, relative to the run directory.
    pub prompt_files: BTreeMap<u32, String>,
    /// Why this task's machine stopped folding (an event that did not fit: a corrupt log).
    pub error: Option<String>,
    /// The same, as the machine said it (reports refuse a log that does not fold).
    fault: Option<MachineError>,
    /// The task was left unfinished by an outage (a `deferred` event): what it waits on. Cleared
    /// when the task moves again (after a resume).
    pub deferred: Option<WaitingOn>,
}

impl std::fmt::Debug for TaskView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskView")
            .field("id", &self.id)
            .field("stage", &self.stage)
            .field("turn", &self.turn)
            .field("max_turns", &self.max_turns)
            .field("turns", &self.turns().len())
            .finish()
    }
}

impl TaskView {
    fn new(spec: TaskSpec, retention: Retention) -> Self {
        let (id, max_turns) = (spec.id, spec.max_turns);
        let (runner, pending) = TaskRunner::start_keeping(spec, retention);
        let (stage, turn) = runner.stage();
        TaskView {
            id,
            runner,
            pending,
            stage,
            turn,
            max_turns,
            streaming: BTreeMap::new(),
            prompt_files: BTreeMap::new(),
            error: None,
            fault: None,
            deferred: None,
        }
    }

    pub fn turns(&self) -> &[TurnRecord] {
        self.runner.turns()
    }

    pub fn feedback(&self) -> FeedbackMode {
        self.runner.spec().feedback
    }

    /// Turns that have a verdict.
    pub fn finished_turns(&self) -> usize {
        self.turns().iter().filter(|t| t.verdict.is_some()).count()
    }

    /// The verdict of the latest finished turn.
    pub fn last_verdict(&self) -> Option<Verdict> {
        self.turns().iter().rev().find_map(|t| t.verdict)
    }

    /// The best speedup among correct turns.
    pub fn best_speedup(&self) -> Option<f64> {
        self.turns()
            .iter()
            .filter_map(TurnRecord::correct_speedup)
            .filter(|s| s.is_finite())
            .reduce(f64::max)
    }

    /// True when the latest finished turn is not correct.
    pub fn failing(&self) -> bool {
        self.last_verdict().is_some_and(|v| v != Verdict::Correct)
    }

    /// The log has driven this task's machine: it left its first turn's Generate, or refused an
    /// event.
    pub fn moved(&self) -> bool {
        self.fault.is_some() || (self.stage, self.turn) != (Stage::Generate, 1)
    }
}

/// One device as the lease events show it. Its leases, held and busy time are the ledger's
/// ([`DeviceUse`], read through `Deref`): one tally for displays and reports.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeviceView {
    /// The task and turn holding the lease now.
    pub holder: Option<(TaskId, u32)>,
    /// The ledger's count of this device's leases.
    pub usage: DeviceUse,
    /// Reference preparations it made ahead of candidates (`reference_prepared`).
    pub prepares: u32,
    /// Time the device was held to prepare reference data ahead of candidates (not in `held_ms`).
    pub prepare_ms: u64,
    /// Of `prepare_ms`, the worker's own time on those preparations (not in `busy_ms`).
    pub prepare_busy_ms: u64,
    /// Why the device was retired, once it was (`device_retired`): it takes no more work.
    pub lost: Option<String>,
}

impl std::ops::Deref for DeviceView {
    type Target = DeviceUse;
    fn deref(&self) -> &DeviceUse {
        &self.usage
    }
}

/// The state of a run after the records applied so far.
#[derive(Debug, Default)]
pub struct RunState {
    /// What the tasks' machines keep of their finished turns: every turn for displays and reports;
    /// only what later prompts need when the engine goes on from the fold ([`RunState::resuming`]).
    retention: Retention,
    /// The run's plan and shape, from its first `RunStarted` (`None` until one is applied).
    pub info: Option<RunInfo>,
    /// `RunStarted` records after the first (resumptions).
    pub resumes: u32,
    /// Every task of the plan, and any other the log names.
    pub tasks: BTreeMap<TaskId, TaskView>,
    /// Devices by name (`cpu`, `cuda:0`): those a lease named, and those a caller added.
    pub devices: BTreeMap<String, DeviceView>,
    /// (task, turn) of LLM requests sent and not yet answered.
    pub llm_in_flight: BTreeSet<(TaskId, u32)>,
    /// (task, turn) → unix ms until which the request waits to retry.
    pub llm_waiting: BTreeMap<(TaskId, u32), u64>,
    /// Retry waits so far (rate limits and transient errors).
    pub retry_waits: u64,
    /// Waits that followed a 429.
    pub rate_limited: u64,
    /// All LLM spending so far (the ledger's total).
    pub spend: Spend,
    /// The same answers counted as the budget counts them ([`Spend::add_budgeted`]): what a resumed
    /// run has already spent of its budget.
    pub budget_spend: Spend,
    /// The model that answered last, as the provider named it.
    pub model: Option<String>,
    /// The first and the latest record's time (unix ms): the run's elapsed time.
    pub first_ts: Option<u64>,
    pub last_ts: u64,
    /// Why the run ended, once its `RunEnded` is applied (cleared when a resume starts).
    pub ended: Option<EndReason>,
    /// The last record applied is a `RunEnded` saying the run finished.
    pub complete: bool,
    /// Which cap stopped new LLM requests (`budget_exhausted`), once one did.
    pub budget_exhausted: Option<String>,
    /// The last persisted record applied: records at or below it are applied already.
    pub last_seq: Option<u64>,
    /// Records applied (transient ones included).
    pub applied: u64,
    /// The ledger's tallies.
    tally: LedgerTally,
    /// Where the time went: the stages' totals and the leases' spans.
    times: Times,
}

impl RunState {
    pub fn new() -> Self {
        RunState::default()
    }

    /// A fold for the engine to go on from (a resume): each task of `plan` starts from its own
    /// spec, and every machine keeps `retention` of its finished turns (the engine keeps only what
    /// later prompts need, since the log holds the rest). What such a state says of finished turns
    /// (verdicts, speedups, [`RunState::task_turns`]) is what the retention kept; its machines go
    /// to the engine through [`RunState::into_runners`].
    pub fn resuming(plan: &[TaskSpec], retention: Retention) -> Self {
        let mut s = RunState {
            retention,
            ..RunState::default()
        };
        for spec in plan {
            s.tasks.insert(spec.id, TaskView::new(*spec, retention));
        }
        s
    }

    /// The tasks' machines, each with the command it still has to perform, for an engine to go on
    /// from; a task whose machine refused an event of the log is that error.
    pub fn into_runners(self) -> BTreeMap<TaskId, Result<(TaskRunner, Command), MachineError>> {
        self.tasks
            .into_iter()
            .map(|(id, t)| {
                let runner = match t.fault {
                    Some(e) => Err(e),
                    None => Ok((t.runner, t.pending)),
                };
                (id, runner)
            })
            .collect()
    }

    /// Fold a whole log.
    pub fn from_records<'a>(records: impl IntoIterator<Item = &'a LogRecord>) -> Self {
        let mut s = RunState::new();
        for r in records {
            s.apply(r);
        }
        s
    }

    /// Apply one record.
    pub fn apply(&mut self, rec: &LogRecord) -> Applied {
        let transient = rec.event.is_transient();
        if !transient {
            if self.last_seq.is_some_and(|s| rec.seq <= s) {
                return Applied::Ignored;
            }
            self.last_seq = Some(rec.seq);
            self.first_ts.get_or_insert(rec.ts_ms);
            self.last_ts = self.last_ts.max(rec.ts_ms);
            self.tally.apply(rec);
            self.times.apply(rec);
            self.complete =
                matches!(&rec.event, Event::RunEnded { reason } if reason.is_finished());
        }
        self.applied += 1;
        let turn_ended = match &rec.event {
            Event::RunStarted { .. } => self.start_run(&rec.event),
            Event::RunEnded { reason } => {
                self.end_run(reason);
                false
            }
            Event::BudgetExhausted { what } => {
                self.budget_exhausted = Some(what.clone());
                false
            }
            Event::LlmStarted { .. }
            | Event::LlmRetryWait { .. }
            | Event::LlmDelta { .. }
            | Event::LlmAttempt { .. }
            | Event::Deferred { .. } => {
                self.note_request(rec);
                false
            }
            Event::LeaseGranted { .. }
            | Event::LeaseReleased { .. }
            | Event::ReferencePrepared { .. }
            | Event::InputsPrepared { .. }
            | Event::DeviceRetired { .. } => {
                self.note_device(rec);
                false
            }
            Event::LlmAnswered { .. }
            | Event::LlmFailed { .. }
            | Event::Compiled { .. }
            | Event::Executed { .. }
            | Event::Profiled { .. } => {
                if let Event::LlmAnswered { answer, .. } = &rec.event {
                    self.spend = *self.tally.total();
                    self.budget_spend.add_budgeted(answer);
                    if !answer.model.is_empty() {
                        self.model = Some(answer.model.clone());
                    }
                }
                self.drive(rec)
            }
        };
        Applied::Folded { turn_ended }
    }

    /// A `RunStarted`: the first one plans the run (true: the plan arrived), a later one is a
    /// resume.
    fn start_run(&mut self, started: &Event) -> bool {
        let Event::RunStarted {
            run,
            method,
            feedback,
            task_ids,
            turns,
            samples,
            simulated,
            problem_names,
            ..
        } = started
        else {
            return false;
        };
        self.ended = None;
        if self.info.is_some() {
            self.resumes += 1;
            return false;
        }
        let logged_feedback = *feedback;
        let feedback = feedback.unwrap_or(FeedbackMode::GE);
        let mut problems: Vec<ProblemKey> = task_ids.iter().map(|t| t.problem).collect();
        problems.sort_unstable();
        problems.dedup();
        self.info = Some(RunInfo {
            run: run.clone(),
            method: *method,
            feedback,
            logged_feedback,
            task_ids: task_ids.clone(),
            turns: *turns,
            samples: *samples,
            simulated: *simulated,
            problem_names: problem_names.clone(),
            problems,
        });
        let retention = self.retention;
        for &id in task_ids {
            self.tasks.entry(id).or_insert_with(|| {
                let spec = TaskSpec {
                    id,
                    max_turns: *turns,
                    feedback,
                };
                TaskView::new(spec, retention)
            });
        }
        true
    }

    /// A `RunEnded`: whatever was in flight was abandoned with the run.
    fn end_run(&mut self, reason: &EndReason) {
        self.ended = Some(reason.clone());
        self.llm_in_flight.clear();
        self.llm_waiting.clear();
        for d in self.devices.values_mut() {
            d.holder = None;
        }
        for t in self.tasks.values_mut() {
            t.streaming.clear();
        }
    }

    /// An LLM request's progress short of its answer: sent, waiting to retry, streaming, an
    /// attempt, or deferred by an outage.
    fn note_request(&mut self, rec: &LogRecord) {
        match &rec.event {
            Event::LlmStarted { turn, prompt_file } => {
                if let Some(task) = rec.task {
                    self.llm_in_flight.insert((task, *turn));
                    if let Some(p) = prompt_file {
                        self.task_mut(task).prompt_files.insert(*turn, p.clone());
                    }
                }
            }
            Event::LlmRetryWait {
                turn,
                wait_ms,
                status,
                ..
            } => {
                self.retry_waits += 1;
                if *status == Some(429) {
                    self.rate_limited += 1;
                }
                if let Some(task) = rec.task {
                    self.llm_waiting
                        .insert((task, *turn), rec.ts_ms.saturating_add(*wait_ms));
                }
            }
            Event::LlmDelta { turn, delta } => {
                if let Some(task) = rec.task {
                    let t = self.task_mut(task);
                    // A delta of a turn already answered (arriving late over the bus) is dropped.
                    if t.turns()
                        .get(*turn as usize - 1)
                        .is_none_or(|r| r.answer.is_none())
                    {
                        t.streaming.entry(*turn).or_default().push_str(delta);
                    }
                }
            }
            Event::Deferred {
                turn, waiting_on, ..
            } => {
                if let Some(task) = rec.task {
                    self.llm_in_flight.remove(&(task, *turn));
                    self.llm_waiting.remove(&(task, *turn));
                    self.task_mut(task).deferred = Some(*waiting_on);
                }
            }
            // Counted by the ledger only.
            _ => {}
        }
    }

    /// A device's lease changing hands, its reference preparation, or its loss.
    fn note_device(&mut self, rec: &LogRecord) {
        match &rec.event {
            Event::LeaseGranted { device, turn, .. } => {
                let usage = self.tally.device(device).copied().unwrap_or_default();
                let d = self.devices.entry(device.clone()).or_default();
                d.usage = usage;
                d.holder = rec.task.map(|t| (t, *turn));
            }
            Event::LeaseReleased { device, .. } => {
                let usage = self.tally.device(device).copied().unwrap_or_default();
                let d = self.devices.entry(device.clone()).or_default();
                d.usage = usage;
                d.holder = None;
            }
            Event::ReferencePrepared {
                device,
                held_ms,
                outcome,
                ..
            } => {
                let d = self.devices.entry(device.clone()).or_default();
                d.prepares += 1;
                d.prepare_ms += held_ms;
                d.prepare_busy_ms += outcome.duration_ms.min(*held_ms);
            }
            Event::DeviceRetired { device, error, .. } => {
                let d = self.devices.entry(device.clone()).or_default();
                d.lost = Some(error.clone());
                d.holder = None;
            }
            // Inputs are made on the CPU with no lease held: no device's time.
            _ => {}
        }
    }

    /// Feed a machine-driving event to its task; true when a turn ended.
    fn drive(&mut self, rec: &LogRecord) -> bool {
        let Some(task) = rec.task else { return false };
        let turn = match &rec.event {
            Event::LlmAnswered { turn, .. } | Event::LlmFailed { turn, .. } => {
                self.llm_in_flight.remove(&(task, *turn));
                self.llm_waiting.remove(&(task, *turn));
                Some(*turn)
            }
            _ => None,
        };
        let t = self.task_mut(task);
        t.deferred = None;
        if let Some(turn) = turn {
            t.streaming.remove(&turn);
        }
        if t.error.is_some() {
            return false;
        }
        let before = t.runner.finished();
        match t.runner.handle(&rec.event) {
            Ok(Some(next)) => t.pending = next,
            Ok(None) => {}
            Err(e) => {
                t.error = Some(e.to_string());
                t.fault = Some(e);
            }
        }
        let (stage, turn) = t.runner.stage();
        t.stage = stage;
        t.turn = turn;
        t.runner.finished() != before
    }

    /// The task, created on first sight when the log names a task `RunStarted` did not list.
    fn task_mut(&mut self, id: TaskId) -> &mut TaskView {
        let (max_turns, feedback) = self
            .info
            .as_ref()
            .map(|i| (i.turns, i.feedback))
            .unwrap_or((u32::MAX, FeedbackMode::GE));
        let retention = self.retention;
        self.tasks.entry(id).or_insert_with(|| {
            let spec = TaskSpec {
                id,
                max_turns,
                feedback,
            };
            TaskView::new(spec, retention)
        })
    }

    /// Turns finished over all tasks.
    pub fn finished_turns(&self) -> u64 {
        self.tasks.values().map(|t| t.finished_turns() as u64).sum()
    }

    /// Turns of the whole plan.
    pub fn planned_turns(&self) -> u64 {
        self.tasks.values().map(|t| t.max_turns as u64).sum()
    }

    /// (correct, not correct) finished turns.
    pub fn verdict_tally(&self) -> (u64, u64) {
        let mut ok = 0;
        let mut bad = 0;
        for t in self.tasks.values() {
            for r in t.turns() {
                match r.verdict {
                    Some(Verdict::Correct) => ok += 1,
                    Some(_) => bad += 1,
                    None => {}
                }
            }
        }
        (ok, bad)
    }

    /// Tasks in each stage.
    pub fn stage_counts(&self) -> BTreeMap<Stage, usize> {
        let mut m = BTreeMap::new();
        for t in self.tasks.values() {
            *m.entry(t.stage).or_insert(0) += 1;
        }
        m
    }

    /// Tasks waiting for a device: in execute or profile and holding no lease.
    pub fn device_queue(&self) -> usize {
        let holding: BTreeSet<TaskId> = self
            .devices
            .values()
            .filter_map(|d| d.holder.map(|(t, _)| t))
            .collect();
        self.tasks
            .values()
            .filter(|t| matches!(t.stage, Stage::Execute | Stage::Profile) && self.ended.is_none())
            .filter(|t| !holding.contains(&t.id))
            .count()
    }

    /// Show a device before any lease names it (the devices a run was given).
    pub fn add_device(&mut self, name: &str) {
        self.devices.entry(name.to_string()).or_default();
    }

    /// Requests waiting out a retry delay at `now_ms`.
    pub fn waiting_at(&self, now_ms: u64) -> usize {
        self.llm_waiting.values().filter(|&&u| u > now_ms).count()
    }

    /// The ledger of the records applied so far (what reports show of the spending).
    pub fn ledger(&self) -> Ledger {
        self.tally.ledger()
    }

    /// Where the run's time went: the stages' totals and the leases' spans.
    pub fn times(&self) -> &Times {
        &self.times
    }

    /// Milliseconds of device leases held per (task, turn): GPU-seconds per turn.
    pub fn device_ms(&self) -> &BTreeMap<(TaskId, u32), u64> {
        self.tally.device_ms()
    }

    /// Every planned task's turns (every task the log names when it has no `RunStarted`), for
    /// reports; an error when one of them did not fold (a corrupt or foreign log).
    pub fn task_turns(&self) -> Result<TaskTurns, MachineError> {
        let ids: Vec<TaskId> = match &self.info {
            Some(info) => info.task_ids.clone(),
            None => self.tasks.keys().copied().collect(),
        };
        let mut out = TaskTurns::new();
        for id in ids {
            let Some(t) = self.tasks.get(&id) else {
                continue;
            };
            if let Some(e) = &t.fault {
                return Err(e.clone());
            }
            out.insert(id, t.turns().to_vec());
        }
        Ok(out)
    }

    /// Time from the first record to `now_ms`, or to the last record once the run ended.
    pub fn elapsed_ms(&self, now_ms: u64) -> u64 {
        let Some(first) = self.first_ts else { return 0 };
        let end = if self.ended.is_some() {
            self.last_ts
        } else {
            now_ms.max(self.last_ts)
        };
        end.saturating_sub(first)
    }

    pub fn problem_name(&self, key: ProblemKey) -> Option<&str> {
        self.info
            .as_ref()
            .and_then(|i| i.problem_names.get(&key))
            .map(String::as_str)
    }
}
