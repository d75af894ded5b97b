//! Pausing the compile pool leaves no process stopped once the pause is over: a process forked
//! while a pause's stop and continue reach its session (a compile worker forks a child per compile)
//! is woken too. Before, such a child could stay stopped with its parent running, and its build hung
//! until the compile timeout (CI's `engine_refprep` tests: "compilation exceeded 300 s").
//!
//! A real process: a Python session that forks children in a loop, each holding the parent's
//! 400 MB so that a fork takes long enough to meet the signals; real SIGSTOP and SIGCONT.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use krefine::worker::pause::Pauser;

mod worker_support;

/// The processes of session `sid` that are stopped now (state `T`).
fn stopped_members(sid: u32) -> Vec<u32> {
    let mut stopped = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp session ...`; comm may hold spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.get(3).and_then(|s| s.parse::<u32>().ok()) == Some(sid) && fields[0] == "T" {
            stopped.push(pid);
        }
    }
    stopped
}

const CYCLES: u32 = 300;

const FORKER: &str = r#"
import os, time
os.setsid()
held = bytearray(400 << 20)
for i in range(0, len(held), 4096):
    held[i] = 1
print("ready", flush=True)
while True:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_process_of_a_paused_session_stays_stopped_after_the_pause() {
    let python = worker_support::test_python().await;
    let mut forker = Command::new(python)
        .args(["-c", FORKER])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(forker.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "ready");
    let sid = forker.id();
    let pauser = Pauser::new(vec![Arc::new(AtomicU32::new(sid))]);

    // Short pauses, as when the CPU device times a candidate that fails at once, each followed by
    // time for the forker to run (and fork) again.
    for _ in 0..CYCLES {
        let guard = pauser.pause().await;
        drop(guard);
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    pauser.wait_unpaused().await;
    // Every member runs again within the pause's follow-up continues (the last 5 s after the
    // pause ends); a member left stopped stays stopped for good.
    let mut stopped = stopped_members(sid);
    for _ in 0..150 {
        if stopped.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        stopped = stopped_members(sid);
    }
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(i32::try_from(sid).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = forker.wait();
    assert!(
        stopped.is_empty(),
        "members of the session still stopped after the pause: {stopped:?}"
    );
    assert_eq!(pauser.pauses(), CYCLES);
}
