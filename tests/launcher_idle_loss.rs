//! A remote worker whose connection dies while it is idle is a lost worker (issue 27, 8), as one
//! whose connection dies during a request is: the loss is recorded on the next request's result and
//! charged to its host, and the request is served by a fresh worker, never blamed on its candidate.
//!
//! Real workers through the ssh launcher to the test sshd (`scripts/slurm-test-cluster ssh-up`, which
//! sets `KREFINE_TEST_SSH_*`); skipped without it, like the other remote-launcher tests.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

mod worker_support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use krefine::config::ResourcesSection;
use krefine::launcher::{Launcher, LauncherKind, SshSection};
use krefine::services::{DeviceId, Executor};
use krefine::types::Verdict;
use krefine::worker::WorkerPool;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use worker_support::*;

const CORRECT: &str = "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, a, b):\n        return a + b\n";

/// `(field 4 of /proc/<pid>/stat, comm)`: the parent and the command name.
fn parent_and_comm(pid: u32) -> Option<(u32, String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_string();
    let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
    Some((ppid, comm))
}

/// The processes whose command line contains `needle`.
fn find(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .map(|b| {
                    String::from_utf8_lossy(&b)
                        .replace('\0', " ")
                        .contains(needle)
                })
                .unwrap_or(false)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_worker_that_dies_while_idle_is_a_lost_worker() {
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (Some(host), Some(port), Some(key), Some(known)) = (
        get("KREFINE_TEST_SSH_HOST"),
        get("KREFINE_TEST_SSH_PORT"),
        get("KREFINE_TEST_SSH_KEY"),
        get("KREFINE_TEST_SSH_KNOWN_HOSTS"),
    ) else {
        assert!(
            get("KREFINE_TEST_SLURM").as_deref() != Some("1"),
            "KREFINE_TEST_SLURM=1 but KREFINE_TEST_SSH_* are not set"
        );
        eprintln!("skipped: no test sshd (KREFINE_TEST_SSH_* unset)");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    let python = test_python().await;
    let harness = deployed_harness(tmp.path()).await;
    let mut settings = cpu_settings(python, harness, &work, &tmp.path().join("cache"));
    let resources = ResourcesSection {
        launcher: LauncherKind::Ssh,
        ssh: SshSection {
            hosts: vec![format!("{host}:cpu")],
            port: Some(port.parse().unwrap()),
            identity: Some(PathBuf::from(key)),
            options: [
                "-o",
                &format!("UserKnownHostsFile={known}"),
                "-o",
                "StrictHostKeyChecking=yes",
            ]
            .map(String::from)
            .to_vec(),
            ..SshSection::default()
        },
        ..ResourcesSection::default()
    };
    let launcher = Launcher::start(&resources, &tokio_util::sync::CancellationToken::new())
        .await
        .unwrap();
    settings.launcher = Arc::new(launcher);
    let pool = WorkerPool::start(settings).await.unwrap();

    let first = pool
        .execute(exec_job(CORRECT, None), &DeviceId::Cpu)
        .await
        .unwrap();
    assert_eq!(first.verdict, Verdict::Correct, "{}", first.feedback);
    assert!(first.worker_losses.is_empty(), "{:?}", first.worker_losses);

    // The worker idles; its connection dies: the sshd process of its session stops answering (a cut
    // network, a hung host), and the local ssh's keep-alives end the connection (exit 255, "Timeout,
    // server ... not responding").
    let scratch = work.join("scratch/cpu-0").display().to_string();
    // A process of the remote side (the worker or a candidate process it forked; not the local
    // ssh, whose command line holds the same words), below the sshd of its session.
    let workers: Vec<u32> = find(&format!("serve --role gpu --scratch {scratch}"))
        .into_iter()
        .filter(|p| parent_and_comm(*p).is_some_and(|(_, c)| c != "ssh"))
        .collect();
    // The topmost of them (its candidate processes fork from it, later).
    let Some(&worker) = workers.iter().min() else {
        panic!("no remote worker under {scratch}");
    };
    let clients: Vec<u32> = find(&scratch)
        .into_iter()
        .filter(|p| parent_and_comm(*p).is_some_and(|(_, c)| c == "ssh"))
        .collect();
    assert!(!clients.is_empty(), "no local ssh for the worker");
    // Every sshd process of its session (the privileged monitor and its child), not the listener.
    let mut session = Vec::new();
    let mut at = worker;
    while let Some((parent, comm)) = parent_and_comm(at)
        && parent > 1
    {
        if comm.starts_with("sshd") {
            session.push(at);
        }
        at = parent;
    }
    assert!(!session.is_empty(), "worker {worker} runs under no sshd");
    for p in &session {
        kill(Pid::from_raw(*p as i32), Signal::SIGSTOP).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    while clients.iter().any(|p| pid_alive(*p)) {
        assert!(
            Instant::now() < deadline,
            "the ssh client did not end: {clients:?} (stopped {session:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for p in &session {
        let _ = kill(Pid::from_raw(*p as i32), Signal::SIGKILL);
        let _ = kill(Pid::from_raw(*p as i32), Signal::SIGCONT);
    }

    let second = pool
        .execute(exec_job(CORRECT, None), &DeviceId::Cpu)
        .await
        .unwrap();
    pool.shutdown().await;
    assert_eq!(second.verdict, Verdict::Correct, "{}", second.feedback);
    assert_eq!(second.worker_losses.len(), 1, "{:?}", second.worker_losses);
    let loss = &second.worker_losses[0];
    assert_eq!(loss.worker, "cpu-0");
    assert!(
        loss.host.is_some(),
        "the loss is charged to a host: {loss:?}"
    );
    assert!(loss.detail.contains("not responding"), "{}", loss.detail);
}
