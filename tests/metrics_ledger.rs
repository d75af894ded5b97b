//! The ledger: tokens and USD per turn / task / run, LLM attempts and retries, device time, compile
//! time, folded from a hand-written log.

use std::collections::BTreeMap;

use krefine::metrics::{DeviceUse, Spend, ledger, step_spend};
use krefine::types::{
    CompileOutcome, CompileStatus, Event, LlmAnswer, LogRecord, MethodKind, ProblemKey, TaskId,
    Usage,
};

fn task(id: u32, sample: u32) -> TaskId {
    TaskId {
        problem: ProblemKey {
            level: 1,
            problem_id: id,
        },
        sample,
    }
}

fn rec(ts_ms: u64, task: Option<TaskId>, event: Event) -> LogRecord {
    LogRecord {
        v: 1,
        seq: ts_ms,
        ts_ms,
        task,
        event,
    }
}

fn answer(usage: Option<(u64, u64, u64)>, cost_usd: Option<f64>) -> LlmAnswer {
    LlmAnswer {
        content: "```python\nclass ModelNew: pass\n```".into(),
        usage: usage.map(|(p, c, r)| Usage {
            prompt_tokens: p,
            completion_tokens: c,
            reasoning_tokens: r,
        }),
        cost_usd,
        model: "m".into(),
        finish_reason: Some("stop".into()),
        latency_ms: 10,
        attempts: 1,
    }
}

fn answered(turn: u32, a: LlmAnswer) -> Event {
    Event::LlmAnswered {
        turn,
        answer: a,
        code: None,
        code_file: None,
    }
}

fn attempt(turn: u32, status: Option<u16>, error: Option<&str>) -> Event {
    Event::LlmAttempt {
        turn,
        attempt: 1,
        status,
        latency_ms: 5,
        error: error.map(str::to_string),
        usage: None,
        cost_usd: None,
        note: None,
    }
}

fn compiled(turn: u32, duration_ms: u64, cached: bool) -> Event {
    Event::Compiled {
        turn,
        outcome: CompileOutcome {
            ran_on: None,
            worker_losses: Vec::new(),
            status: CompileStatus::Ok,
            cached,
            error_name: None,
            error: None,
            feedback: String::new(),
            log_path: None,
            build_dir: None,
            duration_ms,
            findings: Vec::new(),
            build_path: None,
            cpu: None,
        },
    }
}

fn log() -> Vec<LogRecord> {
    let (a, b) = (Some(task(1, 0)), Some(task(2, 0)));
    vec![
        rec(
            1000,
            None,
            Event::RunStarted {
                run: "r".into(),
                method: MethodKind::Refine,
                feedback: None,
                task_ids: vec![task(1, 0), task(2, 0)],
                turns: 2,
                samples: 1,
                krefine_version: "0.1.0".into(),
                resumed: false,
                simulated: false,
                problem_names: Default::default(),
            },
        ),
        // Task A, turn 1: a 429, then success.
        rec(1100, a, attempt(1, Some(429), Some("rate limited"))),
        rec(1200, a, attempt(1, Some(200), None)),
        rec(
            1300,
            a,
            answered(1, answer(Some((1000, 200, 50)), Some(0.25))),
        ),
        rec(1400, a, compiled(1, 40_000, false)),
        rec(
            1500,
            a,
            Event::LeaseGranted {
                device: "cuda:0".into(),
                wait_ms: 500,
                turn: 1,
            },
        ),
        rec(
            1600,
            a,
            Event::LeaseReleased {
                device: "cuda:0".into(),
                held_ms: 3000,
                busy_ms: 2500,
                turn: 1,
            },
        ),
        // Task B, turn 1: the provider sent neither usage nor a cost.
        rec(1700, b, attempt(1, Some(200), None)),
        rec(1800, b, answered(1, answer(None, None))),
        rec(1900, b, compiled(1, 0, true)),
        rec(
            2000,
            b,
            Event::LeaseGranted {
                device: "cuda:1".into(),
                wait_ms: 100,
                turn: 1,
            },
        ),
        rec(
            2100,
            b,
            Event::LeaseReleased {
                device: "cuda:1".into(),
                held_ms: 1000,
                busy_ms: 800,
                turn: 1,
            },
        ),
        // Task A, turn 2; task B, turn 2 fails for good.
        rec(
            2200,
            a,
            answered(2, answer(Some((1500, 300, 0)), Some(0.5))),
        ),
        rec(
            2300,
            b,
            Event::LlmFailed {
                turn: 2,
                error: "timeout".into(),
                fatal: false,
            },
        ),
        rec(
            9000,
            None,
            Event::RunEnded {
                reason: "finished".into(),
            },
        ),
    ]
}

