//! Process management against a scripted fake harness (standard library Python only, starts in
//! milliseconds): every way a worker can fail the protocol, and what the pool makes of it.
//!
//! The fake answers like the real harness, but the candidate source chooses its behaviour with a
//! `FAKE:<what>` marker (sticky error, garbage line, wrong id, hang, exit, ...). A `start.txt` file
//! in the fake's folder chooses how it starts (`ok`, `hang`, `exit`).
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

mod worker_support;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use krefine::config::Timeouts;
use krefine::services::{Compiler, DeviceId, Executor};
use krefine::types::{CompileStatus, ExecOutcome, Verdict};
use krefine::worker::{BaselineTable, WorkerError, WorkerPool, WorkerSettings};
use tokio::sync::OnceCell;
use worker_support::*;

const FAKE_HARNESS: &str = r#"
import json, os, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
role = sys.argv[sys.argv.index("--role") + 1]
start = open(os.path.join(HERE, "start.txt")).read().strip()
out = sys.stdout

def send(obj):
    out.write(json.dumps(obj) + "\n")
    out.flush()

print("fake harness starting, role", role, file=sys.stderr, flush=True)
if start == "hang":
    time.sleep(3600)
if start == "exit":
    print("fake harness: cannot start (scripted)", file=sys.stderr, flush=True)
    os._exit(5)
send({"id": 0, "ok": True, "kind": "ready", "role": role, "python": "3.11.7", "torch": "0.0-fake",
      "cuda": None, "cuda_available": False, "device": None, "pid": os.getpid()})

def evaluate(req):
    src = req["candidate"]["source"]
    meta = {"hardware": "fake", "device": req["device"], "pid": os.getpid(),
            "reference_runtime": req["reference_runtime"]}
    sticky = "FAKE:sticky" in src
    return {"id": req["id"], "ok": True, "kind": "evaluate",
            "status": "cuda_error" if sticky else "correct",
            "compiled": not sticky, "correctness": not sticky, "metadata": meta,
            "runtime": -1.0 if sticky else 1.5,
            "runtime_stats": {} if sticky else {"mean": 1.5, "median": 1.4, "std": 0.1, "min": 1.3,
                                                 "max": 1.9, "num_trials": 5},
            "ref_runtime": -1.0 if sticky else 3.0,
            "ref_runtime_stats": {} if sticky else {"mean": 3.0, "median": 3.0, "std": 0.0,
                                                     "min": 3.0, "max": 3.0, "num_trials": 5},
            "ref_runtime_source": None if sticky else "measured",
            "speedup": None if sticky else 2.0,
            "feedback": "fake feedback",
            "env": {"device_name": "fake", "torch": "0.0-fake", "cuda": None, "precision": req["precision"],
                    "mode": req["mode"], "timing_method": "cpu_perf_counter", "grad_mode": "no_grad",
                    "tf32_matmul": False, "tf32_cudnn": True},
            "phases": {"load_s": 0.1, "reference_s": 0.2, "correctness_s": 0.3, "timing_s": 0.4,
                       "ref_timing_s": 0.5},
            "sticky": sticky}

