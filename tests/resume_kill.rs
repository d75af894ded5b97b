//! Crash safety: a run killed with SIGKILL at any point and resumed with `--resume` ends with the same
//! report as an uninterrupted run, and never asks the LLM again for a logged answer.
//!
//! Uses the real binary, the scripted LLM and the simulated executor so the run is fast and its
//! outcome deterministic.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_krefine")
}

/// A small experiment: 3 problems x 3 turns of G+E+P, verdicts scripted by markers.
fn fixture(root: &Path) -> PathBuf {
    let probs = root.join("problems");
    std::fs::create_dir_all(&probs).unwrap();
    for (id, name) in [(1, "Add"), (2, "Relu"), (3, "Sum")] {
        std::fs::write(
            probs.join(format!("{id}_{name}.py")),
            format!(
                "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + {id}\ndef get_inputs():\n    return [torch.rand(4)]\ndef get_init_inputs():\n    return []\n"
            ),
        )
        .unwrap();
    }
    let markers = [
        [
            "compile=error",
            "verdict=incorrect",
            "verdict=correct speedup=1.3",
        ],
        [
            "verdict=correct speedup=0.7",
            "verdict=correct speedup=1.6",
            "verdict=runtime_error",
        ],
        ["verdict=incorrect", "NOCODE", "verdict=correct speedup=2.5"],
    ];
    let mut answers = String::new();
    for (p, turns) in markers.iter().enumerate() {
        for (t, m) in turns.iter().enumerate() {
            let content = if *m == "NOCODE" {
                "I am not sure how to do this.".to_string()
            } else {
                format!("```python\n# krefine-sim: {m}\nclass ModelNew: pass\n```")
            };
            answers.push_str(
                &serde_json::json!({"problem": format!("1/{}", p + 1), "sample": 0, "turn": t + 1, "content": content})
                    .to_string(),
            );
            answers.push('\n');
        }
    }
    std::fs::write(root.join("answers.jsonl"), answers).unwrap();
    let cfg = root.join("exp.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[run]
name = "killtest"
[dataset]
path = "{}"
level = 1
[method]
kind = "refine"
turns = 3
feedback = "GEP"
[model]
provider = "scripted"
answers = "{}"
[resources]
devices = "cpu"
compile_workers = 2
[eval]
executor = "simulated"
[eval.simulated]
compile_s = 0.03
execute_min_s = 0.02
execute_max_s = 0.04
profile_s = 0.01
"#,
            probs.display(),
            root.join("answers.jsonl").display()
        ),
    )
    .unwrap();
    cfg
}

