//! Headless and background runs, and how signals stop a run (issue 37, item 4; issue 38, item 5):
//! progress lines when stderr is not a terminal (one per finished turn, and a status line at least
//! every interval); the terminal UI falls back to plain output when the process is not in the
//! terminal's foreground (under `timeout`), instead of being stopped by the kernel; SIGTERM ends a
//! run cleanly with or without the UI (the UI leaves by itself once the run has ended); a second
//! signal stops it at once.
//!
//! The real binary, the scripted LLM and the simulated executor; the terminal cases in tmux.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

mod cli_support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cli_support::tmux::Tmux;
use cli_support::{log_lines, s, sim_experiment};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_krefine")
}

fn spawn(cfg: &Path, out: &Path, extra: &[&str], env: &[(&str, &str)]) -> Child {
    Command::new(bin())
        .args(["run", s(cfg), "--no-tui", "--out", s(out)])
        .args(extra)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn signal(child: &Child, sig: &str) {
    let sent = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// Wait until `path` holds `needle` (the run got that far).
fn wait_for_text(path: &Path, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(path).is_ok_and(|t| t.contains(needle)) {
        assert!(
            Instant::now() < deadline,
            "{} never held {needle}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The child's exit status, or a panic when it is still running after a minute (a hang).
fn exit_within_a_minute(mut child: Child) -> (std::process::ExitStatus, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let o = child.wait_with_output().unwrap();
            return (status, String::from_utf8_lossy(&o.stderr).into_owned());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the run did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn last_record(out: &Path) -> serde_json::Value {
    serde_json::from_str(log_lines(out).last().unwrap()).unwrap()
}

#[test]
fn headless_progress_has_a_line_per_turn_and_a_periodic_status() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = sim_experiment(tmp.path(), 2, 3);
    let out = tmp.path().join("r");
    // Slowed so that the run lasts several status intervals.
    let child = spawn(
        &cfg,
        &out,
        &["--set", "eval.simulated.time_scale=0.05"],
        &[("KREFINE_PROGRESS_INTERVAL_S", "0.2")],
    );
    let (status, err) = exit_within_a_minute(child);
    assert!(status.success(), "{err}");
    let turns: Vec<&str> = err.lines().filter(|l| l.contains(" turn ")).collect();
    assert_eq!(turns.len(), 6, "one line per finished turn:\n{err}");
    for problem in ["1/1/0 1_P1.py", "1/2/0 2_P2.py"] {
        for turn in 1..=3 {
            let want = format!("{problem} turn {turn}/3: correct 1.{turn}0x");
            assert!(turns.iter().any(|l| l.contains(&want)), "{want}:\n{err}");
        }
    }
    let status_lines = err.lines().filter(|l| l.contains(" turns | llm ")).count();
    assert!(status_lines >= 3, "a status line every interval:\n{err}");
    assert!(err.contains("6/6 turns | llm 0"), "{err}");
}

#[test]
fn sigterm_stops_a_headless_run_cleanly_and_it_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = sim_experiment(tmp.path(), 2, 3);
    let out = tmp.path().join("r");
    let child = spawn(
        &cfg,
        &out,
        &["--set", "eval.simulated.time_scale=0.05"],
        &[],
    );
    wait_for_text(&out.join("events.jsonl"), "\"type\":\"compiled\"");
    signal(&child, "-TERM");
    let (status, err) = exit_within_a_minute(child);
    assert_eq!(status.code(), Some(143), "{err}");
    assert!(err.contains("stopped by SIGTERM: stopping"), "{err}");
    let last = last_record(&out);
    assert_eq!(last["event"]["type"], "run_ended", "{last}");
    assert_eq!(last["event"]["reason"], "stopped by SIGTERM", "{last}");
    let frozen = out.join("config.toml");
    let (status, err) = exit_within_a_minute(spawn(&frozen, &out, &["--resume"], &[]));
    assert!(status.success(), "{err}");
    assert_eq!(last_record(&out)["event"]["reason"], "finished");
}

#[test]
fn a_second_signal_while_stopping_stops_at_once_and_the_log_stays_resumable() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = sim_experiment(tmp.path(), 2, 3);
    let out = tmp.path().join("r");
    // The shutdown after the run is held for minutes (a test hook of debug builds), as a slow
    // worker or cluster would hold it: only a second signal ends the process soon.
    let child = spawn(
        &cfg,
        &out,
        &["--set", "eval.simulated.time_scale=0.05"],
        &[("KREFINE_TEST_HOLD_SHUTDOWN_S", "600")],
    );
    wait_for_text(&out.join("events.jsonl"), "\"type\":\"compiled\"");
    signal(&child, "-TERM");
    // The first stopped the run cleanly (its end is in the log); the process still shuts down.
    wait_for_text(&out.join("events.jsonl"), "\"type\":\"run_ended\"");
    signal(&child, "-INT");
    let (status, err) = exit_within_a_minute(child);
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("stopped by SIGTERM: stopping"), "{err}");
    assert!(err.contains("stopped at once by a second signal"), "{err}");
    assert_eq!(last_record(&out)["event"]["reason"], "stopped by SIGTERM");
    // The log reads and the run resumes (from its own config) to its end.
    let frozen = out.join("config.toml");
    let (status, err) = exit_within_a_minute(spawn(&frozen, &out, &["--resume"], &[]));
    assert!(status.success(), "{err}");
    assert_eq!(last_record(&out)["event"]["reason"], "finished");
}

#[test]
fn under_timeout_the_ui_falls_back_to_plain_output_and_sigterm_ends_the_ui() {
    let Some(tmux) = Tmux::new() else {
        eprintln!("tmux is not installed: skipping the terminal test");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let cfg = sim_experiment(tmp.path(), 2, 2);
    // `timeout` runs krefine in a process group of its own, not the terminal's foreground one.
    let out = tmp.path().join("bg");
    tmux.start(
        "bg",
        &format!(
            "timeout 120 {} run '{}' --out '{}'",
            bin(),
            cfg.display(),
            out.display()
        ),
    );
    let screen = tmux.wait_for("bg", &["EXIT="]);
    assert!(screen.contains("EXIT=0"), "{screen}");
    assert!(
        screen.contains("not in the terminal's foreground process group"),
        "{screen}"
    );
    assert_eq!(last_record(&out)["event"]["reason"], "finished");

    // In the foreground the UI opens; SIGTERM stops the run and the UI leaves once it ended.
    let out = tmp.path().join("fg");
    tmux.start(
        "fg",
        &format!(
            "{} run '{}' --out '{}' --set eval.simulated.time_scale=0.002",
            bin(),
            cfg.display(),
            out.display()
        ),
    );
    tmux.wait_for("fg", &["Tasks 2/2", "1_P1", "running"]);
    let pid = std::fs::read_to_string(out.join("krefine.pid")).unwrap();
    let sent = Command::new("kill")
        .args(["-TERM", pid.trim()])
        .status()
        .unwrap();
    assert!(sent.success());
    let screen = tmux.wait_for("fg", &["EXIT="]);
    assert!(screen.contains("EXIT=143"), "{screen}");
    assert_eq!(last_record(&out)["event"]["reason"], "stopped by SIGTERM");
}
