//! The async shell around the pure task machines.
//!
//! One tokio task drives each task machine: it performs the machine's command through a service
//! (behind its gate: LLM concurrency, compile pool, device leases), appends the answering event to the
//! log, and only then feeds it to the machine. Resume is the same loop started from a folded log, so a
//! completed turn is never redone and a logged LLM answer is never requested again.
//!
//! Reference data is prepared ahead of candidates by one background loop (`crate::refprep`): a
//! problem is wanted from the moment one of its tasks starts generating until that task executes.
//!
//! An outage is not a verdict: when the LLM endpoint does not answer within its retries
//! (`LlmError::Unavailable`) or the worker machinery cannot serve a step (`services::Unavailable`),
//! the driver logs an informational `Deferred` event and stops that task where it is. The machine
//! never sees the event, so a resume folds the task back to the same command and performs it again;
//! the run ends "incomplete" ([`RunSummary::incomplete_reason`]).
//!
//! Stopping early is `cancel`'s: one [`RunStop`] records why ([`StopReason`], typed and ordered by
//! severity) for the engine, the signals and the displays alike, and escalates a second request from
//! outside to "stop now".

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use tokio::sync::{Semaphore, broadcast, mpsc};
use tokio_util::sync::CancellationToken;

mod cancel;
mod header_warm;
mod resume;
mod stages;

pub use cancel::{Escalation, RunStop, ShutdownSignal, Signals, StopReason, StopState};
use stages::{Interest, compile, generate, on_device};

use crate::cpu_budget::CpuBudget;
use crate::gpu::{DeviceInfo, DevicePool};
use crate::machine::{MachineError, Retention, Stage, TaskRunner, TaskSpec};
use crate::prompt::{PromptSettings, Prompts};
use crate::refprep::{self, PrepServices, Preparer};
use crate::services::{Compiler, EventSink, Executor, Llm, SINK_CAPACITY};
use crate::store::{EventLog, FileWriter, ReadLog, RunDir, StoreError};
use crate::types::{
    Command, EndReason, Event, FeedbackMode, LogRecord, MethodKind, Problem, ProblemKey, TaskId,
    WaitingOn,
};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("resume: {0}")]
    Machine(#[from] MachineError),
    #[error("resume: {0}")]
    Resume(String),
    #[error("prompt for task {task} turn {turn}: {message}")]
    Prompt {
        task: TaskId,
        turn: u32,
        message: String,
    },
}

/// What to run: the problems, the tasks and their shape.
#[derive(Debug, Clone)]
pub struct RunPlan {
    /// The run's name (`run.name`, or the config file's stem), as its log records it.
    pub run: String,
    pub method: MethodKind,
    pub feedback: FeedbackMode,
    /// Turns per task (1 for one-shot and sampling).
    pub turns: u32,
    /// Tasks per problem (k for sampling, else 1).
    pub samples: u32,
    pub problems: Vec<Arc<Problem>>,
    /// Marks runs whose results come from simulated services.
    pub simulated: bool,
}

impl RunPlan {
    pub fn tasks(&self) -> Vec<TaskSpec> {
        let feedback = self.feedback;
        self.problems
            .iter()
            .flat_map(|p| {
                (0..self.samples).map(move |sample| TaskSpec {
                    id: TaskId {
                        problem: p.key,
                        sample,
                    },
                    max_turns: self.turns,
                    feedback,
                })
            })
            .collect()
    }
}

