//! `eval.tolerance` and `eval.timing_method` end to end on CPU with real workers: a borderline
//! candidate (off by 1e-3) is incorrect under KernelBench's current fp32 tolerance and correct under
//! v0's, each result records the tolerance and timer, `compare` names both in its "differs" warning,
//! and the submission export carries them.

use std::path::{Path, PathBuf};

mod cli_support;

use cli_support::{krefine, python, read_json, repo, s};

/// Evaluate the borderline kernel with extra `--set`s; the run directory.
fn evaluate(root: &Path, name: &str, folder: &Path, extra: &[&str]) -> PathBuf {
    let dataset = repo().join("configs/quickstart/problems");
    let out = root.join("runs").join(name);
    let py = format!("resources.python=\"{}\"", python().display());
    let mut args = vec![
        "eval",
        s(folder),
        "--dataset",
        s(&dataset),
        "--out",
        s(&out),
    ];
    let mut sets = vec![
        py.as_str(),
        "resources.devices=cpu",
        "resources.compile_workers=1",
        "eval.timing_trials=3",
        "eval.warmup=1",
        "eval.correct_trials=2",
    ];
    sets.extend(extra);
    for set in &sets {
        args.extend(["--set", set]);
    }
    krefine(&args);
    out
}

#[test]
fn tolerance_presets_decide_a_borderline_candidate_and_are_recorded() {
    let d = tempfile::tempdir().unwrap();
    let folder = d.path().join("kb_run");
    std::fs::create_dir_all(&folder).unwrap();
    // ReLU plus 1e-3: outside fp32's 1e-4 (atol + rtol * |x| stays below 1e-3 for |x| < 9), inside 1e-2.
    std::fs::write(
        folder.join("level_1_problem_2_sample_0_kernel.py"),
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.relu(x) + 1e-3\n",
    )
    .unwrap();

    let current = evaluate(d.path(), "current", &folder, &[]);
    let v0 = evaluate(
        d.path(),
        "v0",
        &folder,
        &[
            "eval.tolerance=\"kernelbench-v0\"",
            "eval.timing_method=\"host_time\"",
        ],
    );

    let first = |run: &Path| read_json(&run.join("eval_results.json"))["2"][0].clone();
    let (a, b) = (first(&current), first(&v0));
    assert_eq!(a["correctness"], false, "{a}");
    assert_eq!(a["metadata"]["correctness_issue"], "Output mismatch", "{a}");
    assert_eq!(b["correctness"], true, "{b}");

    // Recorded in the provenance of each run.
    let report = |run: &Path| -> serde_json::Value {
        let o = krefine(&["report", s(run), "--format", "json"]);
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let (ra, rb) = (report(&current), report(&v0));
    assert_eq!(
        ra["provenance"]["eval"]["tolerance"],
        "kernelbench (atol = rtol = 1e-4)"
    );
    assert_eq!(
        ra["provenance"]["eval"]["timing_method"],
        "cpu_perf_counter"
    );
    assert_eq!(
        rb["provenance"]["eval"]["tolerance"],
        "kernelbench-v0 (atol = rtol = 1e-2)"
    );
    assert_eq!(rb["provenance"]["eval"]["timing_method"], "host_time");

    // compare's "differs:" line names both fields; report warns that the two are not comparable.
    let o = krefine(&["compare", s(&current), s(&v0)]);
    let out = String::from_utf8_lossy(&o.stdout);
    let differs = out
        .lines()
        .find(|l| l.starts_with("differs:"))
        .unwrap_or("");
    assert!(
        differs.contains("timing cpu_perf_counter | host_time")
            && differs.contains("tolerance kernelbench | kernelbench-v0"),
        "{out}"
    );
    let o = krefine(&["report", s(&current), s(&v0)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("the runs differ in timing method (current: cpu_perf_counter; v0: host_time)")
            && err.contains(
                "the runs differ in tolerance (current: kernelbench; v0: kernelbench-v0)"
            ),
        "{err}"
    );

    // fast_p beyond KernelBench's thresholds (Fast@1.2 by default; here 0, which is exact: a correct
    // candidate has a positive speedup, an incorrect one none).
    let o = krefine(&["report", s(&current), s(&v0), "--fast-p", "0,1.2"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("current: fast_0 0.0%, fast_1.2 0.0% (all candidates"),
        "{out}"
    );
    assert!(out.contains("v0: fast_0 100.0%, fast_1.2 "), "{out}");
    let o = krefine(&["compare", s(&current), s(&v0), "--fast-p", "0"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("v0: fast_0 100.0% (all candidates"), "{out}");

    // The leaderboard export carries them.
    let sub = d.path().join("sub.json");
    krefine(&["report", s(&v0), "--submission", s(&sub)]);
    let meta = read_json(&sub)["metadata"].clone();
    assert_eq!(meta["tolerance"], "kernelbench-v0 (atol = rtol = 1e-2)");
    assert_eq!(meta["timing_method"], "host_time");
}
