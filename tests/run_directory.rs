//! A run directory stands on its own and its log loses nothing (issue 37, items 2 and 3): the frozen
//! `config.toml` names every input by an absolute path, so the run resumes from it in any working
//! directory, after the run directory moved; a refused resume names each differing key with both
//! values; a complete log line this krefine cannot read stops the resume with its line number and
//! the log untouched, and `krefine repair` cuts it there with a backup.
//!
//! The real binary, the scripted LLM and the simulated executor (fast, deterministic).
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

mod cli_support;

use std::path::Path;

use cli_support::{krefine_in, log_lines, s, sim_experiment};

fn text(o: &std::process::Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Run the experiment to its end in `cwd`, then cut its log after `keep` lines, as a crash would
/// leave it (the rest is for a resume to redo).
fn unfinished_run(root: &Path, cfg: &Path, out: &Path, keep: usize) {
    let o = krefine_in(root, &["run", s(cfg), "--no-tui", "--out", s(out)]);
    assert!(o.status.success(), "{}", text(&o));
    let lines = log_lines(out);
    assert!(lines.len() > keep);
    let cut: String = lines[..keep].iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(out.join("events.jsonl"), cut).unwrap();
}

#[test]
fn the_frozen_config_resumes_from_anywhere_after_the_run_directory_moved() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let cfg = sim_experiment(root, 2, 2);
    // Started from the experiment's parent folder, its inputs named relative to the config.
    let out = root.join("runs/a");
    unfinished_run(root, &cfg, &out, 6);
    let frozen = std::fs::read_to_string(out.join("config.toml")).unwrap();
    let dataset = root.join("exp/problems");
    assert!(
        frozen.contains(&format!("path = \"{}\"", dataset.display())),
        "{frozen}"
    );
    assert!(frozen.contains("name = \"sim\""), "{frozen}");
    // The run directory moves; the resume starts in an unrelated folder, from the frozen copy.
    let moved = root.join("elsewhere/moved-run");
    std::fs::create_dir_all(moved.parent().unwrap()).unwrap();
    std::fs::rename(&out, &moved).unwrap();
    let cwd = root.join("some/other/folder");
    std::fs::create_dir_all(&cwd).unwrap();
    let frozen_cfg = moved.join("config.toml");
    let o = krefine_in(
        &cwd,
        &[
            "run",
            s(&frozen_cfg),
            "--no-tui",
            "--out",
            s(&moved),
            "--resume",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let log = log_lines(&moved).join("\n");
    assert!(log.contains("\"reason\":\"finished\""), "{log}");
    // The resumed run kept its name.
    assert!(!log.contains("\"run\":\"config\""), "{log}");
}

#[test]
fn a_refused_resume_names_each_key_with_both_values() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let cfg = sim_experiment(root, 1, 2);
    let out = root.join("runs/b");
    unfinished_run(root, &cfg, &out, 4);
    let before = std::fs::read(out.join("events.jsonl")).unwrap();
    let o = krefine_in(
        root,
        &[
            "run",
            s(&cfg),
            "--no-tui",
            "--out",
            s(&out),
            "--resume",
            "--set",
            "method.turns=5",
            "--set",
            "eval.precision=fp16",
            "--set",
            "budget.usd=3",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("in 2 key(s)"), "{err}");
    assert!(
        err.contains("method.turns: the run has 2, the config gives 5"),
        "{err}"
    );
    assert!(
        err.contains("eval.precision: the run has \"fp32\", the config gives \"fp16\""),
        "{err}"
    );
    assert!(!err.contains("budget.usd"), "{err}");
    assert_eq!(std::fs::read(out.join("events.jsonl")).unwrap(), before);
    // The same config resumes from another working directory: its relative paths resolve as
    // they did when the run started (from the config's folder).
    let o = krefine_in(
        &root.join("exp"),
        &["run", s(&cfg), "--no-tui", "--out", s(&out), "--resume"],
    );
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn an_unreadable_complete_line_stops_the_resume_and_repair_cuts_it_with_a_backup() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let cfg = sim_experiment(root, 2, 2);
    let out = root.join("runs/c");
    unfinished_run(root, &cfg, &out, 5);
    // A record a newer krefine wrote, newline and all, as the last line.
    let newer =
        r#"{"v":2,"seq":5,"ts_ms":1,"task":"1/1/0","event":{"type":"a_future_event","x":1}}"#;
    let mut log = std::fs::read_to_string(out.join("events.jsonl")).unwrap();
    log.push_str(newer);
    log.push('\n');
    std::fs::write(out.join("events.jsonl"), &log).unwrap();
    let resume = || {
        krefine_in(
            root,
            &["run", s(&cfg), "--no-tui", "--out", s(&out), "--resume"],
        )
    };
    let o = resume();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("events.jsonl:6: not an event record"), "{err}");
    assert!(err.contains("krefine repair"), "{err}");
    // Nothing was cut: the line is still there, byte for byte.
    assert_eq!(
        std::fs::read_to_string(out.join("events.jsonl")).unwrap(),
        log
    );

    let o = krefine_in(root, &["repair", s(&out)]);
    assert!(o.status.success(), "{}", text(&o));
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("before line 6"), "{said}");
    assert!(
        said.contains("kept 5 record(s); removed 1 line(s)"),
        "{said}"
    );
    let backups: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("events.jsonl.bak-")
        })
        .collect();
    assert_eq!(backups.len(), 1);
    assert_eq!(std::fs::read_to_string(backups[0].path()).unwrap(), log);
    assert_eq!(log_lines(&out).len(), 5);
    let o = resume();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        log_lines(&out)
            .join("\n")
            .contains("\"reason\":\"finished\"")
    );
    // A whole log: nothing to cut.
    let o = krefine_in(root, &["repair", s(&out)]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("nothing to cut"));
}
