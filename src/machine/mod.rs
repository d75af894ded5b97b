//! The pure per-task state machine: Generate → Precompile → Execute → Profile → Feedback → next turn
//! or Done.
//!
//! A task's machine receives the events that answer its commands (`LlmAnswered`, `Compiled`, ...)
//! and returns the next command. No I/O, no clocks, no randomness: the same log always folds into the
//! same state, which is what resume, replay, metrics and the tests rely on.
//!
//! Feedback is not a resting state: when a turn ends, the machine writes the turn's feedback (what the
//! feedback mode lets the next prompt see) and moves straight to the next turn's Generate, or to Done.
//!
//! How much of its finished turns a machine keeps is its [`Retention`]: folds for reports and views
//! keep every turn whole; the engine keeps only what later prompts are made of, since the log holds
//! the rest and a long run has many tasks.

mod feedback;

use statig::prelude::*;

use crate::settings::HistoryPolicy;
use crate::types::{
    Command, CompileStatus, Event, FeedbackMode, PromptContext, TaskId, TurnFeedback, TurnRecord,
    Verdict,
};

pub use feedback::{NO_CODE_FEEDBACK, execution_text, turn_feedback};

/// Turn records of every task of a run, by task.
pub type TaskTurns = std::collections::BTreeMap<TaskId, Vec<TurnRecord>>;

/// Where a task is in its turn: the machine's resting states, as displays, the engine and reports
/// name them. Feedback is not a resting stage: a turn's feedback is written when it ends, and the
/// task moves straight to the next turn's `Generate` (or `Done`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    Generate,
    /// The precompile step (building the candidate, on the CPU pool).
    Compile,
    Execute,
    Profile,
    Done,
}

impl Stage {
    /// The stage's name as displays show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Generate => "generate",
            Stage::Compile => "precompile",
            Stage::Execute => "execute",
            Stage::Profile => "profile",
            Stage::Done => "done",
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a task is: its identity, how many turns it runs, what each turn feeds back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskSpec {
    pub id: TaskId,
    pub max_turns: u32,
    pub feedback: FeedbackMode,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("task {task}: {message}")]
pub struct MachineError {
    pub task: TaskId,
    pub message: String,
}

/// Commands produced while handling one event (statig's external context).
#[derive(Default)]
pub struct Outbox(Vec<Command>);

/// What a machine keeps of the turns it has finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Retention {
    /// Every turn whole, for whoever shows or measures them (reports, metrics, views).
    #[default]
    Everything,
    /// Only what later prompts are made of: a finished turn becomes its feedback (the prompt
    /// builder's form); under the `last` history policy only the latest is kept, since no prompt
    /// shows an older one. The log holds the rest for whoever folds it with `Everything`.
    Prompts(HistoryPolicy),
}

/// Shared storage of the machine: the spec and the turns so far.
pub struct Task {
    spec: TaskSpec,
    retention: Retention,
    /// `Everything`: every turn so far. `Prompts`: the turn in progress only.
    turns: Vec<TurnRecord>,
    /// `Prompts`: what later prompts see of the finished turns, oldest first.
    kept: Vec<TurnFeedback>,
    /// Turns finished so far.
    finished: u32,
    /// Set when an event did not fit the state it arrived in (a corrupt or foreign log).
    rejected: Option<String>,
}

#[state_machine(
    initial = "State::generate(1)",
    state(derive(Debug, Clone, PartialEq, Eq))
)]
impl Task {
    #[state(entry_action = "enter_generate")]
    fn generate(&mut self, turn: &u32, context: &mut Outbox, event: &Event) -> Outcome<State> {
        // The context is only written by entry actions; naming it here tells statig its type.
        let _ = context;
        match event {
            Event::LlmAnswered {
                turn: t,
                answer,
                code,
                ..
            } if t == turn => {
                let rec = self.record(*turn);
                rec.answer = Some(answer.clone());
                rec.code = code.clone();
                match code {
                    Some(_) => Transition(State::precompile(*turn)),
                    None => self.end_turn(*turn, Verdict::NoCode),
                }
            }
            Event::LlmFailed { turn: t, error, .. } if t == turn => {
                self.record(*turn).llm_error = Some(error.clone());
                self.end_turn(*turn, Verdict::LlmError)
            }
            other => self.reject(other, "generate", *turn),
        }
    }

    #[action]
    fn enter_generate(&mut self, turn: &u32, context: &mut Outbox) {
        let history = match self.retention {
            Retention::Everything => self.turns.iter().map(|r| self.feedback_of(r)).collect(),
            Retention::Prompts(_) => self.kept.clone(),
        };
        context.0.push(Command::CallLlm {
            turn: *turn,
            context: PromptContext {
                turn: *turn,
                feedback: self.spec.feedback,
                history,
            },
        });
    }

