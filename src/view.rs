//! `RunView`: the state of a run as folded from its log records, for every display of it.
//!
//! One reducer over the log: the terminal UI (live, `watch`, `replay`) and the `--no-tui` progress
//! bar apply the same [`LogRecord`]s to a `RunView`, and each task is folded through the engine's own
//! task machine ([`TaskRunner`]), so a display can never disagree with what the engine did. Pure: no
//! I/O, no clock, no terminal; records that were already applied (same or older `seq`) are ignored, so
//! a source may hand the same record twice (a live view rebuilt from the log after its broadcast
//! lagged, a watched file read again).

use std::collections::{BTreeMap, BTreeSet};

use crate::machine::{TaskRunner, TaskSpec};
use crate::metrics::ledger::Spend;
use crate::metrics::{Best, FastP, attempt_position, summarize};
use crate::types::{
    Event, FeedbackMode, LogRecord, MethodKind, ProblemKey, TaskId, TurnRecord, Verdict, WaitingOn,
};

/// Where a task is in its turn. Feedback is not a resting stage: a turn's feedback is written when it
/// ends, and the task moves straight to the next turn's `Generate` (or `Done`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    Generate,
    Compile,
    Execute,
    Profile,
    Done,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Generate => "generate",
            Stage::Compile => "precompile",
            Stage::Execute => "execute",
            Stage::Profile => "profile",
            Stage::Done => "done",
        }
    }

    fn of(runner: &TaskRunner) -> (Stage, u32) {
        let (s, turn) = runner.stage();
        let stage = match s {
            "generate" => Stage::Generate,
            "compile" => Stage::Compile,
            "execute" => Stage::Execute,
            "profile" => Stage::Profile,
            _ => Stage::Done,
        };
        (stage, turn)
    }
}

/// What the first `RunStarted` says about the run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    pub run: String,
    pub method: MethodKind,
    pub feedback: FeedbackMode,
    pub turns: u32,
    pub samples: u32,
    pub simulated: bool,
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
    runner: TaskRunner,
    pub stage: Stage,
    /// The turn the task is in (its last turn when done; 0 before its first event for a done task).
    pub turn: u32,
    pub max_turns: u32,
    /// Answer text streamed so far, by turn, until the answer is logged (live runs only: streamed
    /// text is never written to the log).
    pub streaming: BTreeMap<u32, String>,
    /// The prompt file of each turn whose request was sent, relative to the run directory.
    pub prompt_files: BTreeMap<u32, String>,
    /// Why this task's machine stopped folding (an event that did not fit: a corrupt log).
    pub error: Option<String>,
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
    fn new(id: TaskId, max_turns: u32, feedback: FeedbackMode) -> Self {
        let (runner, _) = TaskRunner::start(TaskSpec {
            id,
            max_turns,
            feedback,
        });
        let (stage, turn) = Stage::of(&runner);
        TaskView {
            id,
            runner,
            stage,
            turn,
            max_turns,
            streaming: BTreeMap::new(),
            prompt_files: BTreeMap::new(),
            error: None,
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
}

/// One device as the lease events show it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DeviceView {
    /// The task and turn holding the lease now.
    pub holder: Option<(TaskId, u32)>,
    pub leases: u64,
    pub held_ms: u64,
    pub busy_ms: u64,
    /// Time the device was held to prepare reference data ahead of candidates (not in `held_ms`).
    pub prepare_ms: u64,
    /// Why the device was retired, once it was (`device_retired`): it takes no more work.
    pub lost: Option<String>,
}

/// The state of a run after the records applied so far.
#[derive(Debug, Default)]
pub struct RunView {
    pub info: Option<RunInfo>,
    /// `RunStarted` records after the first (resumptions).
    pub resumes: u32,
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
    pub spend: Spend,
    /// The model that answered last, as the provider named it.
    pub model: Option<String>,
    pub first_ts: Option<u64>,
    pub last_ts: u64,
    /// Why the run ended, once its `RunEnded` is applied (cleared when a resume starts).
    pub ended: Option<String>,
    pub budget_exhausted: Option<String>,
    pub last_seq: Option<u64>,
    /// Records applied (transient ones included).
    pub applied: u64,
    /// fast_p and correct rate at each step `1..=axis`, as of the last [`RunView::refresh`].
    pub curve: Vec<CurvePoint>,
    /// A turn ended since the curve was computed.
    curve_stale: bool,
}

