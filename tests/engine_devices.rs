//! Several devices of one host, through the whole engine with real worker processes on CPU: the
//! device workers run a scripted stand-in harness (standard library Python, started with
//! `CUDA_VISIBLE_DEVICES=<i>` exactly as a GPU's worker is), the input store runs the real
//! `kb_store.py`. Files in the harness folder script each device (`<flag>-<index>`):
//!
//! - `lose-<i>`: the device's next evaluate or prepare kills its worker and leaves `lost-<i>`;
//! - `lost-<i>`: no worker starts on the device any more (the device is gone);
//! - `hold-<i>`: the device's evaluates wait until some device is lost (so that the other device
//!   is certainly the one a waiting candidate gets).
//!
//! Every request a device's worker gets is noted in `requests-<i>.jsonl` (operation, problem, the
//! store entry it was pointed at).
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

mod worker_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use krefine::config::Timeouts;
use krefine::engine::{Engine, EngineParts, RunPlan, RunSummary};
use krefine::gpu::DeviceInfo;
use krefine::services::{DeviceId, EventSink, Llm, LlmError};
use krefine::store::{ReadLog, RunDir, read_log};
use krefine::types::{
    Event, FeedbackMode, LlmAnswer, LlmRequest, LogRecord, MethodKind, Problem, ProblemKey, TaskId,
    Verdict,
};
use krefine::worker::{WorkerPool, WorkerSettings};
use worker_support::*;

const FAKE_HARNESS: &str = r#"
import json, os, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
role = sys.argv[sys.argv.index("--role") + 1]
dev = os.environ.get("CUDA_VISIBLE_DEVICES", "")
out = sys.stdout

def flag(name):
    return os.path.exists(os.path.join(HERE, name + "-" + dev))

def send(obj):
    out.write(json.dumps(obj) + "\n")
    out.flush()

if role == "gpu" and flag("lost"):
    print("fake harness: the device is gone (scripted)", file=sys.stderr, flush=True)
    os._exit(5)
try:
    from importlib.metadata import version
    torch = version("torch")
except Exception:
    torch = "0.0-fake"
send({"id": 0, "ok": True, "kind": "ready", "role": role, "python": "3.11.7", "torch": torch,
      "cuda": None, "cuda_available": False, "device": None, "pid": os.getpid()})

def note(req):
    if role != "gpu":
        return
    with open(os.path.join(HERE, "requests-" + dev + ".jsonl"), "a") as f:
        f.write(json.dumps({"op": req["op"], "problem": req["problem"]["key"],
                            "stored": req.get("stored_inputs")}) + "\n")

def lose():
    if flag("lose"):
        os.remove(os.path.join(HERE, "lose-" + dev))
        open(os.path.join(HERE, "lost-" + dev), "w").close()
        os._exit(3)

def evaluate(req):
    correct = "FAKE:incorrect" not in req["candidate"]["source"]
    stats = {"mean": 1.5, "median": 1.5, "std": 0.0, "min": 1.5, "max": 1.5, "num_trials": 5}
    ref = {"mean": 3.0, "median": 3.0, "std": 0.0, "min": 3.0, "max": 3.0, "num_trials": 5}
    return {"id": req["id"], "ok": True, "kind": "evaluate",
            "status": "correct" if correct else "incorrect",
            "compiled": True, "correctness": correct,
            "metadata": {"hardware": "fake", "device": req["device"]},
            "runtime": 1.5 if correct else -1.0, "runtime_stats": stats if correct else {},
            "ref_runtime": 3.0 if correct else -1.0, "ref_runtime_stats": ref if correct else {},
            "ref_runtime_source": "measured" if correct else None,
            "speedup": 2.0 if correct else None, "feedback": "fake feedback",
            "env": {"device_name": "fake", "torch": torch, "cuda": None, "precision": req["precision"],
                    "mode": req["mode"], "timing_method": "cpu_perf_counter", "grad_mode": "no_grad",
                    "tf32_matmul": False, "tf32_cudnn": True},
            "phases": {"load_s": 0.01, "reference_s": 0.0, "correctness_s": 0.01, "timing_s": 0.01,
                       "ref_timing_s": 0.0}, "sticky": False}

