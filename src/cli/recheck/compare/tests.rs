use super::*;
use crate::types::{CompileOutcome, SpeedupCheck};

fn exec(verdict: Verdict, speedup: Option<f64>, mode: &str) -> ExecOutcome {
    let mut e = ExecOutcome::failure(verdict, "cpu", String::new(), 0);
    e.correctness = verdict == Verdict::Correct;
    e.speedup = speedup;
    e.env.mode = Some(mode.into());
    e.metadata.clear();
    e
}

fn timed(mut e: ExecOutcome, std_over_mean: f64, trials: u32) -> ExecOutcome {
    let stats = TimingStats {
        mean: 1.0,
        median: 1.0,
        std: std_over_mean,
        min: 1.0,
        max: 1.0,
        num_trials: trials,
    };
    e.runtime_stats = Some(stats);
    e.ref_runtime_stats = Some(stats);
    e
}

fn record(e: ExecOutcome) -> TurnRecord {
    TurnRecord {
        turn: 1,
        code: Some("x".into()),
        verdict: Some(e.verdict),
        compile: Some(CompileOutcome {
            status: CompileStatus::Ok,
            cached: false,
            error_name: None,
            error: None,
            feedback: String::new(),
            log_path: None,
            build_dir: None,
            duration_ms: 0,
            findings: Vec::new(),
            build_path: None,
            ran_on: None,
            worker_losses: Vec::new(),
            cpu: None,
        }),
        exec: Some(e),
        ..TurnRecord::default()
    }
}

fn finding(category: &str, severity: Severity) -> Finding {
    Finding {
        category: category.into(),
        severity,
        message: format!("{category} found"),
        line: None,
    }
}

fn changes_of(old: &TurnRecord, new: &TurnRecord) -> (Vec<Change>, Vec<Finding>, Vec<Finding>) {
    let (a, b) = (Standing::of(old).unwrap(), Standing::of(new).unwrap());
    let (c, n, g, _) = compare(&a, old.exec.as_ref(), &b, new.exec.as_ref(), 0.05);
    (c, n, g)
}

#[test]
fn a_forged_result_refused_now_is_no_longer_credited_with_its_finding() {
    let old = record(exec(Verdict::Correct, Some(9.5), "faithful"));
    let mut e = exec(Verdict::Incorrect, None, "strict");
    e.metadata
        .insert("correctness_issue_name".into(), "forged_result".into());
    e.findings.push(finding("forged_result", Severity::Error));
    let new = record(e);
    let (changes, new_findings, gone) = changes_of(&old, &new);
    assert_eq!(
        changes,
        vec![Change::NoLongerCredited, Change::FindingsChanged]
    );
    assert_eq!(
        new_findings,
        vec![finding("forged_result", Severity::Error)]
    );
    assert!(gone.is_empty());
    assert!(changes.iter().any(|c| c.loses_credit()));
    let s = Standing::of(&new).unwrap();
    assert_eq!(s.reason.as_deref(), Some("forged_result"));
    assert_eq!(s.mode.as_deref(), Some("strict"));
}

#[test]
fn a_static_rejection_says_its_first_error() {
    let mut new = TurnRecord {
        turn: 2,
        verdict: Some(Verdict::Rejected),
        ..record(exec(Verdict::Correct, None, "strict"))
    };
    new.exec = None;
    let c = new.compile.as_mut().unwrap();
    c.status = CompileStatus::Rejected;
    c.findings = vec![
        finding("pytorch_wrap", Severity::Warning),
        finding("introspection", Severity::Error),
    ];
    let s = Standing::of(&new).unwrap();
    assert_eq!(
        s.reason.as_deref(),
        Some("introspection: introspection found")
    );
    assert_eq!(s.findings.len(), 2);
}

#[test]
fn speedups_change_only_beyond_the_noise_band() {
    let at = |s: f64| record(timed(exec(Verdict::Correct, Some(s), "strict"), 0.0, 100));
    let old = at(2.0);
    assert_eq!(changes_of(&old, &at(2.05)).0, vec![]);
    assert_eq!(changes_of(&old, &at(1.91)).0, vec![]);
    assert_eq!(changes_of(&old, &at(1.8)).0, vec![Change::SpeedupLower]);
    assert_eq!(changes_of(&old, &at(2.2)).0, vec![Change::SpeedupHigher]);
    // Trials that spread widely widen the band: 0.5 / sqrt(4) on each of four timings gives one
    // standard error of 0.5 in the log of the ratio, a band of two: e^1 - 1 = 172 %.
    let noisy = |s: f64| record(timed(exec(Verdict::Correct, Some(s), "strict"), 0.5, 4));
    assert_eq!(changes_of(&noisy(2.0), &noisy(1.0)).0, vec![]);
    assert_eq!(
        changes_of(&noisy(2.0), &noisy(0.7)).0,
        vec![Change::SpeedupLower]
    );
    let (a, b) = (Standing::of(&old).unwrap(), Standing::of(&at(1.0)).unwrap());
    let band = compare(&a, old.exec.as_ref(), &b, None, 0.05).3.unwrap();
    assert!((band - 0.05).abs() < 1e-12, "{band}");
}

#[test]
fn an_unverified_excessive_speedup_in_strict_mode_is_no_longer_counted() {
    let old = record(exec(Verdict::Correct, Some(60.0), "faithful"));
    let mut e = exec(Verdict::Correct, Some(60.0), "strict");
    e.speedup_check = Some(SpeedupCheck {
        bound: 50.0,
        bound_source: "default".into(),
        flagged: true,
        verified: Some(false),
        reverified_speedup: Some(1.0),
    });
    let new = record(e);
    assert_eq!(Standing::of(&new).unwrap().counted_speedup, None);
    let (changes, ..) = changes_of(&old, &new);
    assert_eq!(changes, vec![Change::SpeedupNoLongerCounted]);
    let (back, ..) = changes_of(&new, &old);
    assert_eq!(back, vec![Change::SpeedupNowCounted]);
}

