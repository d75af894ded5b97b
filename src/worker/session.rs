//! Signalling a worker's whole session (its process group and every member that left the group),
//! from async code or from `Drop`, and tying a child's life to krefine's.

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// Send `signal` to every process of the worker's session `sid` (the worker is its session and
/// group leader): its process group, then each other member found in /proc. ninja starts each
/// compiler in a process group of its own, so signalling the worker's group alone would miss
/// `cc1plus`/`nvcc`; every descendant stays in the session unless it calls `setsid` itself. Refuses 0
/// and 1 (our own group / init), which a bug must never turn into "signal everything".
///
/// Reads /proc synchronously: call it off the async runtime ([`signal_session_async`]).
pub fn signal_session(sid: u32, signal: Signal) {
    let Some(sid) = session_pid(sid) else {
        return;
    };
    // ESRCH (already gone) is the common, harmless case; nothing useful to do on error.
    let _ = killpg(sid, signal);
    for pid in session_members(sid.as_raw()) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

/// [`signal_session`] on a blocking thread; returns once every member was signalled.
pub async fn signal_session_async(sid: u32, signal: Signal) {
    if session_pid(sid).is_none() {
        return;
    }
    let _ = tokio::task::spawn_blocking(move || signal_session(sid, signal)).await;
}

/// SIGKILL the worker's session now, from synchronous code (Drop): the group is killed at once; the
/// /proc scan for members in other groups runs on a blocking thread when a runtime is there.
pub fn kill_group(sid: u32) {
    let Some(pgid) = session_pid(sid) else {
        return;
    };
    let _ = killpg(pgid, Signal::SIGKILL);
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn_blocking(move || signal_session(sid, Signal::SIGKILL));
        }
        Err(_) => signal_session(sid, Signal::SIGKILL),
    }
}

fn session_pid(sid: u32) -> Option<Pid> {
    let sid = i32::try_from(sid).ok()?;
    (sid > 1).then(|| Pid::from_raw(sid))
}

/// Processes whose session id is `sid`, from /proc (empty where /proc is unavailable).
fn session_members(sid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid > 1 && session_of(*pid) == Some(sid))
        .collect()
}

fn session_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')':
    // state ppid pgrp session ...
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(3)?.parse().ok()
}

/// The niceness of the processes that plan and draw problems' reference inputs: they share the cores
/// with the evaluation workers, whose timings are CUDA events around a launch (or a CPU clock on the
/// CPU device), so a timing thread that waits for a core while they run measures the wait as kernel
/// time. At niceness 10 such a process gets about a tenth of a contended core's share against a
/// timing thread at 0, and all of the idle cores.
pub(crate) const INPUTS_NICE: libc::c_int = 10;

/// The niceness of the processes that build candidates: further below the timings, and below the
/// input makers (about a third of a maker's share of a contended core): one problem's inputs hold back
/// every candidate of it, the one that needs no build too, and their plan every problem's inputs, where
/// a build holds back one candidate. With builds and makers at one niceness (issue 36's cold batch on
/// an H200, 16 builds at once), the first inputs were started only at 42 s (after the plan), a 1 GB
/// problem's took 17 s against 5 s with no builds running, and the GPU waited 59 s for its first.
pub(crate) const BUILD_NICE: libc::c_int = 15;

/// Called between `fork` and `exec` (a `pre_exec` hook): lower this process to [`BUILD_NICE`] (see
/// [`lower_priority_to`]).
pub(crate) fn lower_priority() {
    lower_priority_to(BUILD_NICE);
}

/// Called between `fork` and `exec` (a `pre_exec` hook): lower this process to `nice`, unless it is
/// already at least that nice (an unprivileged process cannot raise its priority, and one started
/// nicer stays so). Only async-signal-safe calls; a failure leaves the priority as it was.
pub(crate) fn lower_priority_to(nice: libc::c_int) {
    // SAFETY: plain system calls without pointers.
    unsafe {
        // getpriority's -1 is also a valid niceness; either way the comparison below is right.
        let now = libc::getpriority(libc::PRIO_PROCESS, 0);
        if now < nice {
            libc::setpriority(libc::PRIO_PROCESS, 0, nice);
        }
    }
}

/// Called between `fork` and `exec` (a `pre_exec` hook): the child gets SIGKILL when krefine dies
/// (`PR_SET_PDEATHSIG`), however krefine dies (SIGKILL, the OOM killer) and even while the child is
/// stopped: a compile worker is stopped while the CPU device times a candidate, and a stopped
/// process never reads the end of its closed pipes, so it would stay forever. `parent` is krefine's
/// pid, read before the fork: a krefine that died before the `prctl` is caught here.
///
/// The signal comes when the forking *thread* ends, so such children are started with
/// [`spawn_tied`], on a thread that lives as long as the runtime. Only async-signal-safe calls.
pub(crate) fn die_with_parent(parent: libc::pid_t) -> std::io::Result<()> {
    // SAFETY: plain system calls without pointers.
    unsafe {
        if libc::prctl(
            libc::PR_SET_PDEATHSIG,
            libc::SIGKILL as libc::c_ulong,
            0,
            0,
            0,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        if libc::getppid() != parent {
            return Err(std::io::Error::other(
                "krefine ended while starting this worker",
            ));
        }
    }
    Ok(())
}

/// Start `cmd` (whose `pre_exec` calls [`die_with_parent`]) from a thread that lives as long as the
/// runtime: `PR_SET_PDEATHSIG` fires when the thread that forked the child ends, not the process. A
/// multi-thread runtime's workers live as long as the runtime, while the thread that called
/// `block_on` may end first (a test's thread, a helper thread) and would take every worker it
/// started with it; on a current-thread runtime, the task runs on the `block_on` thread anyway.
pub(crate) async fn spawn_tied(
    mut cmd: tokio::process::Command,
) -> std::io::Result<tokio::process::Child> {
    match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::CurrentThread => cmd.spawn(),
        _ => tokio::spawn(async move { cmd.spawn() })
            .await
            .map_err(std::io::Error::other)?,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_group_refuses_own_group_and_init() {
        // Would be catastrophic if it did anything; with the guard it returns without a syscall.
        kill_group(0);
        kill_group(1);
    }
}
