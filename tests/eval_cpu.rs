//! `krefine eval` on CPU with real workers: a KernelBench runs folder for one tiny problem (a
//! reference-equivalent kernel and a wrong one) becomes a normal run directory plus
//! `eval_results.json`; its submission round-trips through `eval` again, and `compare` reads both.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::path::{Path, PathBuf};
use std::process::Command;

mod cli_support;

use cli_support::{krefine, python, read_json, repo, s};

/// Builds (folders with `krefine-ok.json`) and lock files (`*.lock`) under the build cache.
fn walk_cache(dir: &Path) -> (usize, Vec<PathBuf>) {
    let (mut builds, mut locks) = (0, Vec::new());
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            builds += usize::from(p.join("krefine-ok.json").exists());
            let (b, l) = walk_cache(&p);
            builds += b;
            locks.extend(l);
        } else if p.extension().is_some_and(|x| x == "lock") {
            locks.push(p);
        }
    }
    (builds, locks)
}

/// A KernelBench runs folder for level 1 problem 2 (ReLU) under `root`: sample 0 the reference
/// itself (correct, speedup near 1); with `wrong`, sample 1 the identity, which the problem's signed
/// inputs catch. Returns the quickstart dataset and the folder.
fn relu_runs_folder(root: &Path, wrong: bool) -> (PathBuf, PathBuf) {
    let dataset = repo().join("configs/quickstart/problems");
    let reference = std::fs::read_to_string(dataset.join("level1/2_ReLU.py")).unwrap();
    let folder = root.join("kb_run");
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("level_1_problem_2_sample_0_kernel.py"),
        format!("{reference}\n\nModelNew = Model\n"),
    )
    .unwrap();
    if wrong {
        std::fs::write(
            folder.join("level_1_problem_2_sample_1_kernel.py"),
            "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n",
        )
        .unwrap();
    }
    (dataset, folder)
}