for line in sys.stdin:
    if not line.strip():
        continue
    req = json.loads(line)
    op = req["op"]
    if op == "shutdown":
        send({"id": req["id"], "ok": True, "kind": "shutdown"})
        os._exit(0)
    src = req.get("source") or req.get("candidate", {}).get("source", "")
    code = req.get("problem", {}).get("code", "")
    if op == "evaluate" and "FAKE:slow_reference=" in code:
        # Reference work during an evaluate, announced as the real harness does.
        send({"id": req["id"], "ok": True, "kind": "progress", "reference": "start"})
        time.sleep(float(code.split("FAKE:slow_reference=")[1].split()[0]))
        send({"id": req["id"], "ok": True, "kind": "progress", "reference": "end"})
    if "FAKE:hang" in src:
        time.sleep(3600)
    if "FAKE:flood" in src:
        line = "spam " * 200 + "\n"
        for _ in range(20 * 1024 * 1024 // len(line)):
            sys.stderr.write(line)
        sys.stderr.flush()
    if "FAKE:exit7" in src:
        os._exit(7)
    if "FAKE:kill9" in src:
        os.kill(os.getpid(), 9)
    if "FAKE:garbage" in src:
        out.write("this is not json\n"); out.flush(); continue
    if "FAKE:huge" in src:
        out.write("x" * (17 * 1024 * 1024) + "\n"); out.flush(); continue
    if "FAKE:harness_error" in src:
        send({"id": req["id"], "ok": False, "kind": op, "error": "internal harness error: boom"}); continue
    rid = req["id"] + 100 if "FAKE:wrong_id" in src else req["id"]
    if op == "compile":
        with open(req["log_path"], "w") as f:
            f.write("fake compile log\n")
        send({"id": rid, "ok": True, "kind": "compile", "status": "ok", "error_name": None, "error": None,
              "feedback": "", "log_path": req["log_path"], "duration_s": 0.01})
    elif op == "evaluate":
        resp = evaluate(req)
        resp["id"] = rid
        if "FAKE:wrong_kind" in src:
            resp = {"id": rid, "ok": True, "kind": "shutdown"}
        send(resp)
    elif op == "prepare":
        if "FAKE:slow_reference=" in code:
            time.sleep(float(code.split("FAKE:slow_reference=")[1].split()[0]))
        send({"id": rid, "ok": True, "kind": "prepare", "status": "ready", "seconds": 0.0,
              "tiers": [], "device_bytes": 0, "host_bytes": 0, "parallel_inputs": 0, "feedback": "",
              "done": True, "next": None, "trials_ready": 5, "built": ["trial 1"]})
    elif op == "profile":
        send({"id": rid, "ok": True, "kind": "profile", "status": "ok", "table": "fake table",
              "ncu": None, "note": None, "duration_s": 0.01, "sticky": False})
"#;

static PYTHON: OnceCell<PathBuf> = OnceCell::const_new();

async fn python() -> PathBuf {
    PYTHON.get_or_init(test_python).await.clone()
}

/// A fresh folder with the fake harness (started as `start`) and settings that use it.
async fn fake_setup(start: &str) -> (tempfile::TempDir, WorkerSettings) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let harness = tmp.path().join("harness");
    std::fs::create_dir_all(&harness).expect("harness dir");
    std::fs::write(harness.join("krefine_harness.py"), FAKE_HARNESS).expect("fake harness");
    std::fs::write(harness.join("start.txt"), start).expect("start.txt");
    let work = tmp.path().join("work");
    let cache = work.join("build-cache");
    let mut s = cpu_settings(python().await, harness, &work, &cache);
    s.timeouts = Timeouts {
        compile_s: 2.0,
        load_s: 5.0,
        reference_s: 30.0,
        execute_s: 2.0,
        profile_s: 2.0,
    };
    // The fake worker reports its own pid for the tests to signal, and a sandboxed one would see
    // only its PID namespace's (1). These tests are about the unsandboxed process handling; the
    // sandboxed workers meet the same hangs, crashes and kills in worker_hostile.rs.
    s.sandbox = krefine::worker::sandbox::SandboxMode::Off;
    (tmp, s)
}

async fn fake_pool(start: &str) -> (tempfile::TempDir, Arc<WorkerPool>) {
    let (tmp, s) = fake_setup(start).await;
    let pool = WorkerPool::start(s).await.expect("fake pool starts");
    (tmp, pool)
}

async fn exec(pool: &WorkerPool, code: &str) -> ExecOutcome {
    pool.execute(exec_job(code, None), &DeviceId::Cpu)
        .await
        .unwrap()
}

fn answered_by(e: &ExecOutcome) -> u64 {
    e.metadata
        .get("pid")
        .and_then(|v| v.as_u64())
        .unwrap_or_else(|| panic!("no pid in {e:#?}"))
}

/// A normal request, answered by the worker with pid `answered_by`.
async fn healthy(pool: &WorkerPool) -> u64 {
    let e = exec(pool, "fine").await;
    assert_eq!(e.verdict, Verdict::Correct, "{e:#?}");
    answered_by(&e)
}