/// One step of the fast_p curve.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CurvePoint {
    pub n: u32,
    pub fast_p: FastP,
    pub correct_rate: f64,
    pub geomean: Option<f64>,
}

impl RunView {
    pub fn new() -> Self {
        RunView::default()
    }

    /// Fold a whole log.
    pub fn from_records<'a>(records: impl IntoIterator<Item = &'a LogRecord>) -> Self {
        let mut v = RunView::new();
        for r in records {
            v.apply(r);
        }
        v.refresh();
        v
    }

    /// Recompute the derived numbers (the fast_p curve) after records were applied. Displays call
    /// it once a frame rather than once a record: it looks at every problem's every step.
    pub fn refresh(&mut self) {
        if self.curve_stale {
            self.curve = self.compute_curve();
            self.curve_stale = false;
        }
    }

    /// Apply one record. Returns false when it was ignored (already applied).
    pub fn apply(&mut self, rec: &LogRecord) -> bool {
        let transient = rec.event.is_transient();
        if !transient {
            if self.last_seq.is_some_and(|s| rec.seq <= s) {
                return false;
            }
            self.last_seq = Some(rec.seq);
            self.first_ts.get_or_insert(rec.ts_ms);
            self.last_ts = self.last_ts.max(rec.ts_ms);
        }
        self.applied += 1;
        let mut turn_ended = false;
        match &rec.event {
            Event::RunStarted {
                run,
                method,
                feedback,
                task_ids,
                turns,
                samples,
                simulated,
                problem_names,
                ..
            } => {
                self.ended = None;
                if self.info.is_some() {
                    self.resumes += 1;
                } else {
                    let feedback = feedback.unwrap_or(FeedbackMode::GE);
                    let mut problems: Vec<ProblemKey> =
                        task_ids.iter().map(|t| t.problem).collect();
                    problems.sort_unstable();
                    problems.dedup();
                    self.info = Some(RunInfo {
                        run: run.clone(),
                        method: *method,
                        feedback,
                        turns: *turns,
                        samples: *samples,
                        simulated: *simulated,
                        problem_names: problem_names.clone(),
                        problems,
                    });
                    for &id in task_ids {
                        self.tasks
                            .entry(id)
                            .or_insert_with(|| TaskView::new(id, *turns, feedback));
                    }
                    turn_ended = true;
                }
            }
            Event::RunEnded { reason } => {
                self.ended = Some(reason.clone());
                // Whatever was in flight was abandoned with the run.
                self.llm_in_flight.clear();
                self.llm_waiting.clear();
                for d in self.devices.values_mut() {
                    d.holder = None;
                }
                for t in self.tasks.values_mut() {
                    t.streaming.clear();
                }
            }
            Event::BudgetExhausted { what } => self.budget_exhausted = Some(what.clone()),
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
            Event::LlmAttempt { .. } => {}
            Event::Deferred {
                turn, waiting_on, ..
            } => {
                if let Some(task) = rec.task {
                    self.llm_in_flight.remove(&(task, *turn));
                    self.llm_waiting.remove(&(task, *turn));
                    self.task_mut(task).deferred = Some(*waiting_on);
                }
            }
            Event::LeaseGranted { device, turn, .. } => {
                let d = self.devices.entry(device.clone()).or_default();
                d.leases += 1;
                d.holder = rec.task.map(|t| (t, *turn));
            }
            Event::LeaseReleased {
                device,
                held_ms,
                busy_ms,
                ..
            } => {
                let d = self.devices.entry(device.clone()).or_default();
                d.held_ms += held_ms;
                d.busy_ms += busy_ms;
                d.holder = None;
            }
            Event::ReferencePrepared {
                device, held_ms, ..
            } => {
                self.devices.entry(device.clone()).or_default().prepare_ms += held_ms;
            }
            // Made on the CPU with no lease held: no device's time.
            Event::InputsPrepared { .. } => {}
            Event::DeviceRetired { device, error, .. } => {
                let d = self.devices.entry(device.clone()).or_default();
                d.lost = Some(error.clone());
                d.holder = None;
            }
            Event::LlmAnswered { .. }
            | Event::LlmFailed { .. }
            | Event::Compiled { .. }
            | Event::Executed { .. }
            | Event::Profiled { .. } => {
                if let Event::LlmAnswered { answer, .. } = &rec.event {
                    self.spend.add(&Spend::of(answer));
                    if !answer.model.is_empty() {
                        self.model = Some(answer.model.clone());
                    }
                }
                turn_ended = self.drive(rec);
            }
        }
        self.curve_stale |= turn_ended;
        true
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
        let before = t.finished_turns();
        if let Err(e) = t.runner.handle(&rec.event) {
            t.error = Some(e.to_string());
        }
        let (stage, turn) = Stage::of(&t.runner);
        t.stage = stage;
        t.turn = turn;
        t.finished_turns() != before
    }

    /// The task, created on first sight when the log names a task `RunStarted` did not list.
    fn task_mut(&mut self, id: TaskId) -> &mut TaskView {
        let (turns, feedback) = self
            .info
            .as_ref()
            .map(|i| (i.turns, i.feedback))
            .unwrap_or((u32::MAX, FeedbackMode::GE));
        self.tasks
            .entry(id)
            .or_insert_with(|| TaskView::new(id, turns, feedback))
    }

    fn compute_curve(&self) -> Vec<CurvePoint> {
        let Some(info) = &self.info else {
            return Vec::new();
        };
        let mut bests = vec![Best::default(); info.problems.len()];
        (1..=info.axis())
            .map(|n| {
                let (sample, turn) = attempt_position(info.method, n);
                for (best, &problem) in bests.iter_mut().zip(&info.problems) {
                    let record = self
                        .tasks
                        .get(&TaskId { problem, sample })
                        .and_then(|t| t.turns().iter().find(|r| r.turn == turn));
                    if let Some(r) = record {
                        best.add(r);
                    }
                }
                let s = summarize(&bests);
                CurvePoint {
                    n,
                    fast_p: s.fast_p,
                    correct_rate: s.correct_rate,
                    geomean: s.geomean_speedup,
                }
            })
            .collect()
    }

    /// fast_p at the last step (the run's current standing), as of the last refresh.
    pub fn current(&self) -> Option<CurvePoint> {
        self.curve.last().copied()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{
        CompileOutcome, CompileStatus, ExecOutcome, LlmAnswer, SCHEMA_VERSION, Usage,
    };

    fn task(p: u32) -> TaskId {
        TaskId {
            problem: ProblemKey {
                level: 1,
                problem_id: p,
            },
            sample: 0,
        }
    }

    fn rec(seq: u64, task: Option<TaskId>, event: Event) -> LogRecord {
        LogRecord {
            v: SCHEMA_VERSION,
            seq,
            ts_ms: 1000 + seq * 10,
            task,
            event,
        }
    }

    fn started() -> Event {
        Event::RunStarted {
            run: "r".into(),
            method: MethodKind::Refine,
            feedback: Some(FeedbackMode::GE),
            task_ids: vec![task(1), task(2)],
            turns: 2,
            samples: 1,
            krefine_version: "0".into(),
            resumed: false,
            simulated: true,
            problem_names: BTreeMap::new(),
        }
    }

    fn answered(turn: u32) -> Event {
        Event::LlmAnswered {
            turn,
            answer: LlmAnswer {
                content: "x".into(),
                usage: Some(Usage {
                    prompt_tokens: 10,
                    completion_tokens: 5,
                    reasoning_tokens: 0,
                }),
                cost_usd: Some(0.5),
                model: "m".into(),
                finish_reason: None,
                latency_ms: 1,
                attempts: 1,
            },
            code: Some("code".into()),
            code_file: None,
        }
    }

    fn compiled(turn: u32) -> Event {
        Event::Compiled {
            turn,
            outcome: CompileOutcome {
                ran_on: None,
                worker_losses: Vec::new(),
                status: CompileStatus::Ok,
                cached: false,
                error_name: None,
                error: None,
                feedback: String::new(),
                log_path: None,
                build_dir: None,
                duration_ms: 1,
                findings: Vec::new(),
                build_path: None,
            },
        }
    }

    fn executed(turn: u32, speedup: Option<f64>) -> Event {
        let mut o = ExecOutcome::failure(Verdict::Incorrect, "cpu", "wrong".into(), 1);
        if let Some(s) = speedup {
            o.verdict = Verdict::Correct;
            o.correctness = true;
            o.speedup = Some(s);
        }
        Event::Executed { turn, outcome: o }
    }

    #[test]
    fn duplicate_and_older_records_are_ignored() {
        let mut v = RunView::new();
        assert!(v.apply(&rec(0, None, started())));
        assert!(v.apply(&rec(1, Some(task(1)), answered(1))));
        assert!(!v.apply(&rec(1, Some(task(1)), answered(1))));
        assert!(!v.apply(&rec(0, None, started())));
        assert_eq!(v.spend.tokens(), 15);
        assert_eq!(v.tasks[&task(1)].stage, Stage::Compile);
    }

    #[test]
    fn in_flight_devices_and_curve() {
        let t1 = Some(task(1));
        let mut v = RunView::new();
        let started_llm = Event::LlmStarted {
            turn: 1,
            prompt_file: Some("prompts/p.json".into()),
        };
        for (i, (t, e)) in [
            (None, started()),
            (t1, started_llm),
            (
                t1,
                Event::LlmRetryWait {
                    turn: 1,
                    attempt: 1,
                    wait_ms: 500,
                    status: Some(429),
                },
            ),
        ]
        .into_iter()
        .enumerate()
        {
            v.apply(&rec(i as u64, t, e));
        }
        assert_eq!(v.llm_in_flight.len(), 1);
        assert_eq!(v.waiting_at(1020), 1);
        assert_eq!(v.waiting_at(1020 + 500), 0);
        assert_eq!(v.rate_limited, 1);
        v.apply(&rec(3, t1, answered(1)));
        v.apply(&rec(4, t1, compiled(1)));
        assert!(v.llm_in_flight.is_empty());
        assert_eq!(v.device_queue(), 1);
        v.apply(&rec(
            5,
            t1,
            Event::LeaseGranted {
                device: "cpu".into(),
                wait_ms: 0,
                turn: 1,
            },
        ));
        assert_eq!(v.devices["cpu"].holder, Some((task(1), 1)));
        assert_eq!(v.device_queue(), 0);
        v.apply(&rec(
            6,
            t1,
            Event::LeaseReleased {
                device: "cpu".into(),
                held_ms: 9,
                busy_ms: 7,
                turn: 1,
            },
        ));
        v.apply(&rec(7, t1, executed(1, Some(1.25))));
        v.refresh();
        let t = &v.tasks[&task(1)];
        assert_eq!((t.stage, t.turn), (Stage::Generate, 2));
        assert_eq!(t.best_speedup(), Some(1.25));
        assert_eq!(t.prompt_files[&1], "prompts/p.json");
        let c = v.current().unwrap();
        assert_eq!(c.n, 2);
        // One of two problems is faster than the reference.
        assert_eq!(c.fast_p.get(1.0), Some(0.5));
        assert_eq!(c.fast_p.get(1.5), Some(0.0));
        assert_eq!(v.curve[0].fast_p.get(0.0), Some(0.5));
        assert_eq!(v.finished_turns(), 1);
        assert_eq!(v.planned_turns(), 4);
        assert_eq!(v.verdict_tally(), (1, 0));
    }

    #[test]
    fn streamed_text_lasts_until_the_answer() {
        let t1 = Some(task(1));
        let mut v = RunView::new();
        v.apply(&rec(0, None, started()));
        let delta = |d: &str| LogRecord {
            v: SCHEMA_VERSION,
            seq: 0,
            ts_ms: 1005,
            task: t1,
            event: Event::LlmDelta {
                turn: 1,
                delta: d.into(),
            },
        };
        v.apply(&delta("ab"));
        v.apply(&delta("c"));
        assert_eq!(v.tasks[&task(1)].streaming[&1], "abc");
        v.apply(&rec(1, t1, answered(1)));
        assert!(v.tasks[&task(1)].streaming.is_empty());
        v.apply(&delta("late"));
        assert!(v.tasks[&task(1)].streaming.is_empty());
    }

    #[test]
    fn a_foreign_event_marks_the_task_not_the_run() {
        let mut v = RunView::new();
        v.apply(&rec(0, None, started()));
        v.apply(&rec(1, Some(task(1)), compiled(1)));
        assert!(
            v.tasks[&task(1)]
                .error
                .as_deref()
                .unwrap()
                .contains("compiled")
        );
        v.apply(&rec(2, Some(task(2)), answered(1)));
        assert_eq!(v.tasks[&task(2)].stage, Stage::Compile);
    }
}
