//! The `eval_results.json` export: best or last turn per task, KernelBench's keys and conventions.

use std::collections::BTreeMap;

use krefine::report::{Pick, kernelbench_eval_results};
use krefine::types::{
    CompileOutcome, CompileStatus, EvalEnv, ExecOutcome, ProblemKey, TaskId, TimingStats,
    TurnRecord, Verdict,
};
use serde_json::json;

fn task(level: u32, id: u32, sample: u32) -> TaskId {
    TaskId {
        problem: ProblemKey {
            level,
            problem_id: id,
        },
        sample,
    }
}

fn ran(turn: u32, verdict: Verdict, speedup: Option<f64>, runtime: f64) -> TurnRecord {
    let mut exec = ExecOutcome::failure(verdict, "cuda:0", String::new(), 0);
    exec.compiled = true;
    exec.correctness = verdict == Verdict::Correct;
    exec.speedup = speedup;
    exec.metadata = serde_json::Map::from_iter([(
        "correctness_trials".to_string(),
        json!(if exec.correctness {
            "(5 / 5)"
        } else {
            "(0 / 5)"
        }),
    )]);
    exec.env = EvalEnv {
        device_name: "NVIDIA H100 80GB HBM3".into(),
        ..EvalEnv::default()
    };
    if runtime > 0.0 {
        exec.runtime_ms = runtime;
        exec.runtime_stats = Some(TimingStats {
            mean: runtime,
            median: runtime,
            std: 0.01,
            min: runtime - 0.01,
            max: runtime + 0.1,
            num_trials: 100,
        });
    }
    TurnRecord {
        turn,
        exec: Some(exec),
        verdict: Some(verdict),
        ..TurnRecord::default()
    }
}

fn compile_failed(turn: u32) -> TurnRecord {
    TurnRecord {
        turn,
        compile: Some(CompileOutcome {
            ran_on: None,
            worker_losses: Vec::new(),
            status: CompileStatus::Error,
            cached: false,
            error_name: Some("RuntimeError".into()),
            error: Some("Error building extension 'k'".into()),
            feedback: String::new(),
            log_path: None,
            build_dir: None,
            duration_ms: 1000,
            findings: Vec::new(),
            build_path: None,
            cpu: None,
        }),
        verdict: Some(Verdict::CompileError),
        ..TurnRecord::default()
    }
}

fn turns() -> BTreeMap<TaskId, Vec<TurnRecord>> {
    BTreeMap::from([
        // Problem 3: correct 1.5× at turn 2, slower correct at turn 3.
        (
            task(1, 3, 0),
            vec![
                compile_failed(1),
                ran(2, Verdict::Correct, Some(1.5), 2.0),
                ran(3, Verdict::Correct, Some(1.2), 2.5),
            ],
        ),
        // Problem 10: never correct; last turn a compile failure; a turn still in progress.
        (
            task(1, 10, 0),
            vec![
                ran(1, Verdict::Incorrect, None, -1.0),
                compile_failed(2),
                TurnRecord {
                    turn: 3,
                    ..TurnRecord::default()
                },
            ],
        ),
        (task(1, 10, 1), vec![ran(1, Verdict::Correct, None, -1.0)]),
        // Another level and a task without a finished turn are left out.
        (
            task(2, 1, 0),
            vec![ran(1, Verdict::Correct, Some(2.0), 1.0)],
        ),
        (task(1, 11, 0), vec![]),
    ])
}

fn correct_entry(sample: u32, runtime: f64) -> serde_json::Value {
    json!({
        "sample_id": sample,
        "compiled": true,
        "correctness": true,
        "metadata": {
            "correctness_trials": "(5 / 5)",
            "hardware": "NVIDIA H100 80GB HBM3",
            "device": "cuda:0",
        },
        "runtime": runtime,
        "runtime_stats": {
            "mean": runtime, "std": 0.01, "min": runtime - 0.01, "max": runtime + 0.1,
            "num_trials": 100, "hardware": "NVIDIA H100 80GB HBM3", "device": "cuda:0",
        },
    })
}

fn compile_failed_entry() -> serde_json::Value {
    json!({
        "sample_id": 0,
        "compiled": false,
        "correctness": false,
        "metadata": {
            "compilation_error_name": "RuntimeError",
            "compilation_error": "Error building extension 'k'",
        },
        "runtime": -1.0,
        "runtime_stats": {},
    })
}

#[test]
fn best_turn_per_task() {
    let got = kernelbench_eval_results(1, &turns(), Pick::Best);
    let untimed_correct = json!({
        "sample_id": 1,
        "compiled": true,
        "correctness": true,
        "metadata": {
            "correctness_trials": "(5 / 5)",
            "hardware": "NVIDIA H100 80GB HBM3",
            "device": "cuda:0",
        },
        "runtime": -1.0,
        "runtime_stats": {},
    });
    let want = json!({
        "3": [correct_entry(0, 2.0)],
        // Sample 0 has no correct turn, so its last finished turn stands for it.
        "10": [compile_failed_entry(), untimed_correct],
    });
    assert_eq!(got, want);
}

#[test]
fn last_turn_per_task() {
    let got = kernelbench_eval_results(1, &turns(), Pick::Last);
    assert_eq!(got["3"], json!([correct_entry(0, 2.5)]));
    assert_eq!(got["10"][0], compile_failed_entry());
    let level2 = kernelbench_eval_results(2, &turns(), Pick::Last);
    assert_eq!(level2["1"], json!([correct_entry(0, 1.0)]));
    assert_eq!(level2.as_object().map(|o| o.len()), Some(1));
}

#[test]
fn rejected_and_unverified_strict_speedups() {
    let rejected = TurnRecord {
        turn: 1,
        compile: Some(CompileOutcome {
            ran_on: None,
            worker_losses: Vec::new(),
            status: CompileStatus::Rejected,
            cached: false,
            error_name: Some("StaticCheckError".into()),
            error: Some("static check: timing_patch at line 3: assigns `time.time`".into()),
            feedback: String::new(),
            log_path: None,
            build_dir: None,
            duration_ms: 0,
            findings: Vec::new(),
            build_path: None,
            cpu: None,
        }),
        verdict: Some(Verdict::Rejected),
        ..TurnRecord::default()
    };
    // A strict-mode 90x that re-timing did not confirm ranks below an honest 1.2x.
    let mut hacked = ran(2, Verdict::Correct, Some(90.0), 0.01);
    let e = hacked.exec.as_mut().unwrap();
    e.env.mode = Some("strict".into());
    e.speedup_check = Some(krefine::types::SpeedupCheck {
        bound: 50.0,
        bound_source: "default".into(),
        flagged: true,
        verified: Some(false),
        reverified_speedup: Some(1.0),
    });
    let honest = ran(3, Verdict::Correct, Some(1.2), 0.8);
    let turns = BTreeMap::from([
        (task(1, 1, 0), vec![rejected.clone()]),
        (task(1, 2, 0), vec![hacked, honest]),
    ]);
    let out = kernelbench_eval_results(1, &turns, Pick::Best);
    assert_eq!(
        out["1"][0],
        json!({
            "sample_id": 0,
            "compiled": false,
            "correctness": false,
            "metadata": {
                "compilation_error_name": "StaticCheckError",
                "compilation_error": "static check: timing_patch at line 3: assigns `time.time`"
            },
            "runtime": -1.0,
            "runtime_stats": {}
        })
    );
    assert_eq!(out["2"][0]["runtime"], 0.8);
}