#[tokio::test]
async fn response_fields_are_mapped() {
    let (tmp, mut s) = fake_setup("ok").await;
    s.driver = Some("580.159.04".into());
    let baseline_path = tmp.path().join("H100_Modal/baseline_time_torch.json");
    std::fs::create_dir_all(baseline_path.parent().unwrap()).unwrap();
    std::fs::write(
        &baseline_path,
        r#"{"level1": {"900_add.py": {"mean": 2.5, "std": 0.1, "min": 2.4, "max": 2.9, "num_trials": 100}}}"#,
    )
    .unwrap();
    s.baseline = Some(Arc::new(
        BaselineTable::load(&baseline_path).await.expect("baseline"),
    ));
    let pool = WorkerPool::start(s).await.expect("pool");
    let e = exec(&pool, "fine").await;
    assert_eq!(e.verdict, Verdict::Correct);
    assert_eq!(
        (e.runtime_ms, e.ref_runtime_ms, e.speedup),
        (1.5, 3.0, Some(2.0))
    );
    assert_eq!(e.runtime_stats.map(|s| s.median), Some(1.4));
    assert_eq!(e.ref_source.as_deref(), Some("measured"));
    assert_eq!(e.env.driver.as_deref(), Some("580.159.04"));
    assert_eq!(e.env.timing_method.as_deref(), Some("cpu_perf_counter"));
    assert_eq!(e.phases.get("timing_s").and_then(|v| v.as_f64()), Some(0.4));
    assert_eq!(e.device, "cpu");
    let rr = &e.metadata["reference_runtime"];
    assert_eq!(rr["mean"].as_f64(), Some(2.5));
    assert_eq!(rr["num_trials"].as_u64(), Some(100));
    assert_eq!(
        rr["source"].as_str(),
        Some("baseline:H100_Modal/baseline_time_torch.json")
    );
}

#[tokio::test]
async fn sticky_error_replaces_the_worker() {
    let (_tmp, pool) = fake_pool("ok").await;
    let before = healthy(&pool).await;
    let e = exec(&pool, "FAKE:sticky").await;
    assert_eq!(e.verdict, Verdict::CudaError, "{e:#?}");
    assert_eq!(answered_by(&e), before);
    assert!(
        wait_gone(&[before as u32], Duration::from_secs(5))
            .await
            .is_empty()
    );
    let after = healthy(&pool).await;
    assert_ne!(before, after, "a poisoned worker must not serve again");
}

#[tokio::test]
async fn garbage_line_is_a_protocol_crash() {
    let (_tmp, pool) = fake_pool("ok").await;
    let before = healthy(&pool).await;
    let e = exec(&pool, "FAKE:garbage").await;
    assert_eq!(e.verdict, Verdict::Crashed, "{e:#?}");
    assert!(
        e.feedback.starts_with(
            "worker broke the protocol while evaluating (unparseable response line (not JSON"
        ),
        "{}",
        e.feedback
    );
    assert!(e.feedback.contains("this is not json"), "{}", e.feedback);
    assert!(!pid_alive(before as u32));
    assert_ne!(healthy(&pool).await, before);
}

#[tokio::test]
async fn oversized_line_is_a_protocol_crash() {
    let (_tmp, pool) = fake_pool("ok").await;
    let e = exec(&pool, "FAKE:huge").await;
    assert_eq!(e.verdict, Verdict::Crashed, "{e:#?}");
    assert!(e.feedback.contains("longer than"), "{}", e.feedback);
    healthy(&pool).await;
}

#[tokio::test]
async fn wrong_id_and_wrong_kind_are_protocol_crashes() {
    let (_tmp, pool) = fake_pool("ok").await;
    let e = exec(&pool, "FAKE:wrong_id").await;
    assert_eq!(e.verdict, Verdict::Crashed, "{e:#?}");
    assert!(
        e.feedback.contains("does not match request id"),
        "{}",
        e.feedback
    );
    let e = exec(&pool, "FAKE:wrong_kind").await;
    assert_eq!(e.verdict, Verdict::Crashed, "{e:#?}");
    assert!(
        e.feedback
            .contains("`evaluate` request answered with a `shutdown`"),
        "{}",
        e.feedback
    );
    healthy(&pool).await;
}