fn spend(answers: u64, p: u64, c: u64, r: u64, usd: f64, no_usage: u64, no_cost: u64) -> Spend {
    Spend {
        answers,
        prompt_tokens: p,
        completion_tokens: c,
        reasoning_tokens: r,
        cost_usd: usd,
        answers_without_usage: no_usage,
        answers_without_cost: no_cost,
    }
}

#[test]
fn ledger_by_hand() {
    let l = ledger(&log());
    assert_eq!(l.total, spend(3, 2500, 500, 50, 0.75, 1, 1));
    assert_eq!(l.total.tokens(), 3000);
    assert!(l.total.priced());
    assert_eq!(
        l.per_turn,
        BTreeMap::from([
            (1, spend(2, 1000, 200, 50, 0.25, 1, 1)),
            (2, spend(1, 1500, 300, 0, 0.5, 0, 0)),
        ])
    );
    assert_eq!(
        l.per_task,
        BTreeMap::from([
            (task(1, 0), spend(2, 2500, 500, 50, 0.75, 0, 0)),
            (task(2, 0), spend(1, 0, 0, 0, 0.0, 1, 1)),
        ])
    );
    assert_eq!(
        l.per_task_turn[&task(1, 0)][&2],
        spend(1, 1500, 300, 0, 0.5, 0, 0)
    );
    assert!(!l.per_task[&task(2, 0)].priced());

    // Three attempts for two requests: one retry, one failed attempt.
    assert_eq!(
        (
            l.llm_attempts,
            l.llm_failed_attempts,
            l.llm_retries,
            l.llm_failures
        ),
        (3, 1, 1, 1)
    );
    assert_eq!(
        l.devices,
        BTreeMap::from([
            (
                "cuda:0".to_string(),
                DeviceUse {
                    leases: 1,
                    wait_ms: 500,
                    held_ms: 3000,
                    busy_ms: 2500,
                    work_ms: 0
                }
            ),
            (
                "cuda:1".to_string(),
                DeviceUse {
                    leases: 1,
                    wait_ms: 100,
                    held_ms: 1000,
                    busy_ms: 800,
                    work_ms: 0
                }
            ),
        ])
    );
    assert_eq!(
        l.device_total,
        DeviceUse {
            leases: 2,
            wait_ms: 600,
            held_ms: 4000,
            busy_ms: 3300,
            work_ms: 0
        }
    );
    assert_eq!(
        (l.compiles, l.compiles_cached, l.compile_ms),
        (2, 1, 40_000)
    );
    assert_eq!(l.wall_ms, 8000);
}

#[test]
fn step_spend_follows_the_method_axis() {
    let l = ledger(&log());
    assert_eq!(
        step_spend(MethodKind::Refine, 3, &l),
        vec![
            spend(2, 1000, 200, 50, 0.25, 1, 1),
            spend(1, 1500, 300, 0, 0.5, 0, 0),
            Spend::default(),
        ]
    );
    // Read as a sampling run, step n is turn 1 of sample n - 1: both tasks are sample 0, and their
    // second turns are no sampling step.
    assert_eq!(
        step_spend(MethodKind::Sampling, 2, &l),
        vec![spend(2, 1000, 200, 50, 0.25, 1, 1), Spend::default()]
    );
}

#[test]
fn empty_log_is_an_empty_ledger() {
    let l = ledger(&[]);
    assert_eq!(l.total, Spend::default());
    assert_eq!(l.wall_ms, 0);
    assert_eq!(l.llm_retries, 0);
}

/// GPU work is the timed trials as measured (candidate always, reference where this evaluation
/// measured it), not the lease-held time; the text report shows it next to the leases.
#[test]
fn gpu_work_is_the_measured_timed_trials() {
    let executed = |ref_source: &str| -> Event {
        serde_json::from_value(serde_json::json!({
            "type": "executed", "turn": 1,
            "outcome": {
                "verdict": "correct", "compiled": true, "correctness": true, "metadata": {},
                "runtime_ms": 2.0, "ref_runtime_ms": 5.0,
                "runtime_stats": {"mean": 2.0, "median": 2.0, "std": 0.0, "min": 2.0, "max": 2.0, "num_trials": 100},
                "ref_runtime_stats": {"mean": 5.0, "median": 5.0, "std": 0.0, "min": 5.0, "max": 5.0, "num_trials": 100},
                "ref_source": ref_source, "feedback": "", "env": {}, "device": "cuda:0", "wall_ms": 0
            }
        }))
        .unwrap()
    };
    let log = vec![
        rec(0, Some(task(1, 0)), executed("measured")),
        rec(1, Some(task(1, 1)), executed("cached")),
    ];
    let l = ledger(&log);
    // 2 x (2 ms x 100) for the candidates, 5 ms x 100 for the reference measured once.
    assert_eq!(l.gpu_work_ms, 900);
}
