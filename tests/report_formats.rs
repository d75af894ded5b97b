//! Golden output of every report format for two small hand-built runs (a refinement run and a
//! sampling run), and the CLI format names.

use std::collections::BTreeMap;

use krefine::metrics::{
    DeviceUse, FastP, FindingCounts, Integrity, Ledger, PassAtK, RunMetrics, SpeedupCounts, Spend,
    StepMetrics, Summary,
};
use krefine::report::{Format, RunReport, render};
use krefine::types::{FeedbackMode, MethodKind, ProblemKey, TaskId};

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

fn spend(p: u64, c: u64, usd: Option<f64>) -> Spend {
    Spend {
        answers: 1,
        prompt_tokens: p,
        completion_tokens: c,
        reasoning_tokens: 0,
        cost_usd: usd.unwrap_or(0.0),
        answers_without_usage: 0,
        answers_without_cost: u64::from(usd.is_none()),
    }
}

fn step(
    n: u32,
    fast_p: [f64; 6],
    geomean: Option<f64>,
    correct: usize,
    pending: usize,
) -> StepMetrics {
    StepMetrics {
        n,
        summary: Summary {
            fast_p: FastP(fast_p),
            geomean_speedup: geomean,
            correct_rate: correct as f64 / 3.0,
            compiled_rate: 1.0,
            correct,
            compiled: 3,
            timed: correct,
        },
        // Like run_metrics, only verdicts that occurred are listed.
        verdicts: [("correct", correct), ("incorrect", 3 - correct - pending)]
            .into_iter()
            .filter(|&(_, n)| n > 0)
            .map(|(v, n)| (v.to_string(), n))
            .collect(),
        pending,
        integrity: Integrity::default(),
    }
}

/// Three problems, two turns of G+E refinement, priced answers.
fn refine_report() -> RunReport {
    let third = 1.0 / 3.0;
    let metrics = RunMetrics {
        method: MethodKind::Refine,
        axis: 2,
        problems: vec![pk(1), pk(2), pk(3)],
        steps: vec![
            step(1, [third, third, 0.0, 0.0, 0.0, 0.0], Some(0.75), 1, 0),
            step(
                2,
                [2.0 * third, 2.0 * third, 2.0 * third, third, third, 0.0],
                Some(1.224_744_871_391_589),
                2,
                0,
            ),
        ],
        pass_at_k: vec![],
    };
    let mut ledger = Ledger::default();
    for id in 1..=3 {
        ledger.per_task_turn.insert(
            task(id, 0),
            BTreeMap::from([
                (1, spend(1000, 250, Some(0.125))),
                (2, spend(2000, 250, Some(0.25))),
            ]),
        );
    }
    ledger.total = Spend {
        answers: 6,
        prompt_tokens: 9000,
        completion_tokens: 1500,
        reasoning_tokens: 300,
        cost_usd: 1.125,
        answers_without_usage: 0,
        answers_without_cost: 0,
    };
    ledger.llm_attempts = 7;
    ledger.llm_failed_attempts = 1;
    ledger.llm_retries = 1;
    ledger.devices = BTreeMap::from([(
        "cuda:0".to_string(),
        DeviceUse {
            leases: 6,
            wait_ms: 1500,
            held_ms: 40_000,
            busy_ms: 30_000,
            work_ms: 0,
        },
    )]);
    ledger.device_total = ledger.devices["cuda:0"];
    ledger.compiles = 6;
    ledger.compiles_cached = 1;
    ledger.compile_ms = 250_000;
    ledger.wall_ms = 125_000;
    RunReport {
        run: "refine-ge".into(),
        method: MethodKind::Refine,
        feedback: Some(FeedbackMode::GE),
        model: "gpt-test".into(),
        metrics,
        ledger,
        complete: true,
        provenance: None,
        served: None,
        extra: Default::default(),
    }
}