/// The services and gates an engine runs with.
pub struct EngineParts {
    pub llm: Arc<dyn Llm>,
    pub compiler: Arc<dyn Compiler>,
    pub executor: Arc<dyn Executor>,
    /// The devices candidates run on, one lease each; none: the CPU.
    pub devices: Vec<DeviceInfo>,
    pub prompts: Prompts,
    pub prompt_settings: PromptSettings,
    /// LLM requests in flight at once (at least 1).
    pub llm_concurrency: usize,
    /// Builds at once (at least 1).
    pub compile_workers: usize,
    /// The cores builds, the CPU stage of reference preparation and CPU-device timing share
    /// (`resources.cpu_budget`); `None`: not shared out (remote or simulated builds).
    pub cpu_budget: Option<Arc<CpuBudget>>,
    /// Problems whose reference data is prepared ahead of their candidates at once
    /// (`resources.prepare_ahead`; 0: none, candidates build what they need themselves).
    pub prepare_ahead: usize,
    /// The devices' locks across krefine processes on this machine, held with every lease, so that
    /// two runs never time on one device at once (`None`: this process's leases alone).
    pub host_locks: Option<crate::gpu::HostLocks>,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    /// Tasks planned.
    pub tasks: usize,
    /// Tasks that used all their turns, before this process or in it.
    pub finished: usize,
    /// Why the run stopped before finishing every task, if it did.
    pub stopped: Option<StopReason>,
    /// Tasks left unfinished because the LLM endpoint did not answer within its retries; a resume
    /// redoes exactly their pending step.
    pub waiting_on_llm: usize,
    /// Tasks left unfinished because no worker could be started (or the pool went away).
    pub waiting_on_workers: usize,
    /// Every device of the run was lost (`device: why; ...`): the tasks that reached a device step
    /// wait on workers, and a resume (on working devices) goes on.
    pub devices_lost: Option<String>,
    /// The warning for a torn last line the resumed log had (dropped before appending).
    pub torn_tail: Option<String>,
}

impl RunSummary {
    /// True when tasks wait on the LLM or on workers (an outage), as opposed to a stop or a finish.
    pub fn incomplete(&self) -> bool {
        self.waiting_on_llm + self.waiting_on_workers > 0
    }

    /// `incomplete: 4 task(s) waiting on the LLM, 1 on workers`, when tasks wait; with every
    /// device lost, which and why.
    pub fn incomplete_reason(&self) -> Option<String> {
        incomplete_reason(
            self.waiting_on_llm,
            self.waiting_on_workers,
            self.devices_lost.as_deref(),
        )
    }
}

fn incomplete_reason(llm: usize, workers: usize, devices_lost: Option<&str>) -> Option<String> {
    let waiting = match (llm, workers) {
        (0, 0) => return None,
        (n, 0) => format!("incomplete: {n} task(s) waiting on the LLM"),
        (0, n) => format!("incomplete: {n} task(s) waiting on workers"),
        (n, m) => format!("incomplete: {n} task(s) waiting on the LLM, {m} on workers"),
    };
    Some(match devices_lost {
        Some(lost) if workers > 0 => format!("{waiting}; every device was lost ({lost})"),
        _ => waiting,
    })
}

/// What performing one command produced.
#[allow(
    clippy::large_enum_variant,
    reason = "built once per command and matched at once, like `Event` itself; boxing would only add a hop"
)]
enum Step {
    /// The answering event, to log and feed to the machine.
    Event(Event),
    /// Nothing to log: the run was cancelled or LLM requests were stopped.
    Halt,
    /// An outage outside the candidate: the task stays where it is and waits for a resume.
    Defer {
        waiting_on: WaitingOn,
        error: String,
    },
}