#[tokio::test]
async fn harness_error_keeps_the_worker() {
    let (_tmp, pool) = fake_pool("ok").await;
    let before = healthy(&pool).await;
    let e = exec(&pool, "FAKE:harness_error").await;
    assert_eq!(e.verdict, Verdict::RuntimeError, "{e:#?}");
    assert_eq!(
        e.metadata.get("other_error").and_then(|v| v.as_str()),
        Some("internal harness error: boom")
    );
    assert_eq!(
        healthy(&pool).await,
        before,
        "ok:false must not cost a respawn"
    );
}

#[tokio::test]
async fn exit_code_and_outside_sigkill() {
    let (_tmp, pool) = fake_pool("ok").await;
    let e = exec(&pool, "FAKE:exit7").await;
    assert_eq!(e.verdict, Verdict::Crashed, "{e:#?}");
    assert!(
        e.feedback
            .starts_with("worker exited with exit code 7 while evaluating"),
        "{}",
        e.feedback
    );
    // The worker log's last lines come with it (the fake's start-up line is on stderr).
    assert!(
        e.feedback.contains("fake harness starting"),
        "{}",
        e.feedback
    );
    let e = exec(&pool, "FAKE:kill9").await;
    assert_eq!(e.verdict, Verdict::OutOfMemory, "{e:#?}");
    assert!(
        e.feedback.contains("signal 9 (SIGKILL)") && e.feedback.contains("out-of-memory"),
        "{}",
        e.feedback
    );
    healthy(&pool).await;
}

/// A device whose worker died with its request and on which no worker starts any more is lost:
/// the request gets no verdict (the engine moves it to another device), the device reads as
/// retired, and later requests on it are refused without a start.
#[tokio::test]
async fn a_device_on_which_no_worker_starts_any_more_is_lost_not_a_verdict() {
    let (tmp, pool) = fake_pool("ok").await;
    healthy(&pool).await;
    assert!(!pool.retired(&DeviceId::Cpu));
    std::fs::write(tmp.path().join("harness/start.txt"), "exit").unwrap();
    let e = pool
        .execute(exec_job("FAKE:exit7", None), &DeviceId::Cpu)
        .await
        .unwrap_err();
    assert!(
        e.0.contains("no worker starts on the device any more (2 start(s) in a row failed")
            && e.0.contains("the device is retired"),
        "{e}"
    );
    assert!(pool.retired(&DeviceId::Cpu));
    // The device stays lost even once a worker could start again.
    std::fs::write(tmp.path().join("harness/start.txt"), "ok").unwrap();
    let e = pool
        .execute(exec_job("fine", None), &DeviceId::Cpu)
        .await
        .unwrap_err();
    assert!(e.0.contains("retired"), "{e}");
}

#[tokio::test]
async fn hang_times_out_with_kernelbench_metadata() {
    let (_tmp, pool) = fake_pool("ok").await;
    let before = healthy(&pool).await;
    let t = Instant::now();
    let e = exec(&pool, "FAKE:hang").await;
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(e.verdict, Verdict::Timeout, "{e:#?}");
    assert_eq!(e.feedback, "evaluation exceeded 2 s; the worker was killed");
    assert_eq!(
        e.metadata.get("error").and_then(|v| v.as_str()),
        Some("Evaluation timed out")
    );
    assert!(!e.compiled);
    assert!(e.wall_ms >= 2000);
    // The wall time is explained: the part spent on the reference is given with a failure too.
    assert!(
        e.phases.get("reference_s").is_some_and(|v| v.is_f64()),
        "{:?}",
        e.phases
    );
    assert!(!pid_alive(before as u32), "the hung worker must be killed");
    assert_ne!(healthy(&pool).await, before);
}