/// Three problems, k = 2 samples, one sample still pending, answers without a cost.
fn sampling_report() -> RunReport {
    let third = 1.0 / 3.0;
    let metrics = RunMetrics {
        method: MethodKind::Sampling,
        axis: 2,
        problems: vec![pk(1), pk(2), pk(3)],
        steps: vec![
            step(1, [0.0; 6], None, 0, 0),
            step(2, [third, third, third, third, 0.0, 0.0], Some(1.1), 1, 1),
        ],
        pass_at_k: vec![PassAtK { k: 1, value: 0.25 }, PassAtK { k: 2, value: 0.5 }],
    };
    let mut ledger = Ledger::default();
    for id in 1..=3 {
        ledger
            .per_task_turn
            .insert(task(id, 0), BTreeMap::from([(1, spend(1000, 200, None))]));
    }
    for id in 1..=2 {
        ledger
            .per_task_turn
            .insert(task(id, 1), BTreeMap::from([(1, spend(1000, 300, None))]));
    }
    ledger.total = Spend {
        answers: 5,
        prompt_tokens: 5000,
        completion_tokens: 1200,
        reasoning_tokens: 0,
        cost_usd: 0.0,
        answers_without_usage: 0,
        answers_without_cost: 5,
    };
    ledger.llm_attempts = 5;
    ledger.wall_ms = 60_000;
    RunReport {
        run: "sample, k=2".into(),
        method: MethodKind::Sampling,
        feedback: None,
        model: "gpt-test".into(),
        metrics,
        ledger,
        complete: false,
        provenance: None,
        served: None,
        extra: Default::default(),
    }
}

#[test]
fn format_names() {
    assert_eq!("text".parse::<Format>().unwrap(), Format::Text);
    assert_eq!("md".parse::<Format>().unwrap(), Format::Md);
    assert_eq!("Markdown".parse::<Format>().unwrap(), Format::Md);
    assert_eq!("json".parse::<Format>().unwrap(), Format::Json);
    assert_eq!("csv".parse::<Format>().unwrap(), Format::Csv);
    assert_eq!(
        "yaml".parse::<Format>().unwrap_err().to_string(),
        "unknown report format \"yaml\" (expected text, md, json or csv)"
    );
    for f in [Format::Text, Format::Md, Format::Json, Format::Csv] {
        assert_eq!(f.to_string().parse::<Format>().unwrap(), f);
    }
}

const TEXT: &str = r#"refine-ge (refine, feedback G+E, model gpt-test, 3 problems, complete)
turn  fast_0  fast_0.5  fast_0.8  fast_1  fast_1.5  fast_2  geomean  correct  compiled  tokens     USD
   1   33.3%     33.3%      0.0%    0.0%      0.0%    0.0%    0.750    33.3%    100.0%    3750  0.3750
   2   66.7%     66.7%     66.7%   33.3%     33.3%    0.0%    1.225    66.7%    100.0%    6750  0.7500
tokens   10500 (prompt 9000, completion 1500, reasoning 300)
USD      1.1250
LLM      6 answers; 7 attempts (1 retry, 1 failed); 0 requests given up
devices  6 leases, held 40.0 s, busy 30.0 s (75.0%), lease wait 1.5 s
compile  250.0 s in 6 builds (1 cached)
wall     125.0 s

sample, k=2 (sampling, model gpt-test, 3 problems, incomplete)
samples  fast_0  fast_0.5  fast_0.8  fast_1  fast_1.5  fast_2  geomean  correct  compiled  tokens  USD
      1    0.0%      0.0%      0.0%    0.0%      0.0%    0.0%        -     0.0%    100.0%    3600    -
      2   33.3%     33.3%     33.3%   33.3%      0.0%    0.0%    1.100    33.3%    100.0%    2600    -
pass@1 25.0%, pass@2 50.0%
tokens   6200 (prompt 5000, completion 1200, reasoning 0)
USD      - (5 of 5 answers without a cost)
LLM      5 answers; 5 attempts (0 retries, 0 failed); 0 requests given up
devices  0 leases, held 0.0 s, busy 0.0 s, lease wait 0.0 s
compile  0.0 s in 0 builds (0 cached)
wall     60.0 s
"#;