/// What every task driver of a run shares: the run's log and files, the services that perform
/// commands, the gates in front of them, and how the run stands. One `Arc` per run; the drivers,
/// the informational-event task and the reference preparation hold clones.
struct Shared {
    /// The run directory: where compile logs go, and what logged paths are relative to.
    dir: RunDir,
    /// The event log. Every answering event is appended here before its machine sees it, which is
    /// what makes a killed run resumable.
    log: EventLog,
    /// Prompt files and candidate files, each kind written one after another by a thread of its
    /// own, so that a candidate's file never waits behind prompts.
    prompt_files: FileWriter,
    kernel_files: FileWriter,
    /// Every record as it is logged, in the file's order, plus transient ones (streamed tokens):
    /// what the terminal UI and the progress line follow. The log's writer sends on it.
    bus: broadcast::Sender<Arc<LogRecord>>,
    /// Where services report informational events (attempts, retries, lease and preparation
    /// events); one task logs them in arrival order ([`log_info`]).
    sink: EventSink,
    /// The services that perform the machines' commands.
    llm: Arc<dyn Llm>,
    compiler: Arc<dyn Compiler>,
    executor: Arc<dyn Executor>,
    /// The templates and settings every prompt is rendered with.
    prompts: Prompts,
    prompt_settings: PromptSettings,
    /// The plan's problems by key, for a task's prompt and its device steps.
    problems: HashMap<ProblemKey, Arc<Problem>>,
    /// LLM requests in flight at once (`resources.llm_concurrency`).
    llm_gate: Semaphore,
    /// Builds at once (`resources.compile_workers`): one permit per compile worker.
    compile_gate: Semaphore,
    /// The shared headers made before the builds that use them (see [`header_warm`]).
    header_warm: header_warm::HeaderWarm,
    /// The compile gate's permits in all: taking every one drains the builds while the CPU device
    /// times a candidate (when the compiler cannot pause them).
    compile_slots: u32,
    /// See [`EngineParts::cpu_budget`].
    cpu: Option<Arc<CpuBudget>>,
    /// The run's devices and their leases, granted first come, first served.
    devices: DevicePool,
    /// Reference preparation ahead of candidates (`None`: off, or the executor needs none).
    prep: Option<Arc<Preparer>>,
    /// The steps' cancellation (`stop`'s token), also cancelled by a driver's error: every wait of a
    /// driver ends with it, and nothing more is logged for its step.
    cancel: CancellationToken,
    /// Why the run stops, and its escalation (see `cancel`).
    stop: RunStop,
    /// Set when no new LLM request may start (budget exhausted, fatal provider error).
    llm_stopped: AtomicBool,
    /// Tasks that reached `Finish`, this process's and those the log had finished already.
    finished: AtomicU32,
    /// Tasks deferred by an outage, by what they wait on: a resume redoes exactly their steps.
    waiting_llm: AtomicU32,
    waiting_workers: AtomicU32,
}

impl Shared {
    /// Log `event`; resolves to the record once it is in the file. The event is queued before this
    /// returns and the future does not hold it, which keeps the futures of waiting drivers small.
    fn append(
        &self,
        task: Option<TaskId>,
        event: Event,
    ) -> impl Future<Output = Result<Arc<LogRecord>, StoreError>> + '_ {
        #[cfg(debug_assertions)]
        test_panic_hook();
        // The log's writer sends the record on the bus, in the file's order.
        self.log.append(task, event)
    }

    fn problem(&self, task: TaskId) -> Result<Arc<Problem>, EngineError> {
        self.problems.get(&task.problem).cloned().ok_or_else(|| {
            EngineError::Resume(format!("problem {} is not in the dataset", task.problem))
        })
    }

    /// No new LLM request starts, for `reason`; a reason that cancels steps cancels them too.
    fn stop(&self, reason: StopReason) {
        self.llm_stopped.store(true, Ordering::SeqCst);
        self.stop.request(reason);
    }
}

/// A prepared run: log folded (when resuming), ready to drive.
pub struct Engine {
    shared: Arc<Shared>,
    /// Every planned task's machine with the command it performs first (a new task's first
    /// request, or where a resumed one's log leaves it).
    runners: Vec<(TaskRunner, Command)>,
    /// The other end of the services' sink ([`Shared::sink`]), drained by one task while the run
    /// goes.
    info_rx: mpsc::Receiver<(Option<TaskId>, Event)>,
    /// The warning for a torn last line the resumed log had (dropped before appending).
    torn_tail: Option<String>,
    /// What the run's `RunStarted` record says.
    plan: RunPlan,
    /// The run goes on from a log (`RunStarted.resumed`).
    resumed: bool,
}