for line in sys.stdin:
    if not line.strip():
        continue
    req = json.loads(line)
    op = req["op"]
    if op == "shutdown":
        send({"id": req["id"], "ok": True, "kind": "shutdown"})
        os._exit(0)
    if op == "compile":
        with open(req["log_path"], "w") as f:
            f.write("fake compile log\n")
        send({"id": req["id"], "ok": True, "kind": "compile", "status": "ok", "error_name": None,
              "error": None, "feedback": "", "log_path": req["log_path"], "duration_s": 0.01})
        continue
    note(req)
    lose()
    if op == "evaluate":
        if flag("hold"):
            deadline = time.time() + 60
            while time.time() < deadline and not any(n.startswith("lost-") for n in os.listdir(HERE)):
                time.sleep(0.05)
        send(evaluate(req))
    elif op == "prepare":
        send({"id": req["id"], "ok": True, "kind": "prepare", "status": "ready", "seconds": 0.0,
              "tiers": [], "device_bytes": 0, "host_bytes": 0, "parallel_inputs": 0, "feedback": "",
              "done": True, "next": None, "trials_ready": 5, "built": ["trial 1"]})
    elif op == "profile":
        send({"id": req["id"], "ok": True, "kind": "profile", "status": "ok", "table": "fake table",
              "ncu": None, "note": None, "duration_s": 0.01, "sticky": False})
"#;

fn gpu(i: u32) -> DeviceInfo {
    DeviceInfo {
        id: DeviceId::Gpu(i),
        name: format!("fake GPU {i}"),
        capability: None,
        total_memory_bytes: None,
    }
}

/// The real harness (for `kb_store.py`) with the device workers' entry point replaced by the fake.
async fn setup(tmp: &Path, flags: &[&str]) -> (PathBuf, WorkerSettings) {
    let harness = deployed_harness(tmp).await;
    std::fs::write(harness.join("krefine_harness.py"), FAKE_HARNESS).expect("fake harness");
    for f in flags {
        std::fs::write(harness.join(f), "").expect("flag");
    }
    let work = tmp.join("work");
    let mut s = cpu_settings(
        test_python().await,
        harness.clone(),
        &work,
        &work.join("build-cache"),
    );
    s.devices = vec![DeviceId::Gpu(0), DeviceId::Gpu(1)];
    s.visible_devices = None;
    s.sandbox = krefine::worker::sandbox::SandboxMode::Off;
    s.timeouts = Timeouts {
        compile_s: 30.0,
        load_s: 20.0,
        reference_s: 120.0,
        execute_s: 120.0,
        profile_s: 30.0,
    };
    (harness, s)
}

/// Sample 0 answers a correct candidate, sample 1 an incorrect one; with a gate, answers wait until
/// it opens.
struct Answers {
    gate: Option<watch::Receiver<bool>>,
}

#[async_trait::async_trait]
impl Llm for Answers {
    fn describe(&self) -> String {
        "scripted answers".into()
    }

    async fn complete(&self, req: LlmRequest, _sink: &EventSink) -> Result<LlmAnswer, LlmError> {
        if let Some(gate) = &self.gate {
            let mut gate = gate.clone();
            let wait = std::time::Duration::from_secs(120);
            if !matches!(
                tokio::time::timeout(wait, gate.wait_for(|open| *open)).await,
                Ok(Ok(_))
            ) {
                return Err(LlmError::Failed("the gate never opened".into()));
            }
        }
        let marker = if req.task.sample == 0 {
            "FAKE:correct"
        } else {
            "FAKE:incorrect"
        };
        Ok(LlmAnswer {
            content: format!(
                "```python\nimport torch\n\n\nclass ModelNew(torch.nn.Module):\n    pass  # {marker}\n```"
            ),
            usage: None,
            cost_usd: None,
            model: "scripted".into(),
            finish_reason: None,
            latency_ms: 0,
            attempts: 1,
        })
    }
}

fn problems(n: u32) -> Vec<Arc<Problem>> {
    let base = problem_add();
    (0..n)
        .map(|i| {
            Arc::new(Problem {
                key: ProblemKey {
                    level: 1,
                    problem_id: 900 + i,
                },
                name: format!("{}_add.py", 900 + i),
                code: format!("{}\n# problem {i}\n", base.code),
            })
        })
        .collect()
}

struct Run {
    problems: u32,
    prepare_ahead: usize,
    /// Open the LLM's gate once this says so about a logged record.
    open_when: Option<fn(&LogRecord, &mut Vec<String>) -> bool>,
}

async fn run(
    pool: &Arc<WorkerPool>,
    root: &Path,
    prior: Option<ReadLog>,
    how: &Run,
) -> (RunSummary, Vec<LogRecord>) {
    let plan = RunPlan {
        run: "devices".into(),
        method: MethodKind::OneShot,
        feedback: FeedbackMode::GE,
        turns: 1,
        samples: 2,
        problems: problems(how.problems),
        simulated: false,
    };
    let (open, gate) = watch::channel(false);
    let parts = EngineParts {
        llm: Arc::new(Answers {
            gate: how.open_when.map(|_| gate),
        }),
        compiler: pool.clone(),
        executor: pool.clone(),
        devices: vec![gpu(0), gpu(1)],
        prompts: krefine::prompt::Prompts::load(None).unwrap(),
        prompt_settings: krefine::prompt::PromptSettings::default(),
        llm_concurrency: 8,
        compile_workers: 1,
        prepare_ahead: how.prepare_ahead,
        host_locks: None,
        cpu_budget: None,
    };
    let dir = match prior {
        Some(_) => RunDir::open(root).unwrap(),
        None => RunDir::create(root, "").unwrap(),
    };
    let events = dir.events_path();
    let engine = Engine::prepare(plan, parts, dir, prior, false, CancellationToken::new())
        .await
        .unwrap();
    if let Some(open_when) = how.open_when {
        let mut bus = engine.subscribe();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Ok(rec) = bus.recv().await {
                if open_when(&rec, &mut seen) {
                    let _ = open.send(true);
                }
            }
        });
    }
    let summary = engine.run().await.unwrap();
    (summary, read_log(&events).unwrap().records)
}