/// The `--set`s of these tests: the test's Python, one CPU device, one compile worker, short checks.
fn cpu_sets() -> Vec<String> {
    let py = format!("resources.python=\"{}\"", python().display());
    [
        "--set",
        &py,
        "--set",
        "resources.devices=cpu",
        "--set",
        "resources.compile_workers=1",
        "--set",
        "eval.timing_trials=3",
        "--set",
        "eval.warmup=1",
        "--set",
        "eval.correct_trials=2",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect()
}

#[test]
fn runs_folder_and_submission_evaluate_on_cpu_workers() {
    let d = tempfile::tempdir().unwrap();
    let (dataset, folder) = relu_runs_folder(d.path(), true);
    let sets = cpu_sets();
    let run_a = d.path().join("runs/eval-folder");
    let mut args = vec![
        "eval",
        s(&folder),
        "--dataset",
        s(&dataset),
        "--out",
        s(&run_a),
    ];
    args.extend(sets.iter().map(String::as_str));
    // Scratch lives in the system temp folder: the run's own goes when it ends, and a dead run's
    // (SIGKILL leaves it) goes when the next one starts (issue 27, 7).
    let temp = d.path().join("tmp");
    let dead = temp.join("krefine-4194304999");
    std::fs::create_dir_all(dead.join("eval-cpu-0")).unwrap();
    std::fs::write(dead.join("krefine-owner"), "4194304999 1").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_krefine"))
        .args(&args)
        .env("TMPDIR", &temp)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let left: Vec<_> = std::fs::read_dir(&temp)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("krefine-"))
        .collect();
    assert_eq!(left, Vec::<std::ffi::OsString>::new());

    let results = read_json(&run_a.join("eval_results.json"));
    let list = results["2"]
        .as_array()
        .expect("problem 2 in eval_results.json");
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["sample_id"], 0);
    assert_eq!(
        (list[0]["compiled"].clone(), list[0]["correctness"].clone()),
        (true.into(), true.into())
    );
    assert!(list[0]["runtime"].as_f64().unwrap() > 0.0);
    assert_eq!(list[1]["sample_id"], 1);
    assert_eq!(list[1]["correctness"], false);
    assert_eq!(list[1]["metadata"]["correctness_issue"], "Output mismatch");

    // The run directory is a normal run: report reads it.
    let o = krefine(&["report", s(&run_a), "--format", "json"]);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["method"], "sampling");
    assert_eq!(report["turns"][1]["correct"], 1);
    assert_eq!(report["pass_at_k"]["1"], 0.5);
    // Served generations are not LLM calls (issue 27, 5): no answers, tokens or USD.
    let ledger = &report["ledger"];
    assert_eq!(ledger["llm_answers"], 0, "{ledger}");
    assert_eq!(ledger["tokens"]["total"], 0, "{ledger}");
    assert_eq!(ledger["cost_usd"].as_f64().unwrap_or(0.0), 0.0, "{ledger}");
    let o = krefine(&["report", s(&run_a)]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("none (2 generations served, no model called)"),
        "{out}"
    );

    // Round trip: its submission (the correct sample) evaluates as correct again.
    let sub = d.path().join("sub.json");
    krefine(&["report", s(&run_a), "--submission", s(&sub)]);
    let run_b = d.path().join("runs/eval-sub");
    let mut args = vec![
        "eval",
        s(&sub),
        "--dataset",
        s(&dataset),
        "--out",
        s(&run_b),
    ];
    args.extend(sets.iter().map(String::as_str));
    krefine(&args);
    let results = read_json(&run_b.join("eval_results.json"));
    // No lock file outlives its build (issue 27, 6): the builds stay, their locks do not.
    let cache = d.path().join("runs/.build-cache");
    let (builds, locks) = walk_cache(&cache);
    assert!(builds > 0, "no build in {}", cache.display());
    assert_eq!(locks, Vec::<PathBuf>::new());
    assert_eq!(results["2"][0]["correctness"], true);
    let o = krefine(&["report", s(&run_b), "--format", "json"]);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["method"], "one_shot");
    assert_eq!(report["turns"][0]["correct"], 1);
    assert!(report["turns"][0]["geomean_speedup"].as_f64().unwrap() > 0.0);

    let o = krefine(&["compare", s(&run_a), s(&run_b), "--resamples", "10"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("differs: method sampling | one_shot"), "{out}");
    // The LLM budget axes say why they cannot compare served generations.
    assert_eq!(
        out.matches(
            "not comparable: eval-folder, eval-sub served existing generations (no LLM calls)"
        )
        .count(),
        3,
        "{out}"
    );
}