impl Engine {
    /// Set up gates and services and open the run's log. `prior` is the log as read back when the
    /// run is resumed (folded here so finished turns are never redone), `None` for a new run.
    /// `stop` is how the run is stopped from outside: a [`RunStop`] (typed reasons, escalation), or a
    /// bare token whose cancellation reads as [`StopReason::Cancelled`].
    pub async fn prepare(
        plan: RunPlan,
        parts: EngineParts,
        dir: RunDir,
        prior: Option<ReadLog>,
        fsync: bool,
        stop: impl Into<RunStop>,
    ) -> Result<Engine, EngineError> {
        let stop: RunStop = stop.into();
        let specs = plan.tasks();
        let events_path = dir.events_path();
        let resume = prior.is_some();
        let (records, valid_len, torn_tail) = match prior {
            Some(read) => (read.records, read.valid_len, read.torn_tail),
            None => (Vec::new(), 0, None),
        };
        let next_seq = records.last().map(|r| r.seq + 1).unwrap_or(0);
        // The engine keeps of finished turns only what later prompts need; views and reports fold
        // the log for the rest.
        let retention = Retention::Prompts(parts.prompt_settings.history);
        let runners = resume::fold(&specs, retention, &records, &dir.config_path())?;

        let (bus, _) = broadcast::channel(4096);
        let log = EventLog::open_broadcasting(
            &events_path,
            valid_len,
            next_seq,
            fsync,
            Some(bus.clone()),
        )
        .await?;
        let (info_tx, info_rx) = mpsc::channel(SINK_CAPACITY);
        let problems = plan.problems.iter().map(|p| (p.key, p.clone())).collect();
        let devices = if parts.devices.is_empty() {
            vec![DeviceInfo::cpu()]
        } else {
            parts.devices
        };
        let prep = (parts.prepare_ahead > 0 && parts.executor.prepares_reference())
            .then(|| Arc::new(Preparer::new(parts.prepare_ahead)));
        let shared = Arc::new(Shared {
            dir,
            log,
            prompt_files: FileWriter::start("prompts")?,
            kernel_files: FileWriter::start("kernels")?,
            bus,
            sink: EventSink::new(info_tx),
            llm: parts.llm,
            compiler: parts.compiler,
            executor: parts.executor,
            prompts: parts.prompts,
            prompt_settings: parts.prompt_settings,
            problems,
            llm_gate: Semaphore::new(parts.llm_concurrency.max(1)),
            compile_gate: Semaphore::new(parts.compile_workers.max(1)),
            header_warm: header_warm::HeaderWarm::new(),
            compile_slots: parts.compile_workers.max(1) as u32,
            cpu: parts.cpu_budget,
            devices: match parts.host_locks {
                Some(locks) => DevicePool::new(devices).with_host_locks(locks),
                None => DevicePool::new(devices),
            },
            prep,
            cancel: stop.token().clone(),
            stop,
            llm_stopped: AtomicBool::new(false),
            finished: AtomicU32::new(0),
            waiting_llm: AtomicU32::new(0),
            waiting_workers: AtomicU32::new(0),
        });
        Ok(Engine {
            shared,
            runners,
            info_rx,
            torn_tail,
            plan,
            resumed: resume,
        })
    }

