//! fast_p@n, geomean, rates, verdict counts, pass@k and the equal-budget comparison, against values
//! computed by hand.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::collections::BTreeMap;

use krefine::metrics::{
    FastP, FindingCounts, Integrity, MetricsError, PassAtK, RunInput, RunMetrics, SpeedupCounts,
    cumulative_tokens_per_problem, equal_attempts, equal_tokens, ledger, pass_at_k, run_metrics,
    run_problems,
};
use krefine::types::{
    CompileOutcome, CompileStatus, Event, ExecOutcome, Finding, LlmAnswer, LogRecord, MethodKind,
    ProblemKey, Severity, SpeedupCheck, TaskId, TurnRecord, Usage, Verdict,
};

fn pk(id: u32) -> ProblemKey {
    ProblemKey {
        level: 1,
        problem_id: id,
    }
}

fn task(id: u32, sample: u32) -> TaskId {
    TaskId {
        problem: pk(id),
        sample,
    }
}

/// A finished turn whose candidate ran with `verdict`; `speedup` only matters when correct.
fn ran(turn: u32, verdict: Verdict, speedup: Option<f64>) -> TurnRecord {
    let mut exec = ExecOutcome::failure(verdict, "cuda:0", String::new(), 0);
    exec.compiled = true;
    exec.correctness = verdict == Verdict::Correct;
    exec.speedup = speedup;
    TurnRecord {
        turn,
        code: Some("class ModelNew: pass".into()),
        compile: Some(compile(CompileStatus::Ok)),
        exec: Some(exec),
        verdict: Some(verdict),
        ..TurnRecord::default()
    }
}

fn correct(turn: u32, speedup: f64) -> TurnRecord {
    ran(turn, Verdict::Correct, Some(speedup))
}

fn compile(status: CompileStatus) -> CompileOutcome {
    CompileOutcome {
        ran_on: None,
        worker_losses: Vec::new(),
        status,
        cached: false,
        error_name: None,
        error: None,
        feedback: String::new(),
        log_path: None,
        build_dir: None,
        duration_ms: 0,
        findings: Vec::new(),
        build_path: None,
        cpu: None,
    }
}

fn compile_error(turn: u32) -> TurnRecord {
    TurnRecord {
        turn,
        code: Some("broken".into()),
        compile: Some(compile(CompileStatus::Error)),
        verdict: Some(Verdict::CompileError),
        ..TurnRecord::default()
    }
}

