//! The sandbox against hostile candidates, one per hole (README "Threat model"), with real workers on
//! the CPU. Each hostile candidate attacks when it is imported — in the compile worker and again in
//! the evaluation worker — prints what it found (`KREFINE_PROBE ...`) and is otherwise honest, so it
//! must still be judged correct; after each, an honest candidate must still be judged correct.
//!
//! `KREFINE_TEST_DEVICE=gpu` evaluates on GPU 0 instead of the CPU (the H100 procedure,
//! bench/gpu/sandbox.sh): the same holes must stay closed with the driver and /dev/nvidia* visible.
//!
//! Keep this the only test in this file: it puts a secret into the test process's environment (the
//! orchestrator's), which is only sound while no other thread runs.

mod worker_support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use krefine::services::{Compiler, DeviceId, Executor};
use krefine::types::{CompileStatus, Verdict};
use krefine::worker::sandbox::SandboxLevel;
use krefine::worker::{WorkerPool, WorkerSettings};
use worker_support::*;

const HONEST: &str = r#"
# honest
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return a + b
"#;

/// Appended to every hostile candidate: the part that is judged.
const HONEST_MODEL: &str = r#"

import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, a, b):
        return a + b
"#;

struct Paths {
    events: PathBuf,
    cache: PathBuf,
    scratch_root: PathBuf,
    port: u16,
    orchestrator: u32,
    bystander: u32,
}

fn hostile_candidates(p: &Paths) -> Vec<(&'static str, String)> {
    let env = r#"
import os
hits = 0
scanned = 0
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        continue
    scanned += 1
    for item in data.split(b"\0"):
        if item.startswith(b"KREFINE_SANDBOX_TEST_SECRET="):
            hits += 1
            print("LEAKED", item.decode(errors="replace"), flush=True)
print(f"KREFINE_PROBE env scanned={scanned} hits={hits}", flush=True)
"#
    .to_string();
    let runlog = format!(
        r#"
import os
wrote = 0
for path in [{events:?}, os.path.join(os.path.dirname({events:?}), "config.toml")]:
    try:
        with open(path, "a") as f:
            f.write('{{"forged": true}}\n')
        wrote += 1
    except OSError as e:
        print(f"KREFINE_PROBE runlog refused {{type(e).__name__}}", flush=True)
print(f"KREFINE_PROBE runlog wrote={{wrote}}", flush=True)
"#,
        events = p.events.display().to_string()
    );
    let cache = format!(
        r#"
import os
own = os.path.dirname(os.path.abspath(__file__))
changed = 0
for root, dirs, files in os.walk({cache:?}):
    if os.path.abspath(root).startswith(own):
        continue
    for name in files:
        path = os.path.join(root, name)
        try:
            os.chmod(path, 0o644)
            with open(path, "w") as f:
                f.write("class ModelNew: pass  # forged\n")
            changed += 1
        except OSError:
            pass
print(f"KREFINE_PROBE cache attempted={{changed}}", flush=True)
"#,
        cache = p.cache.display().to_string()
    );
    let net = format!(
        r#"
import socket
try:
    s = socket.create_connection(("127.0.0.1", {port}), timeout=2)
    s.sendall(b"hello from the sandbox")
    s.close()
    print("KREFINE_PROBE net connected=1", flush=True)
except OSError as e:
    print(f"KREFINE_PROBE net connected=0 {{type(e).__name__}}", flush=True)
"#,
        port = p.port
    );
    let kill = format!(
        r#"
import os, signal
ppid = os.getppid()
print(f"KREFINE_PROBE kill ppid={{ppid}}", flush=True)
if ppid > 1:
    try:
        # The orchestrator, were the sandbox broken; inside it, the candidate's own worker, which
        # Landlock's signal scope protects (EPERM) where the kernel has it.
        os.kill(ppid, signal.SIGKILL)
    except OSError as e:
        print(f"KREFINE_PROBE kill parent refused errno={{e.errno}}", flush=True)
reached = 0
# SIGCONT: harmless to any process it might reach, and the bystander notices it.
for target in ({orch}, {bystander}):
    try:
        os.kill(target, signal.SIGCONT)
        reached += 1
        print(f"KREFINE_PROBE kill reached {{target}}", flush=True)
    except OSError:
        pass
# A broadcast may reach the candidate's own helpers inside its sandbox (its forked build child's
# parent, say); whether it went further shows in the bystander's flag.
try:
    os.kill(-1, signal.SIGCONT)
    print("KREFINE_PROBE kill broadcast delivered inside", flush=True)
except OSError:
    pass
print(f"KREFINE_PROBE kill reached={{reached}}", flush=True)
"#,
        orch = p.orchestrator,
        bystander = p.bystander
    );
    let scratch = format!(
        r#"
import os
found = 0
for top in [{root:?}, "/tmp", os.path.dirname(os.getcwd())]:
    for root, dirs, files in os.walk(top):
        for name in files:
            try:
                with open(os.path.join(root, name), errors="replace") as f:
                    text = f.read(4096)
            except OSError:
                continue
            if "-".join(["peer", "scratch", ""]) in text:  # built at run time: not in its own source or .pyc
                found += 1
                print("LEAKED", text, flush=True)
print(f"KREFINE_PROBE scratch found={{found}}", flush=True)
"#,
        root = p.scratch_root.display().to_string()
    );
    [
        ("env", env),
        ("runlog", runlog),
        ("cache", cache),
        ("net", net),
        ("kill", kill),
        ("scratch", scratch),
    ]
    .into_iter()
    .map(|(name, attack)| (name, format!("# hostile: {name}\n{attack}{HONEST_MODEL}")))
    .collect()
}