    /// Live events (appended records, plus transient ones such as streamed tokens).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<LogRecord>> {
        self.shared.bus.subscribe()
    }

    /// The sink services report informational events through.
    pub fn sink(&self) -> EventSink {
        self.shared.sink.clone()
    }

    /// (task, stage, turn) of every task before the run continues.
    pub fn stages(&self) -> Vec<(TaskId, Stage, u32)> {
        self.runners
            .iter()
            .map(|(r, _)| {
                let (s, t) = r.stage();
                (r.spec().id, s, t)
            })
            .collect()
    }

    pub fn torn_tail(&self) -> Option<&str> {
        self.torn_tail.as_deref()
    }

    /// Drive every unfinished task to its end (or until cancelled or stopped).
    pub async fn run(self) -> Result<RunSummary, EngineError> {
        let Engine {
            shared,
            runners,
            mut info_rx,
            torn_tail,
            plan,
            resumed,
        } = self;
        shared
            .append(
                None,
                Event::RunStarted {
                    run: plan.run.clone(),
                    method: plan.method,
                    feedback: Some(plan.feedback),
                    task_ids: runners.iter().map(|(r, _)| r.spec().id).collect(),
                    turns: plan.turns,
                    samples: plan.samples,
                    krefine_version: env!("CARGO_PKG_VERSION").into(),
                    resumed,
                    simulated: plan.simulated,
                    problem_names: plan
                        .problems
                        .iter()
                        .map(|p| (p.key, p.name.clone()))
                        .collect(),
                },
            )
            .await?;

        // Informational events from services go through the same log, in arrival order. `drain`
        // asks the task to log what is still queued and stop, once every driver has returned.
        let info_shared = shared.clone();
        let drain = CancellationToken::new();
        let drain_rx = drain.clone();
        let info_task = tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    biased;
                    m = info_rx.recv() => m,
                    _ = drain_rx.cancelled() => info_rx.try_recv().ok(),
                };
                let Some((task, event)) = msg else { break };
                log_info(&info_shared, task, event).await;
            }
        });

        // Reference data for the problems whose answers are being generated, while they are.
        let prep_stop = CancellationToken::new();
        let prep_task = shared.prep.clone().map(|prep| {
            let (shared, stop) = (shared.clone(), prep_stop.clone());
            tokio::spawn(async move {
                let services = PrepServices {
                    devices: &shared.devices,
                    executor: &*shared.executor,
                    compiler: &*shared.compiler,
                    problems: &shared.problems,
                    sink: &shared.sink,
                    cpu: shared.cpu.as_deref(),
                };
                refprep::run(&prep, services, &stop).await;
            })
        });

        let total = runners.len();
        let mut handles = Vec::new();
        for (runner, pending) in runners {
            if runner.is_done() {
                shared.finished.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            let shared = shared.clone();
            handles.push(tokio::spawn(drive(shared, runner, pending)));
        }
        let mut first_err = None;
        for h in handles {
            match h.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    shared.stop(StopReason::Failed(e.to_string()));
                    first_err.get_or_insert(e);
                }
                Err(join) => {
                    let msg = format!("a task driver failed: {join}");
                    shared.stop(StopReason::Failed(msg.clone()));
                    first_err.get_or_insert(EngineError::Resume(msg));
                }
            }
        }
        let finished = shared.finished.load(Ordering::SeqCst) as usize;
        let waiting_on_llm = shared.waiting_llm.load(Ordering::SeqCst) as usize;
        let waiting_on_workers = shared.waiting_workers.load(Ordering::SeqCst) as usize;
        let devices_lost = shared
            .devices
            .live_devices()
            .is_empty()
            .then(|| shared.devices.lost_summary());
        let incomplete =
            incomplete_reason(waiting_on_llm, waiting_on_workers, devices_lost.as_deref());
        // Deferred tasks alone are not a stop: they say so in `incomplete`.
        let stopped = if finished < total {
            shared.stop.reason().or_else(|| {
                incomplete
                    .is_none()
                    .then(|| StopReason::Failed("stopped".into()))
            })
        } else {
            None
        };
        // A step still in flight is dropped (its worker goes with the pool's shutdown).
        prep_stop.cancel();
        if let Some(t) = prep_task {
            let _ = t.await;
        }
        // Services' last informational events land before the closing record.
        drain.cancel();
        let _ = info_task.await;
        shared
            .append(
                None,
                Event::RunEnded {
                    reason: EndReason::of(stopped.as_ref(), incomplete.as_deref()),
                },
            )
            .await?;
        if let Some(e) = first_err {
            return Err(e);
        }
        Ok(RunSummary {
            tasks: total,
            finished,
            stopped,
            waiting_on_llm,
            waiting_on_workers,
            devices_lost,
            torn_tail,
        })
    }
}

