//! Matched-budget comparison with hand-computed values: fast_p, attempts and bootstrap intervals on
//! two tiny runs (2 shared problems, a third only in one run).

use std::collections::BTreeMap;

use krefine::metrics::bootstrap::Interval;
use krefine::metrics::compare::{BudgetAxis, CompareRun, CompareSettings, compare};
use krefine::metrics::{Attempt, AttemptCost, RunAttempts};
use krefine::types::ProblemKey;

fn pk(id: u32) -> ProblemKey {
    ProblemKey {
        level: 1,
        problem_id: id,
    }
}

fn cost(tokens: u64, usd: f64, gpu_s: f64) -> AttemptCost {
    AttemptCost { tokens, usd, gpu_s }
}

fn ok(speedup: f64, c: AttemptCost) -> Attempt {
    Attempt::new(true, true, true, Some(speedup), c)
}

fn bad(c: AttemptCost) -> Attempt {
    Attempt::new(true, true, false, None, c)
}

/// Refinement: problem 1 fails then reaches 2.0x; problem 2 is 0.5x then 1.5x. Later turns cost more.
fn refine() -> RunAttempts {
    BTreeMap::from([
        (
            pk(1),
            vec![bad(cost(100, 0.01, 1.0)), ok(2.0, cost(300, 0.03, 2.0))],
        ),
        (
            pk(2),
            vec![ok(0.5, cost(100, 0.01, 1.0)), ok(1.5, cost(300, 0.03, 2.0))],
        ),
    ])
}

