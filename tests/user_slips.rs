//! A user's slips are caught up front (issue 37, item 5): a scripted answers file missing an answer
//! stops the run before it starts; `doctor CONFIG` checks the dataset and the answers; `eval` names a
//! mistyped kernel file instead of skipping it; the run's final report has the `report.fast_p`
//! columns `krefine report` shows; `check` follows the run's backend on a CPU-only config;
//! `provenance.json` records how results are judged and timed. (`report --plot x.pdf` and plots of
//! equal curves: tests/compare_runs.rs.)
//!
//! The real binary, the scripted LLM and the simulated executor.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

mod cli_support;

use std::path::Path;

use cli_support::{krefine_in, read_json, s, sim_experiment};

fn out_err(o: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Remove the answer of `problem` turn `turn` from the experiment's answers file.
fn drop_answer(cfg: &Path, problem: &str, turn: u32) {
    let answers = cfg.parent().unwrap().join("answers.jsonl");
    let text = std::fs::read_to_string(&answers).unwrap();
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| {
            !(l.contains(&format!("\"problem\":\"{problem}\""))
                && l.contains(&format!("\"turn\":{turn}")))
        })
        .collect();
    assert_eq!(kept.len() + 1, text.lines().count());
    std::fs::write(&answers, kept.join("\n") + "\n").unwrap();
}

#[test]
fn a_missing_scripted_answer_stops_the_run_before_it_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let cfg = sim_experiment(root, 2, 3);
    drop_answer(&cfg, "1/2", 2);
    let out = root.join("run");
    let o = krefine_in(root, &["run", s(&cfg), "--no-tui", "--out", s(&out)]);
    let (_, err) = out_err(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("has no answer for problem 1/2 sample 0 turn 2: every planned turn needs one"),
        "{err}"
    );
    assert!(!out.exists(), "a refused run leaves no directory");
    // A run of fewer turns needs no more answers than it has.
    let o = krefine_in(
        root,
        &[
            "run",
            s(&cfg),
            "--no-tui",
            "--out",
            s(&out),
            "--set",
            "method.turns=1",
        ],
    );
    assert!(o.status.success(), "{}", out_err(&o).1);
}

#[test]
fn doctor_checks_the_dataset_and_the_answers_of_a_config() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let cfg = sim_experiment(root, 2, 2);
    let o = krefine_in(root, &["doctor", s(&cfg)]);
    let (out, err) = out_err(&o);
    assert!(out.contains("Inputs ("), "{out}");
    assert!(out.contains("  dataset.path: "), "{out}");
    assert!(out.contains("2 problem(s) of level 1 (all)"), "{out}");
    assert!(
        out.contains("answers.jsonl: an answer for each of the 4 planned turn(s)"),
        "{out}\n{err}"
    );
    assert!(!out.contains("PROBLEM"), "{out}");
    // An answer missing, and a dataset that is not there.
    drop_answer(&cfg, "1/1", 1);
    let o = krefine_in(root, &["doctor", s(&cfg)]);
    let (out, _) = out_err(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("  model.answers: PROBLEM: model.answers ")
            && out.contains("has no answer for problem 1/1 sample 0 turn 1"),
        "{out}"
    );
    std::fs::rename(root.join("exp/problems"), root.join("exp/moved")).unwrap();
    let o = krefine_in(root, &["doctor", s(&cfg)]);
    let (out, _) = out_err(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("  dataset.path: PROBLEM: "), "{out}");
    assert!(out.contains("exp/problems"), "{out}");
}

#[test]
fn eval_names_a_mistyped_kernel_file_instead_of_skipping_it() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    sim_experiment(root, 2, 1);
    let folder = root.join("kb_run");
    std::fs::create_dir_all(&folder).unwrap();
    let code = "# krefine-sim: verdict=correct speedup=1.5\nclass ModelNew: pass\n";
    std::fs::write(folder.join("level_1_problem_1_sample_0_kernel.py"), code).unwrap();
    std::fs::write(folder.join("Level_1_problem_2_sample_0_kernel.py"), code).unwrap();
    let o = krefine_in(
        root,
        &[
            "eval",
            s(&folder),
            "--dataset",
            s(&root.join("exp/problems")),
            "--check",
        ],
    );
    let (_, err) = out_err(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("Level_1_problem_2_sample_0_kernel.py: error: not a kernel file name"),
        "{err}"
    );
    assert!(err.contains("nothing was evaluated"), "{err}");
}

#[test]
fn the_runs_final_report_is_the_report_with_its_fast_p_columns() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let cfg = sim_experiment(root, 2, 2);
    let out = root.join("run");
    let o = krefine_in(
        root,
        &[
            "run",
            s(&cfg),
            "--no-tui",
            "--out",
            s(&out),
            "--set",
            "report.fast_p=[1.15, 1.7]",
        ],
    );
    let (printed, err) = out_err(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        printed.contains("fast_1.15") && printed.contains("fast_1.7"),
        "{printed}"
    );
    let o = krefine_in(root, &["report", s(&out)]);
    let (report, _) = out_err(&o);
    assert_eq!(printed, report);
}

#[test]
fn check_follows_the_runs_backend_and_provenance_records_the_evaluation() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let cfg = sim_experiment(root, 1, 1);
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/static/kb_non_default_stream.py");
    // A CUDA candidate whose C++ has a function: `cpu`'s missing_kernel is satisfied, `cuda`'s is
    // not (no `__global__` kernel).
    let missing_cuda_kernel = "error missing_kernel: no `__global__` kernel";
    let check = |devices: &str| {
        let o = krefine_in(
            root,
            &[
                "check",
                "--mode",
                "strict",
                "--config",
                s(&with_devices(&cfg, devices)),
                s(&file),
            ],
        );
        out_err(&o).0
    };
    // A CPU-only run asks for C++ kernels; a GPU run for CUDA ones.
    assert!(!check("\"cpu\"").contains(missing_cuda_kernel));
    assert!(check("[0]").contains(missing_cuda_kernel));

    let out = root.join("run");
    let o = krefine_in(
        root,
        &[
            "run",
            s(&cfg),
            "--no-tui",
            "--out",
            s(&out),
            "--set",
            "eval.precision=fp16",
        ],
    );
    assert!(o.status.success(), "{}", out_err(&o).1);
    let p = read_json(&out.join("provenance.json"));
    let e = &p["evaluation"];
    assert_eq!(e["mode"], "faithful", "{p}");
    assert_eq!(e["precision"], "fp16");
    assert_eq!(e["timing_method"], "cuda_event");
    assert_eq!(
        e["tolerance"],
        serde_json::json!({"name": "kernelbench", "atol": 0.01, "rtol": 0.01})
    );
    assert_eq!(e["simulated"], true);
}

/// A copy of the experiment's config with `resources.devices = devices`.
fn with_devices(cfg: &Path, devices: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(cfg).unwrap();
    let path = cfg.with_file_name(format!("devices-{}.toml", devices.len()));
    std::fs::write(
        &path,
        text.replace("devices = \"cpu\"", &format!("devices = {devices}")),
    )
    .unwrap();
    path
}