fn no_code(turn: u32) -> TurnRecord {
    TurnRecord {
        turn,
        verdict: Some(Verdict::NoCode),
        ..TurnRecord::default()
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

fn assert_fast_p(got: FastP, want: [f64; 6], what: &str) {
    assert_eq!(got.0, want, "{what}");
}

fn verdicts(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()
}

// ------------------------------------------------------------------------------------------------
// pass@k

#[test]
fn pass_at_k_unbiased_estimator() {
    assert!(close(pass_at_k(5, 2, 1), 0.4));
    assert!(close(pass_at_k(5, 2, 2), 0.7));
    // 1 - (7/10)(6/9)(5/8)... with k=1: 1 - (1 - 1/8)(1 - 1/9)(1 - 1/10) = 1 - 7/10 = 0.3.
    assert!(close(pass_at_k(10, 3, 1), 0.3));
    // n - c < k: every draw of k contains a correct sample.
    assert_eq!(pass_at_k(5, 4, 2), 1.0);
    assert_eq!(pass_at_k(5, 5, 1), 1.0);
    // No correct sample, or no sample at all.
    assert_eq!(pass_at_k(5, 0, 3), 0.0);
    assert_eq!(pass_at_k(0, 0, 1), 0.0);
    // k above n is capped at n (KernelBench does the same).
    assert_eq!(pass_at_k(3, 1, 5), 1.0);
    assert_eq!(pass_at_k(4, 1, 0), 0.0);
}

// ------------------------------------------------------------------------------------------------
// Refinement

/// Four problems, three turns:
/// - 1: compile error, correct 1.2×, correct 2.5×
/// - 2: correct 0.6×, incorrect, correct 0.9×
/// - 3: correct without timing, then a turn still in progress (the run stopped)
/// - 4: never started
fn refine_turns() -> BTreeMap<TaskId, Vec<TurnRecord>> {
    let mut in_progress = TurnRecord {
        turn: 2,
        code: Some("x".into()),
        ..TurnRecord::default()
    };
    in_progress.compile = Some(compile(CompileStatus::Ok));
    BTreeMap::from([
        (
            task(1, 0),
            vec![compile_error(1), correct(2, 1.2), correct(3, 2.5)],
        ),
        (
            task(2, 0),
            vec![
                correct(1, 0.6),
                ran(2, Verdict::Incorrect, None),
                correct(3, 0.9),
            ],
        ),
        (
            task(3, 0),
            vec![ran(1, Verdict::Correct, None), in_progress],
        ),
    ])
}

#[test]
fn refine_curve_by_hand() {
    let turns = refine_turns();
    let problems = [pk(4), pk(1), pk(2), pk(3), pk(2)];
    let m = run_metrics(&RunInput {
        method: MethodKind::Refine,
        axis: 3,
        problems: &problems,
        turns: &turns,
    });
    assert_eq!(m.problems, vec![pk(1), pk(2), pk(3), pk(4)]);
    assert_eq!(m.steps.len(), 3);
    assert!(m.pass_at_k.is_empty());

    // Turn 1: best = {-, 0.6, correct untimed, -}.
    let s = &m.steps[0];
    assert_eq!(s.n, 1);
    assert_fast_p(s.summary.fast_p, [0.25, 0.25, 0.0, 0.0, 0.0, 0.0], "turn 1");
    assert!(close(s.summary.geomean_speedup.unwrap(), 0.6));
    assert_eq!(s.summary.correct_rate, 0.5);
    assert_eq!(s.summary.compiled_rate, 0.5);
    assert_eq!(
        (s.summary.correct, s.summary.compiled, s.summary.timed),
        (2, 2, 1)
    );
    assert_eq!(
        s.verdicts,
        verdicts(&[("compile_error", 1), ("correct", 2)])
    );
    assert_eq!(s.pending, 1);

    // Turn 2: best = {1.2, 0.6, untimed, -}; geomean sqrt(0.72).
    let s = &m.steps[1];
    assert_fast_p(s.summary.fast_p, [0.5, 0.5, 0.25, 0.25, 0.0, 0.0], "turn 2");
    assert!(close(
        s.summary.geomean_speedup.unwrap(),
        0.848_528_137_423_857
    ));
    assert_eq!(s.summary.correct_rate, 0.75);
    assert_eq!(s.summary.compiled_rate, 0.75);
    assert_eq!(s.verdicts, verdicts(&[("correct", 1), ("incorrect", 1)]));
    // Problem 3's turn 2 is in progress and problem 4 never started.
    assert_eq!(s.pending, 2);

    // Turn 3: best = {2.5, 0.9, untimed, -}; geomean sqrt(2.25) = 1.5.
    let s = &m.steps[2];
    assert_fast_p(
        s.summary.fast_p,
        [0.5, 0.5, 0.5, 0.25, 0.25, 0.25],
        "turn 3",
    );
    assert!(close(s.summary.geomean_speedup.unwrap(), 1.5));
    assert_eq!(s.summary.correct_rate, 0.75);
    assert_eq!(s.verdicts, verdicts(&[("correct", 2)]));
    assert_eq!(s.pending, 2);
    assert_eq!(m.last().map(|s| s.n), Some(3));
    assert_eq!(s.summary.fast_p.get(1.5), Some(0.25));
    assert_eq!(s.summary.fast_p.get(3.0), None);
}

#[test]
fn no_correct_candidate_means_no_geomean_and_zero_rates() {
    let turns = BTreeMap::from([(task(1, 0), vec![compile_error(1), no_code(2)])]);
    let m = run_metrics(&RunInput {
        method: MethodKind::Refine,
        axis: 2,
        problems: &[pk(1)],
        turns: &turns,
    });
    let s = &m.steps[1];
    assert_eq!(s.summary.geomean_speedup, None);
    assert_fast_p(s.summary.fast_p, [0.0; 6], "no correct");
    assert_eq!(s.summary.correct_rate, 0.0);
    assert_eq!(s.summary.compiled_rate, 0.0);
    assert_eq!(s.verdicts, verdicts(&[("no_code", 1)]));

    // No problems at all: shares are 0, not NaN.
    let empty = run_metrics(&RunInput {
        method: MethodKind::OneShot,
        axis: 1,
        problems: &[],
        turns: &BTreeMap::new(),
    });
    assert_fast_p(empty.steps[0].summary.fast_p, [0.0; 6], "empty run");
    assert_eq!(empty.pass_at_k, vec![PassAtK { k: 1, value: 0.0 }]);
}

// ------------------------------------------------------------------------------------------------
// Sampling

/// Two problems, k = 3:
/// - 1: incorrect, correct 1.5×, correct 3.0×
/// - 2: correct 1.0×, runtime error, no code
fn sampling_turns() -> BTreeMap<TaskId, Vec<TurnRecord>> {
    BTreeMap::from([
        (task(1, 0), vec![ran(1, Verdict::Incorrect, None)]),
        (task(1, 1), vec![correct(1, 1.5)]),
        (task(1, 2), vec![correct(1, 3.0)]),
        (task(2, 0), vec![correct(1, 1.0)]),
        (task(2, 1), vec![ran(1, Verdict::RuntimeError, None)]),
        (task(2, 2), vec![no_code(1)]),
    ])
}

#[test]
fn sampling_curve_and_pass_at_k_by_hand() {
    let turns = sampling_turns();
    let problems = run_problems(&turns.keys().copied().collect::<Vec<_>>());
    assert_eq!(problems, vec![pk(1), pk(2)]);
    let m = run_metrics(&RunInput {
        method: MethodKind::Sampling,
        axis: 3,
        problems: &problems,
        turns: &turns,
    });
    // 1 sample: {-, 1.0}. fast_1 is strict, so 1.0× does not count.
    let s = &m.steps[0];
    assert_fast_p(s.summary.fast_p, [0.5, 0.5, 0.5, 0.0, 0.0, 0.0], "1 sample");
    assert!(close(s.summary.geomean_speedup.unwrap(), 1.0));
    assert_eq!(s.summary.compiled_rate, 1.0);
    assert_eq!(s.verdicts, verdicts(&[("correct", 1), ("incorrect", 1)]));
    // 2 samples: {1.5, 1.0}; 1.5 is not > 1.5.
    let s = &m.steps[1];
    assert_fast_p(
        s.summary.fast_p,
        [1.0, 1.0, 1.0, 0.5, 0.0, 0.0],
        "2 samples",
    );
    assert!(close(
        s.summary.geomean_speedup.unwrap(),
        1.224_744_871_391_589
    ));
    assert_eq!(s.summary.correct_rate, 1.0);
    assert_eq!(
        s.verdicts,
        verdicts(&[("correct", 1), ("runtime_error", 1)])
    );
    // 3 samples: {3.0, 1.0}.
    let s = &m.steps[2];
    assert_fast_p(
        s.summary.fast_p,
        [1.0, 1.0, 1.0, 0.5, 0.5, 0.5],
        "3 samples",
    );
    assert!(close(
        s.summary.geomean_speedup.unwrap(),
        1.732_050_807_568_877_2
    ));
    assert_eq!(s.verdicts, verdicts(&[("correct", 1), ("no_code", 1)]));

    // Problem 1: n=3, c=2; problem 2: n=3, c=1.
    // pass@1 = (2/3 + 1/3) / 2; pass@2 = (1 + 2/3) / 2; pass@3 = 1.
    let want = [0.5, 5.0 / 6.0, 1.0];
    assert_eq!(m.pass_at_k.len(), 3);
    for (got, (k, want)) in m.pass_at_k.iter().zip((1..).zip(want)) {
        assert_eq!(got.k, k);
        assert!(close(got.value, want), "pass@{k}: {} vs {want}", got.value);
    }
}

// ------------------------------------------------------------------------------------------------
// Equal budget

fn answered(seq: u64, t: TaskId, turn: u32, prompt: u64, completion: u64) -> LogRecord {
    LogRecord {
        v: 1,
        seq,
        ts_ms: 1000 + seq,
        task: Some(t),
        event: Event::LlmAnswered {
            turn,
            answer: LlmAnswer {
                content: String::new(),
                usage: Some(Usage {
                    prompt_tokens: prompt,
                    completion_tokens: completion,
                    reasoning_tokens: 0,
                }),
                cost_usd: None,
                model: "m".into(),
                finish_reason: None,
                latency_ms: 0,
                attempts: 1,
            },
            code: None,
            code_file: None,
        },
    }
}

#[test]
fn refine_vs_sampling_at_equal_attempts_and_tokens() {
    // Refinement: problem 1 incorrect then 2.0×; problem 2 1.2× then 1.5×. Turn 2 prompts carry the
    // history: 100 tokens for turn 1, 300 for turn 2.
    let refine_turns = BTreeMap::from([
        (
            task(1, 0),
            vec![ran(1, Verdict::Incorrect, None), correct(2, 2.0)],
        ),
        (task(2, 0), vec![correct(1, 1.2), correct(2, 1.5)]),
    ]);
    let refine_log = [
        answered(1, task(1, 0), 1, 80, 20),
        answered(2, task(1, 0), 2, 260, 40),
        answered(3, task(2, 0), 1, 80, 20),
        answered(4, task(2, 0), 2, 260, 40),
    ];
    // Sampling: problem 1 incorrect then 1.1×; problem 2 fails twice. 100 tokens per sample.
    let sampling_turns = BTreeMap::from([
        (task(1, 0), vec![ran(1, Verdict::Incorrect, None)]),
        (task(1, 1), vec![correct(1, 1.1)]),
        (task(2, 0), vec![ran(1, Verdict::Incorrect, None)]),
        (task(2, 1), vec![compile_error(1)]),
    ]);
    let sampling_log = [
        answered(1, task(1, 0), 1, 80, 20),
        answered(2, task(1, 1), 1, 80, 20),
        answered(3, task(2, 0), 1, 80, 20),
        answered(4, task(2, 1), 1, 80, 20),
    ];
    let problems = [pk(1), pk(2)];
    let refine = RunInput {
        method: MethodKind::Refine,
        axis: 2,
        problems: &problems,
        turns: &refine_turns,
    };
    let sampling = RunInput {
        method: MethodKind::Sampling,
        axis: 2,
        problems: &problems,
        turns: &sampling_turns,
    };
    let (rm, sm) = (run_metrics(&refine), run_metrics(&sampling));

    let rows = equal_attempts(&rm, &sm).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].attempts, 1);
    assert_fast_p(
        rows[0].refine.fast_p,
        [0.5, 0.5, 0.5, 0.5, 0.0, 0.0],
        "refine@1",
    );
    assert_fast_p(rows[0].sampling.fast_p, [0.0; 6], "sampling@1");
    // 2.0 is not > 2.
    assert_fast_p(
        rows[1].refine.fast_p,
        [1.0, 1.0, 1.0, 1.0, 0.5, 0.0],
        "refine@2",
    );
    assert_fast_p(
        rows[1].sampling.fast_p,
        [0.5, 0.5, 0.5, 0.5, 0.0, 0.0],
        "sampling@2",
    );

    let (rl, sl) = (ledger(&refine_log), ledger(&sampling_log));
    assert_eq!(
        cumulative_tokens_per_problem(&refine, &rl),
        vec![100.0, 400.0]
    );
    assert_eq!(
        cumulative_tokens_per_problem(&sampling, &sl),
        vec![100.0, 200.0]
    );
    let rows = equal_tokens(&refine, &rl, &sampling, &sl, &[100, 200, 400]).unwrap();
    assert_eq!(rows.len(), 3);
    // 100 tokens: one attempt each.
    assert_eq!(rows[0].budget_tokens, 100);
    assert_eq!(
        (rows[0].refine_attempts, rows[0].sampling_attempts),
        (1.0, 1.0)
    );
    assert_fast_p(
        rows[0].refine.fast_p,
        [0.5, 0.5, 0.5, 0.5, 0.0, 0.0],
        "refine 100",
    );
    assert_fast_p(rows[0].sampling.fast_p, [0.0; 6], "sampling 100");
    // 200 tokens: a second refinement turn (400 in all) does not fit, a second sample does.
    assert_eq!(
        (rows[1].refine_attempts, rows[1].sampling_attempts),
        (1.0, 2.0)
    );
    assert_eq!(rows[1].refine.fast_p, rows[0].refine.fast_p);
    assert_fast_p(
        rows[1].sampling.fast_p,
        [0.5, 0.5, 0.5, 0.5, 0.0, 0.0],
        "sampling 200",
    );
    // 400 tokens: everything.
    assert_eq!(
        (rows[2].refine_attempts, rows[2].sampling_attempts),
        (2.0, 2.0)
    );
    assert_fast_p(
        rows[2].refine.fast_p,
        [1.0, 1.0, 1.0, 1.0, 0.5, 0.0],
        "refine 400",
    );
    assert!(close(
        rows[2].refine.geomean_speedup.unwrap(),
        3.0f64.sqrt()
    ));
}