/// Sampling, unpriced: problem 1 gets 1.2x then fails; problem 2 fails then 3.0x; problem 3 only here.
fn sampling() -> RunAttempts {
    BTreeMap::from([
        (
            pk(1),
            vec![ok(1.2, cost(100, 0.0, 1.0)), bad(cost(100, 0.0, 1.0))],
        ),
        (
            pk(2),
            vec![bad(cost(100, 0.0, 1.0)), ok(3.0, cost(100, 0.0, 1.0))],
        ),
        (pk(3), vec![ok(9.0, cost(100, 0.0, 1.0))]),
    ])
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

fn iv(i: Option<Interval>) -> (f64, f64) {
    let i = i.expect("an interval");
    (i.lo, i.hi)
}

#[test]
fn matched_llm_calls_with_golden_bootstrap_intervals() {
    let (r, s) = (refine(), sampling());
    let runs = [
        CompareRun {
            name: "refine",
            attempts: &r,
            served: false,
        },
        CompareRun {
            name: "sampling",
            attempts: &s,
            served: false,
        },
    ];
    // 4 resamples with seed 0 are [P1,P1], [P2,P1], [P2,P1], [P1,P2] (pinned in bootstrap.rs);
    // a 50% interval is the 0.25 and 0.75 quantiles (positions 0.75 and 2.25 of 4 sorted values).
    let c = compare(
        &runs,
        CompareSettings {
            resamples: 4,
            seed: 0,
            level: 0.5,
        },
    );
    assert_eq!(c.shared_problems, vec![pk(1), pk(2)]);
    assert_eq!(c.dropped, vec![0, 1]);
    let calls = &c.axes[0];
    assert_eq!(calls.axis, BudgetAxis::LlmCalls);
    assert_eq!(calls.rows.len(), 2);

    let row1 = &calls.rows[0];
    assert_eq!(row1.budget, 1.0);
    let (a, b) = (&row1.runs[0], &row1.runs[1]);
    // Refine after 1 call: only problem 2, at 0.5x.
    assert_eq!(a.summary.fast_p.0, [0.5, 0.0, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(a.summary.correct_rate, 0.5);
    assert_eq!(a.summary.geomean_speedup, Some(0.5));
    assert_eq!((a.attempts, a.exhausted), (1.0, false));
    let ci = a.ci.as_ref().unwrap();
    // fast_0 over resamples: 0 ([P1,P1]) and 0.5 three times -> [0.375, 0.5].
    assert_eq!(iv(ci.fast_p.0[0]), (0.375, 0.5));
    assert_eq!(iv(ci.geomean_speedup), (0.5, 0.5));
    assert!(a.vs_first.is_none());
    // Sampling after 1 sample: problem 1 at 1.2x.
    assert_eq!(b.summary.fast_p.0, [0.5, 0.5, 0.5, 0.5, 0.0, 0.0]);
    assert_eq!(b.summary.geomean_speedup, Some(1.2));
    let ci = b.ci.as_ref().unwrap();
    // fast_1: 1 ([P1,P1]) and 0.5 three times -> sorted [.5,.5,.5,1] -> [0.5, 0.625].
    assert_eq!(iv(ci.fast_p.0[3]), (0.5, 0.625));
    assert_eq!(iv(ci.geomean_speedup), (1.2, 1.2));
    let d = b.vs_first.as_ref().unwrap();
    assert_eq!(d.fast_p.0[3], 0.5);
    assert_eq!(iv(d.fast_p_ci.0[3]), (0.5, 0.625));
    // correct_rate difference per resample: 1 - 0 once, 0.5 - 0.5 three times -> [0, 0.25].
    assert_eq!(d.correct_rate, 0.0);
    assert_eq!(iv(d.correct_rate_ci), (0.0, 0.25));

    let row2 = &calls.rows[1];
    let (a, b) = (&row2.runs[0], &row2.runs[1]);
    assert_eq!(a.summary.fast_p.0, [1.0, 1.0, 1.0, 1.0, 0.5, 0.0]);
    assert!(close(a.summary.geomean_speedup.unwrap(), 3f64.sqrt()));
    assert_eq!(b.summary.fast_p.0, [1.0, 1.0, 1.0, 1.0, 0.5, 0.5]);
    assert!(close(b.summary.geomean_speedup.unwrap(), 3.6f64.sqrt()));
    assert!(a.exhausted && b.exhausted);
    assert_eq!(b.vs_first.as_ref().unwrap().fast_p.0[5], 0.5);
}

#[test]
fn cost_axes_use_each_runs_curve_as_budgets_and_name_what_is_missing() {
    let (r, s) = (refine(), sampling());
    let runs = [
        CompareRun {
            name: "refine",
            attempts: &r,
            served: false,
        },
        CompareRun {
            name: "sampling",
            attempts: &s,
            served: false,
        },
    ];
    let c = compare(&runs, CompareSettings::default());
    let tokens = &c.axes[1];
    assert_eq!(tokens.axis, BudgetAxis::Tokens);
    // Mean cumulative tokens per problem: refine 100, 400; sampling 100, 200 (shared problems only).
    let budgets: Vec<f64> = tokens.rows.iter().map(|r| r.budget).collect();
    assert_eq!(budgets, vec![100.0, 200.0, 400.0]);
    // At 200 tokens refine affords one turn per problem, sampling both samples.
    let at200 = &tokens.rows[1];
    assert_eq!(at200.runs[0].attempts, 1.0);
    assert_eq!(at200.runs[0].summary.fast_p.0[3], 0.0);
    assert_eq!(at200.runs[1].attempts, 2.0);
    assert!(at200.runs[1].exhausted && !at200.runs[0].exhausted);
    assert_eq!(at200.runs[1].summary.fast_p.0[3], 1.0);
    let at400 = &tokens.rows[2];
    assert_eq!(at400.runs[0].summary.fast_p.0[3], 1.0);
    assert!(at400.runs[0].exhausted);

    let usd = &c.axes[2];
    assert_eq!(usd.axis, BudgetAxis::Usd);
    assert_eq!(
        usd.unavailable.as_deref(),
        Some("sampling recorded no priced LLM answers")
    );
    assert!(usd.rows.is_empty());

    let gpu = &c.axes[3];
    let budgets: Vec<f64> = gpu.rows.iter().map(|r| r.budget).collect();
    assert_eq!(budgets, vec![1.0, 2.0, 3.0]);
    // Same resamples, same seed: the same intervals every time.
    assert_eq!(c, compare(&runs, CompareSettings::default()));
}
