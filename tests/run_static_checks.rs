//! Static checks in a whole run (real binary, scripted model, real CPU workers): a strict run rejects
//! a timing-patch candidate before compiling it and goes on; a faithful run builds and evaluates the
//! same candidate and records the finding as a warning. Both show up in `krefine report`.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

mod cli_support;
mod worker_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use cli_support::cpu_refine_experiment;
use serde_json::Value;
use worker_support::{hostile, test_python};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_krefine")
}

/// The honest CPU candidate with a timer patch appended (a no-op, so the faithful run's timing is
/// honest; the static check flags the assignment all the same). Returns the code and the patch's
/// line.
fn patched() -> (String, u32) {
    let ok = hostile("ok_cpp.py");
    let line = ok.lines().count() as u32 + 2;
    (
        format!("{ok}import time\ntime.perf_counter = time.perf_counter\n"),
        line,
    )
}

fn fixture(root: &Path, python: &Path) -> PathBuf {
    let probs = root.join("problems");
    std::fs::create_dir_all(&probs).unwrap();
    std::fs::write(probs.join("1_Add.py"), hostile("problem_add.py")).unwrap();
    let mut answers = String::new();
    for (turn, code) in [(1, patched().0), (2, hostile("ok_cpp.py"))] {
        let content = format!("Here it is.\n```python\n{code}```\n");
        answers.push_str(
            &serde_json::json!({"problem": "1/1", "sample": 0, "turn": turn, "content": content})
                .to_string(),
        );
        answers.push('\n');
    }
    std::fs::write(root.join("answers.jsonl"), answers).unwrap();
    cpu_refine_experiment(root, &probs, python, 3)
}

fn events(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn of_turn<'a>(events: &'a [Value], kind: &str, turn: u64) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["event"]["type"] == kind && e["event"]["turn"] == turn)
        .map(|e| &e["event"])
        .collect()
}

fn run_and_report(cfg: &Path, out: &Path, sets: &[&str]) -> Value {
    let mut c = Command::new(bin());
    c.arg("run").arg(cfg).args(["--no-tui", "--out"]).arg(out);
    for s in sets {
        c.args(["--set", s]);
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(bin())
        .args(["report", "--format", "json"])
        .arg(out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn strict_rejects_a_timer_patch_before_compiling_and_faithful_records_it() {
    let python = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(test_python());
    let tmp = tempfile::tempdir().unwrap();
    let cfg = fixture(tmp.path(), &python);
    let (_, line) = patched();

    // Strict: turn 1 never reaches the compiler or a device; turn 2 runs as usual.
    let out = tmp.path().join("strict");
    let report = run_and_report(&cfg, &out, &["eval.mode=strict"]);
    let ev = events(&out);
    let compiled = of_turn(&ev, "compiled", 1);
    assert_eq!(compiled.len(), 1);
    let c = &compiled[0]["outcome"];
    assert_eq!(c["status"], "rejected", "{c}");
    assert_eq!(c["error_name"], "StaticCheckError");
    assert_eq!(
        c["findings"],
        serde_json::json!([{
            "category": "timing_patch",
            "severity": "error",
            "message": "assigns `time.perf_counter`: replacing a timer, `synchronize` or a CUDA event fakes the measured time",
            "line": line
        }])
    );
    assert!(of_turn(&ev, "executed", 1).is_empty());
    assert!(of_turn(&ev, "lease_granted", 1).is_empty());
    assert_eq!(of_turn(&ev, "compiled", 2)[0]["outcome"]["status"], "ok");
    assert_eq!(
        of_turn(&ev, "executed", 2)[0]["outcome"]["verdict"],
        "correct"
    );
    assert_eq!(
        report["turns"][0]["verdicts"],
        serde_json::json!({"rejected": 1})
    );
    assert_eq!(
        report["turns"][1]["verdicts"],
        serde_json::json!({"correct": 1})
    );
    assert_eq!(
        report["integrity"]["static"],
        serde_json::json!({"timing_patch": {"warnings": 0, "errors": 1}})
    );
    assert_eq!(report["integrity"]["rejected"], 1);
    assert_eq!(
        report["ledger"]["compiles"], 1,
        "a rejection is not a build"
    );

    // Faithful: the same candidate is built and evaluated; the finding is a warning.
    let out = tmp.path().join("faithful");
    let report = run_and_report(&cfg, &out, &[]);
    let ev = events(&out);
    let c = &of_turn(&ev, "compiled", 1)[0]["outcome"];
    assert_eq!(c["status"], "ok", "{c}");
    assert_eq!(c["findings"][0]["severity"], "warning");
    assert_eq!(c["findings"][0]["line"], line);
    assert_eq!(
        of_turn(&ev, "executed", 1)[0]["outcome"]["verdict"],
        "correct"
    );
    assert_eq!(
        report["turns"][0]["verdicts"],
        serde_json::json!({"correct": 1})
    );
    assert_eq!(
        report["integrity"]["static"],
        serde_json::json!({"timing_patch": {"warnings": 1, "errors": 0}})
    );
    assert_eq!(report["integrity"]["rejected"], 0);
    // The text report names the category.
    let o = Command::new(bin())
        .arg("report")
        .arg(&out)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("checks   static: timing_patch (1 warned)"),
        "{text}"
    );
}

#[test]
fn check_command_lints_files_and_fails_on_errors() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/static");
    let check = |args: &[&str], file: &str| {
        Command::new(bin())
            .arg("check")
            .args(args)
            .arg(fixtures.join(file))
            .output()
            .unwrap()
    };
    let o = check(
        &["--mode", "strict", "--backend", "cuda"],
        "kb_non_default_stream.py",
    );
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].ends_with("kb_non_default_stream.py: error missing_kernel: no `__global__` kernel in the CUDA sources: the work is not done by a custom CUDA kernel"),
        "{out}"
    );
    assert!(
        lines[1].contains(
            "kb_non_default_stream.py:15: error stream_injection: `cudaStreamCreateWithFlags`"
        ),
        "{out}"
    );
    // Faithful mode only warns: exit status 0.
    let o = check(&[], "kb_non_default_stream.py");
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains(": warning stream_injection:"));
    let o = check(&["--mode", "strict"], "false_positives.py");
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "");
    let o = check(&["--backend", "gpu"], "false_positives.py");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--backend \"gpu\""));
}