#[test]
fn equal_budget_rejects_wrong_methods_and_different_problems() {
    let turns = BTreeMap::new();
    let refine = run_metrics(&RunInput {
        method: MethodKind::Refine,
        axis: 2,
        problems: &[pk(1), pk(2)],
        turns: &turns,
    });
    let sampling = run_metrics(&RunInput {
        method: MethodKind::Sampling,
        axis: 2,
        problems: &[pk(2), pk(3), pk(4)],
        turns: &turns,
    });
    assert_eq!(
        equal_attempts(&sampling, &refine).unwrap_err(),
        MetricsError::Method {
            expected: "refine",
            got: MethodKind::Sampling
        }
    );
    let e = equal_attempts(&refine, &sampling).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the runs cover different problems (1 only in the first run, 2 only in the second)"
    );
}

// ------------------------------------------------------------------------------------------------
// Integrity: findings and excessive speedups

fn finding(category: &str, severity: Severity) -> Finding {
    Finding {
        category: category.into(),
        severity,
        message: "m".into(),
        line: Some(3),
    }
}

/// A correct turn measured in `mode` whose speedup the guard flagged, re-verified or not.
fn flagged(turn: u32, speedup: f64, mode: &str, verified: Option<bool>) -> TurnRecord {
    let mut r = correct(turn, speedup);
    let e = r.exec.as_mut().unwrap();
    e.env.mode = Some(mode.into());
    e.speedup_check = Some(SpeedupCheck {
        bound: 50.0,
        bound_source: "default".into(),
        flagged: true,
        verified,
        reverified_speedup: None,
    });
    r
}