    #[state(entry_action = "enter_precompile")]
    fn precompile(&mut self, turn: &u32, event: &Event) -> Outcome<State> {
        match event {
            Event::Compiled { turn: t, outcome } if t == turn => {
                self.record(*turn).compile = Some(outcome.clone());
                match outcome.status {
                    CompileStatus::Ok => Transition(State::execute(*turn)),
                    CompileStatus::Error => self.end_turn(*turn, Verdict::CompileError),
                    CompileStatus::Timeout => self.end_turn(*turn, Verdict::Timeout),
                    CompileStatus::Crashed => self.end_turn(*turn, Verdict::Crashed),
                    CompileStatus::Rejected => self.end_turn(*turn, Verdict::Rejected),
                }
            }
            other => self.reject(other, "precompile", *turn),
        }
    }

    #[action]
    fn enter_precompile(&mut self, turn: &u32, context: &mut Outbox) {
        let code = self.code_of(*turn);
        context.0.push(Command::Compile { turn: *turn, code });
    }

    #[state(entry_action = "enter_execute")]
    fn execute(&mut self, turn: &u32, event: &Event) -> Outcome<State> {
        match event {
            Event::Executed { turn: t, outcome } if t == turn => {
                self.record(*turn).exec = Some(outcome.clone());
                if outcome.verdict == Verdict::Correct && self.spec.feedback.includes_profile() {
                    Transition(State::profile(*turn))
                } else {
                    self.end_turn(*turn, outcome.verdict)
                }
            }
            other => self.reject(other, "execute", *turn),
        }
    }

    #[action]
    fn enter_execute(&mut self, turn: &u32, context: &mut Outbox) {
        let code = self.code_of(*turn);
        context.0.push(Command::Execute { turn: *turn, code });
    }

    #[state(entry_action = "enter_profile")]
    fn profile(&mut self, turn: &u32, event: &Event) -> Outcome<State> {
        match event {
            Event::Profiled { turn: t, outcome } if t == turn => {
                self.record(*turn).profile = Some(outcome.clone());
                // A failed profile does not undo a correct candidate.
                self.end_turn(*turn, Verdict::Correct)
            }
            other => self.reject(other, "profile", *turn),
        }
    }

    #[action]
    fn enter_profile(&mut self, turn: &u32, context: &mut Outbox) {
        let code = self.code_of(*turn);
        context.0.push(Command::Profile { turn: *turn, code });
    }

    #[state(entry_action = "enter_done")]
    fn done(&mut self, event: &Event) -> Outcome<State> {
        self.reject(event, "done", 0)
    }

    #[action]
    fn enter_done(context: &mut Outbox) {
        context.0.push(Command::Finish);
    }
}

impl Task {
    fn record(&mut self, turn: u32) -> &mut TurnRecord {
        match self.retention {
            Retention::Everything => {
                let idx = (turn as usize).saturating_sub(1);
                while self.turns.len() <= idx {
                    let n = self.turns.len() as u32 + 1;
                    self.turns.push(TurnRecord {
                        turn: n,
                        ..TurnRecord::default()
                    });
                }
                &mut self.turns[idx]
            }
            Retention::Prompts(_) => {
                if self.turns.last().map(|r| r.turn) != Some(turn) {
                    self.turns.clear();
                    self.turns.push(TurnRecord {
                        turn,
                        ..TurnRecord::default()
                    });
                }
                let last = self.turns.len() - 1;
                &mut self.turns[last]
            }
        }
    }

    fn held(&self, turn: u32) -> Option<&TurnRecord> {
        self.turns.iter().rev().find(|r| r.turn == turn)
    }

    fn code_of(&self, turn: u32) -> String {
        self.held(turn)
            .and_then(|r| r.code.clone())
            .unwrap_or_default()
    }

    /// The Feedback step: close the turn and go on to the next one or finish.
    fn end_turn(&mut self, turn: u32, verdict: Verdict) -> Outcome<State> {
        self.record(turn).verdict = Some(verdict);
        self.finished = self.finished.max(turn);
        let last_turn = turn >= self.spec.max_turns;
        if let Retention::Prompts(policy) = self.retention {
            if let Some(rec) = self.turns.pop() {
                if policy == HistoryPolicy::Last {
                    self.kept.clear();
                }
                self.kept.push(self.feedback_of(&rec));
            }
            if last_turn {
                // A finished task makes no more prompts.
                self.turns = Vec::new();
                self.kept = Vec::new();
            }
        }
        if last_turn {
            Transition(State::done())
        } else {
            Transition(State::generate(turn + 1))
        }
    }