const MD: &str = r#"### refine-ge

refine, feedback G+E, model gpt-test, 3 problems, complete

| turn | fast_0 | fast_0.5 | fast_0.8 | fast_1 | fast_1.5 | fast_2 | geomean | correct | compiled | tokens | USD |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
| 1 | 33.3% | 33.3% | 0.0% | 0.0% | 0.0% | 0.0% | 0.750 | 33.3% | 100.0% | 3750 | 0.3750 |
| 2 | 66.7% | 66.7% | 66.7% | 33.3% | 33.3% | 0.0% | 1.225 | 66.7% | 100.0% | 6750 | 0.7500 |

- tokens: 10500 (prompt 9000, completion 1500, reasoning 300)
- USD: 1.1250
- LLM: 6 answers; 7 attempts (1 retry, 1 failed); 0 requests given up
- devices: 6 leases, held 40.0 s, busy 30.0 s (75.0%), lease wait 1.5 s
- compile: 250.0 s in 6 builds (1 cached)
- wall: 125.0 s

### sample, k=2

sampling, model gpt-test, 3 problems, incomplete

| samples | fast_0 | fast_0.5 | fast_0.8 | fast_1 | fast_1.5 | fast_2 | geomean | correct | compiled | tokens | USD |
|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
| 1 | 0.0% | 0.0% | 0.0% | 0.0% | 0.0% | 0.0% | - | 0.0% | 100.0% | 3600 | - |
| 2 | 33.3% | 33.3% | 33.3% | 33.3% | 0.0% | 0.0% | 1.100 | 33.3% | 100.0% | 2600 | - |

pass@1 25.0%, pass@2 50.0%

- tokens: 6200 (prompt 5000, completion 1200, reasoning 0)
- USD: - (5 of 5 answers without a cost)
- LLM: 5 answers; 5 attempts (0 retries, 0 failed); 0 requests given up
- devices: 0 leases, held 0.0 s, busy 0.0 s, lease wait 0.0 s
- compile: 0.0 s in 0 builds (0 cached)
- wall: 60.0 s
"#;

const CSV: &str = r#"run,method,feedback,model,complete,axis,turn,problems,fast_0,fast_0.5,fast_0.8,fast_1,fast_1.5,fast_2,geomean_speedup,correct_rate,compiled_rate,correct,compiled,pending,prompt_tokens,completion_tokens,reasoning_tokens,tokens,cost_usd,cumulative_tokens,cumulative_cost_usd,rejected,speedups_flagged,speedups_verified,speedups_unverified,speedups_excluded,findings
refine-ge,refine,GE,gpt-test,true,turns,1,3,0.3333333333333333,0.3333333333333333,0,0,0,0,0.75,0.3333333333333333,1,1,3,0,3000,750,0,3750,0.375,3750,0.375,0,0,0,0,0,
refine-ge,refine,GE,gpt-test,true,turns,2,3,0.6666666666666666,0.6666666666666666,0.6666666666666666,0.3333333333333333,0.3333333333333333,0,1.224744871391589,0.6666666666666666,1,2,3,0,6000,750,0,6750,0.75,10500,1.125,0,0,0,0,0,
"sample, k=2",sampling,,gpt-test,false,samples,1,3,0,0,0,0,0,0,,0,1,0,3,0,3000,600,0,3600,,3600,,0,0,0,0,0,
"sample, k=2",sampling,,gpt-test,false,samples,2,3,0.3333333333333333,0.3333333333333333,0.3333333333333333,0.3333333333333333,0,0,1.1,0.3333333333333333,1,1,3,1,2000,600,0,2600,,6200,,0,0,0,0,0,
"#;

