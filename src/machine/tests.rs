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
            cpu: None,
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
    assert_eq!(m.stage(), (Stage::Generate, 2));
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
    assert_eq!(m.stage(), (Stage::Done, 1));
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
    assert_eq!(m.stage(), (Stage::Generate, 1));
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

/// The events of three turns: no code, a compile error, then a correct and profiled candidate.
fn three_turns() -> Vec<Event> {
    vec![
        answered(1, None),
        answered(2, Some("c2")),
        compiled(2, CompileStatus::Error),
        answered(3, Some("c3")),
        compiled(3, CompileStatus::Ok),
        executed(3, Verdict::Correct, Some(1.4)),
        profiled(3),
    ]
}

/// The pending command after each prefix of `events`, folded keeping `retention`.
fn pending_after_each(retention: Retention, events: &[Event]) -> Vec<Command> {
    (0..=events.len())
        .map(|n| {
            TaskRunner::fold_keeping(spec(4, FeedbackMode::GEP), retention, &events[..n])
                .unwrap()
                .1
        })
        .collect()
}

#[test]
fn prompt_retention_under_full_history_asks_exactly_what_keeping_everything_asks() {
    let events = three_turns();
    assert_eq!(
        pending_after_each(Retention::Prompts(HistoryPolicy::Full), &events),
        pending_after_each(Retention::Everything, &events)
    );
}

#[test]
fn prompt_retention_under_last_history_keeps_only_the_latest_feedback() {
    let events = three_turns();
    let everything = pending_after_each(Retention::Everything, &events);
    let last = pending_after_each(Retention::Prompts(HistoryPolicy::Last), &events);
    for (all, kept) in everything.iter().zip(&last) {
        match (all, kept) {
            (Command::CallLlm { context: a, .. }, Command::CallLlm { context: k, .. }) => {
                assert_eq!((k.turn, k.feedback), (a.turn, a.feedback));
                // The only entry the `last` policy's prompt shows, and nothing else.
                assert_eq!(
                    k.history,
                    a.history.last().cloned().into_iter().collect::<Vec<_>>()
                );
            }
            _ => assert_eq!(all, kept),
        }
    }
}

#[test]
fn a_finished_turn_is_kept_in_the_prompt_builders_form_only() {
    let (mut m, _) = TaskRunner::start_keeping(
        spec(3, FeedbackMode::GEP),
        Retention::Prompts(HistoryPolicy::Last),
    );
    m.handle(&answered(1, Some("c1"))).unwrap();
    m.handle(&compiled(1, CompileStatus::Ok)).unwrap();
    // The turn in progress is whole: the device step needs its compile outcome.
    assert_eq!(
        m.turn(1)
            .and_then(|r| r.compile.as_ref())
            .and_then(|c| c.build_dir.as_deref()),
        Some("/b")
    );
    m.handle(&executed(1, Verdict::Correct, Some(1.5))).unwrap();
    m.handle(&profiled(1)).unwrap();
    assert!(m.turns().is_empty());
    assert_eq!(
        m.kept_feedback(),
        &[TurnFeedback {
            turn: 1,
            answer: Some("answer 1".into()),
            code: Some("c1".into()),
            execution: Some("E1: correct".into()),
            profile: Some("P1 table".into()),
        }]
    );
    m.handle(&answered(2, None)).unwrap();
    assert_eq!(
        m.kept_feedback().iter().map(|f| f.turn).collect::<Vec<_>>(),
        vec![2]
    );
    assert_eq!(m.stage(), (Stage::Generate, 3));
}

#[test]
fn a_finished_task_keeps_nothing_of_its_turns() {
    for policy in [HistoryPolicy::Last, HistoryPolicy::Full] {
        let (m, pending) = TaskRunner::fold_keeping(
            spec(3, FeedbackMode::GEP),
            Retention::Prompts(policy),
            &three_turns(),
        )
        .unwrap();
        assert_eq!(pending, Command::Finish);
        assert!(m.is_done());
        assert!(m.turns().is_empty() && m.kept_feedback().is_empty());
        assert_eq!(m.stage(), (Stage::Done, 3));
    }
    // Folds for views and reports keep every turn whole.
    let (m, _) = TaskRunner::fold(spec(3, FeedbackMode::GEP), &three_turns()).unwrap();
    assert_eq!(
        m.turns().iter().map(|r| r.verdict).collect::<Vec<_>>(),
        vec![
            Some(Verdict::NoCode),
            Some(Verdict::CompileError),
            Some(Verdict::Correct)
        ]
    );
    assert_eq!(m.stage(), (Stage::Done, 3));
}