    fn reject(&mut self, event: &Event, state: &str, turn: u32) -> Outcome<State> {
        if event.drives_machine() {
            self.rejected = Some(format!(
                "event `{}` does not fit state {state} (turn {turn})",
                event.kind()
            ));
        }
        Handled
    }

    /// What the next prompt may see of a finished turn, by feedback mode.
    fn feedback_of(&self, r: &TurnRecord) -> TurnFeedback {
        turn_feedback(self.spec.feedback, r)
    }
}

/// A running task machine with its pending command.
pub struct TaskRunner {
    sm: statig::blocking::InitializedStateMachine<Task>,
}

impl TaskRunner {
    /// A new task at turn 1 that keeps every turn; returns the first command (`CallLlm`).
    pub fn start(spec: TaskSpec) -> (Self, Command) {
        Self::start_keeping(spec, Retention::Everything)
    }

    /// A new task at turn 1 that keeps `retention` of its finished turns.
    pub fn start_keeping(spec: TaskSpec, retention: Retention) -> (Self, Command) {
        let mut out = Outbox::default();
        let sm = Task {
            spec,
            retention,
            turns: Vec::new(),
            kept: Vec::new(),
            finished: 0,
            rejected: None,
        }
        .uninitialized_state_machine()
        .init_with_context(&mut out);
        let cmd = single(out).unwrap_or(Command::Finish);
        (TaskRunner { sm }, cmd)
    }

    /// Feed one event; returns the next command, or `None` for informational events.
    pub fn handle(&mut self, event: &Event) -> Result<Option<Command>, MachineError> {
        if !event.drives_machine() {
            return Ok(None);
        }
        let mut out = Outbox::default();
        self.sm.handle_with_context(event, &mut out);
        // A rejected event poisons the machine for good: the log it came from cannot be trusted.
        if let Some(message) = self.sm.rejected.clone() {
            return Err(MachineError {
                task: self.sm.spec.id,
                message,
            });
        }
        Ok(single(out))
    }

    /// Rebuild a task from its logged events, keeping every turn; returns the runner and the command
    /// still to perform.
    pub fn fold<'a>(
        spec: TaskSpec,
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Result<(Self, Command), MachineError> {
        Self::fold_keeping(spec, Retention::Everything, events)
    }

    /// [`TaskRunner::fold`] keeping `retention` of the finished turns.
    pub fn fold_keeping<'a>(
        spec: TaskSpec,
        retention: Retention,
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Result<(Self, Command), MachineError> {
        let (mut runner, mut pending) = TaskRunner::start_keeping(spec, retention);
        for e in events {
            if let Some(cmd) = runner.handle(e)? {
                pending = cmd;
            }
        }
        Ok((runner, pending))
    }

    pub fn spec(&self) -> &TaskSpec {
        &self.sm.spec
    }

    /// The turns held whole: every turn so far under [`Retention::Everything`], only the turn in
    /// progress under [`Retention::Prompts`].
    pub fn turns(&self) -> &[TurnRecord] {
        &self.sm.turns
    }

    /// Turn `turn` when it is held whole (see [`TaskRunner::turns`]).
    pub fn turn(&self, turn: u32) -> Option<&TurnRecord> {
        self.sm.held(turn)
    }

    /// What later prompts see of the finished turns under [`Retention::Prompts`] (empty otherwise,
    /// and once the task is done).
    pub fn kept_feedback(&self) -> &[TurnFeedback] {
        &self.sm.kept
    }

    pub fn is_done(&self) -> bool {
        matches!(self.sm.state(), State::Done {})
    }

    /// Turns finished so far, whatever the retention keeps of them.
    pub fn finished(&self) -> u32 {
        self.sm.finished
    }

    /// The stage and turn the task is in (its last turn once done), for displays.
    pub fn stage(&self) -> (Stage, u32) {
        match self.sm.state() {
            State::Generate { turn } => (Stage::Generate, *turn),
            State::Precompile { turn } => (Stage::Compile, *turn),
            State::Execute { turn } => (Stage::Execute, *turn),
            State::Profile { turn } => (Stage::Profile, *turn),
            State::Done {} => (Stage::Done, self.sm.finished),
        }
    }
}

fn single(out: Outbox) -> Option<Command> {
    // Every transition enters exactly one state, whose entry action issues exactly one command.
    out.0.into_iter().last()
}

#[cfg(test)]
mod tests;