#[test]
fn failures_that_stay_failures_only_change_their_verdict() {
    let old = record(exec(Verdict::CompileError, None, "faithful"));
    let new = record(exec(Verdict::RuntimeError, None, "strict"));
    assert_eq!(changes_of(&old, &new).0, vec![Change::VerdictChanged]);
    assert_eq!(changes_of(&old, &old.clone()).0, vec![]);
    let good = record(exec(Verdict::Correct, Some(1.0), "strict"));
    assert_eq!(changes_of(&old, &good).0, vec![Change::NewlyCredited]);
}

#[test]
fn findings_compare_by_category_and_severity() {
    let mut a = exec(Verdict::Correct, Some(1.0), "faithful");
    a.findings = vec![finding("memo_suspected", Severity::Warning)];
    let mut b = a.clone();
    b.findings = vec![
        finding("memo_suspected", Severity::Warning),
        finding("precision_lowered", Severity::Warning),
        finding("precision_lowered", Severity::Warning),
    ];
    let (changes, new, gone) = changes_of(&record(a.clone()), &record(b));
    assert_eq!(changes, vec![Change::FindingsChanged]);
    assert_eq!(new, vec![finding("precision_lowered", Severity::Warning)]);
    assert!(gone.is_empty());
    let mut c = a.clone();
    c.findings = vec![finding("memo_suspected", Severity::Error)];
    // A warning that became an error is new (once); the other way round it is gone.
    let (changes, new, gone) = changes_of(&record(a.clone()), &record(c.clone()));
    assert_eq!(changes, vec![Change::FindingsChanged]);
    assert_eq!(new, vec![finding("memo_suspected", Severity::Error)]);
    assert!(gone.is_empty());
    let (_, new, gone) = changes_of(&record(c), &record(a));
    assert!(new.is_empty());
    assert_eq!(gone, vec![finding("memo_suspected", Severity::Error)]);
}

#[test]
fn counts_and_fast_p_with_the_rechecked_results_in_place() {
    let p = |id| ProblemKey {
        level: 1,
        problem_id: id,
    };
    let task = |id| TaskId {
        problem: p(id),
        sample: 0,
    };
    let turn = |n: u32, e: ExecOutcome| TurnRecord {
        turn: n,
        ..record(e)
    };
    let mut turns = TaskTurns::new();
    // Problem 1: an honest x1.5 at turn 1, a forged x9 at turn 2. Problem 2: x0.9.
    turns.insert(
        task(1),
        vec![
            turn(1, exec(Verdict::Correct, Some(1.5), "faithful")),
            turn(2, exec(Verdict::Correct, Some(9.0), "faithful")),
        ],
    );
    turns.insert(
        task(2),
        vec![turn(1, exec(Verdict::Correct, Some(0.9), "faithful"))],
    );
    let problems = [p(1), p(2)];
    let shape = Shape {
        method: MethodKind::Refine,
        axis: 2,
        problems: &problems,
        extra: &[1.2],
    };
    let before = headline(&shape, &turns);
    let refused = turn(2, exec(Verdict::Incorrect, None, "strict"));
    let after_turns = replaced(&turns, [(task(1), 2, &refused)]);
    let after = headline(&shape, &after_turns);
    let at = |h: &Headline, p: f64| h.fast_p.1[h.fast_p.0.iter().position(|&t| t == p).unwrap()];
    assert_eq!(before.fast_p.0, vec![0.0, 0.5, 0.8, 1.0, 1.5, 2.0, 1.2]);
    assert_eq!((at(&before, 2.0), at(&after, 2.0)), (0.5, 0.0));
    assert_eq!((at(&before, 1.2), at(&after, 1.2)), (0.5, 0.5));
    assert_eq!((at(&before, 0.0), at(&after, 0.0)), (1.0, 1.0));
    assert_eq!((before.correct, after.correct), (2, 2));
    assert_eq!(before.problems, 2);
    // The original is left as it was.
    assert_eq!(turns[&task(1)][1].verdict, Some(Verdict::Correct));
    let json = serde_json::to_value(&after).unwrap();
    assert_eq!(json["fast_p"]["2"], 0.0);
    assert_eq!(json["fast_p"]["1.2"], 0.5);

    let stand = |v, s| Standing::of(&record(exec(v, s, "strict"))).unwrap();
    let result = |old: Standing, new: Option<Standing>, changes: Vec<Change>| Rechecked {
        problem: p(1),
        name: None,
        sample: 0,
        turn: 1,
        recheck_sample: new.as_ref().map(|_| 0),
        old,
        new,
        changes,
        new_findings: Vec::new(),
        gone_findings: Vec::new(),
        noise_band: None,
        notes: Vec::new(),
    };
    let ok = || stand(Verdict::Correct, Some(1.0));
    let results = [
        result(ok(), Some(ok()), vec![]),
        result(
            ok(),
            Some(stand(Verdict::Incorrect, None)),
            vec![Change::NoLongerCredited, Change::FindingsChanged],
        ),
        result(ok(), Some(ok()), vec![Change::SpeedupLower]),
        result(ok(), None, vec![]),
    ];
    let c = Counts::of(&results);
    assert_eq!(
        (
            c.selected,
            c.rechecked,
            c.unchanged,
            c.no_longer_credited,
            c.speedup_lower,
            c.findings_changed,
            c.credit_lost,
            c.not_rechecked
        ),
        (4, 3, 1, 1, 1, 1, 2, 1)
    );
}
