//! A worker lives as long as krefine, not as long as the thread that started it: the kernel's
//! `PR_SET_PDEATHSIG` (a worker dies with krefine, stopped or not) fires when the *thread* that
//! forked it ends. A pool started inside `block_on` on a short-lived thread (a test's thread, a helper
//! thread) must not lose its workers when that thread ends; they are forked on the runtime's own
//! threads.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

mod worker_support;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use krefine::services::{Compiler, DeviceId, Executor};
use krefine::types::{CompileStatus, Verdict};
use krefine::worker::WorkerPool;
use worker_support::*;

static RT: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("test runtime")
});

/// Our child processes (the workers, or their sandbox supervisors), by pid.
fn children() -> Vec<u32> {
    let me = std::process::id();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        if ppid == Some(me) {
            found.push(pid);
        }
    }
    found.sort_unstable();
    found
}

#[test]
fn workers_outlive_the_thread_that_started_them() {
    let work = persistent_dir("worker-spawn-thread");
    let _ = std::fs::remove_dir_all(work.join("logs"));
    // Started, and made to compile (so a compile worker runs), on a thread that then ends.
    let started = {
        let work = work.clone();
        std::thread::spawn(move || {
            RT.block_on(async {
                let python = test_python().await;
                let harness = deployed_harness(&work).await;
                let cache = work.join("build-cache");
                let pool: Arc<WorkerPool> =
                    WorkerPool::start(cpu_settings(python, harness, &work, &cache))
                        .await
                        .expect("pool starts");
                let c = pool
                    .compile(compile_job(
                        &hostile("ok_cpp.py"),
                        &work.join("logs"),
                        "first",
                    ))
                    .await
                    .expect("compiles");
                assert_eq!(c.status, CompileStatus::Ok, "{c:?}");
                // And an evaluation (the CPU device's worker).
                let e = pool
                    .execute(
                        exec_job(&hostile("ok_cpp.py"), c.build_dir.clone()),
                        &DeviceId::Cpu,
                    )
                    .await
                    .expect("evaluates");
                assert_eq!(e.verdict, Verdict::Correct, "{e:?}");
                // A worker that dies is replaced by the next request: here, inside this thread's
                // `block_on` (as in a test's thread, or any caller's).
                let dies = pool
                    .compile(compile_job(
                        &hostile("exit3.py"),
                        &work.join("logs"),
                        "exit3",
                    ))
                    .await
                    .expect("compiles");
                let e = pool
                    .execute(
                        exec_job(&hostile("exit3.py"), dies.build_dir),
                        &DeviceId::Cpu,
                    )
                    .await
                    .expect("evaluates");
                assert_eq!(e.verdict, Verdict::Crashed, "{e:?}");
                let e = pool
                    .execute(
                        exec_job(&hostile("ok_cpp.py"), c.build_dir.clone()),
                        &DeviceId::Cpu,
                    )
                    .await
                    .expect("evaluates");
                assert_eq!(e.verdict, Verdict::Correct, "{e:?}");
                pool
            })
        })
        .join()
        .expect("the starting thread")
    };
    let before = children();
    assert!(!before.is_empty(), "a compile worker runs");
    // The thread is gone; give the kernel's signal time to arrive if it were coming.
    std::thread::sleep(Duration::from_millis(500));
    let after = children();
    assert_eq!(
        before, after,
        "workers died with the thread that started them"
    );
    RT.block_on(async {
        let c = started
            .compile(compile_job(
                &hostile("ok_cpp.py"),
                &work.join("logs"),
                "second",
            ))
            .await
            .expect("compiles");
        assert_eq!(c.status, CompileStatus::Ok, "{c:?}");
        let e = started
            .execute(exec_job(&hostile("ok_cpp.py"), c.build_dir), &DeviceId::Cpu)
            .await
            .expect("evaluates");
        assert_eq!(e.verdict, Verdict::Correct, "{e:?}");
        started.shutdown().await;
    });
}