#[test]
fn baseline_times_references_into_kernelbench_shape() {
    let d = tempfile::tempdir().unwrap();
    let dataset = repo().join("configs/quickstart/problems");
    // With --hardware and no --out: KernelBench's results/timing/<hardware>/ layout, under the cwd.
    let out = d
        .path()
        .join("results/timing/cpu_ci/baseline_time_torch.json");
    let py = format!("resources.python=\"{}\"", python().display());
    let bad = Command::new(env!("CARGO_BIN_EXE_krefine"))
        .args([
            "baseline",
            "--dataset",
            s(&dataset),
            "--levels",
            "1",
            "--hardware",
            "../x",
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--hardware \"../x\": expected a name"));
    let o = Command::new(env!("CARGO_BIN_EXE_krefine"))
        .current_dir(d.path())
        .args([
            "baseline",
            "--dataset",
            s(&dataset),
            "--levels",
            "1",
            "--problems",
            "2",
            "--hardware",
            "cpu_ci",
            "--set",
            &py,
            "--set",
            "resources.devices=cpu",
            "--set",
            "resources.compile_workers=1",
            "--set",
            "eval.timing_trials=3",
            "--set",
            "eval.warmup=1",
            "--set",
            "eval.correct_trials=1",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = read_json(&out);
    let e = &v["level1"]["2_ReLU.py"];
    assert_eq!(e["hardware"], "cpu_ci");
    assert!(e["mean"].as_f64().unwrap() > 0.0, "{v}");
    assert_eq!(e["num_trials"], 3);
    assert_eq!(e["device"], "cpu");
    assert_eq!(v["level1"].as_object().unwrap().len(), 1);
    // The file is what eval.baseline reads, and its run directory is a normal run.
    let text = std::fs::read_to_string(&out).unwrap();
    let table = krefine::worker::BaselineTable::parse(&out, &text).unwrap();
    assert_eq!(table.len(), 1);
    let run = d
        .path()
        .join("results/timing/cpu_ci/baseline_time_torch.json.runs/level1-eager");
    let o = krefine(&["report", s(&run), "--format", "json"]);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["turns"][0]["correct"], 1);
}

/// The precision probe's float64 forward runs once per problem and kind of device (issue 36): the
/// first run keeps the worker's summary in the reference cache; the next run's worker takes it from
/// there (a summary edited in between is the figure the next run reports, so it was not made again).
#[test]
fn a_precision_probe_is_kept_in_the_reference_cache_for_the_next_run() {
    let d = tempfile::tempdir().unwrap();
    let (dataset, folder) = relu_runs_folder(d.path(), false);
    let cache = d.path().join("refs");
    let refs = format!("eval.reference_cache=\"{}\"", cache.display());
    let eval = |out: &Path| {
        let o = Command::new(env!("CARGO_BIN_EXE_krefine"))
            .args([
                "eval",
                s(&folder),
                "--dataset",
                s(&dataset),
                "--out",
                s(out),
                "--set",
                &refs,
            ])
            .args(cpu_sets())
            .env("TMPDIR", d.path())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let results = read_json(&out.join("eval_results.json"));
        let first = results["2"][0].clone();
        assert_eq!(first["correctness"], true, "{first}");
        first["metadata"]["precision"].clone()
    };
    let made = eval(&d.path().join("runs/first"));
    let probes: Vec<PathBuf> = std::fs::read_dir(cache.join("precision-probes"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(probes.len(), 1, "{probes:?}");
    let kept = read_json(&probes[0]);
    assert_eq!(kept["kind"], made["inputs"], "{kept} {made}");
    assert_eq!(kept["e_ref"], made["reference_error"], "{kept} {made}");
    // A figure no probe of this problem would make: the next run reports it, so it ran no forward.
    std::fs::write(&probes[0], r#"{"kind": "signed", "e_ref": 0.00625}"#).unwrap();
    let next = eval(&d.path().join("runs/next"));
    assert_eq!(next["reference_error"], 0.00625, "{next}");
    assert_eq!(next["inputs"], "signed", "{next}");
}

/// `krefine bench throughput` turns the lease trace on and sums it (issue 36): with real CPU workers,
/// one traced job per candidate, and the table under the pass's figures.
#[test]
fn bench_throughput_says_where_the_leases_went() {
    let d = tempfile::tempdir().unwrap();
    let (dataset, folder) = relu_runs_folder(d.path(), true);
    let work = d.path().join("bench");
    let o = Command::new(env!("CARGO_BIN_EXE_krefine"))
        .args([
            "bench",
            "throughput",
            s(&folder),
            "--dataset",
            s(&dataset),
            "--cold-only",
            "--work-dir",
            s(&work),
        ])
        .args(cpu_sets())
        .env("TMPDIR", d.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("where the leases went"), "{text}");
    // An evaluate job per candidate at least (a noisy time on a busy CPU is measured again, in a
    // job of its own; the reference's own timing is a job of another kind).
    let count = |what: &str| -> u32 {
        let line = text.lines().find(|l| l.trim_start().starts_with(what));
        line.and_then(|l| l.split_whitespace().last()?.parse().ok())
            .unwrap_or_else(|| panic!("{what} in {text}"))
    };
    assert!(count("evaluate jobs") >= 2, "{text}");
    assert!(count("jobs traced") >= count("evaluate jobs"), "{text}");
    for step in ["total", "take", "retire", "correctness_s"] {
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().next() == Some(step)),
            "{step} in {text}"
        );
    }
}
