//! Reference data prepared while the first answer is generated, through the whole engine with real
//! CPU workers: the preparation is issued as soon as a task starts generating (the scripted LLM answers
//! only once a `reference_prepared` event is logged), and the first candidates' results are the same
//! as without it (KernelBench's metadata, to the string).
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

mod worker_support;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use krefine::cpu_budget::{CpuBudget, Held};
use krefine::engine::{Engine, EngineParts, RunPlan};
use krefine::services::{EventSink, Llm, LlmError};
use krefine::store::{RunDir, read_log};
use krefine::types::{
    Event, ExecOutcome, FeedbackMode, LlmAnswer, LlmRequest, LogRecord, MethodKind, PrepareStatus,
    Problem, ProblemKey,
};
use krefine::worker::WorkerPool;
use worker_support::*;

/// Sample 0: a correct pure-Python candidate; sample 1: one off by 1.0 in one element (incorrect in
/// every trial, so all five trials run). With a gate, answers wait until it opens.
struct Answers {
    gate: Option<watch::Receiver<bool>>,
}

#[async_trait::async_trait]
impl Llm for Answers {
    fn describe(&self) -> String {
        "gated answers".into()
    }

    async fn complete(&self, req: LlmRequest, _sink: &EventSink) -> Result<LlmAnswer, LlmError> {
        if let Some(gate) = &self.gate {
            let mut gate = gate.clone();
            let opened =
                tokio::time::timeout(Duration::from_secs(300), gate.wait_for(|open| *open));
            if !matches!(opened.await, Ok(Ok(_))) {
                return Err(LlmError::Failed(
                    "no reference_prepared event while the answer was being generated".into(),
                ));
            }
        }
        let code = if req.task.sample == 0 {
            "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, a, b):\n        return torch.add(a, b)\n".to_string()
        } else {
            hostile("value_mismatch.py")
        };
        Ok(LlmAnswer {
            content: format!("```python\n{code}\n```"),
            usage: None,
            cost_usd: None,
            model: "gated".into(),
            finish_reason: None,
            latency_ms: 0,
            attempts: 1,
        })
    }
}

/// Run one-shot on `problem` with 2 samples; returns the log.
async fn run(
    pool: &Arc<WorkerPool>,
    root: &std::path::Path,
    problem: Problem,
    prepare_ahead: usize,
) -> Vec<LogRecord> {
    // Builds, the CPU stage and the CPU device's timings share two cores.
    run_with_budget(
        pool,
        root,
        problem,
        prepare_ahead,
        Arc::new(CpuBudget::new(2)),
    )
    .await
}

async fn run_with_budget(
    pool: &Arc<WorkerPool>,
    root: &std::path::Path,
    problem: Problem,
    prepare_ahead: usize,
    budget: Arc<CpuBudget>,
) -> Vec<LogRecord> {
    let key = problem.key;
    let plan = RunPlan {
        run: format!("refprep-{prepare_ahead}"),
        method: MethodKind::OneShot,
        feedback: FeedbackMode::GE,
        turns: 1,
        samples: 2,
        problems: vec![Arc::new(problem)],
        simulated: false,
    };
    let (open, gate) = watch::channel(false);
    let parts = EngineParts {
        llm: Arc::new(Answers {
            gate: (prepare_ahead > 0).then_some(gate),
        }),
        compiler: pool.clone(),
        executor: pool.clone(),
        devices: vec![krefine::gpu::DeviceInfo::cpu()],
        prompts: krefine::prompt::Prompts::load(None).unwrap(),
        prompt_settings: krefine::prompt::PromptSettings::default(),
        llm_concurrency: 2,
        compile_workers: 1,
        cpu_budget: Some(budget.clone()),
        prepare_ahead,
        host_locks: None,
    };
    let dir = RunDir::create(&root.join(format!("run-{prepare_ahead}")), "").unwrap();
    let events = dir.events_path();
    let engine = Engine::prepare(plan, parts, dir, None, false, CancellationToken::new())
        .await
        .unwrap();
    let mut bus = engine.subscribe();
    tokio::spawn(async move {
        while let Ok(rec) = bus.recv().await {
            if matches!(&rec.event, Event::ReferencePrepared { problem, .. } if *problem == key) {
                let _ = open.send(true);
            }
        }
    });
    let summary = engine.run().await.unwrap();
    assert_eq!(summary.finished, 2, "{summary:?}");
    assert_eq!(budget.held(), Held::default(), "every claim was given back");
    read_log(&events).unwrap().records
}