/// (verdict, speedup, device) of every task's executed turn.
fn verdicts(log: &[LogRecord]) -> BTreeMap<TaskId, (Verdict, Option<f64>, String)> {
    log.iter()
        .filter_map(|r| match (&r.task, &r.event) {
            (Some(t), Event::Executed { outcome, .. }) => {
                assert!(outcome.verdict != Verdict::Crashed, "{outcome:#?}");
                Some((
                    *t,
                    (outcome.verdict, outcome.speedup, outcome.device.clone()),
                ))
            }
            _ => None,
        })
        .collect()
}

fn expected(t: &TaskId) -> (Verdict, Option<f64>) {
    if t.sample == 0 {
        (Verdict::Correct, Some(2.0))
    } else {
        (Verdict::Incorrect, None)
    }
}

fn retired(log: &[LogRecord]) -> Vec<(String, u32)> {
    log.iter()
        .filter_map(|r| match &r.event {
            Event::DeviceRetired {
                device, remaining, ..
            } => Some((device.clone(), *remaining)),
            _ => None,
        })
        .collect()
}

/// The requests a device's worker got: (operation, problem, store entry).
fn requests(harness: &Path, device: u32) -> Vec<(String, String, Option<String>)> {
    let Ok(text) = std::fs::read_to_string(harness.join(format!("requests-{device}.jsonl"))) else {
        return Vec::new();
    };
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["op"].as_str().unwrap().to_string(),
                v["problem"].as_str().unwrap().to_string(),
                v["stored"].as_str().map(str::to_string),
            )
        })
        .collect()
}

/// A candidate's step on a device that is lost mid-request moves to the other device: the run
/// finishes, every verdict is what the candidate earns, and the log says which device was retired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_lost_mid_request_moves_its_step_and_verdicts_are_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    // GPU 0 holds its first candidate until GPU 1 is lost, so the other candidate lands on GPU 1.
    let (harness, settings) = setup(tmp.path(), &["lose-1", "hold-0"]).await;
    let pool = WorkerPool::start(settings).await.expect("pool starts");
    let how = Run {
        problems: 1,
        prepare_ahead: 0,
        open_when: None,
    };
    let (summary, log) = run(&pool, &tmp.path().join("run"), None, &how).await;
    pool.shutdown().await;
    assert_eq!((summary.finished, summary.tasks), (2, 2), "{summary:?}");
    assert!(!summary.incomplete(), "{summary:?}");
    assert_eq!(retired(&log), vec![("cuda:1".to_string(), 1)]);
    let v = verdicts(&log);
    assert_eq!(v.len(), 2);
    for (t, (verdict, speedup, device)) in &v {
        assert_eq!((*verdict, *speedup), expected(t), "task {t}");
        assert_eq!(
            device, "cuda:0",
            "task {t}: every verdict came from the device left"
        );
    }
    // The moved step: granted on GPU 1, which was retired, then granted on GPU 0.
    let moved: Vec<(TaskId, String)> = log
        .iter()
        .filter_map(|r| match (&r.task, &r.event) {
            (Some(t), Event::LeaseGranted { device, .. }) => Some((*t, device.clone())),
            _ => None,
        })
        .collect();
    let on_1: Vec<_> = moved.iter().filter(|(_, d)| d == "cuda:1").collect();
    assert_eq!(on_1.len(), 1, "{moved:?}");
    let task = on_1[0].0;
    let grants: Vec<&str> = moved
        .iter()
        .filter(|(t, _)| *t == task)
        .map(|(_, d)| d.as_str())
        .collect();
    assert_eq!(grants, ["cuda:1", "cuda:0"]);
    assert!(
        log.iter()
            .all(|r| !matches!(r.event, Event::Deferred { .. })),
        "nothing deferred"
    );
    // GPU 1's worker got the one evaluate it died in; no worker started there since.
    let ops: Vec<String> = requests(&harness, 1).into_iter().map(|r| r.0).collect();
    assert_eq!(ops, ["evaluate"]);
}

