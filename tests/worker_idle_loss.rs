//! A local worker killed while idle (the OOM killer, `kill -9` from outside) is a lost worker, as a
//! remote one is (issue 27, 8; `launcher_idle_loss.rs`): the next request is served by a fresh worker
//! and gets its candidate's true verdict, and the loss is recorded on its result (the `executed`
//! event's `worker_losses`), never turned into the candidate's `crashed`.
//!
//! Real workers (the test Python with torch, the real harness), killed from outside with SIGKILL.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

mod worker_support;

use std::path::Path;
use std::time::Duration;

use krefine::services::{Compiler, DeviceId, Executor};
use krefine::types::{CompileStatus, Verdict};
use krefine::worker::WorkerPool;
use krefine::worker::sandbox::SandboxLevel;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use worker_support::*;

const CORRECT: &str = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, a, b):\n        return a + b\n";

/// Field 4 of /proc/<pid>/stat: the parent.
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The processes whose command line contains `needle`.
fn find(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|b| {
                String::from_utf8_lossy(&b)
                    .replace('\0', " ")
                    .contains(needle)
            })
        })
        .collect()
}

/// The evaluation worker's Python process (not a candidate process it forked, whose parent is the
/// worker itself): inside the sandbox its parent is the supervisor krefine started, without one it
/// is the process krefine started.
fn eval_worker(work: &Path) -> u32 {
    let needle = format!(
        "serve --role gpu --scratch {}",
        work.join("scratch/cpu-0").display()
    );
    let all = find(&needle);
    let top: Vec<u32> = all
        .iter()
        .copied()
        .filter(|p| parent(*p).is_some_and(|pp| !all.contains(&pp)))
        .collect();
    assert_eq!(top.len(), 1, "one evaluation worker: {all:?} -> {top:?}");
    top[0]
}

async fn pool(tmp: &Path) -> std::sync::Arc<WorkerPool> {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let work = tmp.join("work");
    let python = test_python().await;
    let harness = deployed_harness(tmp).await;
    let settings = cpu_settings(python, harness, &work, &tmp.join("cache"));
    WorkerPool::start(settings).await.expect("pool starts")
}

