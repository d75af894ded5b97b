//! No worker outlives krefine (issue 27, 8): krefine killed with SIGKILL while its workers are stopped
//! (the compile workers are, while the CPU device times a candidate) leaves no process behind. A
//! stopped process never reads the EOF of its closed pipes, so only the kernel can end it: every
//! worker is started with `PR_SET_PDEATHSIG`.
//!
//! The real binary and real workers: `krefine eval` of a candidate that sleeps in its build.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

mod cli_support;

use cli_support::{python, repo, s};

/// `pid`'s descendants (from /proc), parents first.
fn descendants(pid: u32) -> Vec<u32> {
    let mut children: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|v| v.parse().ok()) {
            children.entry(ppid).or_default().push(p);
        }
    }
    let mut out = Vec::new();
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        for &c in children.get(&p).into_iter().flatten() {
            out.push(c);
            queue.push(c);
        }
    }
    out
}

/// Alive and not a zombie.
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next().map(|st| st != "Z"))
        })
        .unwrap_or(false)
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

#[test]
fn stopped_workers_die_with_a_killed_krefine() {
    let d = tempfile::tempdir().unwrap();
    let dataset = repo().join("configs/quickstart/problems");
    let folder = d.path().join("kb_run");
    std::fs::create_dir_all(&folder).unwrap();
    // A build that takes minutes: the compile worker is busy (and its build child alive) when
    // krefine is killed.
    std::fs::write(
        folder.join("level_1_problem_2_sample_0_kernel.py"),
        "import time\nimport torch.nn as nn\ntime.sleep(600)\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n",
    )
    .unwrap();
    let py = format!("resources.python=\"{}\"", python().display());
    let temp = d.path().join("tmp");
    std::fs::create_dir_all(&temp).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_krefine"))
        .args([
            "eval",
            s(&folder),
            "--dataset",
            s(&dataset),
            "--out",
            s(&d.path().join("runs/orphans")),
            "--set",
            &py,
            "--set",
            "resources.devices=cpu",
            "--set",
            "resources.compile_workers=1",
        ])
        .env("TMPDIR", &temp)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let krefine = child.id();

    // Wait for the workers, and a little longer for the build child a compile worker forks for the
    // candidate (or the candidate process of an evaluation) to be in flight.
    let deadline = Instant::now() + Duration::from_secs(300);
    let tree = loop {
        let tree = descendants(krefine);
        if tree
            .iter()
            .any(|p| cmdline(*p).contains("serve --role compile"))
        {
            std::thread::sleep(Duration::from_secs(5));
            break descendants(krefine);
        }
        assert!(
            Instant::now() < deadline,
            "no compile worker appeared: {:?}",
            tree.iter().map(|p| cmdline(*p)).collect::<Vec<_>>()
        );
        if let Ok(Some(status)) = child.try_wait() {
            panic!("krefine ended early: {status}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(!tree.is_empty());

    // Stop every process below krefine (as the CPU timing lease stops the compile workers), then
    // kill krefine the way the OOM killer or `kill -9` would.
    for p in &tree {
        let _ = kill(Pid::from_raw(*p as i32), Signal::SIGSTOP);
    }
    child.kill().unwrap();
    child.wait().unwrap();

    let deadline = Instant::now() + Duration::from_secs(30);
    let mut left: Vec<u32> = tree.iter().copied().filter(|p| running(*p)).collect();
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        left.retain(|p| running(*p));
    }
    let described: Vec<String> = left
        .iter()
        .map(|p| format!("{p}: {}", cmdline(*p)))
        .collect();
    // Leave nothing behind whatever the verdict.
    for p in &left {
        let _ = kill(Pid::from_raw(*p as i32), Signal::SIGKILL);
        let _ = kill(Pid::from_raw(*p as i32), Signal::SIGCONT);
    }
    assert!(
        described.is_empty(),
        "processes outlived krefine: {described:#?}"
    );
}