/// Every device lost: the steps wait on workers, the run ends incomplete saying which devices were
/// lost and why, and a resume on working devices finishes with the verdicts the candidates earn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_device_is_lost_the_run_ends_incomplete_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let (harness, settings) = setup(tmp.path(), &["lose-0", "lose-1"]).await;
    let pool = WorkerPool::start(settings.clone())
        .await
        .expect("pool starts");
    let root = tmp.path().join("run");
    let how = Run {
        problems: 2,
        prepare_ahead: 0,
        open_when: None,
    };
    let (summary, log) = run(&pool, &root, None, &how).await;
    pool.shutdown().await;
    assert_eq!(summary.finished, 0, "{summary:?}");
    assert_eq!(summary.waiting_on_workers, 4, "{summary:?}");
    // Retired one after the other: one left after the first, none after the second.
    let lost = retired(&log);
    let mut devices: Vec<&str> = lost.iter().map(|(d, _)| d.as_str()).collect();
    devices.sort();
    assert_eq!(devices, ["cuda:0", "cuda:1"]);
    assert_eq!(lost.iter().map(|(_, n)| *n).collect::<Vec<_>>(), [1, 0]);
    let reason = summary.incomplete_reason().unwrap();
    assert!(
        reason.starts_with("incomplete: 4 task(s) waiting on workers; every device was lost (")
            && reason.contains("cuda:0: ")
            && reason.contains("cuda:1: "),
        "{reason}"
    );
    let ended = log.last().expect("records");
    assert!(
        matches!(&ended.event, Event::RunEnded { reason: r } if r.to_string() == reason),
        "{ended:?}"
    );
    assert!(verdicts(&log).is_empty(), "no verdict from a lost device");

    // The devices are back: a resume does exactly the deferred steps.
    for d in [0, 1] {
        let _ = std::fs::remove_file(harness.join(format!("lost-{d}")));
    }
    let pool = WorkerPool::start(settings)
        .await
        .expect("pool starts again");
    let prior = krefine::store::read_log(&root.join("events.jsonl")).unwrap();
    let (summary, log) = run(&pool, &root, Some(prior), &how).await;
    pool.shutdown().await;
    assert_eq!((summary.finished, summary.tasks), (4, 4), "{summary:?}");
    let v = verdicts(&log);
    assert_eq!(v.len(), 4);
    for (t, (verdict, speedup, _)) in &v {
        assert_eq!((*verdict, *speedup), expected(t), "task {t}");
    }
}

/// Reference data is per (problem, device): a problem with two candidates coming is prepared on
/// both devices, while its inputs are made once on the CPU and every device is pointed at the same
/// store entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_data_is_prepared_on_each_device_from_inputs_made_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (harness, mut settings) = setup(tmp.path(), &[]).await;
    settings.reference_cache = Some(tmp.path().join("refs"));
    settings.reference_cache_bytes = 1_000_000_000;
    let pool = WorkerPool::start(settings).await.expect("pool starts");
    // Answers wait until the problem was prepared on both devices.
    let how = Run {
        problems: 1,
        prepare_ahead: 2,
        open_when: Some(|rec, seen| {
            if let Event::ReferencePrepared { device, .. } = &rec.event
                && !seen.contains(device)
            {
                seen.push(device.clone());
            }
            seen.len() == 2
        }),
    };
    let (summary, log) = run(&pool, &tmp.path().join("run"), None, &how).await;
    pool.shutdown().await;
    assert_eq!((summary.finished, summary.tasks), (2, 2), "{summary:?}");
    let mut prepared: Vec<String> = log
        .iter()
        .filter_map(|r| match &r.event {
            Event::ReferencePrepared { device, .. } => Some(device.clone()),
            _ => None,
        })
        .collect();
    prepared.sort();
    assert_eq!(prepared, ["cuda:0", "cuda:1"]);
    let inputs: Vec<&str> = log
        .iter()
        .filter_map(|r| match &r.event {
            Event::InputsPrepared { outcome, .. } => Some(outcome.status.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(inputs, ["generated"], "inputs made once for both devices");
    // Each device's worker was pointed at the one store entry, for its preparation and evaluates.
    let mut entries = Vec::new();
    for d in [0, 1] {
        let reqs = requests(&harness, d);
        assert_eq!(
            reqs.first().map(|r| r.0.as_str()),
            Some("prepare"),
            "{reqs:?}"
        );
        for (op, problem, stored) in reqs {
            assert_eq!(problem, "1/900", "{op}");
            entries.push(stored.unwrap_or_else(|| panic!("{op} on GPU {d} without the entry")));
        }
    }
    entries.dedup();
    assert_eq!(entries.len(), 1, "{entries:?}");
    for (t, (verdict, speedup, _)) in &verdicts(&log) {
        assert_eq!((*verdict, *speedup), expected(t), "task {t}");
    }
}