/// Tests only (debug builds): `KREFINE_TEST_PANIC_AT_EVENT=N` panics in whatever task appends the
/// run's N-th event (counted in this process), so that a test can show that a panic anywhere leaves
/// the run directory resumable.
#[cfg(debug_assertions)]
fn test_panic_hook() {
    static APPENDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    static AT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| {
        std::env::var("KREFINE_TEST_PANIC_AT_EVENT")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    if let Some(at) = *at
        && APPENDS.fetch_add(1, Ordering::SeqCst) + 1 == at
    {
        panic!("KREFINE_TEST_PANIC_AT_EVENT={at}: a test's panic");
    }
}

/// Log (or, for transient events, only broadcast) one informational event.
async fn log_info(shared: &Shared, task: Option<TaskId>, event: Event) {
    if event.is_transient() {
        let rec = LogRecord {
            v: crate::types::SCHEMA_VERSION,
            seq: 0,
            ts_ms: crate::store::now_ms(),
            task,
            event,
        };
        let _ = shared.bus.send(Arc::new(rec));
    } else if let Err(e) = shared.append(task, event).await {
        tracing::error!("cannot log an informational event: {e}");
    }
}

/// Run a task's commands until it finishes, the run is cancelled, or LLM requests are stopped.
///
/// Every task of a run has a driver from start to finish, most of them waiting at a gate, so the
/// stages run as boxed futures: a waiting driver holds the stage it waits in, not room for the
/// largest one.
async fn drive(
    shared: Arc<Shared>,
    mut runner: TaskRunner,
    mut cmd: Command,
) -> Result<(), EngineError> {
    let task = runner.spec().id;
    let mut interest = Interest {
        prep: shared.prep.as_deref(),
        problem: task.problem,
        on: false,
    };
    // The problem's stored inputs are held from the candidate's build to the end of its evaluation:
    // an entry evicted while its candidates build (to admit another problem's) is made again inside
    // their leases (2 GPUs, cold: level 1 problem 93's 32 GB twice, 114-122 s of lease each).
    let mut _inputs_hold = None;
    loop {
        let (turn, step) = match cmd {
            Command::Finish => {
                shared.finished.fetch_add(1, Ordering::SeqCst);
                return Ok(());
            }
            Command::CallLlm { turn, context } => {
                _inputs_hold = None;
                (
                    turn,
                    Box::pin(generate(&shared, task, turn, &context, &mut interest)).await?,
                )
            }
            Command::Compile { turn, code } => {
                _inputs_hold = shared.executor.hold_inputs(&*shared.problem(task)?);
                (turn, Box::pin(compile(&shared, task, turn, code)).await)
            }
            Command::Execute { turn, code } => {
                interest.end();
                let build_dir = build_dir(&runner, turn);
                let stage = on_device(&shared, task, turn, code, build_dir, false);
                let step = Box::pin(stage).await?;
                _inputs_hold = None;
                (turn, step)
            }
            Command::Profile { turn, code } => {
                let build_dir = build_dir(&runner, turn);
                let stage = on_device(&shared, task, turn, code, build_dir, true);
                (turn, Box::pin(stage).await?)
            }
        };
        let event = match step {
            Step::Event(e) => e,
            // The task stops here without an event (cancelled, or no more LLM requests).
            Step::Halt => return Ok(()),
            Step::Defer { waiting_on, error } => {
                // Informational only: the machine never sees it, so a resume folds the task back to
                // this very command and performs it again.
                tracing::warn!("task {task} turn {turn} waits on {waiting_on}: {error}");
                let counter = match waiting_on {
                    WaitingOn::Llm => &shared.waiting_llm,
                    WaitingOn::Workers => &shared.waiting_workers,
                };
                counter.fetch_add(1, Ordering::SeqCst);
                shared
                    .append(
                        Some(task),
                        Event::Deferred {
                            turn,
                            waiting_on,
                            error,
                        },
                    )
                    .await?;
                return Ok(());
            }
        };
        // Write-ahead: the event is durable before the machine acts on it.
        let rec = shared.append(Some(task), event).await?;
        match runner.handle(&rec.event)? {
            Some(next) => cmd = next,
            None => {
                return Err(EngineError::Resume(format!(
                    "task {task}: the machine issued no command after `{}`",
                    rec.event.kind()
                )));
            }
        }
    }
}

/// The build folder of the turn's candidate, when its compile step left one for the device step.
fn build_dir(runner: &TaskRunner, turn: u32) -> Option<String> {
    runner
        .turn(turn)
        .and_then(|r| r.compile.as_ref())
        .and_then(|c| c.build_dir.clone())
}