fn slow_reference_job(seconds: f64) -> krefine::services::ExecJob {
    let mut job = exec_job("fine", None);
    let mut problem = (*job.problem).clone();
    problem.code = format!("# FAKE:slow_reference={seconds} \n{}", problem.code);
    job.problem = Arc::new(problem);
    job
}

#[tokio::test]
async fn building_the_reference_is_not_charged_to_the_candidate() {
    // Reference work announced during the evaluate takes longer than a candidate may take
    // (execute_s = 2): it runs on the reference's allowance instead.
    let (_tmp, pool) = fake_pool("ok").await;
    let e = pool
        .execute(slow_reference_job(3.0), &DeviceId::Cpu)
        .await
        .unwrap();
    assert_eq!(e.verdict, Verdict::Correct, "{e:#?}");
    assert!(
        e.wall_ms >= 3000,
        "wall covers the whole request: {}",
        e.wall_ms
    );
}

#[tokio::test]
async fn a_candidate_still_gets_only_its_own_time_after_reference_work() {
    // Reference work first (not charged), then a hanging candidate: killed at execute_s as usual.
    let (_tmp, pool) = fake_pool("ok").await;
    let mut job = slow_reference_job(1.0);
    job.code = "FAKE:hang".into();
    let e = pool.execute(job, &DeviceId::Cpu).await.unwrap();
    assert_eq!(e.verdict, Verdict::Timeout, "{e:#?}");
    assert_eq!(e.feedback, "evaluation exceeded 2 s; the worker was killed");
    assert!(
        e.phases.get("reference_s").is_some_and(|v| v.is_f64()),
        "{:?}",
        e.phases
    );
    healthy(&pool).await;
}

#[tokio::test]
async fn a_prepare_step_reports_what_it_built() {
    let (_tmp, pool) = fake_pool("ok").await;
    assert!(pool.prepares_reference());
    let o = pool
        .prepare_reference(problem_add(), &DeviceId::Cpu, true)
        .await
        .unwrap();
    assert_eq!(o.status, krefine::types::PrepareStatus::Ready, "{o:#?}");
    assert_eq!(
        (o.built, o.trials_ready, o.done),
        (vec!["trial 1".to_string()], 5, true)
    );
    // A step that times out is a failed step (the worker is replaced), not an outage.
    let (_tmp, mut s) = fake_setup("ok").await;
    s.timeouts.reference_s = 1.0;
    let pool = WorkerPool::start(s).await.expect("pool");
    let o = pool
        .prepare_reference(slow_reference_job(60.0).problem, &DeviceId::Cpu, true)
        .await
        .unwrap();
    assert_eq!(o.status, krefine::types::PrepareStatus::Failed, "{o:#?}");
    assert!(
        o.error
            .as_deref()
            .is_some_and(|e| e.contains("eval.timeouts.reference_s")),
        "{o:#?}"
    );
    healthy(&pool).await;
}

#[tokio::test]
async fn reference_timeout_is_a_reference_error_not_the_candidates() {
    let (_tmp, mut s) = fake_setup("ok").await;
    s.timeouts.reference_s = 1.0;
    let pool = WorkerPool::start(s).await.expect("pool");
    let before = healthy(&pool).await;
    let t = Instant::now();
    let e = pool
        .execute(slow_reference_job(60.0), &DeviceId::Cpu)
        .await
        .unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(e.verdict, Verdict::ReferenceError, "{e:#?}");
    assert!(
        e.feedback
            .starts_with("preparing the reference (its inputs, outputs and timing) exceeded 1 s")
            && e.feedback.contains("eval.timeouts.reference_s"),
        "{}",
        e.feedback
    );
    assert_eq!(
        e.metadata
            .get("reference_timeout_s")
            .and_then(|v| v.as_f64()),
        Some(1.0)
    );
    assert!(!pid_alive(before as u32), "the worker must be killed");
    assert_ne!(healthy(&pool).await, before);
}