fn read_all_files(dir: &Path, out: &mut String) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            read_all_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "log")
            && let Ok(text) = std::fs::read_to_string(&path)
        {
            out.push_str(&text);
        }
    }
}

fn digest_tree(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read build dir").flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            } else if let Ok(bytes) = std::fs::read(e.path()) {
                files.push((e.path(), bytes));
            }
        }
    }
    files.sort();
    files
}

fn probe_lines(text: &str, hole: &str) -> Vec<String> {
    let prefix = format!("KREFINE_PROBE {hole} ");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

/// A run directory with its log and config, which no candidate may change; returns the log.
fn run_dir_under_attack(run_dir: &Path) -> PathBuf {
    std::fs::create_dir_all(run_dir.join("logs")).expect("run dir");
    let events = run_dir.join("events.jsonl");
    std::fs::write(&events, "{\"original\": true}\n").expect("events");
    std::fs::write(run_dir.join("config.toml"), "[run]\n").expect("config");
    events
}

/// The device the test evaluates on: a GPU with `KREFINE_TEST_DEVICE=gpu`, else the CPU.
fn test_device() -> DeviceId {
    match std::env::var("KREFINE_TEST_DEVICE").as_deref() {
        Ok("gpu") => DeviceId::Gpu(0),
        _ => DeviceId::Cpu,
    }
}

/// The pool's settings on `device` alone.
fn settings_on(
    device: &DeviceId,
    python: PathBuf,
    harness: PathBuf,
    work: &Path,
    cache: &Path,
) -> WorkerSettings {
    let mut settings = cpu_settings(python, harness, work, cache);
    settings.devices = vec![device.clone()];
    if matches!(device, DeviceId::Gpu(_)) {
        // A GPU candidate process needs its CUDA context (a spawned one 4-9 s, seen on the H100)
        // before anything is timed; the CPU-sized 10 s made an honest run a Timeout there.
        settings.timeouts.execute_s = 120.0;
        settings.timeouts.load_s = 120.0;
    }
    settings
}

/// A process of the same user outside the sandbox (the user's shell, say) that holds the secret
/// too and notes any SIGCONT it gets in the file returned with it.
async fn start_bystander(python: &Path, dir: &Path) -> (std::process::Child, PathBuf) {
    let flag = dir.join("bystander-signalled");
    let ready = dir.join("bystander-ready");
    let bystander = std::process::Command::new(python)
        .args([
            "-c",
            &format!(
                "import signal, time\nsignal.signal(signal.SIGCONT, lambda *a: open({:?}, 'w').write('hit'))\nopen({:?}, 'w').write('ready')\ntime.sleep(600)",
                flag.display().to_string(),
                ready.display().to_string()
            ),
        ])
        .spawn()
        .expect("bystander");
    for _ in 0..200 {
        if ready.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready.exists(), "bystander did not start");
    (bystander, flag)
}

/// What every worker and candidate wrote (`seen`): each attack ran in both workers, and found
/// nothing: no secret, no write to the run log, no connection, no signal outside.
fn assert_no_hole_in(seen: &str, secret: &str) {
    for hole in ["env", "runlog", "net", "kill", "scratch"] {
        assert!(
            seen.matches(&format!("KREFINE_PROBE {hole} ")).count() >= 2,
            "{hole}: the attack did not also run in the evaluation worker"
        );
    }
    assert!(!seen.contains(secret), "the orchestrator's secret leaked");
    assert!(
        !seen.contains("LEAKED"),
        "a hostile candidate found something"
    );
    assert!(!seen.contains("runlog wrote=1") && !seen.contains("runlog wrote=2"));
    assert!(!seen.contains("net connected=1"));
    let reached: Vec<&str> = seen
        .lines()
        .filter(|l| l.contains("kill reached "))
        .collect();
    assert!(
        reached.is_empty(),
        "a signal reached a process outside: {reached:?}"
    );
}

/// Whether anything connected to `listener` (non-blocking) so far.
fn accepted_any(listener: &std::net::TcpListener) -> bool {
    let mut accepted = false;
    loop {
        match listener.accept() {
            Ok((mut s, _)) => {
                let mut buf = Vec::new();
                let _ = s.read_to_end(&mut buf);
                accepted = true;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(_) => break,
        }
    }
    accepted
}

#[test]
#[allow(
    unsafe_code,
    reason = "std::env::set_var is unsafe: it runs before any other thread"
)]
fn hostile_candidates_find_no_hole_and_honest_ones_pass() {
    let secret = format!("sk-sandbox-{}-must-not-leak", std::process::id());
    // SAFETY: the only test of this binary, before any other thread exists.
    unsafe {
        std::env::set_var("KREFINE_SANDBOX_TEST_SECRET", &secret);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let tmp = tempfile::tempdir().expect("tempdir");
        let work = tmp.path().join("work");
        let run_dir = tmp.path().join("run");
        let events = run_dir_under_attack(&run_dir);
        let python = test_python().await;
        let harness = deployed_harness(tmp.path()).await;
        let cache = work.join("build-cache");
        let device = test_device();
        let settings = settings_on(&device, python.clone(), harness, &work, &cache);
        let eval_worker = match device {
            DeviceId::Gpu(_) => "gpu-0.cow",
            DeviceId::Cpu => "cpu-0.cow",
        };
        let scratch_root = settings.scratch_root.clone();
        let pool = WorkerPool::start(settings).await.expect("pool");
        assert_eq!(
            pool.sandbox_level(),
            &SandboxLevel::Namespaces,
            "this machine allows user namespaces; the sandbox must be on"
        );

        // Another worker's scratch with something private in it.
        let peer = scratch_root.join("compile-7");
        std::fs::create_dir_all(&peer).expect("peer scratch");
        let peer_secret = format!("peer-scratch-{}", std::process::id());
        std::fs::write(peer.join("notes.txt"), &peer_secret).expect("peer file");

        let (mut bystander, flag) = start_bystander(&python, tmp.path()).await;

        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listener");
        listener.set_nonblocking(true).expect("nonblocking");
        let paths = Paths {
            events: events.clone(),
            cache: cache.clone(),
            scratch_root: scratch_root.clone(),
            port: listener.local_addr().expect("addr").port(),
            orchestrator: std::process::id(),
            bystander: bystander.id(),
        };

        let logs = run_dir.join("logs");
        let honest = pool
            .compile(compile_job(HONEST, &logs, "honest"))
            .await
            .expect("workers available");
        assert_eq!(honest.status, CompileStatus::Ok, "{honest:#?}");
        let honest_dir = PathBuf::from(honest.build_dir.clone().expect("build dir"));
        let honest_files = digest_tree(&honest_dir);
        assert!(
            honest_files
                .iter()
                .any(|(p, _)| p.ends_with("candidate.py")),
            "the honest build was published into the cache"
        );

        let mut seen = String::new();
        for (hole, code) in hostile_candidates(&paths) {
            let c = pool
                .compile(compile_job(&code, &logs, hole))
                .await
                .expect("workers available");
            assert_eq!(c.status, CompileStatus::Ok, "{hole}: {c:#?}");
            let compile_log =
                std::fs::read_to_string(c.log_path.clone().expect("log")).expect("compile log");
            let e = pool
                .execute(exec_job(&code, c.build_dir.clone()), &device)
                .await
                .expect("workers available");
            assert_eq!(
                e.verdict,
                Verdict::Correct,
                "{hole}: the hostile candidate's model is honest: {e:#?}"
            );
            assert_eq!(e.env.sandbox.as_deref(), Some("namespaces"), "{hole}");
            if matches!(device, DeviceId::Gpu(_)) {
                assert!(
                    !e.env.device_name.is_empty(),
                    "{hole}: the GPU is visible: {e:#?}"
                );
            }
            // What the import printed in the evaluation worker (its load.log, in the worker's
            // copy-on-write layer, which the next worker start clears).
            read_all_files(&scratch_root.join(eval_worker), &mut seen);
            let h = pool
                .execute(exec_job(HONEST, honest.build_dir.clone()), &device)
                .await
                .expect("workers available");
            assert_eq!(h.verdict, Verdict::Correct, "after {hole}: {h:#?}");
            assert!(h.speedup.is_some_and(|s| s > 0.0), "after {hole}: {h:#?}");

            let probes = probe_lines(&compile_log, hole);
            assert!(
                !probes.is_empty(),
                "{hole}: the attack did not run at import:\n{compile_log}"
            );
            let expect_zero = match hole {
                "env" => "hits=0",
                "runlog" => "wrote=0",
                "net" => "connected=0",
                "kill" => "reached=0",
                "scratch" => "found=0",
                _ => "",
            };
            assert!(
                probes.iter().any(|l| l.contains(expect_zero)),
                "{hole}: hole open at compile time: {probes:?}\n{compile_log}"
            );
            seen.push_str(&compile_log);
            seen.push_str(&format!("{c:?}{e:?}{h:?}"));
        }
        pool.shutdown().await;

        read_all_files(&work.join("workers"), &mut seen);
        assert_no_hole_in(&seen, &secret);
        assert_eq!(
            std::fs::read_to_string(&events).expect("events"),
            "{\"original\": true}\n",
            "the run log was changed"
        );
        assert_eq!(
            digest_tree(&honest_dir),
            honest_files,
            "another candidate's cached build was changed"
        );
        assert!(
            !accepted_any(&listener),
            "a candidate connected to 127.0.0.1"
        );
        assert!(
            !flag.exists(),
            "a candidate signalled a process outside its sandbox"
        );
        let _ = bystander.kill();
        let _ = bystander.wait();
    });
}
