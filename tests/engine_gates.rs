//! The engine's gates, observed through instrumented services: LLM concurrency, the compile pool
//! size, one candidate per device at a time, and no build running while the CPU device is timing.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use krefine::cpu_budget::{CORE, CpuBudget};
use krefine::engine::{Engine, EngineParts, RunPlan};
use krefine::gpu::DeviceInfo;
use krefine::prompt::{PromptSettings, Prompts};
use krefine::services::{
    CompileJob, Compiler, DeviceId, EventSink, ExecJob, Executor, Llm, LlmError, Unavailable,
};
use krefine::store::RunDir;
use krefine::types::{
    BuildCpu, CompileOutcome, CompileStatus, ExecOutcome, FeedbackMode, LlmAnswer, LlmRequest,
    MethodKind, Problem, ProblemKey, ProfileOutcome, Verdict,
};

/// Counts how many calls are inside a section at once, and the most there ever were.
#[derive(Default)]
struct Meter {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl Meter {
    fn enter(&self) -> usize {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        n
    }
    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
    fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }
}

#[derive(Default)]
struct Probe {
    llm: Meter,
    compile: Meter,
    execute: Meter,
    /// Times a build was running while a candidate was being timed.
    overlaps: AtomicUsize,
    /// Compile calls so far, and how many of the first ones find no worker (an outage).
    compiles: AtomicUsize,
    compile_outage: AtomicUsize,
    /// When set, GPU 0's host is drained at its first execution: the call is Unavailable and the
    /// executor says the device is retired from then on.
    drain_gpu0: std::sync::atomic::AtomicBool,
    gpu0_retired: std::sync::atomic::AtomicBool,
    gpu0_calls: AtomicUsize,
    /// The CPU budget the engine gets (`None`: none), and the CPU time each build reports using
    /// per millisecond of wall time, in milli-cores.
    cpu_budget: Option<Arc<CpuBudget>>,
    build_milli_cores: u64,
    /// Every candidate was built before: `cached` answers each one.
    all_cached: std::sync::atomic::AtomicBool,
    /// Holds on each problem's stored inputs alive now, and the builds and executions that found
    /// none on their own problem.
    holds: Arc<std::sync::Mutex<std::collections::HashMap<ProblemKey, usize>>>,
    unheld_builds: AtomicUsize,
    unheld_executions: AtomicUsize,
    /// Header warm-up: builds of even-numbered problems use the warmed headers; the warm-ups made,
    /// whether one ended, the cores the budget held for builds during it, whether a build that uses
    /// no header ran during it, and builds that use them started before it ended.
    warm: std::sync::atomic::AtomicBool,
    warms: AtomicUsize,
    warm_ended: std::sync::atomic::AtomicBool,
    warm_cores: std::sync::atomic::AtomicU64,
    other_built: tokio::sync::Notify,
    other_built_during_warm: std::sync::atomic::AtomicBool,
    built_before_warm: AtomicUsize,
}

impl Probe {
    fn held(&self, problem: ProblemKey) -> bool {
        self.holds
            .lock()
            .unwrap()
            .get(&problem)
            .copied()
            .unwrap_or(0)
            > 0
    }
}

/// A hold on a problem's stored inputs, counted while it lives.
struct Hold {
    holds: Arc<std::sync::Mutex<std::collections::HashMap<ProblemKey, usize>>>,
    problem: ProblemKey,
}

impl Drop for Hold {
    fn drop(&mut self) {
        *self.holds.lock().unwrap().get_mut(&self.problem).unwrap() -= 1;
    }
}

struct Services(Arc<Probe>);

#[async_trait]
impl Llm for Services {
    fn describe(&self) -> String {
        "probe".into()
    }
    async fn complete(&self, _req: LlmRequest, _sink: &EventSink) -> Result<LlmAnswer, LlmError> {
        self.0.llm.enter();
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.0.llm.leave();
        Ok(LlmAnswer {
            content: "```python\nclass ModelNew: pass\n```".into(),
            usage: None,
            cost_usd: None,
            model: "probe".into(),
            finish_reason: None,
            latency_ms: 5,
            attempts: 1,
        })
    }
}