#[tokio::test]
async fn compile_timeout_and_log_note() {
    let (tmp, pool) = fake_pool("ok").await;
    let logs = tmp.path().join("logs");
    let c = pool
        .compile(compile_job("FAKE:hang", &logs, "hang"))
        .await
        .unwrap();
    assert_eq!(c.status, CompileStatus::Timeout, "{c:#?}");
    assert_eq!(
        c.error.as_deref(),
        Some("compilation exceeded 2 s; the worker was killed")
    );
    let log = std::fs::read_to_string(c.log_path.as_deref().expect("log")).expect("log");
    assert!(log.contains("compilation exceeded 2 s"), "{log}");
    // The next compile gets a fresh worker and succeeds, and a failed build is never cached.
    let ok = pool
        .compile(compile_job("fine", &logs, "fine"))
        .await
        .unwrap();
    assert_eq!(ok.status, CompileStatus::Ok, "{ok:#?}");
    let again = pool
        .compile(compile_job("FAKE:hang", &logs, "hang"))
        .await
        .unwrap();
    assert!(!again.cached);
}

#[tokio::test]
async fn workers_recycle_after_n_requests() {
    let (_tmp, mut s) = fake_setup("ok").await;
    s.recycle_after = 2;
    let pool = WorkerPool::start(s).await.expect("pool");
    let a = healthy(&pool).await;
    let b = healthy(&pool).await;
    let c = healthy(&pool).await;
    assert_eq!(a, b);
    assert_ne!(b, c, "the third request must be served by a new worker");
    assert!(
        wait_gone(&[a as u32], Duration::from_secs(5))
            .await
            .is_empty(),
        "the recycled worker must exit"
    );
}

#[tokio::test]
async fn start_failures_are_precise() {
    let (_tmp, mut s) = fake_setup("hang").await;
    s.timeouts.load_s = 1.0;
    let err = WorkerPool::start(s).await.expect_err("must not start");
    let msg = err.to_string();
    assert!(matches!(err, WorkerError::Start { .. }), "{msg}");
    assert!(msg.contains("no `ready` within 1 s"), "{msg}");

    let (_tmp, s) = fake_setup("exit").await;
    let err = WorkerPool::start(s)
        .await
        .expect_err("must not start")
        .to_string();
    assert!(
        err.contains("exited with exit code 5 before it was ready"),
        "{err}"
    );
    assert!(
        err.contains("cannot start (scripted)"),
        "log tail expected: {err}"
    );

    let (_tmp, mut s) = fake_setup("ok").await;
    s.python = PathBuf::from("/nonexistent/python3");
    let err = WorkerPool::start(s)
        .await
        .expect_err("must not start")
        .to_string();
    assert!(err.contains("/nonexistent/python3"), "{err}");
}

#[tokio::test]
async fn cancelled_request_kills_the_worker() {
    let (_tmp, pool) = fake_pool("ok").await;
    let before = healthy(&pool).await;
    // Drop the evaluation half-way (as the engine does when a run is cancelled).
    let r = tokio::time::timeout(Duration::from_millis(500), exec(&pool, "FAKE:hang")).await;
    assert!(r.is_err(), "the hang should still be running");
    assert!(
        wait_gone(&[before as u32], Duration::from_secs(5))
            .await
            .is_empty(),
        "a worker abandoned mid-request must be killed"
    );
    assert_ne!(healthy(&pool).await, before);
}

#[tokio::test]
async fn shutdown_stops_everything_and_refuses_later_work() {
    let (tmp, pool) = fake_pool("ok").await;
    healthy(&pool).await;
    let pids = pool.worker_pids().await;
    assert_eq!(pids.len(), 2);
    pool.shutdown().await;
    assert!(wait_gone(&pids, Duration::from_secs(5)).await.is_empty());
    // Not the candidate's fault: no verdict, the turn is left for a resume.
    let e = pool
        .execute(exec_job("fine", None), &DeviceId::Cpu)
        .await
        .unwrap_err();
    assert!(e.0.contains("shut down"), "{e}");
    let c = pool
        .compile(compile_job("fine", &tmp.path().join("logs"), "late"))
        .await
        .unwrap_err();
    assert!(c.0.contains("shut down"), "{c}");
}