/// Sample `sample`'s execution, its metadata without what the machine decides rather than the inputs:
/// `worker_clock`, the worker's own timings of faithful mode's fresh calls (issue 35), and
/// `timing_retimed` / `timing_unsteady`, a wild timing taken again (issue 37). They differ from run to
/// run and are not KernelBench's metadata.
fn executed(log: &[LogRecord], sample: u32) -> ExecOutcome {
    let mut outcome = log
        .iter()
        .find_map(|r| match (&r.task, &r.event) {
            (Some(t), Event::Executed { outcome, .. }) if t.sample == sample => {
                Some(outcome.clone())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no executed event for sample {sample}"));
    for key in ["worker_clock", "timing_retimed", "timing_unsteady"] {
        outcome.metadata.remove(key);
    }
    outcome
}

fn kinds(log: &[LogRecord]) -> Vec<&'static str> {
    log.iter().map(|r| r.event.kind()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_is_prepared_while_the_first_answer_is_generated_and_results_are_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    let harness = deployed_harness(tmp.path()).await;
    let settings = cpu_settings(
        test_python().await,
        harness,
        &work,
        &work.join("build-cache"),
    );
    let pool = WorkerPool::start(settings).await.expect("pool starts");

    let base = problem_add();
    let prepared = run(&pool, tmp.path(), (*base).clone(), 2).await;
    // The same problem under another key and hash (a cold reference on the same worker), judged
    // without preparation: each candidate's check builds what it reaches.
    let cold = Problem {
        key: ProblemKey {
            level: 1,
            problem_id: 901,
        },
        name: "901_add.py".into(),
        code: format!(
            "{}\n# the same problem, another reference cache entry\n",
            base.code
        ),
    };
    let lazy = run(&pool, tmp.path(), cold, 0).await;
    pool.shutdown().await;

    // Issued at run start: the first preparation step is logged before any answer (the LLM waited
    // for it), it built the first trial, and later steps built the rest before the first execute.
    let first_prep = prepared
        .iter()
        .position(|r| matches!(r.event, Event::ReferencePrepared { .. }))
        .unwrap_or_else(|| panic!("no reference_prepared event: {:?}", kinds(&prepared)));
    let first_answer = prepared
        .iter()
        .position(|r| matches!(r.event, Event::LlmAnswered { .. }))
        .expect("an answer");
    assert!(first_prep < first_answer, "{:?}", kinds(&prepared));
    let steps: Vec<_> = prepared
        .iter()
        .filter_map(|r| match &r.event {
            Event::ReferencePrepared {
                problem,
                device,
                outcome,
                ..
            } => Some((*problem, device.clone(), outcome.clone())),
            _ => None,
        })
        .collect();
    let (problem, device, first) = &steps[0];
    assert_eq!((*problem, device.as_str()), (base.key, "cpu"));
    assert_eq!(first.status, PrepareStatus::Ready, "{first:#?}");
    assert_eq!(first.built, vec!["trial 1".to_string()]);
    assert!(
        steps
            .iter()
            .all(|(_, _, o)| o.status == PrepareStatus::Ready),
        "{steps:#?}"
    );
    assert!(
        lazy.iter()
            .all(|r| !matches!(r.event, Event::ReferencePrepared { .. })),
        "prepare_ahead = 0 prepares nothing"
    );

    // The same verdicts and KernelBench metadata either way.
    for sample in [0, 1] {
        let (a, b) = (executed(&prepared, sample), executed(&lazy, sample));
        assert_eq!(
            (a.verdict, a.compiled, a.correctness, &a.metadata),
            (b.verdict, b.compiled, b.correctness, &b.metadata),
            "sample {sample}"
        );
    }
    let correct = executed(&prepared, 0);
    assert_eq!(
        correct.verdict,
        krefine::types::Verdict::Correct,
        "{correct:#?}"
    );
    let wrong = executed(&prepared, 1);
    assert_eq!(
        wrong
            .metadata
            .get("correctness_trials")
            .and_then(|v| v.as_str()),
        Some("(0 / 5)"),
        "{wrong:#?}"
    );
}

/// A CPU worker pool under `dir` with the input store on (`disk_bytes` its cap) and its in-memory tier
/// (`ram_bytes`; 0: off); the store's folder.
async fn pool_with_store(
    dir: &std::path::Path,
    disk_bytes: u64,
    ram_bytes: u64,
) -> (std::sync::Arc<WorkerPool>, std::path::PathBuf) {
    pool_with_stores(dir, disk_bytes, ram_bytes, false).await
}

async fn pool_with_stores(
    dir: &std::path::Path,
    disk_bytes: u64,
    ram_bytes: u64,
    keep_ram: bool,
) -> (std::sync::Arc<WorkerPool>, std::path::PathBuf) {
    let work = dir.join("work");
    let harness = deployed_harness(dir).await;
    let mut settings = cpu_settings(
        test_python().await,
        harness,
        &work,
        &work.join("build-cache"),
    );
    let store = dir.join("reference-cache");
    settings.reference_cache = Some(store.clone());
    settings.reference_cache_bytes = disk_bytes;
    settings.reference_ram_bytes = ram_bytes;
    settings.reference_ram_keep = keep_ram;
    let pool = WorkerPool::start(settings).await.expect("pool starts");
    (pool, store)
}

fn inputs_statuses(log: &[LogRecord]) -> Vec<String> {
    log.iter()
        .filter_map(|r| match &r.event {
            Event::InputsPrepared { outcome, .. } => Some(outcome.status.clone()),
            _ => None,
        })
        .collect()
}

/// With the input store on: the inputs are made on the CPU (logged before the first device step),
/// a second run finds them stored, and the verdicts and KernelBench metadata are those of inputs made
/// by the worker itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_inputs_are_made_once_off_the_lease_and_change_no_result() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    let harness = deployed_harness(tmp.path()).await;
    let mut settings = cpu_settings(
        test_python().await,
        harness,
        &work,
        &work.join("build-cache"),
    );
    let store = tmp.path().join("reference-cache");
    settings.reference_cache = Some(store.clone());
    settings.reference_cache_bytes = 1 << 30;
    let pool = WorkerPool::start(settings).await.expect("pool starts");

    let base = problem_add();
    let first = run(&pool, &tmp.path().join("first"), (*base).clone(), 2).await;
    let again = run(&pool, &tmp.path().join("again"), (*base).clone(), 2).await;
    let cold = Problem {
        key: ProblemKey {
            level: 1,
            problem_id: 901,
        },
        name: "901_add.py".into(),
        code: format!("{}\n# another store entry, never made\n", base.code),
    };
    let lazy = run(&pool, &tmp.path().join("lazy"), cold, 0).await;
    pool.shutdown().await;

    assert_eq!(
        inputs_statuses(&first),
        ["generated"],
        "{:?}",
        kinds(&first)
    );
    assert_eq!(inputs_statuses(&again), ["hit"], "{:?}", kinds(&again));
    assert!(inputs_statuses(&lazy).is_empty());
    let made = first
        .iter()
        .position(|r| matches!(r.event, Event::InputsPrepared { .. }))
        .unwrap();
    let on_device = first
        .iter()
        .position(|r| matches!(r.event, Event::ReferencePrepared { .. }))
        .unwrap();
    assert!(made < on_device, "{:?}", kinds(&first));
    assert_eq!(
        std::fs::read_dir(&store)
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| e.path().join("manifest.json").is_file())
            .count(),
        1,
        "one entry for the problem"
    );
    for sample in [0, 1] {
        let (a, b, c) = (
            executed(&first, sample),
            executed(&again, sample),
            executed(&lazy, sample),
        );
        for other in [&b, &c] {
            assert_eq!(
                (a.verdict, a.compiled, a.correctness, &a.metadata),
                (
                    other.verdict,
                    other.compiled,
                    other.correctness,
                    &other.metadata
                ),
                "sample {sample}"
            );
        }
        assert_eq!(a.env.inputs.as_deref(), Some("kernelbench"));
    }
}

/// An entry that does not fit the store's cap (1 byte here) is not stored: its CPU stage ends
/// `over_budget` (not an error), the worker makes the inputs itself as before the store existed,
/// and the verdicts are those of a run that never used the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_over_the_store_cap_are_made_by_the_worker_and_change_no_result() {
    let tmp = tempfile::tempdir().unwrap();
    let (pool, store) = pool_with_store(tmp.path(), 1, 0).await;

    let base = problem_add();
    let over = run(&pool, &tmp.path().join("over"), (*base).clone(), 2).await;
    let cold = Problem {
        key: ProblemKey {
            level: 1,
            problem_id: 902,
        },
        name: "902_add.py".into(),
        code: format!("{}\n# another store entry, never made\n", base.code),
    };
    let lazy = run(&pool, &tmp.path().join("lazy"), cold, 0).await;
    pool.shutdown().await;

    assert_eq!(
        inputs_statuses(&over),
        ["over_budget"],
        "{:?}",
        kinds(&over)
    );
    assert!(inputs_statuses(&lazy).is_empty());
    let stored = std::fs::read_dir(&store)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().join("manifest.json").is_file())
                .count()
        })
        .unwrap_or(0);
    assert_eq!(stored, 0, "nothing was stored");
    for sample in [0, 1] {
        let (a, b) = (executed(&over, sample), executed(&lazy, sample));
        assert_eq!(
            (a.verdict, a.compiled, a.correctness, &a.metadata),
            (b.verdict, b.compiled, b.correctness, &b.metadata),
            "sample {sample}"
        );
        assert_eq!(a.env.inputs.as_deref(), Some("kernelbench"));
    }
}