#[async_trait]
impl Compiler for Services {
    async fn cached(&self, _job: &CompileJob) -> Option<CompileOutcome> {
        self.0
            .all_cached
            .load(Ordering::SeqCst)
            .then(|| CompileOutcome {
                ran_on: None,
                worker_losses: Vec::new(),
                status: CompileStatus::Ok,
                cached: true,
                error_name: None,
                error: None,
                feedback: String::new(),
                log_path: None,
                build_dir: None,
                duration_ms: 0,
                findings: Vec::new(),
                build_path: None,
                cpu: None,
            })
    }

    fn uses_warm_headers(&self, job: &CompileJob) -> bool {
        self.0.warm.load(Ordering::SeqCst) && job.task.problem.problem_id.is_multiple_of(2)
    }

    async fn warm_headers(&self, _wait: Duration) {
        self.0.warms.fetch_add(1, Ordering::SeqCst);
        if let Some(budget) = &self.0.cpu_budget {
            self.0
                .warm_cores
                .store(budget.held().builds, Ordering::SeqCst);
        }
        // Ends once a build that uses no header has run meanwhile (or after 20 s, which the test
        // then reports).
        let other = tokio::time::timeout(Duration::from_secs(20), self.0.other_built.notified());
        self.0
            .other_built_during_warm
            .store(other.await.is_ok(), Ordering::SeqCst);
        self.0.warm_ended.store(true, Ordering::SeqCst);
    }

    async fn compile(&self, job: CompileJob) -> Result<CompileOutcome, Unavailable> {
        if self.0.warm.load(Ordering::SeqCst) {
            if self.uses_warm_headers(&job) {
                if !self.0.warm_ended.load(Ordering::SeqCst) {
                    self.0.built_before_warm.fetch_add(1, Ordering::SeqCst);
                }
            } else {
                self.0.other_built.notify_one();
            }
        }
        if !self.0.held(job.task.problem) {
            self.0.unheld_builds.fetch_add(1, Ordering::SeqCst);
        }
        let n = self.0.compiles.fetch_add(1, Ordering::SeqCst);
        if n < self.0.compile_outage.load(Ordering::SeqCst) {
            return Err(Unavailable("no worker could be started".into()));
        }
        self.0.compile.enter();
        tokio::time::sleep(Duration::from_millis(15)).await;
        self.0.compile.leave();
        Ok(CompileOutcome {
            ran_on: None,
            worker_losses: Vec::new(),
            status: CompileStatus::Ok,
            cached: false,
            error_name: None,
            error: None,
            feedback: String::new(),
            log_path: None,
            build_dir: None,
            duration_ms: 15,
            findings: Vec::new(),
            build_path: None,
            // As if measured over a second of the build.
            cpu: (self.0.build_milli_cores > 0).then(|| BuildCpu {
                cpu_ms: self.0.build_milli_cores,
                wall_ms: 1000,
            }),
        })
    }
}

