//! The pure per-task state machine: Generate → Precompile → Execute → Profile → Feedback → next turn
//! or Done.
//!
//! A task's machine receives the events that answer its commands (`LlmAnswered`, `Compiled`, ...)
//! and returns the next command. No I/O, no clocks, no randomness: the same log always folds into the
//! same state, which is what resume, replay, metrics and the tests rely on.
//!
//! Feedback is not a resting state: when a turn ends, the machine writes the turn's feedback (what the
//! feedback mode lets the next prompt see) and moves straight to the next turn's Generate, or to Done.

use statig::prelude::*;

use crate::checks;
use crate::types::{
    Command, CompileStatus, Event, FeedbackMode, PromptContext, TaskId, TurnFeedback, TurnRecord,
    Verdict,
};

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

/// The words a prompt gets when an answer had no usable code.
pub const NO_CODE_FEEDBACK: &str = "Your answer contained no code block with a `ModelNew` class, so nothing could be compiled or evaluated. Reply with the complete new architecture in a single ```python block.";

/// Commands produced while handling one event (statig's external context).
#[derive(Default)]
pub struct Outbox(Vec<Command>);

/// Shared storage of the machine: the spec and the turns so far.
pub struct Task {
    spec: TaskSpec,
    turns: Vec<TurnRecord>,
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
        let history = self.turns.iter().map(|r| self.feedback_of(r)).collect();
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

    fn code_of(&self, turn: u32) -> String {
        self.turns
            .get((turn as usize).saturating_sub(1))
            .and_then(|r| r.code.clone())
            .unwrap_or_default()
    }