fn run(cfg: &Path, out: &Path, resume: bool) -> std::process::Child {
    let mut c = Command::new(bin());
    c.arg("run").arg(cfg).arg("--no-tui").arg("--out").arg(out);
    if resume {
        c.arg("--resume");
    }
    c.stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn report_turns(out: &Path) -> serde_json::Value {
    let o = Command::new(bin())
        .args(["report", "--format", "json"])
        .arg(out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    serde_json::json!({"method": v["method"], "turns": v["turns"]})
}

fn count_answers(out: &Path) -> usize {
    std::fs::read_to_string(out.join("events.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"type\":\"llm_answered\""))
        .count()
}

#[test]
fn sigkill_at_any_point_then_resume_matches_uninterrupted() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = fixture(tmp.path());
    let clean = tmp.path().join("clean");
    let started = Instant::now();
    assert!(run(&cfg, &clean, false).wait().unwrap().success());
    let full = started.elapsed();
    let want = report_turns(&clean);
    assert_eq!(want["turns"].as_array().unwrap().len(), 3, "{want}");
    assert_eq!(count_answers(&clean), 9);

    // Kill points spread over the whole run, including very early and near the end.
    let span = full.as_millis().max(40) as u64;
    let mut interrupted = 0;
    for (i, frac) in [0.05, 0.2, 0.35, 0.5, 0.65, 0.8, 0.95].iter().enumerate() {
        let out = tmp.path().join(format!("killed{i}"));
        let mut child = run(&cfg, &out, false);
        std::thread::sleep(Duration::from_millis((span as f64 * frac) as u64));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        // The first process may have been killed before it created the run directory.
        let mut resume = out.join("events.jsonl").exists();
        if resume
            && !std::fs::read_to_string(out.join("events.jsonl"))
                .unwrap()
                .contains("\"reason\":\"finished\"")
        {
            interrupted += 1;
        }
        let mut tries = 0;
        loop {
            tries += 1;
            assert!(tries < 10, "run {i} did not finish after resumes");
            let status = run(&cfg, &out, resume).wait().unwrap();
            if status.success() {
                break;
            }
            resume = true;
        }
        assert_eq!(report_turns(&out), want, "kill point {frac}");
        assert_eq!(
            count_answers(&out),
            9,
            "an answer was requested twice (kill point {frac})"
        );
    }
    assert!(
        interrupted >= 3,
        "only {interrupted} kill(s) landed mid-run"
    );
}

#[test]
fn existing_run_dir_is_not_overwritten_without_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = fixture(tmp.path());
    let out = tmp.path().join("r");
    assert!(run(&cfg, &out, false).wait().unwrap().success());
    let before = std::fs::read(out.join("events.jsonl")).unwrap();
    let o = Command::new(bin())
        .arg("run")
        .arg(&cfg)
        .args(["--no-tui", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--resume"));
    assert_eq!(std::fs::read(out.join("events.jsonl")).unwrap(), before);
}

#[test]
fn wrong_key_and_type_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = fixture(tmp.path());
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, text.replace("turns = 3", "turnz = 3")).unwrap();
    let o = Command::new(bin())
        .arg("run")
        .arg(&cfg)
        .args(["--no-tui", "--out"])
        .arg(tmp.path().join("x"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("exp.toml") && err.contains("turnz"), "{err}");
    std::fs::write(&cfg, text.replace("turns = 3", "turns = \"three\"")).unwrap();
    let o = Command::new(bin())
        .arg("run")
        .arg(&cfg)
        .args(["--no-tui", "--out"])
        .arg(tmp.path().join("y"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("turns") && err.contains("line"), "{err}");
    assert!(
        !tmp.path().join("y").exists(),
        "a bad config must not leave a run directory"
    );
}

#[test]
fn report_into_a_closed_pipe_does_not_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = fixture(tmp.path());
    let out = tmp.path().join("r");
    assert!(run(&cfg, &out, false).wait().unwrap().success());
    let mut child = Command::new(bin())
        .args(["report", "--format", "json"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close the read end before the report is written, as `| head -0` would.
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(o.status.success(), "{err}");
}

#[test]
fn ctrl_c_ends_cleanly_and_the_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = fixture(tmp.path());
    // Slow builds so the interrupt lands mid-run.
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, text.replace("compile_s = 0.03", "compile_s = 0.4")).unwrap();
    let out = tmp.path().join("r");
    let child = run(&cfg, &out, false);
    std::thread::sleep(Duration::from_millis(600));
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = child.wait_with_output().unwrap().status;
    assert_eq!(status.code(), Some(130), "an interrupted run exits 130");
    let log = std::fs::read_to_string(out.join("events.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"]["type"], "run_ended", "{last}");
    assert_eq!(last["event"]["reason"], "interrupted", "{last}");
    assert!(
        count_answers(&out) < 9,
        "the interrupt came too late to test anything"
    );
    assert!(run(&cfg, &out, true).wait().unwrap().success());
    assert_eq!(count_answers(&out), 9);
}

/// A panic anywhere (here: in whichever task appends the run's N-th event, through a hook that
/// debug builds read from `KREFINE_TEST_PANIC_AT_EVENT`) ends the process without hanging and
/// leaves a run directory that `--resume` finishes with the uninterrupted run's report, asking the
/// LLM no answer twice (issue 27, 8).
#[test]
fn a_panic_anywhere_leaves_the_run_resumable() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = fixture(tmp.path());
    let clean = tmp.path().join("clean");
    assert!(run(&cfg, &clean, false).wait().unwrap().success());
    let want = report_turns(&clean);
    // Points over the whole run (it appends about 60 events): its first event (`run_started`, in the
    // engine's own task), LLM answers, builds, leases and results (in the task drivers), near the end.
    for at in [1, 2, 7, 15, 25, 35, 45, 55] {
        let out = tmp.path().join(format!("panic{at}"));
        let mut child = Command::new(bin())
            .arg("run")
            .arg(&cfg)
            .arg("--no-tui")
            .arg("--out")
            .arg(&out)
            .env("KREFINE_TEST_PANIC_AT_EVENT", at.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("the run hung after its panic at event {at}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert!(
            !status.success(),
            "event {at}: the panic ended nothing: {err}"
        );
        assert!(err.contains("a test's panic"), "event {at}: {err}");
        let mut tries = 0;
        while !run(&cfg, &out, true).wait().unwrap().success() {
            tries += 1;
            assert!(tries < 3, "the run panicked at event {at} does not resume");
        }
        assert_eq!(report_turns(&out), want, "panic at event {at}");
        assert_eq!(
            count_answers(&out),
            9,
            "an answer was asked twice (event {at})"
        );
    }
}

#[test]
fn resume_refuses_a_different_experiment_but_allows_other_resources() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = fixture(tmp.path());
    let out = tmp.path().join("r");
    assert!(run(&cfg, &out, false).wait().unwrap().success());
    let resume_with = |set: &str| {
        Command::new(bin())
            .arg("run")
            .arg(&cfg)
            .args(["--no-tui", "--resume", "--set", set, "--out"])
            .arg(&out)
            .output()
            .unwrap()
    };
    let o = resume_with("method.turns=5");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("method.turns: the run has 3, the config gives 5")
            && err.contains("config.toml"),
        "{err}"
    );
    let o = resume_with("resources.compile_workers=1");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn replaying_a_run_reproduces_its_answers_and_results() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = fixture(tmp.path());
    let first = tmp.path().join("first");
    assert!(run(&cfg, &first, false).wait().unwrap().success());
    // The scripted answers are gone: every answer must come from the recorded run.
    std::fs::write(tmp.path().join("answers.jsonl"), "").unwrap();
    let replayed = tmp.path().join("replayed");
    let o = Command::new(bin())
        .arg("run")
        .arg(&cfg)
        .args(["--no-tui", "--replay-llm"])
        .arg(&first)
        .arg("--out")
        .arg(&replayed)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(report_turns(&replayed), report_turns(&first));
    assert_eq!(count_answers(&replayed), 9);
}