const ONE_JSON: &str = r#"{
  "run": "refine-ge",
  "method": "refine",
  "feedback": "GE",
  "model": "gpt-test",
  "complete": true,
  "axis": "turns",
  "problems": 3,
  "turns": [
    {
      "turn": 1,
      "fast_p": {
        "0": 0.3333333333333333,
        "0.5": 0.3333333333333333,
        "0.8": 0.0,
        "1": 0.0,
        "1.5": 0.0,
        "2": 0.0
      },
      "geomean_speedup": 0.75,
      "correct_rate": 0.3333333333333333,
      "compiled_rate": 1.0,
      "correct": 1,
      "compiled": 3,
      "timed": 1,
      "pending": 0,
      "verdicts": {
        "correct": 1,
        "incorrect": 2
      },
      "tokens": {
        "prompt": 3000,
        "completion": 750,
        "reasoning": 0,
        "total": 3750
      },
      "cost_usd": 0.375,
      "cumulative_tokens": 3750,
      "cumulative_cost_usd": 0.375
    },
    {
      "turn": 2,
      "fast_p": {
        "0": 0.6666666666666666,
        "0.5": 0.6666666666666666,
        "0.8": 0.6666666666666666,
        "1": 0.3333333333333333,
        "1.5": 0.3333333333333333,
        "2": 0.0
      },
      "geomean_speedup": 1.224744871391589,
      "correct_rate": 0.6666666666666666,
      "compiled_rate": 1.0,
      "correct": 2,
      "compiled": 3,
      "timed": 2,
      "pending": 0,
      "verdicts": {
        "correct": 2,
        "incorrect": 1
      },
      "tokens": {
        "prompt": 6000,
        "completion": 750,
        "reasoning": 0,
        "total": 6750
      },
      "cost_usd": 0.75,
      "cumulative_tokens": 10500,
      "cumulative_cost_usd": 1.125
    }
  ],
  "ledger": {
    "tokens": {
      "prompt": 9000,
      "completion": 1500,
      "reasoning": 300,
      "total": 10500
    },
    "cost_usd": 1.125,
    "llm_answers": 6,
    "answers_without_usage": 0,
    "answers_without_cost": 0,
    "llm_attempts": 7,
    "llm_failed_attempts": 1,
    "llm_retries": 1,
    "llm_failures": 0,
    "device_time": {
      "leases": 6,
      "wait_ms": 1500,
      "held_ms": 40000,
      "busy_ms": 30000
    },
    "devices": {
      "cuda:0": {
        "leases": 6,
        "wait_ms": 1500,
        "held_ms": 40000,
        "busy_ms": 30000
      }
    },
    "compiles": 6,
    "compiles_cached": 1,
    "compile_ms": 250000,
    "wall_ms": 125000
  }
}
"#;

#[test]
fn text_golden() {
    assert_eq!(
        render(&[refine_report(), sampling_report()], Format::Text),
        TEXT
    );
}

#[test]
fn markdown_golden() {
    assert_eq!(
        render(&[refine_report(), sampling_report()], Format::Md),
        MD
    );
}

#[test]
fn csv_golden() {
    assert_eq!(
        render(&[refine_report(), sampling_report()], Format::Csv),
        CSV
    );
}

#[test]
fn json_golden_for_one_run() {
    assert_eq!(render(&[refine_report()], Format::Json), ONE_JSON);
}

#[test]
fn json_for_several_runs_is_an_array() {
    let out = render(&[refine_report(), sampling_report()], Format::Json);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let runs = v.as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(
        runs[0],
        serde_json::from_str::<serde_json::Value>(ONE_JSON).unwrap()
    );
    let s = &runs[1];
    assert_eq!(s["run"], "sample, k=2");
    assert_eq!(s["method"], "sampling");
    assert_eq!(s["axis"], "samples");
    assert_eq!(s["feedback"], serde_json::Value::Null);
    assert_eq!(s["complete"], false);
    assert_eq!(s["turns"][1]["turn"], 2);
    assert_eq!(s["turns"][1]["fast_p"]["1"], 1.0 / 3.0);
    assert_eq!(s["turns"][0]["geomean_speedup"], serde_json::Value::Null);
    assert_eq!(s["turns"][1]["cost_usd"], serde_json::Value::Null);
    assert_eq!(s["turns"][1]["cumulative_tokens"], 6200);
    assert_eq!(s["pass_at_k"], serde_json::json!({"1": 0.25, "2": 0.5}));
    assert_eq!(s["ledger"]["answers_without_cost"], 5);
    // Refinement has no pass@k.
    assert!(runs[0].get("pass_at_k").is_none());
}