fn rejected(turn: u32) -> TurnRecord {
    let mut c = compile(CompileStatus::Rejected);
    c.findings = vec![
        finding("timing_patch", Severity::Error),
        finding("timing_patch", Severity::Error),
        finding("pytorch_wrap", Severity::Warning),
    ];
    TurnRecord {
        turn,
        code: Some("patched".into()),
        compile: Some(c),
        verdict: Some(Verdict::Rejected),
        ..TurnRecord::default()
    }
}

/// Three problems, two turns, every result measured in `mode`:
/// - 1: 60× flagged, not re-verified; then 2.0×
/// - 2: 80× flagged and confirmed; then rejected by static checks
/// - 3: 100× flagged, re-timing disagreed; then 1.5× with a static and a runtime warning
fn guarded_run(mode: &str) -> BTreeMap<TaskId, Vec<TurnRecord>> {
    let mut warned = correct(2, 1.5);
    warned.compile.as_mut().unwrap().findings = vec![finding("code_bypass", Severity::Warning)];
    let e = warned.exec.as_mut().unwrap();
    e.env.mode = Some(mode.into());
    e.findings = vec![finding("tf32_changed", Severity::Warning)];
    BTreeMap::from([
        (
            task(1, 0),
            vec![flagged(1, 60.0, mode, None), correct(2, 2.0)],
        ),
        (
            task(2, 0),
            vec![flagged(1, 80.0, mode, Some(true)), rejected(2)],
        ),
        (
            task(3, 0),
            vec![flagged(1, 100.0, mode, Some(false)), warned],
        ),
    ])
}