#[async_trait]
impl Executor for Services {
    async fn execute(&self, job: ExecJob, device: &DeviceId) -> Result<ExecOutcome, Unavailable> {
        if !self.0.held(job.problem.key) {
            self.0.unheld_executions.fetch_add(1, Ordering::SeqCst);
        }
        if *device == DeviceId::Gpu(0) && self.0.drain_gpu0.load(Ordering::SeqCst) {
            self.0.gpu0_calls.fetch_add(1, Ordering::SeqCst);
            self.0.gpu0_retired.store(true, Ordering::SeqCst);
            return Err(Unavailable("worker lost; its host is drained".into()));
        }
        self.0.execute.enter();
        for _ in 0..5 {
            if self.0.compile.now.load(Ordering::SeqCst) > 0 {
                self.0.overlaps.fetch_add(1, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.0.execute.leave();
        let mut o = ExecOutcome::failure(Verdict::Correct, &device.to_string(), "ok".into(), 10);
        o.correctness = true;
        o.speedup = Some(1.0);
        Ok(o)
    }
    async fn profile(
        &self,
        _job: ExecJob,
        _device: &DeviceId,
    ) -> Result<ProfileOutcome, Unavailable> {
        Ok(ProfileOutcome {
            worker_losses: Vec::new(),
            ok: true,
            table: String::new(),
            ncu: None,
            error: None,
            duration_ms: 0,
        })
    }
    fn retired(&self, device: &DeviceId) -> bool {
        *device == DeviceId::Gpu(0) && self.0.gpu0_retired.load(Ordering::SeqCst)
    }
    fn hold_inputs(&self, problem: &Problem) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        *self.0.holds.lock().unwrap().entry(problem.key).or_default() += 1;
        Some(Box::new(Hold {
            holds: self.0.holds.clone(),
            problem: problem.key,
        }))
    }
}

async fn run(
    devices: Vec<DeviceInfo>,
    llm_concurrency: usize,
    compile_workers: usize,
) -> Arc<Probe> {
    let probe = Arc::new(Probe::default());
    let tmp = tempfile::tempdir().unwrap();
    let dir = RunDir::create(&tmp.path().join("run"), "").unwrap();
    let summary = run_in(&probe, dir, None, devices, llm_concurrency, compile_workers).await;
    assert_eq!((summary.finished, summary.tasks), (12, 12));
    probe
}

async fn run_in(
    probe: &Arc<Probe>,
    dir: RunDir,
    prior: Option<krefine::store::ReadLog>,
    devices: Vec<DeviceInfo>,
    llm_concurrency: usize,
    compile_workers: usize,
) -> krefine::engine::RunSummary {
    let services = Arc::new(Services(probe.clone()));
    let problems = (1..=12)
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
        run: "gates".into(),
        method: MethodKind::Refine,
        feedback: FeedbackMode::GE,
        turns: 3,
        samples: 1,
        problems,
        simulated: true,
    };
    let parts = EngineParts {
        llm: services.clone(),
        compiler: services.clone(),
        executor: services,
        devices,
        prompts: Prompts::load(None).unwrap(),
        prompt_settings: PromptSettings::default(),
        llm_concurrency,
        compile_workers,
        // These services prepare no reference data (`Executor::prepares_reference` is false).
        cpu_budget: probe.cpu_budget.clone(),
        prepare_ahead: 2,
        host_locks: None,
    };
    let engine = Engine::prepare(plan, parts, dir, prior, false, CancellationToken::new())
        .await
        .unwrap();
    engine.run().await.unwrap()
}

fn gpu(i: u32) -> DeviceInfo {
    DeviceInfo {
        id: DeviceId::Gpu(i),
        name: format!("G{i}"),
        capability: Some((9, 0)),
        total_memory_bytes: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_problems_stored_inputs_are_held_from_its_candidates_build_to_the_end_of_its_evaluation()
{
    let p = run(vec![gpu(0)], 4, 2).await;
    // 12 tasks x 3 turns, every build and every execution with its problem's inputs held (they were
    // held from the lease queue on before: an entry could be evicted while its candidates built).
    assert_eq!(p.compiles.load(Ordering::SeqCst), 36);
    assert_eq!(p.unheld_builds.load(Ordering::SeqCst), 0);
    assert_eq!(p.unheld_executions.load(Ordering::SeqCst), 0);
    // And let go once each evaluation ended.
    assert!(p.holds.lock().unwrap().values().all(|n| *n == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gates_bound_concurrency_per_resource() {
    let p = run(vec![gpu(0), gpu(1)], 3, 4).await;
    assert_eq!(p.llm.max(), 3, "LLM requests in flight");
    assert_eq!(p.compile.max(), 4, "compile pool");
    assert_eq!(p.execute.max(), 2, "one candidate per device");
    // With GPUs, builds go on while candidates are timed.
    assert!(p.overlaps.load(Ordering::SeqCst) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builds_run_as_many_at_once_as_the_cpu_budget_holds_by_their_measured_cores() {
    // 4 cores, 8 compile workers; builds were measured at 2 cores each and report 3 from now on.
    let budget = Arc::new(CpuBudget::new(4));
    budget.measured_build(30, 15);
    assert_eq!(budget.next_build_claim(), 2 * CORE);
    let probe = Arc::new(Probe {
        cpu_budget: Some(budget.clone()),
        build_milli_cores: 3 * CORE,
        ..Probe::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let dir = RunDir::create(&tmp.path().join("run"), "").unwrap();
    let summary = run_in(&probe, dir, None, vec![gpu(0), gpu(1)], 8, 8).await;
    assert_eq!((summary.finished, summary.tasks), (12, 12));
    assert_eq!(
        probe.compile.max(),
        2,
        "two 2-core builds fill 4 cores; 8 workers do not matter"
    );
    assert_eq!(probe.compiles.load(Ordering::SeqCst), 36);
    // Every build reported 3 cores: the estimate is theirs now, and nothing is left held.
    assert_eq!(budget.next_build_claim(), 3 * CORE);
    assert_eq!(budget.held(), krefine::cpu_budget::Held::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_build_is_found_before_a_compile_slot_or_cores_are_taken() {
    // Every core of the budget is held for good: a turn that asked for a build's cores would wait
    // forever. Cached outcomes need none, and no compile call is made.
    let budget = Arc::new(CpuBudget::new(1));
    let _held = budget.claim(krefine::cpu_budget::Claim::Inputs, CORE).await;
    let probe = Arc::new(Probe {
        cpu_budget: Some(budget.clone()),
        ..Probe::default()
    });
    probe.all_cached.store(true, Ordering::SeqCst);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("run");
    let dir = RunDir::create(&root, "").unwrap();
    let run = run_in(&probe, dir, None, vec![gpu(0)], 4, 1);
    let summary = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("a cached turn waited for cores or a slot");
    assert_eq!((summary.finished, summary.tasks), (12, 12));
    assert_eq!(probe.compiles.load(Ordering::SeqCst), 0);
    assert_eq!(probe.compile.max(), 0);
    let log = krefine::store::read_log(&root.join("events.jsonl")).unwrap();
    let cached = log
        .records
        .iter()
        .filter(|r| matches!(&r.event, krefine::types::Event::Compiled { outcome, .. } if outcome.cached))
        .count();
    assert_eq!(cached, 12 * 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builds_that_use_the_shared_headers_wait_for_one_warm_up_and_the_others_do_not() {
    // Half the problems' candidates would use the warmed headers. The first of them has them made
    // (once for the run, on a compile slot and two cores of the budget); the others start no
    // build until it ended, while the other half's builds go on meanwhile.
    let budget = Arc::new(CpuBudget::new(8));
    let probe = Arc::new(Probe {
        cpu_budget: Some(budget.clone()),
        ..Probe::default()
    });
    probe.warm.store(true, Ordering::SeqCst);
    let tmp = tempfile::tempdir().unwrap();
    let dir = RunDir::create(&tmp.path().join("run"), "").unwrap();
    let summary = run_in(&probe, dir, None, vec![gpu(0)], 4, 3).await;
    assert_eq!((summary.finished, summary.tasks), (12, 12));
    assert_eq!(probe.warms.load(Ordering::SeqCst), 1, "one warm-up a run");
    assert_eq!(
        probe.built_before_warm.load(Ordering::SeqCst),
        0,
        "a build that uses the headers started before they were made"
    );
    assert!(
        probe.other_built_during_warm.load(Ordering::SeqCst),
        "a build that uses no header waited for the warm-up"
    );
    assert!(
        probe.warm_cores.load(Ordering::SeqCst) >= 2 * CORE,
        "the warm-up held {} milli-cores of the budget",
        probe.warm_cores.load(Ordering::SeqCst)
    );
    assert_eq!(probe.compiles.load(Ordering::SeqCst), 36);
    assert_eq!(budget.held(), krefine::cpu_budget::Held::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_build_runs_while_the_cpu_device_is_timing() {
    let p = run(vec![DeviceInfo::cpu()], 8, 4).await;
    assert_eq!(p.execute.max(), 1);
    assert_eq!(p.overlaps.load(Ordering::SeqCst), 0);
    assert!(
        p.compile.max() > 1,
        "builds still run in parallel between timings"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cpu_device_times_on_quiet_cores_of_the_budget() {
    let budget = Arc::new(CpuBudget::new(2));
    let probe = Arc::new(Probe {
        cpu_budget: Some(budget.clone()),
        build_milli_cores: CORE / 2,
        ..Probe::default()
    });
    let tmp = tempfile::tempdir().unwrap();
    let dir = RunDir::create(&tmp.path().join("run"), "").unwrap();
    let summary = run_in(&probe, dir, None, vec![DeviceInfo::cpu()], 8, 8).await;
    assert_eq!((summary.finished, summary.tasks), (12, 12));
    assert_eq!(probe.execute.max(), 1);
    assert_eq!(probe.overlaps.load(Ordering::SeqCst), 0);
    // Half-core builds: four fit in two cores.
    assert_eq!(budget.next_build_claim(), CORE / 2);
    assert!(probe.compile.max() <= 4, "{}", probe.compile.max());
    assert_eq!(budget.held(), krefine::cpu_budget::Held::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_outage_defers_tasks_and_resume_redoes_exactly_them() {
    let probe = Arc::new(Probe::default());
    probe.compile_outage.store(3, Ordering::SeqCst);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("run");
    let dir = RunDir::create(&root, "").unwrap();
    let s = run_in(&probe, dir, None, vec![gpu(0)], 4, 4).await;
    assert_eq!((s.finished, s.tasks), (9, 12));
    assert_eq!((s.waiting_on_workers, s.waiting_on_llm), (3, 0));
    assert_eq!(s.stopped, None, "an outage is not a stop");
    assert_eq!(
        s.incomplete_reason().as_deref(),
        Some("incomplete: 3 task(s) waiting on workers")
    );
    let log = krefine::store::read_log(&root.join("events.jsonl")).unwrap();
    let kinds = |log: &krefine::store::ReadLog, kind: &str| {
        log.records
            .iter()
            .filter(|r| r.event.kind() == kind)
            .count()
    };
    assert_eq!(kinds(&log, "deferred"), 3);
    // The three deferred tasks stopped at their first compile: no verdict was recorded for them.
    assert_eq!(kinds(&log, "compiled"), 9 * 3);

    let s = run_in(
        &probe,
        RunDir::open(&root).unwrap(),
        Some(log),
        vec![gpu(0)],
        4,
        4,
    )
    .await;
    assert_eq!((s.finished, s.tasks), (12, 12));
    assert!(!s.incomplete());
    let log = krefine::store::read_log(&root.join("events.jsonl")).unwrap();
    assert_eq!(kinds(&log, "compiled"), 12 * 3);
    assert_eq!(
        kinds(&log, "llm_answered"),
        12 * 3,
        "no answer asked for twice"
    );
    // 3 refused calls, then every turn's compile exactly once.
    assert_eq!(probe.compiles.load(Ordering::SeqCst), 3 + 12 * 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_device_gets_no_more_work_and_its_step_runs_elsewhere() {
    let probe = Arc::new(Probe::default());
    probe.drain_gpu0.store(true, Ordering::SeqCst);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("run");
    let dir = RunDir::create(&root, "").unwrap();
    let s = run_in(&probe, dir, None, vec![gpu(0), gpu(1)], 4, 4).await;
    assert_eq!((s.finished, s.tasks), (12, 12), "nothing deferred");
    assert_eq!(
        probe.gpu0_calls.load(Ordering::SeqCst),
        1,
        "one call, then retired"
    );
    let log = krefine::store::read_log(&root.join("events.jsonl")).unwrap();
    let mut executed = 0;
    for r in &log.records {
        match &r.event {
            krefine::types::Event::Executed { outcome, .. } => {
                executed += 1;
                assert_eq!(outcome.device, "cuda:1");
            }
            krefine::types::Event::Deferred { .. } => panic!("a deferred step: {r:?}"),
            _ => {}
        }
    }
    assert_eq!(executed, 12 * 3);
    // The retired device's one lease is in the log, granted and released.
    let leases_on = |kind: &str| {
        log.records
            .iter()
            .filter(|r| r.event.kind() == kind && format!("{:?}", r.event).contains("cuda:0"))
            .count()
    };
    assert_eq!(
        (leases_on("lease_granted"), leases_on("lease_released")),
        (1, 1)
    );
}