#[test]
fn no_runs() {
    assert_eq!(render(&[], Format::Json), "[]\n");
    assert_eq!(render(&[], Format::Text), "");
    assert!(render(&[], Format::Csv).starts_with("run,method,feedback,model,complete,axis,turn,"));
    assert_eq!(render(&[], Format::Csv).lines().count(), 1);
}

#[test]
fn integrity_in_every_format() {
    let counts = |warnings, errors| FindingCounts { warnings, errors };
    let mut r = refine_report();
    r.metrics.steps[0].integrity = Integrity {
        static_checks: BTreeMap::from([
            ("code_bypass".to_string(), counts(2, 0)),
            ("timing_patch".to_string(), counts(0, 1)),
        ]),
        runtime_checks: BTreeMap::from([("tf32_changed".to_string(), counts(1, 0))]),
        rejected: 1,
        speedups: SpeedupCounts {
            flagged: 2,
            verified: 1,
            unverified: 1,
            excluded: 1,
        },
    };
    let text = render(std::slice::from_ref(&r), Format::Text);
    assert!(
        text.contains(
            "checks   static: code_bypass (2 warned), timing_patch (1 rejected); runtime: tf32_changed (1 warned)\n\
             speedups 2 flagged as excessive: 1 re-verified, 1 unverified; not counted in fast_p and geomean (strict mode)\n\
             tokens   "
        ),
        "{text}"
    );
    let md = render(std::slice::from_ref(&r), Format::Md);
    assert!(
        md.contains("\n- checks: static: code_bypass (2 warned), timing_patch (1 rejected); runtime: tf32_changed (1 warned)\n- speedups: 2 flagged"),
        "{md}"
    );
    let csv = render(std::slice::from_ref(&r), Format::Csv);
    let lines: Vec<&str> = csv.lines().collect();
    assert!(
        lines[0].ends_with(",rejected,speedups_flagged,speedups_verified,speedups_unverified,speedups_excluded,findings")
    );
    assert!(
        lines[1].ends_with(
            ",1,2,1,1,1,static.code_bypass:2/0 static.timing_patch:0/1 runtime.tf32_changed:1/0"
        ),
        "{}",
        lines[1]
    );
    assert!(lines[2].ends_with(",0,0,0,0,0,"), "{}", lines[2]);
    let v: serde_json::Value =
        serde_json::from_str(&render(std::slice::from_ref(&r), Format::Json)).unwrap();
    assert_eq!(
        v["integrity"],
        serde_json::json!({
            "static": {
                "code_bypass": {"warnings": 2, "errors": 0},
                "timing_patch": {"warnings": 0, "errors": 1}
            },
            "runtime": {"tf32_changed": {"warnings": 1, "errors": 0}},
            "rejected": 1,
            "speedups": {"flagged": 2, "verified": 1, "unverified": 1, "excluded": 1}
        })
    );
    assert_eq!(v["turns"][0]["integrity"], v["integrity"]);
    assert!(v["turns"][1].get("integrity").is_none());
    // Faithful mode only flags: the report says the flagged speedups were counted.
    r.metrics.steps[0].integrity.speedups.excluded = 0;
    let text = render(&[r], Format::Text);
    assert!(
        text.contains(
            "1 unverified; counted in fast_p and geomean (faithful mode only flags them)"
        ),
        "{text}"
    );
}