fn guarded_metrics(mode: &str) -> RunMetrics {
    let turns = guarded_run(mode);
    run_metrics(&RunInput {
        method: MethodKind::Refine,
        axis: 2,
        problems: &[pk(1), pk(2), pk(3)],
        turns: &turns,
    })
}

#[test]
fn strict_mode_leaves_unverified_excessive_speedups_out_of_fast_p_and_geomean() {
    let m = guarded_metrics("strict");
    let third = 1.0 / 3.0;
    let s1 = &m.steps[0].summary;
    // Only the confirmed 80× counts; the other two are correct but untimed.
    assert_fast_p(s1.fast_p, [third; 6], "strict step 1");
    assert!(close(s1.geomean_speedup.unwrap(), 80.0));
    assert_eq!((s1.correct, s1.timed), (3, 1));
    assert_eq!(s1.correct_rate, 1.0);
    let s2 = &m.steps[1].summary;
    assert_fast_p(
        s2.fast_p,
        [1.0, 1.0, 1.0, 1.0, 2.0 * third, third],
        "strict step 2",
    );
    assert!(close(
        s2.geomean_speedup.unwrap(),
        (2.0f64 * 80.0 * 1.5).powf(1.0 / 3.0)
    ));
    assert_eq!(s2.timed, 3);
    assert_eq!(
        m.steps[1].verdicts,
        verdicts(&[("correct", 2), ("rejected", 1)])
    );
}

