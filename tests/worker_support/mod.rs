//! Shared helpers for the worker integration tests (`tests/worker_*.rs`).
#![allow(dead_code, reason = "each test binary uses a different subset")]
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use krefine::config::Timeouts;
use krefine::services::{CompileJob, DeviceId, ExecJob};
use krefine::types::{Problem, ProblemKey, TaskId};
use krefine::worker::{WorkerSettings, deploy_harness, find_python};

/// The repository: `KREFINE_REPO_ROOT` when set (a test binary copied to another machine, e.g. the
/// GPU procedure in bench/gpu/sandbox.sh), else where it was built.
pub fn repo_root() -> PathBuf {
    match std::env::var_os("KREFINE_REPO_ROOT") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")),
    }
}

/// The Python with torch the tests run workers with: `KREFINE_TEST_PYTHON`, else `.venv/bin/python`
/// in the repository. A test that finds none fails loudly: a worker test that silently skips proves
/// nothing.
pub async fn test_python() -> PathBuf {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("KREFINE_TEST_PYTHON") {
        candidates.push(PathBuf::from(p));
    } else {
        candidates.push(repo_root().join(".venv/bin/python"));
    }
    let mut tried = Vec::new();
    for c in &candidates {
        if !c.exists() {
            tried.push(format!("{} (does not exist)", c.display()));
            continue;
        }
        match find_python(Some(c), None).await {
            Ok(p) => return p,
            Err(e) => tried.push(e.to_string()),
        }
    }
    panic!(
        "no Python with torch for the worker tests; set KREFINE_TEST_PYTHON. Tried: {}",
        tried.join("; ")
    );
}

/// A folder under cargo's per-target temp dir that lives across runs (build caches).
pub fn persistent_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name)
}

pub fn hostile_dir() -> PathBuf {
    repo_root().join("tests/fixtures/hostile")
}

pub fn hostile(name: &str) -> String {
    let path = hostile_dir().join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("fixture {} is missing: {e}", path.display()))
}

pub fn problem_add() -> Arc<Problem> {
    Arc::new(Problem {
        key: ProblemKey {
            level: 1,
            problem_id: 900,
        },
        name: "900_add.py".into(),
        code: hostile("problem_add.py"),
    })
}

pub async fn deployed_harness(work: &Path) -> PathBuf {
    deploy_harness(&work.join("harness"))
        .await
        .expect("deploy harness")
}

/// CPU-only settings sized for tests: few trials, short timeouts where the test needs them.
pub fn cpu_settings(
    python: PathBuf,
    harness: PathBuf,
    work: &Path,
    cache: &Path,
) -> WorkerSettings {
    let mut s = WorkerSettings::new(python, harness, work);
    s.build_cache = cache.to_path_buf();
    s.devices = vec![DeviceId::Cpu];
    s.compile_workers = 1;
    s.correct_trials = 5;
    s.warmup = 1;
    s.timing_trials = 5;
    s.timeouts = Timeouts {
        compile_s: 300.0,
        load_s: 120.0,
        reference_s: 30.0,
        execute_s: 10.0,
        profile_s: 60.0,
    };
    s
}

pub fn compile_job(code: &str, log_dir: &Path, label: &str) -> CompileJob {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    CompileJob {
        task: task(),
        turn: n,
        code: code.to_string(),
        log_path: log_dir.join(format!("{label}-{n}.compile.log")),
    }
}

pub fn exec_job(code: &str, build_dir: Option<String>) -> ExecJob {
    ExecJob {
        task: task(),
        turn: 0,
        problem: problem_add(),
        code: code.to_string(),
        build_dir,
    }
}

fn task() -> TaskId {
    TaskId {
        problem: ProblemKey {
            level: 1,
            problem_id: 900,
        },
        sample: 0,
    }
}

/// True while `pid` names a live (not zombie) process.
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // Field 3 (after the parenthesised command) is the state; Z = zombie (dead, not yet reaped).
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
            .unwrap_or(true),
        Err(_) => false,
    }
}

/// Wait up to `limit` for every pid to be gone; returns the survivors.
pub async fn wait_gone(pids: &[u32], limit: Duration) -> Vec<u32> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let alive: Vec<u32> = pids.iter().copied().filter(|p| pid_alive(*p)).collect();
        if alive.is_empty() || tokio::time::Instant::now() >= deadline {
            return alive;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