#[tokio::test]
async fn unknown_device_is_refused() {
    let (_tmp, pool) = fake_pool("ok").await;
    let e = pool
        .execute(exec_job("fine", None), &DeviceId::Gpu(3))
        .await
        .unwrap_err();
    assert!(e.0.contains("cuda:3"), "{e}");
    let p = pool
        .profile(exec_job("fine", None), &DeviceId::Cpu)
        .await
        .unwrap();
    assert!(p.ok && p.table == "fake table", "{p:#?}");
}

#[tokio::test]
async fn worker_logs_live_in_the_log_dir() {
    let (tmp, pool) = fake_pool("ok").await;
    healthy(&pool).await;
    let dir: &Path = &tmp.path().join("work/workers");
    for name in ["compile-0.log", "cpu-0.log"] {
        let text = std::fs::read_to_string(dir.join(name)).expect(name);
        assert!(text.contains("fake harness starting"), "{name}: {text}");
    }
}

#[tokio::test]
async fn shutdown_during_a_request_is_reported_as_shutdown() {
    let (_tmp, pool) = fake_pool("ok").await;
    healthy(&pool).await;
    let busy = {
        let pool = Arc::clone(&pool);
        tokio::spawn(async move {
            pool.execute(exec_job("FAKE:hang", None), &DeviceId::Cpu)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    pool.shutdown().await;
    let e = busy.await.expect("task");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    // Not the candidate's doing: no verdict, the turn waits for a resume.
    let e = e.unwrap_err();
    assert_eq!(e.0, "the worker pool was shut down");
}

#[tokio::test]
async fn a_worker_that_died_while_idle_is_not_blamed_on_the_next_candidate() {
    let (_tmp, pool) = fake_pool("ok").await;
    let before = healthy(&pool).await;
    // Killed from outside between requests (the OOM killer, an operator).
    krefine::worker::process::kill_group(before as u32);
    assert!(
        wait_gone(&[before as u32], Duration::from_secs(5))
            .await
            .is_empty()
    );
    let after = healthy(&pool).await;
    assert_ne!(before, after);
}

/// An LLM that answers every turn of problem 1 with a build that hangs and every other one with a
/// candidate that builds at once.
struct TwoCandidates;

#[async_trait::async_trait]
impl krefine::services::Llm for TwoCandidates {
    fn describe(&self) -> String {
        "two candidates".into()
    }
    async fn complete(
        &self,
        req: krefine::types::LlmRequest,
        _sink: &krefine::services::EventSink,
    ) -> Result<krefine::types::LlmAnswer, krefine::services::LlmError> {
        let body = if req.task.problem.problem_id == 1 {
            "FAKE:hang"
        } else {
            "fine"
        };
        Ok(krefine::types::LlmAnswer {
            content: format!("```python\n# {body}\nclass ModelNew: pass\n```"),
            usage: None,
            cost_usd: None,
            model: "two".into(),
            finish_reason: None,
            latency_ms: 0,
            attempts: 1,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_build_does_not_hold_cpu_timing_back() {
    use krefine::engine::{Engine, EngineParts, RunPlan};
    use krefine::types::{Event, FeedbackMode, MethodKind, Problem, ProblemKey};

    let (tmp, mut s) = fake_setup("ok").await;
    s.compile_workers = 2;
    // Long enough that waiting for the hung build (the old way) cannot pass this test.
    s.timeouts.compile_s = 30.0;
    s.timeouts.execute_s = 30.0;
    let pool = WorkerPool::start(s).await.expect("fake pool starts");
    let problems = (1..=2)
        .map(|i| {
            Arc::new(Problem {
                key: ProblemKey {
                    level: 1,
                    problem_id: i,
                },
                name: format!("{i}_P.py"),
                code: "class Model: pass\n".into(),
            })
        })
        .collect();
    let plan = RunPlan {
        run: "pause".into(),
        method: MethodKind::OneShot,
        feedback: FeedbackMode::GE,
        turns: 1,
        samples: 1,
        problems,
        simulated: false,
    };
    let parts = EngineParts {
        llm: Arc::new(TwoCandidates),
        compiler: pool.clone(),
        executor: pool.clone(),
        devices: vec![krefine::gpu::DeviceInfo::cpu()],
        prompts: krefine::prompt::Prompts::load(None).unwrap(),
        prompt_settings: krefine::prompt::PromptSettings::default(),
        llm_concurrency: 2,
        compile_workers: 2,
        cpu_budget: None,
        prepare_ahead: 0,
        host_locks: None,
    };
    let dir = krefine::store::RunDir::create(&tmp.path().join("run"), "").unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    let engine = Engine::prepare(plan, parts, dir, None, false, cancel.clone())
        .await
        .unwrap();
    let mut bus = engine.subscribe();
    let run = tokio::spawn(engine.run());

    // Problem 2's candidate is timed while problem 1's build still hangs.
    let mut seen = Vec::new();
    loop {
        let rec = tokio::time::timeout(Duration::from_secs(120), bus.recv())
            .await
            .expect("the run goes on")
            .expect("bus open");
        let problem = rec.task.map(|t| t.problem.problem_id);
        seen.push((problem, rec.event.kind()));
        if let Event::Executed { outcome, .. } = &rec.event {
            assert_eq!(problem, Some(2), "{seen:?}");
            assert_eq!(outcome.verdict, Verdict::Correct, "{outcome:#?}");
            break;
        }
    }
    assert!(
        !seen.contains(&(Some(1), "compiled")),
        "the hung build ended before the other candidate was timed: {seen:?}"
    );
    assert_eq!(
        pool.build_pauses(),
        1,
        "the builds were paused for the timing"
    );

    // After the lease the hung build runs again (continued, not left stopped).
    let pids = pool.worker_pids().await;
    let stopped = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, r)| r.trim_start().starts_with('T'))
            })
            .unwrap_or(false)
    };
    let t = Instant::now();
    while pids.iter().any(stopped) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "a worker stayed stopped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    cancel.cancel();
    let summary = run.await.unwrap().unwrap();
    assert_eq!(summary.finished, 1);
    pool.shutdown().await;
}

#[tokio::test]
async fn a_print_flood_is_capped_per_request_in_the_worker_log() {
    let (tmp, pool) = fake_pool("ok").await;
    healthy(&pool).await;
    let log = tmp.path().join("work/workers/cpu-0.log");
    for round in 1..=2u64 {
        // 20 MiB on stderr, then a normal answer.
        let e = exec(&pool, "FAKE:flood").await;
        assert_eq!(e.verdict, Verdict::Correct, "{e:#?}");
        // The pump writes asynchronously; a normal request afterwards orders us behind it.
        healthy(&pool).await;
        let size = std::fs::metadata(&log).unwrap().len();
        let cap = krefine::worker::process::LOG_BYTES_PER_REQUEST;
        assert!(
            size <= round * (cap + 4096) + 64 * 1024,
            "round {round}: {size} bytes"
        );
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        text.matches("MiB of output in one request; the rest of it is dropped")
            .count(),
        2
    );
}

/// A process's niceness, from `/proc/<pid>/stat` (field 19).
fn nice_of(pid: u32) -> i64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // After the command's closing parenthesis the fields start at field 3 (the state).
    let after = &stat[stat.rfind(')').unwrap() + 1..];
    after
        .split_whitespace()
        .nth(19 - 3)
        .unwrap()
        .parse()
        .unwrap()
}

/// Builds yield the cores to timings and to input makers: the compile worker runs at niceness 15 (or
/// its parent's, when that is nicer already; input makers at 10, `input_store`), the evaluation
/// worker at its parent's.
#[tokio::test]
async fn compile_workers_run_nicer_than_evaluation_workers() {
    let (_tmp, pool) = fake_pool("ok").await;
    healthy(&pool).await;
    // Compile workers first, then evaluation workers.
    let pids = pool.worker_pids().await;
    assert_eq!(pids.len(), 2);
    let own = nice_of(std::process::id());
    assert_eq!(nice_of(pids[0]), own.max(15), "the compile worker");
    assert_eq!(nice_of(pids[1]), own, "the evaluation worker");
}
