//! `krefine compare`, `report --plot` and `report --submission` on run directories built from event
//! logs, through the real binary: exact matched-budget values and intervals, what differs, plots on
//! disk, the submission's content, and `eval --check` validation of good and malformed submissions.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use krefine::types::{
    CompileOutcome, CompileStatus, Event, ExecOutcome, FeedbackMode, LlmAnswer, LogRecord,
    MethodKind, ProfileOutcome, SCHEMA_VERSION, TaskId, Usage, Verdict,
};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_krefine")
}

fn krefine(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .output()
        .expect("run krefine")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// One attempt: verdict, speedup (correct ones), usage and cost, device lease time.
struct Turn {
    task: &'static str,
    turn: u32,
    verdict: Verdict,
    speedup: Option<f64>,
    tokens: (u64, u64),
    usd: f64,
    lease_ms: u64,
}

fn t(
    task: &'static str,
    turn: u32,
    verdict: Verdict,
    speedup: Option<f64>,
    tokens: (u64, u64),
    usd: f64,
    lease_ms: u64,
) -> Turn {
    Turn {
        task,
        turn,
        verdict,
        speedup,
        tokens,
        usd,
        lease_ms,
    }
}

fn code_of(task: &str, turn: u32) -> String {
    format!("# kernel of {task} turn {turn}\nclass ModelNew: pass\n")
}

/// Write a run directory whose log holds `turns`.
#[allow(
    clippy::too_many_arguments,
    reason = "each argument is one fact of the run written"
)]
fn write_run(
    dir: &Path,
    name: &str,
    method: MethodKind,
    feedback: Option<FeedbackMode>,
    task_ids: &[&str],
    n_turns: u32,
    samples: u32,
    turns: &[Turn],
) {
    std::fs::create_dir_all(dir.join("kernels")).unwrap();
    std::fs::write(
        dir.join("config.toml"),
        format!(
            "[run]\nname = \"{name}\"\n[dataset]\npath = \"problems\"\n[model]\nname = \"model-x\"\n[method]\nkind = \"{method}\"\n"
        ),
    )
    .unwrap();
    let mut seq = 0;
    let mut records = Vec::new();
    let mut push = |task: Option<TaskId>, event: Event| {
        records.push(LogRecord {
            v: SCHEMA_VERSION,
            seq,
            ts_ms: 1_000 + seq,
            task,
            event,
        });
        seq += 1;
    };
    push(
        None,
        Event::RunStarted {
            run: name.into(),
            method,
            feedback,
            task_ids: task_ids.iter().map(|s| s.parse().unwrap()).collect(),
            turns: n_turns,
            samples,
            krefine_version: "test".into(),
            resumed: false,
            simulated: false,
            problem_names: Default::default(),
        },
    );
    for x in turns {
        let task: TaskId = x.task.parse().unwrap();
        let code = code_of(x.task, x.turn);
        push(
            Some(task),
            Event::LlmAnswered {
                turn: x.turn,
                answer: LlmAnswer {
                    content: format!("```python\n{code}```"),
                    usage: Some(Usage {
                        prompt_tokens: x.tokens.0,
                        completion_tokens: x.tokens.1,
                        reasoning_tokens: 0,
                    }),
                    cost_usd: Some(x.usd),
                    model: "model-x".into(),
                    finish_reason: Some("stop".into()),
                    latency_ms: 5,
                    attempts: 1,
                },
                code: Some(code),
                code_file: None,
            },
        );
        push(
            Some(task),
            Event::Compiled {
                turn: x.turn,
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
                    duration_ms: 10,
                    findings: Vec::new(),
                    build_path: None,
                    cpu: None,
                },
            },
        );
        push(
            Some(task),
            Event::LeaseGranted {
                device: "cpu".into(),
                wait_ms: 0,
                turn: x.turn,
            },
        );
        let mut exec = ExecOutcome::failure(x.verdict, "cpu", String::new(), x.lease_ms);
        exec.compiled = true;
        exec.correctness = x.verdict == Verdict::Correct;
        exec.speedup = x.speedup;
        exec.metadata = Default::default();
        exec.env.device_name = "cpu".into();
        exec.env.precision = Some("fp32".into());
        if let Some(s) = x.speedup {
            exec.runtime_ms = 1.0 / s;
            exec.ref_runtime_ms = 1.0;
            exec.ref_source = Some("measured".into());
        }
        push(
            Some(task),
            Event::Executed {
                turn: x.turn,
                outcome: exec,
            },
        );
        push(
            Some(task),
            Event::LeaseReleased {
                device: "cpu".into(),
                held_ms: x.lease_ms,
                busy_ms: x.lease_ms,
                turn: x.turn,
            },
        );
    }
    push(
        None,
        Event::RunEnded {
            reason: "finished".into(),
        },
    );
    let lines: Vec<String> = records
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    std::fs::write(dir.join("events.jsonl"), lines.join("\n") + "\n").unwrap();
}