/// Build the candidate (as a run does before evaluating it: its evaluation then leaves the build
/// cache's view untouched, so the worker is kept) and evaluate it.
async fn evaluate(pool: &WorkerPool, logs: &Path) -> krefine::types::ExecOutcome {
    let built = pool
        .compile(compile_job(CORRECT, logs, "idle"))
        .await
        .expect("a build");
    assert_eq!(built.status, CompileStatus::Ok, "{}", built.feedback);
    pool.execute(exec_job(CORRECT, built.build_dir), &DeviceId::Cpu)
        .await
        .expect("a verdict")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_worker_killed_while_idle_is_a_lost_worker() {
    let tmp = tempfile::tempdir().unwrap();
    let pool = pool(tmp.path()).await;
    let first = evaluate(&pool, tmp.path()).await;
    assert_eq!(first.verdict, Verdict::Correct, "{}", first.feedback);
    assert!(first.worker_losses.is_empty(), "{:?}", first.worker_losses);

    // Idle now; killed from outside, and gone before the next request comes.
    let worker = eval_worker(&tmp.path().join("work"));
    kill(Pid::from_raw(worker as i32), Signal::SIGKILL).unwrap();
    assert!(
        wait_gone(&[worker], Duration::from_secs(10))
            .await
            .is_empty()
    );
    tokio::time::sleep(Duration::from_millis(200)).await;

    let second = evaluate(&pool, tmp.path()).await;
    let third = evaluate(&pool, tmp.path()).await;
    pool.shutdown().await;
    assert_eq!(second.verdict, Verdict::Correct, "{}", second.feedback);
    assert_eq!(second.worker_losses.len(), 1, "{:?}", second.worker_losses);
    let loss = &second.worker_losses[0];
    assert_eq!(loss.worker, "cpu-0");
    assert!(!loss.drained, "{loss:?}");
    assert!(
        loss.detail.contains("ended while idle") && loss.detail.contains("SIGKILL"),
        "{}",
        loss.detail
    );
    // The fresh worker serves on; the loss is not carried to later requests.
    assert_eq!(third.verdict, Verdict::Correct, "{}", third.feedback);
    assert!(third.worker_losses.is_empty(), "{:?}", third.worker_losses);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_worker_killed_while_idle_is_a_lost_worker() {
    let tmp = tempfile::tempdir().unwrap();
    let pool = pool(tmp.path()).await;
    let first = pool
        .compile(compile_job(CORRECT, tmp.path(), "idle"))
        .await
        .expect("a build");
    assert_eq!(first.status, CompileStatus::Ok, "{}", first.feedback);

    let needle = format!(
        "serve --role compile --scratch {}",
        tmp.path().join("work/scratch/compile-0").display()
    );
    let all = find(&needle);
    let top: Vec<u32> = all
        .iter()
        .copied()
        .filter(|p| parent(*p).is_some_and(|pp| !all.contains(&pp)))
        .collect();
    assert_eq!(top.len(), 1, "one compile worker: {all:?} -> {top:?}");
    kill(Pid::from_raw(top[0] as i32), Signal::SIGKILL).unwrap();
    assert!(wait_gone(&top, Duration::from_secs(10)).await.is_empty());

    // Another source (not a cache hit): the build needs the worker.
    let other = format!("{CORRECT}\n# another candidate\n");
    let second = pool
        .compile(compile_job(&other, tmp.path(), "idle"))
        .await
        .expect("a build");
    pool.shutdown().await;
    assert_eq!(second.status, CompileStatus::Ok, "{}", second.feedback);
    assert_eq!(second.worker_losses.len(), 1, "{:?}", second.worker_losses);
    assert_eq!(second.worker_losses[0].worker, "compile-0");
}

/// A pool whose evaluation worker served one candidate, then was killed while idle behind its
/// supervisor, held stopped (so that the death has not reached krefine): (the pool, the supervisor's
/// pid); None, with the pool shut down, where there is no namespaces sandbox and so no supervisor.
async fn killed_behind_a_stopped_supervisor(
    tmp: &Path,
) -> Option<(std::sync::Arc<WorkerPool>, u32)> {
    let pool = pool(tmp).await;
    if *pool.sandbox_level() != SandboxLevel::Namespaces {
        eprintln!(
            "skipped: no namespaces sandbox here ({}), so no supervisor between the pool and its worker",
            pool.sandbox_level().as_str()
        );
        pool.shutdown().await;
        return None;
    }
    let first = evaluate(&pool, tmp).await;
    assert_eq!(first.verdict, Verdict::Correct, "{}", first.feedback);

    let worker = eval_worker(&tmp.join("work"));
    let supervisor = parent(worker).expect("the worker's parent");
    assert_ne!(supervisor, std::process::id(), "sandboxed: a supervisor");
    kill(Pid::from_raw(supervisor as i32), Signal::SIGSTOP).unwrap();
    kill(Pid::from_raw(worker as i32), Signal::SIGKILL).unwrap();
    assert!(
        wait_gone(&[worker], Duration::from_secs(10))
            .await
            .is_empty()
    );
    Some((pool, supervisor))
}

/// Inside the sandbox the process krefine holds is the supervisor, which passes its child's death on
/// a moment later. The supervisor is held stopped here, so the worker's death never reaches krefine
/// as an exit status: the idle check finds the supervisor childless, and the request is retried on a
/// fresh worker. (Before, the request was written to the dead worker's pipe: `crashed`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_worker_dead_behind_its_supervisor_is_a_lost_worker() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((pool, supervisor)) = killed_behind_a_stopped_supervisor(tmp.path()).await else {
        return;
    };
    let second = evaluate(&pool, tmp.path()).await;
    // The pool killed the stopped supervisor with the rest of the worker's session.
    let left = wait_gone(&[supervisor], Duration::from_secs(10)).await;
    if !left.is_empty() {
        let _ = kill(Pid::from_raw(supervisor as i32), Signal::SIGKILL);
        let _ = kill(Pid::from_raw(supervisor as i32), Signal::SIGCONT);
    }
    pool.shutdown().await;
    assert!(
        left.is_empty(),
        "the stopped supervisor outlived its worker"
    );
    assert_eq!(second.verdict, Verdict::Correct, "{}", second.feedback);
    assert_eq!(second.worker_losses.len(), 1, "{:?}", second.worker_losses);
    let loss = &second.worker_losses[0];
    assert!(
        loss.detail
            .contains("ended while idle (inside the sandbox)"),
        "{}",
        loss.detail
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_worker_whose_supervisor_passes_its_death_on_late_says_how_it_ended() {
    let tmp = tempfile::tempdir().unwrap();
    // The supervisor held up between its worker's death and its own exit, as a loaded machine holds
    // it (CI saw the next request come first), and let go while that request waits.
    let Some((pool, supervisor)) = killed_behind_a_stopped_supervisor(tmp.path()).await else {
        return;
    };
    let built = pool
        .compile(compile_job(CORRECT, tmp.path(), "idle"))
        .await
        .expect("a build");
    assert_eq!(built.status, CompileStatus::Ok, "{}", built.feedback);
    let resume = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = kill(Pid::from_raw(supervisor as i32), Signal::SIGCONT);
    });
    let second = pool
        .execute(exec_job(CORRECT, built.build_dir), &DeviceId::Cpu)
        .await
        .expect("a verdict");
    resume.await.unwrap();
    pool.shutdown().await;
    assert_eq!(second.verdict, Verdict::Correct, "{}", second.feedback);
    assert_eq!(second.worker_losses.len(), 1, "{:?}", second.worker_losses);
    let loss = &second.worker_losses[0];
    assert!(
        loss.detail.contains("ended while idle with") && loss.detail.contains("SIGKILL"),
        "the loss says how the worker ended: {}",
        loss.detail
    );
}