/// An entry too large for the disk store (1 byte here) goes to the in-memory tier instead: made off
/// the lease all the same (`generated`, "in memory"), read by the worker from this run's own folder
/// in /dev/shm (the sandboxed worker sees it), with the verdicts of a run that never used a store;
/// the folder is gone once the pool is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_too_large_for_the_disk_go_to_the_in_memory_tier() {
    if !std::path::Path::new("/dev/shm").is_dir() {
        eprintln!("no /dev/shm on this machine: nothing to test");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (pool, _store) = pool_with_store(tmp.path(), 1, 1_000_000_000).await;
    let ram = krefine::worker::input_store::ram_store_dir(false).join("inputs");

    let base = problem_add();
    let in_memory = run(&pool, &tmp.path().join("ram"), (*base).clone(), 2).await;
    let again = run(&pool, &tmp.path().join("ram-again"), (*base).clone(), 2).await;
    let entries_in_memory = std::fs::read_dir(&ram)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().join("manifest.json").is_file())
                .count()
        })
        .unwrap_or(0);
    let cold = Problem {
        key: ProblemKey {
            level: 1,
            problem_id: 903,
        },
        name: "903_add.py".into(),
        code: format!("{}\n# another store entry, never made\n", base.code),
    };
    let lazy = run(&pool, &tmp.path().join("lazy"), cold, 0).await;
    pool.shutdown().await;
    drop(pool);

    let outcomes: Vec<_> = in_memory
        .iter()
        .filter_map(|r| match &r.event {
            Event::InputsPrepared { outcome, .. } => Some(outcome.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(outcomes.len(), 1, "{:?}", kinds(&in_memory));
    assert_eq!(outcomes[0].status, "generated");
    let detail = outcomes[0].detail.clone().unwrap_or_default();
    assert!(detail.starts_with("in memory ("), "{detail}");
    assert_eq!(outcomes[0].tier.as_deref(), Some("memory"));
    // The next run finds it there at once: no disk-store generator is asked (and refused) first.
    let found: Vec<_> = again
        .iter()
        .filter_map(|r| match &r.event {
            Event::InputsPrepared { outcome, .. } => Some(outcome.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(found.len(), 1, "{:?}", kinds(&again));
    assert_eq!(
        (
            found[0].status.as_str(),
            found[0].detail.as_deref(),
            found[0].tier.as_deref()
        ),
        ("hit", Some("in memory"), Some("memory"))
    );
    assert_eq!(entries_in_memory, 1, "the entry was in {}", ram.display());
    for sample in [0, 1] {
        let (a, b) = (executed(&in_memory, sample), executed(&lazy, sample));
        assert_eq!(
            (a.verdict, a.compiled, a.correctness, &a.metadata),
            (b.verdict, b.compiled, b.correctness, &b.metadata),
            "sample {sample}"
        );
    }
    assert!(
        !ram.parent().unwrap().exists(),
        "the in-memory folder outlived its pool"
    );
}

/// With `resources.reference_ram_keep` the in-memory tier is the machine's kept folder: an entry one
/// run made there outlives it, and the next run (another pool, another disk store) finds it (`hit`)
/// and reads its inputs from memory through the sandbox, with the same verdicts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_in_memory_tier_serves_the_next_run() {
    if !std::path::Path::new("/dev/shm").is_dir() {
        eprintln!("no /dev/shm on this machine: nothing to test");
        return;
    }
    let kept = krefine::worker::input_store::ram_store_dir(true).join("inputs");
    let entries = || -> std::collections::BTreeSet<std::ffi::OsString> {
        std::fs::read_dir(&kept)
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.path().join("manifest.json").is_file())
                    .map(|e| e.file_name())
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = entries();
    let tmp = tempfile::tempdir().unwrap();
    let base = problem_add();
    // Code no other run has: its entry is this test's alone (removed at the end).
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let problem = Problem {
        key: ProblemKey {
            level: 1,
            problem_id: 904,
        },
        name: "904_add.py".into(),
        code: format!(
            "{}\n# kept tier {} {nonce}\n",
            base.code,
            std::process::id()
        ),
    };
    let (pool, _) = pool_with_stores(&tmp.path().join("a"), 1, 1_000_000_000, true).await;
    let first = run(&pool, &tmp.path().join("first"), problem.clone(), 2).await;
    pool.shutdown().await;
    drop(pool);
    let made: Vec<_> = entries().difference(&before).cloned().collect();
    let (pool, _) = pool_with_stores(&tmp.path().join("b"), 1, 1_000_000_000, true).await;
    let second = run(&pool, &tmp.path().join("second"), problem, 2).await;
    pool.shutdown().await;
    drop(pool);
    for key in &made {
        let _ = std::fs::remove_dir_all(kept.join(key));
        let mut lock = key.clone();
        lock.push(".lock");
        let _ = std::fs::remove_file(kept.join(lock));
    }

    assert_eq!(
        made.len(),
        1,
        "the first run's entry outlived it in the kept tier"
    );
    assert_eq!(inputs_statuses(&first), ["generated"]);
    assert_eq!(inputs_statuses(&second), ["hit"], "{:?}", kinds(&second));
    for sample in [0, 1] {
        let (a, b) = (executed(&first, sample), executed(&second, sample));
        assert_eq!(
            (a.verdict, a.compiled, a.correctness, &a.metadata),
            (b.verdict, b.compiled, b.correctness, &b.metadata),
            "sample {sample}"
        );
    }
}

/// The CPU stage claims the cores its input maker runs: a problem with small inputs is made by the
/// generator's one process and claims one core, not the half of a 12-core budget (6) it once claimed
/// whatever the maker ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_maker_claims_the_processes_it_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (pool, _store) = pool_with_store(tmp.path(), 1 << 30, 0).await;
    let budget = Arc::new(CpuBudget::new(12));
    let most = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let watch = {
        let (budget, most) = (budget.clone(), most.clone());
        tokio::spawn(async move {
            loop {
                most.fetch_max(budget.held().inputs, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    let log = run_with_budget(&pool, tmp.path(), (*problem_add()).clone(), 2, budget).await;
    watch.abort();
    assert_eq!(inputs_statuses(&log), ["generated"]);
    assert_eq!(
        most.load(std::sync::atomic::Ordering::SeqCst),
        krefine::cpu_budget::CORE,
        "one core for the one process that made the inputs"
    );
}

/// A problem's input plan is made once and kept in the disk store (`.plans/<key>.json`): the next
/// run reads it instead of starting a planner process (torch imported, about 4 s before a warm
/// batch's first lease). A plan kept under another processes cap is made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_plan_is_made_once_and_kept_for_the_next_run() {
    use krefine::services::Executor;
    let tmp = tempfile::tempdir().unwrap();
    let (pool, store) = pool_with_store(tmp.path(), 1_000_000_000, 0).await;
    let problem = problem_add();
    let first = pool.plan_inputs(vec![problem.clone()], Some(6)).await;
    let made = first[&problem.key];
    assert!(made.bytes.is_some_and(|b| b > 0), "{made:?}");
    let kept: Vec<_> = std::fs::read_dir(store.join(".plans"))
        .expect("the plans folder")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    // Mark the kept plan: a second planning that ran the planner would answer the real size.
    let text = std::fs::read_to_string(&kept[0]).unwrap();
    let marked = text.replace(&made.bytes.unwrap().to_string(), "12345");
    assert_ne!(marked, text);
    std::fs::write(&kept[0], marked).unwrap();
    let again = pool.plan_inputs(vec![problem.clone()], Some(6)).await;
    assert_eq!(
        again[&problem.key].bytes,
        Some(12345),
        "read from the kept plan"
    );
    let other_cap = pool.plan_inputs(vec![problem.clone()], Some(2)).await;
    assert_eq!(
        other_cap[&problem.key].bytes, made.bytes,
        "made again under another cap"
    );
    pool.shutdown().await;
}