/// The refinement and sampling runs of tests/metrics_compare.rs, as logs (USD priced in both).
fn fixture_runs(root: &Path) -> (PathBuf, PathBuf) {
    use Verdict::{Correct, Incorrect};
    let refine = root.join("ref");
    write_run(
        &refine,
        "ref",
        MethodKind::Refine,
        Some(FeedbackMode::GE),
        &["1/1/0", "1/2/0"],
        2,
        1,
        &[
            t("1/1/0", 1, Incorrect, None, (80, 20), 0.01, 1000),
            t("1/2/0", 1, Correct, Some(0.5), (80, 20), 0.01, 1000),
            t("1/1/0", 2, Correct, Some(2.0), (250, 50), 0.03, 2000),
            t("1/2/0", 2, Correct, Some(1.5), (250, 50), 0.03, 2000),
        ],
    );
    let sampling = root.join("smp");
    write_run(
        &sampling,
        "smp",
        MethodKind::Sampling,
        None,
        &["1/1/0", "1/1/1", "1/2/0", "1/2/1", "1/3/0", "1/3/1"],
        1,
        2,
        &[
            t("1/1/0", 1, Correct, Some(1.2), (80, 20), 0.01, 1000),
            t("1/1/1", 1, Incorrect, None, (80, 20), 0.01, 1000),
            t("1/2/0", 1, Incorrect, None, (80, 20), 0.01, 1000),
            t("1/2/1", 1, Correct, Some(3.0), (80, 20), 0.01, 1000),
            t("1/3/0", 1, Correct, Some(9.0), (80, 20), 0.01, 1000),
            t("1/3/1", 1, Incorrect, None, (80, 20), 0.01, 1000),
        ],
    );
    (refine, sampling)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Make a run's log G+E+P with Nsight Compute profiles carrying a fraction of speed of light after
/// the executions of `(task, turn)`s.
fn add_profiles(dir: &Path, sols: &[(&str, u32, f64)]) {
    let path = dir.join("events.jsonl");
    let text = std::fs::read_to_string(&path).unwrap();
    let records: Vec<LogRecord> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut out = Vec::new();
    for mut record in records {
        // Only G+E+P turns are profiled.
        if let Event::RunStarted { feedback, .. } = &mut record.event {
            *feedback = Some(FeedbackMode::GEP);
        }
        let after = match (&record.task, &record.event) {
            (Some(t), Event::Executed { turn, .. }) => sols
                .iter()
                .find(|(task, n, _)| task.parse::<TaskId>().unwrap() == *t && n == turn)
                .copied(),
            _ => None,
        };
        let task = record.task;
        out.push(record);
        if let Some((_, turn, sol)) = after {
            let outcome = ProfileOutcome {
                ok: true,
                table: String::new(),
                ncu: Some(
                    serde_json::json!({"duration_ns": 1000.0, "num_kernels": 1, "sol_fraction": sol}),
                ),
                error: None,
                duration_ms: 1,
                worker_losses: Vec::new(),
            };
            out.push(LogRecord {
                v: SCHEMA_VERSION,
                seq: 0,
                ts_ms: 5_000,
                task,
                event: Event::Profiled { turn, outcome },
            });
        }
    }
    let mut records = out;
    let lines: Vec<String> = records
        .iter_mut()
        .enumerate()
        .map(|(i, r)| {
            r.seq = i as u64;
            serde_json::to_string(r).unwrap()
        })
        .collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
}

/// `--fast-p` thresholds beyond KernelBench's as named columns in every format of `report` and
/// `compare`, and the mean fraction of speed of light of the correct profiled candidates.
#[test]
fn fast_p_at_chosen_thresholds_and_speed_of_light_in_every_format() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = fixture_runs(d.path());
    // G+E+P profiles every correct candidate.
    add_profiles(
        &a,
        &[("1/2/0", 1, 0.25), ("1/1/0", 2, 0.5), ("1/2/0", 2, 0.6)],
    );
    // Turn 1: problem 2 at 0.5x; turn 2: 2.0x and 1.5x. `1` is KernelBench's: no second column.
    let o = krefine(&["report", s(&a), "--format", "json", "--fast-p", "1.2,1.7,1"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let turns = &v["turns"];
    assert_eq!(
        turns[0]["fast_p_extra"],
        serde_json::json!({"1.2": 0.0, "1.7": 0.0})
    );
    assert_eq!(
        turns[1]["fast_p_extra"],
        serde_json::json!({"1.2": 1.0, "1.7": 0.5})
    );
    assert_eq!(turns[0]["sol_mean"], 0.25);
    assert_eq!(turns[0]["sol_candidates"], 1);
    assert_eq!(turns[1]["sol_mean"], (0.25 + 0.5 + 0.6) / 3.0);
    assert_eq!(turns[1]["sol_candidates"], 3);

    let o = krefine(&["report", s(&a), "--format", "csv", "--fast-p", "1.2,1.7"]);
    let (out, _) = text(&o);
    let lines: Vec<&str> = out.lines().collect();
    let header: Vec<&str> = lines[0].split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let cell = |row: usize, name: &str| lines[row].split(',').nth(col(name)).unwrap().to_string();
    assert_eq!(col("fast_1.2"), col("fast_2") + 1);
    assert_eq!(col("fast_1.7"), col("fast_2") + 2);
    assert_eq!(header[header.len() - 2..], ["sol_mean", "sol_candidates"]);
    assert_eq!(cell(1, "fast_1.2"), "0");
    assert_eq!(cell(2, "fast_1.2"), "1");
    assert_eq!(cell(2, "fast_1.7"), "0.5");
    assert_eq!(cell(1, "sol_mean"), "0.25");
    assert_eq!(cell(2, "sol_candidates"), "3");

    let o = krefine(&["report", s(&a), "--fast-p", "1.2"]);
    let (out, _) = text(&o);
    let table: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("turn") || l.starts_with("   "))
        .collect();
    assert!(
        out.contains("fast_2  fast_1.2  geomean    SOL (n)  correct"),
        "{out}"
    );
    assert_eq!(
        table[2],
        "   2  100.0%    100.0%    100.0%  100.0%     50.0%    0.0%    100.0%    1.732  45.0% (3)   100.0%    100.0%     600  0.0600"
    );
    assert!(
        out.contains("ref: fast_1.2 100.0% (all candidates"),
        "{out}"
    );
    assert!(
        out.contains(
            "ref: mean fraction of speed of light 45.0% over 3 correct candidate(s) with a roofline"
        ),
        "{out}"
    );
    // No thresholds asked and no profile: the table is KernelBench's alone.
    let o = krefine(&["report", s(&b), "--fast-p", ""]);
    let (out, _) = text(&o);
    assert!(out.contains("fast_1.5  fast_2  geomean  correct"), "{out}");
    assert!(!out.contains("SOL"), "{out}");

    // compare: the extra thresholds at every budget. One LLM call: refine has problem 2 at 0.5x,
    // sampling problem 1 at 1.2x (not above 1.2); two: 2.0x and 1.5x against 1.2x and 3.0x.
    let o = krefine(&[
        "compare",
        s(&a),
        s(&b),
        "--format",
        "json",
        "--resamples",
        "0",
        "--fast-p",
        "1.2,1.7",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let calls = &v["axes"][0]["rows"];
    assert_eq!(
        calls[0]["runs"][0]["fast_p_extra"],
        serde_json::json!({"1.2": 0.0, "1.7": 0.0})
    );
    assert_eq!(
        calls[0]["runs"][1]["fast_p_extra"],
        serde_json::json!({"1.2": 0.0, "1.7": 0.0})
    );
    assert_eq!(
        calls[1]["runs"][0]["fast_p_extra"],
        serde_json::json!({"1.2": 1.0, "1.7": 0.5})
    );
    assert_eq!(
        calls[1]["runs"][1]["fast_p_extra"],
        serde_json::json!({"1.2": 0.5, "1.7": 0.5})
    );
    let o = krefine(&[
        "compare",
        s(&a),
        s(&b),
        "--format",
        "csv",
        "--resamples",
        "0",
        "--fast-p",
        "1.2",
    ]);
    let (out, _) = text(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].ends_with(",delta_correct_rate_hi,fast_1.2"),
        "{}",
        lines[0]
    );
    assert!(
        lines[3].starts_with("llm_calls,2,ref,") && lines[3].ends_with(",1"),
        "{out}"
    );
    assert!(
        lines[4].starts_with("llm_calls,2,smp,") && lines[4].ends_with(",0.5"),
        "{out}"
    );
    let o = krefine(&[
        "compare",
        s(&a),
        s(&b),
        "--resamples",
        "0",
        "--fast-p",
        "1.2",
    ]);
    let (out, _) = text(&o);
    assert!(out.contains("fast_2  fast_1.2  correct"), "{out}");
}

#[test]
fn compare_matches_budgets_from_logs_with_exact_intervals() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = fixture_runs(d.path());
    let o = krefine(&[
        "compare",
        s(&a),
        s(&b),
        "--format",
        "json",
        "--resamples",
        "4",
        "--seed",
        "0",
        "--level",
        "0.5",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["shared_problems"], serde_json::json!(["1/1", "1/2"]));
    assert_eq!(v["dropped"], serde_json::json!([0, 1]));
    let differs: Vec<&str> = v["differs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["field"].as_str().unwrap())
        .collect();
    assert_eq!(differs, ["method", "feedback", "budget"]);
    let axes = v["axes"].as_array().unwrap();
    let names: Vec<&str> = axes.iter().map(|a| a["axis"].as_str().unwrap()).collect();
    assert_eq!(names, ["llm_calls", "tokens", "usd", "gpu_s"]);
    // One LLM call: refine has problem 2 at 0.5x, sampling problem 1 at 1.2x.
    let r1 = &axes[0]["rows"][0]["runs"];
    assert_eq!(r1[0]["fast_p"]["0"], 0.5);
    assert_eq!(r1[0]["fast_p"]["1"], 0.0);
    assert_eq!(r1[1]["fast_p"]["1"], 0.5);
    assert_eq!(
        r1[1]["ci"]["fast_p"]["1"],
        serde_json::json!({"lo": 0.5, "hi": 0.625})
    );
    assert_eq!(
        r1[1]["vs_first"]["correct_rate_ci"],
        serde_json::json!({"lo": 0.0, "hi": 0.25})
    );
    // Budgets on the cost axes: every run's mean cumulative cost per shared problem.
    let budgets = |i: usize| -> Vec<f64> {
        axes[i]["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["budget"].as_f64().unwrap())
            .collect()
    };
    assert_eq!(budgets(1), [100.0, 200.0, 400.0]);
    assert_eq!(budgets(3), [1.0, 2.0, 3.0]);
    let usd = budgets(2);
    assert_eq!(usd.len(), 3);
    assert!((usd[2] - 0.04).abs() < 1e-12, "{usd:?}");
    // At 200 tokens per problem refinement affords one turn, sampling both samples.
    let at200 = &axes[1]["rows"][1]["runs"];
    assert_eq!(at200[0]["attempts"], 1.0);
    assert_eq!(at200[1]["attempts"], 2.0);
    assert_eq!(at200[1]["exhausted"], true);
    assert_eq!(at200[1]["fast_p"]["1"], 1.0);

    let o = krefine(&["compare", s(&a), s(&b), "--resamples", "50"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("compare: ref vs smp (2 shared problems; dropped because not in every run: ref 0, smp 1)"),
        "{out}"
    );
    assert!(
        out.contains(
            "differs: method refine | sampling; feedback GE | -; budget 2 turns | 2 samples"
        ),
        "{out}"
    );
    assert!(
        out.contains("same: model model-x; hardware cpu; precision fp32;"),
        "{out}"
    );
    assert!(out.contains("\nllm_calls: LLM calls per problem"), "{out}");

    let o = krefine(&[
        "compare",
        s(&a),
        s(&b),
        "--format",
        "csv",
        "--resamples",
        "10",
    ]);
    let (out, _) = text(&o);
    let lines: Vec<&str> = out.trim_end().lines().collect();
    assert!(
        lines[0]
            .starts_with("axis,budget,run,problems,attempts,exhausted,fast_0,fast_0_lo,fast_0_hi")
    );
    // 2 budgets on llm_calls, 3 on each of the others, two runs each.
    assert_eq!(lines.len(), 1 + 2 * (2 + 3 + 3 + 3));
    assert!(
        lines[1].starts_with("llm_calls,1,ref,2,1,false,0.5,"),
        "{}",
        lines[1]
    );
}

/// Issue 27 (1): two runs made from one config (refinement, and `--set method.kind=sampling`)
/// carry the config's name; `compare` tells them apart by their directories instead of refusing.
#[test]
fn runs_of_one_config_are_told_apart_by_their_directories() {
    use Verdict::{Correct, Incorrect};
    let d = tempfile::tempdir().unwrap();
    let a = d.path().join("refine");
    write_run(
        &a,
        "quickstart",
        MethodKind::Refine,
        Some(FeedbackMode::GE),
        &["1/1/0"],
        1,
        1,
        &[t("1/1/0", 1, Correct, Some(2.0), (80, 20), 0.01, 1000)],
    );
    let b = d.path().join("sampling");
    write_run(
        &b,
        "quickstart",
        MethodKind::Sampling,
        None,
        &["1/1/0"],
        1,
        1,
        &[t("1/1/0", 1, Incorrect, None, (80, 20), 0.01, 1000)],
    );
    let o = krefine(&["compare", s(&a), s(&b), "--resamples", "0"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains("compare: refine vs sampling (1 shared problems;"),
        "{out}"
    );
    assert!(out.contains("differs: method refine | sampling"), "{out}");

    // The same directory twice still compares (each copy numbered).
    let o = krefine(&[
        "compare",
        s(&a),
        s(&a),
        "--resamples",
        "0",
        "--format",
        "json",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    // One `runs` key (the run descriptions), not a second one of bare names after it.
    assert_eq!(out.matches("\"runs\": [\n    {").count(), 1, "{out}");
    assert_eq!(out.matches("\n  \"runs\":").count(), 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let runs: Vec<&str> = v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run"].as_str().unwrap())
        .collect();
    assert_eq!(runs.len(), 2);
    assert_ne!(runs[0], runs[1]);
}

#[test]
fn plots_are_written_as_svg_and_png() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = fixture_runs(d.path());
    let svg = d.path().join("cmp.svg");
    let o = krefine(&[
        "compare",
        s(&a),
        s(&b),
        "--plot",
        s(&svg),
        "--resamples",
        "20",
    ]);
    assert!(o.status.success(), "{}", text(&o).1);
    let body = std::fs::read_to_string(&svg).unwrap();
    assert!(body.starts_with("<svg"), "{}", &body[..100]);
    for label in [
        "fast_1 by llm_calls",
        "fast_1 by gpu_s",
        "ref",
        "smp",
        "best speedup",
    ] {
        assert!(body.contains(label), "{label} missing from the plot");
    }
    let png = d.path().join("run.png");
    let o = krefine(&["report", s(&a), "--plot", s(&png)]);
    let (_, err) = text(&o);
    if o.status.success() {
        let bytes = std::fs::read(&png).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    } else {
        // A machine without fonts must say so, not write an unlabelled picture.
        assert!(err.contains("PNG output needs a system font"), "{err}");
    }
    // A file the plot cannot be: refused before the report is printed, by report and compare.
    for bad in ["x.pdf", "no/such/folder/x.svg"] {
        let path = d.path().join(bad);
        for cmd in [vec!["report", s(&a)], vec!["compare", s(&a), s(&b)]] {
            let mut args = cmd.clone();
            args.extend(["--plot", s(&path)]);
            let o = krefine(&args);
            let (out, err) = text(&o);
            assert!(!o.status.success(), "{bad}");
            assert!(out.is_empty(), "{cmd:?} --plot {bad} printed first:\n{out}");
            let why = if bad.ends_with(".pdf") {
                "expected a file name ending in .svg or .png"
            } else {
                "no folder"
            };
            assert!(err.contains(why), "{err}");
        }
    }
}

/// Curves with equal values are drawn once and labelled with every name, so that none hides
/// under another: run `ref` has fast_0.5 = fast_0.8 = fast_1 at both turns, while fast_1.5 and
/// fast_2 part at turn 2 (so those two keep lines of their own).
#[test]
fn equal_curves_share_one_labelled_line() {
    let d = tempfile::tempdir().unwrap();
    let (a, _) = fixture_runs(d.path());
    let svg = d.path().join("run.svg");
    let o = krefine(&["report", s(&a), "--plot", s(&svg)]);
    assert!(o.status.success(), "{}", text(&o).1);
    let body = std::fs::read_to_string(&svg).unwrap();
    let labels: Vec<&str> = body.lines().filter(|l| l.starts_with("fast_")).collect();
    assert_eq!(
        labels,
        [
            "fast_0",
            "fast_0.5 = fast_0.8 = fast_1",
            "fast_1.5",
            "fast_2"
        ],
        "{body}"
    );
}

#[test]
fn submission_holds_the_chosen_kernels_and_validates() {
    let d = tempfile::tempdir().unwrap();
    let (a, _) = fixture_runs(d.path());
    let sub = d.path().join("sub.json");
    let o = krefine(&[
        "report",
        s(&a),
        "--submission",
        s(&sub),
        "--display-name",
        "team x",
        "--format",
        "json",
    ]);
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("2 kernel(s), 2 correct"), "{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&sub).unwrap()).unwrap();
    assert_eq!(v["metadata"]["display_name"], "team x");
    assert_eq!(v["metadata"]["organization"], "");
    // The score's provenance travels with it, the same object as `report --format json`'s.
    let o = krefine(&["report", s(&a), "--format", "json"]);
    let report: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert!(v["metadata"]["provenance"].is_object(), "{v}");
    assert_eq!(v["metadata"]["provenance"], report["provenance"]);
    // Best: the fastest correct turn of each problem (turn 2 for both).
    assert_eq!(
        v["kernels"]["level_1_problem_1_sample_0"],
        code_of("1/1/0", 2)
    );
    assert_eq!(
        v["kernels"]["level_1_problem_2_sample_0"],
        code_of("1/2/0", 2)
    );
    assert_eq!(v["kernels"].as_object().unwrap().len(), 2);

    let dataset = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("configs/quickstart/problems");
    let o = krefine(&["eval", s(&sub), "--dataset", s(&dataset), "--check"]);
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("level_1_problem_1_sample_0: ok: 1_Vector_add.py sample 0, 2 lines"),
        "{err}"
    );
    assert!(err.contains("valid: 2 generation(s)"), "{err}");

    // Malformed: every key gets its message, nothing runs, exit status 2.
    let bad = d.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"metadata": {"display_name": "x"}, "kernels": {
            "level_1_problem_2_sample_0": "code",
            "level_1_problem_99_sample_0": "code",
            "level_1_problem_1_sample_0": ["code"],
            "level_7_problem_1_sample_0": "code",
            "problem_3": "code"}}"#,
    )
    .unwrap();
    let o = krefine(&["eval", s(&bad), "--dataset", s(&dataset)]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for want in [
        "level_1_problem_2_sample_0: ok: 2_ReLU.py sample 0",
        "level_1_problem_99_sample_0: error: problem 99 is not in level 1 of the dataset (it has ids 1-4)",
        "level_1_problem_1_sample_0: error: the code must be a string, got an array",
        "level_7_problem_1_sample_0: error: level 7 is not in the dataset",
        "problem_3: error: bad key: expected level_<L>_problem_<P>_sample_<S>",
        "4 problem(s) found (listed above); nothing was evaluated",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
    std::fs::write(
        &bad,
        "{\"metadata\": {\"display_name\": \"x\"},\n \"kernels\": {\"a\": }}",
    )
    .unwrap();
    let o = krefine(&["eval", s(&bad), "--dataset", s(&dataset)]);
    let (_, err) = text(&o);
    assert!(
        err.contains("is not valid JSON: expected value at line 2, column 19"),
        "{err}"
    );
}

/// A problem whose reference took very different times in two runs (on a shared machine, something
/// ran on the device while one of them timed it) is named in a warning, in every format; the runs'
/// settings say nothing of it (issue 37, item 1).
#[test]
fn compare_warns_when_a_problems_reference_time_differs_by_more_than_2x() {
    let d = tempfile::tempdir().unwrap();
    let (a, b) = fixture_runs(d.path());
    let o = krefine(&["compare", s(&a), s(&b), "--resamples", "0"]);
    assert!(!text(&o).0.contains("WARNING"), "alike runs: no warning");
    // Run b timed problem 1's reference 14.45 times slower, problem 2's 1.5 times (within 2x).
    let log = std::fs::read_to_string(b.join("events.jsonl")).unwrap();
    let slowed: Vec<String> = log
        .lines()
        .map(|l| {
            if l.contains("\"task\":\"1/1/") {
                l.replace("\"ref_runtime_ms\":1.0", "\"ref_runtime_ms\":14.45")
            } else {
                l.replace("\"ref_runtime_ms\":1.0", "\"ref_runtime_ms\":1.5")
            }
        })
        .collect();
    std::fs::write(b.join("events.jsonl"), slowed.join("\n") + "\n").unwrap();
    let o = krefine(&["compare", s(&a), s(&b), "--resamples", "0"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        out.contains(
            "WARNING: problem 1/1: the reference took 1.0000 ms in ref, 14.4500 ms in smp (14.4x apart)"
        ),
        "{out}"
    );
    assert_eq!(out.matches("WARNING").count(), 1, "{out}");
    let o = krefine(&[
        "compare",
        s(&a),
        s(&b),
        "--format",
        "json",
        "--resamples",
        "0",
    ]);
    let v: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    let w = &v["reference_time_warnings"];
    assert_eq!(w.as_array().unwrap().len(), 1, "{w}");
    assert_eq!(w[0]["problem"], "1/1");
    assert_eq!(
        w[0]["ref_ms"],
        serde_json::json!({"ref": 1.0, "smp": 14.45})
    );
    // CSV has no place for it: stderr says it.
    let o = krefine(&[
        "compare",
        s(&a),
        s(&b),
        "--format",
        "csv",
        "--resamples",
        "0",
    ]);
    let (out, err) = text(&o);
    assert!(
        !out.contains("WARNING") && err.contains("WARNING: problem 1/1"),
        "{err}"
    );
}