#[test]
fn faithful_mode_counts_flagged_speedups_and_reports_them() {
    let m = guarded_metrics("faithful");
    let s1 = &m.steps[0].summary;
    assert_fast_p(s1.fast_p, [1.0; 6], "faithful step 1");
    assert!(close(
        s1.geomean_speedup.unwrap(),
        (60.0f64 * 80.0 * 100.0).powf(1.0 / 3.0)
    ));
    let i = m.integrity();
    assert_eq!(
        i.speedups,
        SpeedupCounts {
            flagged: 3,
            verified: 1,
            unverified: 2,
            excluded: 0,
        }
    );
}

#[test]
fn integrity_counts_candidates_per_category_and_step() {
    let m = guarded_metrics("strict");
    let s1 = &m.steps[0].integrity;
    assert_eq!(
        *s1,
        Integrity {
            speedups: SpeedupCounts {
                flagged: 3,
                verified: 1,
                unverified: 2,
                excluded: 2,
            },
            ..Integrity::default()
        }
    );
    let s2 = &m.steps[1].integrity;
    let counts = |w, e| FindingCounts {
        warnings: w,
        errors: e,
    };
    // Two timing_patch errors in one candidate count once.
    assert_eq!(
        s2.static_checks,
        BTreeMap::from([
            ("code_bypass".to_string(), counts(1, 0)),
            ("pytorch_wrap".to_string(), counts(1, 0)),
            ("timing_patch".to_string(), counts(0, 1)),
        ])
    );
    assert_eq!(
        s2.runtime_checks,
        BTreeMap::from([("tf32_changed".to_string(), counts(1, 0))])
    );
    assert_eq!(s2.rejected, 1);
    assert_eq!(s2.speedups, SpeedupCounts::default());
    let total = m.integrity();
    assert_eq!(total.rejected, 1);
    assert_eq!(total.speedups.excluded, 2);
    assert_eq!(total.static_checks.len(), 3);
}

#[test]
fn a_rejected_candidate_is_not_a_build() {
    let rec = |seq, event| LogRecord {
        v: 1,
        seq,
        ts_ms: seq,
        task: Some(task(1, 0)),
        event,
    };
    let mut ok = compile(CompileStatus::Ok);
    ok.duration_ms = 7;
    let records = vec![
        rec(
            0,
            Event::Compiled {
                turn: 1,
                outcome: compile(CompileStatus::Rejected),
            },
        ),
        rec(
            1,
            Event::Compiled {
                turn: 2,
                outcome: ok,
            },
        ),
    ];
    let l = ledger(&records);
    assert_eq!((l.compiles, l.compile_ms), (1, 7));
}