    /// The Feedback step: close the turn and go on to the next one or finish.
    fn end_turn(&mut self, turn: u32, verdict: Verdict) -> Outcome<State> {
        self.record(turn).verdict = Some(verdict);
        if turn < self.spec.max_turns {
            Transition(State::generate(turn + 1))
        } else {
            Transition(State::done())
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

/// What the next prompt may see of a finished turn under `mode` (also what displays show as the
/// feedback sent back to the model).
pub fn turn_feedback(mode: FeedbackMode, r: &TurnRecord) -> TurnFeedback {
    let execution = mode
        .includes_execution()
        .then(|| execution_text(r))
        .flatten();
    let profile = if mode.includes_profile() {
        r.profile
            .as_ref()
            .filter(|p| p.ok && !p.table.is_empty())
            .map(|p| p.table.clone())
    } else {
        None
    };
    TurnFeedback {
        turn: r.turn,
        answer: r.answer.as_ref().map(|a| a.content.clone()),
        code: r.code.clone(),
        execution,
        profile,
    }
}

/// Findings listed per kind (static, runtime) in one turn's feedback; the rest are counted.
const FINDINGS_IN_FEEDBACK: usize = 10;

/// The execution feedback (E) of a turn in plain words: the result, then the static-check findings
/// on its source and the runtime findings of its evaluation.
pub fn execution_text(r: &TurnRecord) -> Option<String> {
    if let Some(err) = &r.llm_error {
        return Some(format!(
            "The request to the model failed ({err}); no candidate was produced in this turn."
        ));
    }
    if r.answer.is_some() && r.code.is_none() {
        return Some(NO_CODE_FEEDBACK.to_string());
    }
    let static_findings = r.compile.as_ref().map_or(&[][..], |c| &c.findings[..]);
    let runtime_findings = r.exec.as_ref().map_or(&[][..], |e| &e.findings[..]);
    let parts: Vec<String> = [
        result_text(r),
        checks::findings_text("static", static_findings, FINDINGS_IN_FEEDBACK),
        checks::findings_text("runtime", runtime_findings, FINDINGS_IN_FEEDBACK),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| parts.join("\n"))
}

/// What the evaluation (or the build, when it ended the turn) said about a turn's candidate.
fn result_text(r: &TurnRecord) -> Option<String> {
    if let Some(e) = &r.exec {
        return Some(e.feedback.clone());
    }
    let c = r.compile.as_ref()?;
    let head = match c.status {
        CompileStatus::Ok => return None,
        CompileStatus::Error => match &c.error_name {
            Some(name) => format!("Compilation failed ({name})."),
            None => "Compilation failed.".to_string(),
        },
        CompileStatus::Timeout => "Compilation did not finish within the time limit.".to_string(),
        CompileStatus::Crashed => "The compiler process crashed.".to_string(),
        CompileStatus::Rejected => {
            "The candidate was rejected before compiling: static checks found code that the evaluation does not allow.".to_string()
        }
    };
    Some(if c.feedback.trim().is_empty() {
        head
    } else {
        format!("{head}\n{}", c.feedback.trim_end())
    })
}

/// A running task machine with its pending command.
pub struct TaskRunner {
    sm: statig::blocking::InitializedStateMachine<Task>,
}

impl TaskRunner {
    /// A new task at turn 1; returns the first command (`CallLlm`).
    pub fn start(spec: TaskSpec) -> (Self, Command) {
        let mut out = Outbox::default();
        let sm = Task {
            spec,
            turns: Vec::new(),
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

    /// Rebuild a task from its logged events; returns the runner and the command still to perform.
    pub fn fold<'a>(
        spec: TaskSpec,
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Result<(Self, Command), MachineError> {
        let (mut runner, mut pending) = TaskRunner::start(spec);
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

    pub fn turns(&self) -> &[TurnRecord] {
        &self.sm.turns
    }

    pub fn is_done(&self) -> bool {
        matches!(self.sm.state(), State::Done {})
    }

    /// The stage and turn the task is in, for progress displays.
    pub fn stage(&self) -> (&'static str, u32) {
        match self.sm.state() {
            State::Generate { turn } => ("generate", *turn),
            State::Precompile { turn } => ("compile", *turn),
            State::Execute { turn } => ("execute", *turn),
            State::Profile { turn } => ("profile", *turn),
            State::Done {} => ("done", self.sm.turns.len() as u32),
        }
    }
}

fn single(out: Outbox) -> Option<Command> {
    // Every transition enters exactly one state, whose entry action issues exactly one command.
    out.0.into_iter().last()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{CompileOutcome, ExecOutcome, LlmAnswer, ProblemKey, ProfileOutcome};

    fn spec(turns: u32, feedback: FeedbackMode) -> TaskSpec {
        TaskSpec {
            id: TaskId {
                problem: ProblemKey {
                    level: 1,
                    problem_id: 3,
                },
                sample: 0,
            },
            max_turns: turns,
            feedback,
        }
    }

    fn answered(turn: u32, code: Option<&str>) -> Event {
        Event::LlmAnswered {
            turn,
            answer: LlmAnswer {
                content: format!("answer {turn}"),
                usage: None,
                cost_usd: None,
                model: "m".into(),
                finish_reason: None,
                latency_ms: 0,
                attempts: 1,
            },
            code: code.map(str::to_string),
            code_file: None,
        }
    }

    fn compiled(turn: u32, status: CompileStatus) -> Event {
        Event::Compiled {
            turn,
            outcome: CompileOutcome {
                ran_on: None,
                worker_losses: Vec::new(),
                status,
                cached: false,
                error_name: (status == CompileStatus::Error).then(|| "BuildError".into()),
                error: None,
                feedback: if status == CompileStatus::Error {
                    "x.cu:3: error: expected ';'".into()
                } else {
                    String::new()
                },
                log_path: None,
                build_dir: Some("/b".into()),
                duration_ms: 5,
                findings: Vec::new(),
                build_path: None,
            },
        }
    }

    fn executed(turn: u32, verdict: Verdict, speedup: Option<f64>) -> Event {
        let mut o = ExecOutcome::failure(verdict, "cpu", format!("E{turn}: {verdict}"), 3);
        o.correctness = verdict == Verdict::Correct;
        o.speedup = speedup;
        Event::Executed { turn, outcome: o }
    }

    fn profiled(turn: u32) -> Event {
        Event::Profiled {
            turn,
            outcome: ProfileOutcome {
                worker_losses: Vec::new(),
                ok: true,
                table: format!("P{turn} table"),
                ncu: None,
                error: None,
                duration_ms: 1,
            },
        }
    }

    fn call_llm(cmd: &Command) -> &PromptContext {
        match cmd {
            Command::CallLlm { context, .. } => context,
            other => panic!("expected CallLlm, got {other:?}"),
        }
    }

    #[test]
    fn gep_full_turn_then_next_turn_sees_g_e_p() {
        let (mut m, first) = TaskRunner::start(spec(2, FeedbackMode::GEP));
        assert_eq!(
            first,
            Command::CallLlm {
                turn: 1,
                context: PromptContext {
                    turn: 1,
                    feedback: FeedbackMode::GEP,
                    history: vec![]
                }
            }
        );
        assert_eq!(
            m.handle(&answered(1, Some("code1"))).unwrap(),
            Some(Command::Compile {
                turn: 1,
                code: "code1".into()
            })
        );
        assert_eq!(
            m.handle(&compiled(1, CompileStatus::Ok)).unwrap(),
            Some(Command::Execute {
                turn: 1,
                code: "code1".into()
            })
        );
        assert_eq!(
            m.handle(&executed(1, Verdict::Correct, Some(1.5))).unwrap(),
            Some(Command::Profile {
                turn: 1,
                code: "code1".into()
            })
        );
        let next = m.handle(&profiled(1)).unwrap().unwrap();
        assert_eq!(
            call_llm(&next).history,
            vec![TurnFeedback {
                turn: 1,
                answer: Some("answer 1".into()),
                code: Some("code1".into()),
                execution: Some("E1: correct".into()),
                profile: Some("P1 table".into()),
            }]
        );
        assert_eq!(m.stage(), ("generate", 2));
        assert_eq!(m.turns()[0].verdict, Some(Verdict::Correct));
    }

    #[test]
    fn ge_skips_profile_and_hides_it() {
        let (mut m, _) = TaskRunner::start(spec(2, FeedbackMode::GE));
        m.handle(&answered(1, Some("c"))).unwrap();
        m.handle(&compiled(1, CompileStatus::Ok)).unwrap();
        let next = m
            .handle(&executed(1, Verdict::Correct, Some(2.0)))
            .unwrap()
            .unwrap();
        let h = &call_llm(&next).history[0];
        assert_eq!(h.execution.as_deref(), Some("E1: correct"));
        assert_eq!(h.profile, None);
    }

    #[test]
    fn g_shows_only_the_generation() {
        let (mut m, _) = TaskRunner::start(spec(2, FeedbackMode::G));
        m.handle(&answered(1, Some("c"))).unwrap();
        m.handle(&compiled(1, CompileStatus::Ok)).unwrap();
        let next = m
            .handle(&executed(1, Verdict::Incorrect, None))
            .unwrap()
            .unwrap();
        let h = &call_llm(&next).history[0];
        assert_eq!(h.code.as_deref(), Some("c"));
        assert_eq!(h.execution, None);
        assert_eq!(h.profile, None);
    }

    #[test]
    fn gep_profiles_only_correct_candidates() {
        let (mut m, _) = TaskRunner::start(spec(2, FeedbackMode::GEP));
        m.handle(&answered(1, Some("c"))).unwrap();
        m.handle(&compiled(1, CompileStatus::Ok)).unwrap();
        let next = m
            .handle(&executed(1, Verdict::Incorrect, None))
            .unwrap()
            .unwrap();
        assert!(matches!(next, Command::CallLlm { turn: 2, .. }));
        assert_eq!(m.turns()[0].verdict, Some(Verdict::Incorrect));
    }

    #[test]
    fn compile_error_ends_turn_with_compiler_feedback() {
        let (mut m, _) = TaskRunner::start(spec(2, FeedbackMode::GE));
        m.handle(&answered(1, Some("c"))).unwrap();
        let next = m
            .handle(&compiled(1, CompileStatus::Error))
            .unwrap()
            .unwrap();
        assert_eq!(
            call_llm(&next).history[0].execution.as_deref(),
            Some("Compilation failed (BuildError).\nx.cu:3: error: expected ';'")
        );
        assert_eq!(m.turns()[0].verdict, Some(Verdict::CompileError));
    }

    #[test]
    fn compile_timeout_and_crash_verdicts() {
        for (status, verdict) in [
            (CompileStatus::Timeout, Verdict::Timeout),
            (CompileStatus::Crashed, Verdict::Crashed),
        ] {
            let (mut m, _) = TaskRunner::start(spec(1, FeedbackMode::GE));
            m.handle(&answered(1, Some("c"))).unwrap();
            assert_eq!(
                m.handle(&compiled(1, status)).unwrap(),
                Some(Command::Finish)
            );
            assert_eq!(m.turns()[0].verdict, Some(verdict));
            assert!(m.is_done());
        }
    }

    #[test]
    fn rejected_by_static_checks_ends_the_turn_with_the_findings() {
        use crate::types::{Finding, Severity};
        let finding = |category: &str, severity, line| Finding {
            category: category.into(),
            severity,
            message: "why".into(),
            line,
        };
        let (mut m, _) = TaskRunner::start(spec(2, FeedbackMode::GE));
        m.handle(&answered(1, Some("c"))).unwrap();
        let Event::Compiled { mut outcome, .. } = compiled(1, CompileStatus::Rejected) else {
            unreachable!()
        };
        outcome.findings = vec![
            finding("timing_patch", Severity::Error, Some(12)),
            finding("missing_kernel", Severity::Warning, None),
        ];
        let next = m
            .handle(&Event::Compiled { turn: 1, outcome })
            .unwrap()
            .unwrap();
        assert_eq!(m.turns()[0].verdict, Some(Verdict::Rejected));
        assert_eq!(
            call_llm(&next).history[0].execution.as_deref(),
            Some(
                "The candidate was rejected before compiling: static checks found code that the evaluation does not allow.\n\
                 Static check errors (the candidate fails them):\n\
                 - static check: timing_patch at line 12: why\n\
                 Static check warnings (recorded; they do not change the verdict):\n\
                 - static check: missing_kernel: why"
            )
        );
    }

    #[test]
    fn warnings_and_runtime_findings_follow_the_execution_result() {
        use crate::types::{Finding, Severity};
        let (mut m, _) = TaskRunner::start(spec(2, FeedbackMode::GE));
        m.handle(&answered(1, Some("c"))).unwrap();
        let Event::Compiled { mut outcome, .. } = compiled(1, CompileStatus::Ok) else {
            unreachable!()
        };
        outcome.findings = vec![Finding {
            category: "code_bypass".into(),
            severity: Severity::Warning,
            message: "try".into(),
            line: Some(4),
        }];
        m.handle(&Event::Compiled { turn: 1, outcome }).unwrap();
        let Event::Executed { mut outcome, .. } = executed(1, Verdict::Incorrect, None) else {
            unreachable!()
        };
        outcome.findings = vec![Finding {
            category: "leftover_thread".into(),
            severity: Severity::Error,
            message: "a thread kept running".into(),
            line: None,
        }];
        let next = m
            .handle(&Event::Executed { turn: 1, outcome })
            .unwrap()
            .unwrap();
        assert_eq!(
            call_llm(&next).history[0].execution.as_deref(),
            Some(
                "E1: incorrect\n\
                 Static check warnings (recorded; they do not change the verdict):\n\
                 - static check: code_bypass at line 4: try\n\
                 Runtime check errors (the candidate fails them):\n\
                 - runtime check: leftover_thread: a thread kept running"
            )
        );
    }

    #[test]
    fn no_code_spends_the_turn() {
        let (mut m, _) = TaskRunner::start(spec(2, FeedbackMode::GE));
        let next = m.handle(&answered(1, None)).unwrap().unwrap();
        let h = &call_llm(&next).history[0];
        assert_eq!(h.execution.as_deref(), Some(NO_CODE_FEEDBACK));
        assert_eq!(h.code, None);
        assert_eq!(m.turns()[0].verdict, Some(Verdict::NoCode));
    }

    #[test]
    fn llm_failure_spends_the_turn() {
        let (mut m, _) = TaskRunner::start(spec(1, FeedbackMode::GEP));
        let e = Event::LlmFailed {
            turn: 1,
            error: "HTTP 500".into(),
            fatal: false,
        };
        assert_eq!(m.handle(&e).unwrap(), Some(Command::Finish));
        assert_eq!(m.turns()[0].verdict, Some(Verdict::LlmError));
    }

    #[test]
    fn last_turn_finishes() {
        let (mut m, _) = TaskRunner::start(spec(1, FeedbackMode::GEP));
        m.handle(&answered(1, Some("c"))).unwrap();
        m.handle(&compiled(1, CompileStatus::Ok)).unwrap();
        m.handle(&executed(1, Verdict::Correct, Some(1.1))).unwrap();
        assert_eq!(m.handle(&profiled(1)).unwrap(), Some(Command::Finish));
        assert!(m.is_done());
        assert_eq!(m.stage(), ("done", 1));
    }

    #[test]
    fn history_accumulates_oldest_first() {
        let (mut m, _) = TaskRunner::start(spec(3, FeedbackMode::GE));
        m.handle(&answered(1, None)).unwrap();
        m.handle(&answered(2, Some("c2"))).unwrap();
        m.handle(&compiled(2, CompileStatus::Ok)).unwrap();
        let next = m
            .handle(&executed(2, Verdict::RuntimeError, None))
            .unwrap()
            .unwrap();
        let ctx = call_llm(&next);
        assert_eq!(ctx.turn, 3);
        assert_eq!(
            ctx.history.iter().map(|h| h.turn).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(
            ctx.history[1].execution.as_deref(),
            Some("E2: runtime_error")
        );
    }

    #[test]
    fn wrong_turn_or_state_is_rejected() {
        let (mut m, _) = TaskRunner::start(spec(2, FeedbackMode::GE));
        let e = m.handle(&answered(2, Some("c"))).unwrap_err();
        assert!(e.message.contains("llm_answered"), "{e}");
        let (mut m, _) = TaskRunner::start(spec(2, FeedbackMode::GE));
        assert!(m.handle(&compiled(1, CompileStatus::Ok)).is_err());
    }

    #[test]
    fn informational_events_do_nothing() {
        let (mut m, _) = TaskRunner::start(spec(2, FeedbackMode::GE));
        let e = Event::LeaseGranted {
            device: "cpu".into(),
            wait_ms: 1,
            turn: 1,
        };
        assert_eq!(m.handle(&e).unwrap(), None);
        assert_eq!(m.stage(), ("generate", 1));
    }

    #[test]
    fn fold_returns_the_pending_command() {
        let events = vec![
            answered(1, Some("c1")),
            compiled(1, CompileStatus::Ok),
            executed(1, Verdict::Correct, Some(1.2)),
        ];
        let (m, pending) = TaskRunner::fold(spec(3, FeedbackMode::GEP), &events).unwrap();
        assert_eq!(
            pending,
            Command::Profile {
                turn: 1,
                code: "c1".into()
            }
        );
        assert_eq!(m.turns().len(), 1);
        let (_, pending) = TaskRunner::fold(spec(3, FeedbackMode::GEP), &[]).unwrap();
        assert!(matches!(pending, Command::CallLlm { turn: 1, .. }));
    }
}