#[test]
fn a_run_that_cannot_start_leaves_no_run_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = fixture(tmp.path());
    let text = std::fs::read_to_string(&cfg).unwrap();
    let attempt = |out: &Path| {
        Command::new(bin())
            .arg("run")
            .arg(&cfg)
            .args(["--no-tui", "--out"])
            .arg(out)
            .output()
            .unwrap()
    };
    // A dataset path that does not exist: named in the error, nothing created.
    std::fs::write(&cfg, text.replace("problems\"", "no-such-folder\"")).unwrap();
    let out = tmp.path().join("a");
    let o = attempt(&out);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no-such-folder"));
    assert!(!out.exists());
    // The answers file is missing: found only once the run directory exists, which is then removed.
    std::fs::write(&cfg, &text).unwrap();
    std::fs::rename(
        tmp.path().join("answers.jsonl"),
        tmp.path().join("moved.jsonl"),
    )
    .unwrap();
    let out = tmp.path().join("b");
    let o = attempt(&out);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("answers.jsonl"));
    assert!(
        !out.exists(),
        "a run that never started must not block the next attempt"
    );
    std::fs::rename(
        tmp.path().join("moved.jsonl"),
        tmp.path().join("answers.jsonl"),
    )
    .unwrap();
    assert!(
        attempt(&out).status.success(),
        "the same --out works once the cause is fixed"
    );
}

#[test]
fn the_quickstart_config_runs_from_any_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/quickstart.toml");
    let o = Command::new(bin())
        .current_dir(tmp.path())
        .arg("run")
        .arg(&cfg)
        .args(["--no-tui", "--set", "eval.executor=simulated"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The run directory is made where krefine runs, not beside the config.
    assert!(
        tmp.path()
            .join("trajectories/quickstart/events.jsonl")
            .is_file()
    );
    assert!(
        !Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("configs/trajectories")
            .exists()
    );
}
