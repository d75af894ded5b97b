//! A Slurm allocation krefine asks for that waits: against the real single-node cluster of
//! `scripts/slurm-test-cluster up` (2 CPUs; CI sets `KREFINE_TEST_SLURM=1`, else these tests skip
//! when no cluster answers). Its own test binary, so that its jobs never meet the other launcher
//! tests' `squeue` checks.
//! - a request the cluster can never grant (more CPUs than the partition has: `PartitionConfig`)
//!   fails at once with Slurm's reason and what to change, not after `grant_timeout_s`;
//! - SIGTERM while the request waits (a held job) stops the run and withdraws the request.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn slurm_available() -> bool {
    let ok = Command::new("sinfo")
        .args(["-h", "-o", "%t"])
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("idle"));
    if !ok {
        assert!(
            std::env::var("KREFINE_TEST_SLURM").is_err_and(|_| true)
                || std::env::var("KREFINE_TEST_SLURM").is_ok_and(|v| v != "1"),
            "KREFINE_TEST_SLURM=1 but no idle Slurm node answers sinfo"
        );
        eprintln!(
            "skipped: no Slurm cluster (`eval \"$(scripts/slurm-test-cluster up)\"` as root)"
        );
    }
    ok
}

fn squeue() -> String {
    let o = Command::new("squeue")
        .args(["-h", "-o", "%i %j %T %r"])
        .output()
        .expect("squeue");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// A slurm run of the quickstart (nothing of it runs: the allocation is never granted).
fn slurm_run(out: &Path, extra: &[&str]) -> Child {
    let mut args: Vec<String> = vec![
        "run".into(),
        repo().join("configs/quickstart.toml").display().to_string(),
        "--no-tui".into(),
        "--out".into(),
        out.display().to_string(),
    ];
    let output_dir = out.with_file_name("output");
    for s in [
        "resources.devices=cpu".to_string(),
        "resources.compile_workers=1".into(),
        format!("output.dir=\"{}\"", output_dir.display()),
        "resources.launcher=\"slurm\"".into(),
        "resources.slurm.time=\"00:10:00\"".into(),
        "resources.slurm.grant_timeout_s=600".into(),
    ]
    .into_iter()
    .chain(extra.iter().map(|s| s.to_string()))
    {
        args.push("--set".into());
        args.push(s);
    }
    Command::new(env!("CARGO_BIN_EXE_krefine"))
        .args(args)
        .env_remove("SLURM_JOB_ID")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start krefine")
}

/// The child's output once it ended, or a failure when it is still running at `deadline`.
fn ended_by(mut child: Child, deadline: Instant, what: &str) -> Output {
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "{what}: krefine still waits; stderr:\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn requests_that_wait_end_with_a_reason_or_a_signal() {
    if !slurm_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();

    // 6 + 1 CPUs on a 2-CPU node: pending with reason PartitionConfig for good.
    let child = slurm_run(&tmp.path().join("big"), &["resources.slurm.gpu_cpus=6"]);
    let o = ended_by(
        child,
        Instant::now() + Duration::from_secs(60),
        "a request that can never be granted",
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("can never be granted"), "{err}");
    assert!(err.contains("PartitionConfig"), "{err}");
    assert!(err.contains("7 CPUs"), "{err}");
    assert!(err.contains("resources.slurm.gpu_cpus = 6"), "{err}");
    assert_eq!(squeue(), "", "the request was not withdrawn");

    // A held job waits (JobHeldUser resolves when released): SIGTERM ends the wait.
    let child = slurm_run(
        &tmp.path().join("held"),
        &[
            "resources.slurm.gpu_cpus=1",
            "resources.slurm.salloc_args=[\"--hold\"]",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !squeue().contains("PENDING") {
        assert!(Instant::now() < deadline, "the request never got queued");
        std::thread::sleep(Duration::from_millis(100));
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let o = ended_by(
        child,
        Instant::now() + Duration::from_secs(30),
        "SIGTERM while waiting for the grant",
    );
    let err = String::from_utf8_lossy(&o.stderr);
    // SIGTERM's status (128 + 15), as for any run it stops (issue 37's typed stop reasons).
    assert_eq!(o.status.code(), Some(143), "{err}");
    assert!(
        err.contains("interrupted while waiting for the allocation"),
        "{err}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !squeue().is_empty() {
        assert!(Instant::now() < deadline, "jobs left behind: {}", squeue());
        std::thread::sleep(Duration::from_millis(250));
    }
}
