//! [`WorkerPool`]: the real `Compiler` and `Executor`.
//!
//! - Compile: N persistent CPU workers (role `compile`, GPUs hidden), one job each at a time. Builds
//!   are content-addressed (`build_cache/<blake3(source, torch, arch list)[..16]>`); a build dir that
//!   holds a success marker answers `cached: true` without touching Python, and a per-build-dir async
//!   lock keeps two jobs from ever using one build dir at once.
//! - Execute/profile: one persistent evaluation worker per device (role `gpu`,
//!   `CUDA_VISIBLE_DEVICES=<index>`, device `cuda:0` inside; `cpu` for the CPU device). The engine
//!   holds the device lease while it calls, so each worker sees one request at a time.
//! - Every request has a deadline. Timeouts, crashes, protocol violations and sticky CUDA errors kill
//!   the worker's process group; the next request starts a fresh worker. The job gets a verdict that
//!   says what happened, in KernelBench's metadata shape where one applies.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::{Mutex, OwnedMutexGuard, Semaphore};

use super::WorkerError;
use super::baseline::BaselineTable;
use super::build_store::{cow_tainted, make_files_read_only, publish_build};
use super::loss::{Fault, give_up, toolchain_mismatch};
use super::pause::Pauser;
use super::process::Remote;
use super::process::{Budget, RequestError, SpawnSpec, WorkerProcess, kill_group, log_tail};
use super::protocol::{
    CandidateSpec, CompileRequest, CompileStatusWire, EvaluateResponse, IntegritySpec,
    PrepareRequest, ProblemSpec, ProfileRequest, ProfileResponse, ProfileStatus, RequestBody,
    ResponseBody, TimingSpec, WorkerRole,
};
use super::sandbox::{self, Overlay, SandboxLevel, SandboxMode, SandboxSpec};
use crate::config::{BuildMode, EvalSection, Timeouts};
use crate::launcher::Launcher;
use crate::services::{BuildPause, CompileJob, Compiler, DeviceId, ExecJob, Executor, Unavailable};
use crate::types::{
    CompileOutcome, CompileStatus, EvalEnv, EvalMode, ExecOutcome, Precision, PrepareOutcome,
    Problem, ProfileOutcome, RanOn, Verdict, WorkerLoss,
};

use super::build_store::SUCCESS_MARKER;
/// A copy of the compile log kept with the build, handed to later jobs that hit the cache.
const CACHED_LOG: &str = "krefine-compile.log";
/// How long a worker asked to exit (recycling, shutdown) may take before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(5);
/// Lines of a log quoted in a verdict's feedback.
const TAIL_LINES: usize = 20;

/// Everything the pool needs. Paths should be absolute (the harness gets them verbatim).
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Interpreter with torch (see [`super::find_python`]).
    pub python: PathBuf,
    /// Folder holding the deployed harness (see [`super::deploy_harness`]).
    pub harness_dir: PathBuf,
    /// Each worker gets `<scratch_root>/<worker name>/` as HOME, TMPDIR and working directory.
    pub scratch_root: PathBuf,
    /// Worker logs: `<log_dir>/<worker name>.log` (`compile-0.log`, `gpu-1.log`, `cpu-0.log`).
    pub log_dir: PathBuf,
    /// Content-addressed build directories.
    pub build_cache: PathBuf,
    /// How `load_inline` extensions are built (`eval.build`).
    pub build: BuildMode,
    /// Persistent compile worker processes (at least 1).
    pub compile_workers: usize,
    /// One evaluation worker per device.
    pub devices: Vec<DeviceId>,
    /// `TORCH_CUDA_ARCH_LIST`; `None`: from the GPUs' compute capabilities (none on a CPU-only pool).
    pub arch_list: Option<String>,
    pub precision: Precision,
    pub mode: EvalMode,
    pub seed: u64,
    pub correct_trials: u32,
    pub warmup: u32,
    /// Timed trials; 0 turns timing off.
    pub timing_trials: u32,
    pub timeouts: Timeouts,
    /// Replace a worker after this many requests (0: never).
    pub recycle_after: u32,
    pub profile_rows: u32,
    pub ncu: bool,
    /// Reference runtimes from a KernelBench baseline file instead of timing the reference.
    pub baseline: Option<Arc<BaselineTable>>,
    /// GPU driver version, recorded in every result's `env`.
    pub driver: Option<String>,
    /// `eval.max_speedup`: the excessive-speedup bound (default: the roofline, or 50).
    pub max_speedup: Option<f64>,
    /// `eval.cast_integer_inputs`: KernelBench's cast of integer and bool inputs.
    pub cast_integer_inputs: bool,
    /// Extra worker environment (the Hugging Face cache and offline mode, see `crate::hf`).
    pub extra_env: Vec<(String, std::ffi::OsString)>,
    /// The orchestrator's own `CUDA_VISIBLE_DEVICES` (set by the user or a scheduler), against which
    /// `DeviceId::Gpu(i)` is an index; see [`crate::gpu::worker_visible_device`].
    pub visible_devices: Option<String>,
    /// `eval.sandbox`: confine every worker in namespaces (see [`super::sandbox`]).
    pub sandbox: SandboxMode,
    /// Where workers start (`resources.launcher`; see [`crate::launcher`]).
    pub launcher: Arc<Launcher>,
}

impl WorkerSettings {
    /// Settings with `EvalSection`'s defaults, one compile worker, the CPU device, and the scratch,
    /// log and build-cache folders under `work_dir` (`scratch/`, `workers/`, `build-cache/`).
    pub fn new(python: PathBuf, harness_dir: PathBuf, work_dir: &Path) -> WorkerSettings {
        let eval = EvalSection::default();
        let mut s = WorkerSettings {
            python,
            harness_dir,
            scratch_root: work_dir.join("scratch"),
            log_dir: work_dir.join("workers"),
            build_cache: work_dir.join("build-cache"),
            build: BuildMode::default(),
            compile_workers: 1,
            devices: vec![DeviceId::Cpu],
            arch_list: None,
            precision: Precision::default(),
            mode: EvalMode::default(),
            seed: 0,
            correct_trials: 0,
            warmup: 0,
            timing_trials: 0,
            timeouts: Timeouts::default(),
            recycle_after: 0,
            profile_rows: 0,
            ncu: false,
            baseline: None,
            driver: None,
            max_speedup: None,
            cast_integer_inputs: false,
            extra_env: Vec::new(),
            visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
            sandbox: SandboxMode::default(),
            launcher: Arc::new(Launcher::local()),
        };
        s.apply_eval(&eval);
        s
    }

    /// Take the evaluation settings of a config's `[eval]` section (the baseline file is loaded
    /// separately, with [`BaselineTable::load`]).
    pub fn apply_eval(&mut self, eval: &EvalSection) {
        self.precision = eval.precision;
        self.mode = eval.mode;
        self.seed = eval.seed;
        self.correct_trials = eval.correct_trials;
        self.warmup = eval.warmup;
        self.timing_trials = eval.timing_trials;
        self.arch_list = eval.arch_list.clone();
        self.timeouts = eval.timeouts.clone();
        self.recycle_after = eval.recycle_after;
        self.profile_rows = eval.profile_rows;
        self.ncu = eval.ncu;
        self.build = eval.build;
        self.max_speedup = eval.max_speedup;
        self.cast_integer_inputs = eval.cast_integer_inputs;
        self.sandbox = eval.sandbox_mode();
        if let Some(dir) = &eval.build_cache {
            self.build_cache = dir.clone();
        }
    }
}

/// The timeouts as durations, validated once.
#[derive(Debug, Clone, Copy)]
struct Deadlines {
    compile: Duration,
    load: Duration,
    reference: Duration,
    execute: Duration,
    profile: Duration,
}

impl Deadlines {
    fn from(t: &Timeouts) -> Result<Deadlines, WorkerError> {
        let d = |name: &str, secs: f64| {
            if secs.is_finite() && secs > 0.0 {
                Duration::try_from_secs_f64(secs)
                    .map_err(|e| WorkerError::Settings(format!("timeouts.{name} = {secs}: {e}")))
            } else {
                Err(WorkerError::Settings(format!(
                    "timeouts.{name} must be a positive number of seconds, got {secs}"
                )))
            }
        };
        Ok(Deadlines {
            compile: d("compile_s", t.compile_s)?,
            load: d("load_s", t.load_s)?,
            reference: d("reference_s", t.reference_s)?,
            execute: d("execute_s", t.execute_s)?,
            profile: d("profile_s", t.profile_s)?,
        })
    }
}

/// One worker position: how to start its process, and the process while it lives.
struct Slot {
    spec: SpawnSpec,
    state: Mutex<SlotState>,
    /// Process group of the live process (0: none), readable without the lock so `shutdown` can kill
    /// a worker that is busy with a request (and the pauser can stop a compile worker mid-build).
    pgid: Arc<AtomicU32>,
    /// The device name the worker reported (GPUs only), for outcomes the orchestrator writes itself.
    hardware: StdMutex<Option<String>>,
    /// Where its current (or last) worker ran.
    ran_on: StdMutex<Option<RanOn>>,
    /// The slot's host was drained and the slot is bound to it (SSH): it serves nothing more.
    retired: AtomicBool,
}

impl Slot {
    fn ran_on(&self) -> Option<RanOn> {
        match self.ran_on.lock() {
            Ok(r) => r.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The host its worker runs on: the one it reported, else the one it is bound to.
    fn host(&self) -> Option<String> {
        self.ran_on()
            .map(|r| r.host)
            .filter(|h| !h.is_empty())
            .or_else(|| {
                let r = self.spec.remote.as_ref()?;
                r.launcher.placement_host(&r.placement)
            })
    }

    fn hardware(&self) -> Option<String> {
        match self.hardware.lock() {
            Ok(h) => h.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn note_ready(&self, process: &WorkerProcess, launcher: &Launcher) {
        let here = launcher.ran_on(process.ready());
        match self.ran_on.lock() {
            Ok(mut r) => *r = Some(here),
            Err(poisoned) => *poisoned.into_inner() = Some(here),
        }
        if let Some(dev) = &process.ready().device {
            let mut h = match self.hardware.lock() {
                Ok(h) => h,
                Err(poisoned) => poisoned.into_inner(),
            };
            *h = Some(dev.name.clone());
        }
    }
}

#[derive(Default)]
struct SlotState {
    process: Option<WorkerProcess>,
    /// Requests the current process has served (for recycling).
    served: u32,
}

/// Why a slot could not produce a response.
pub(super) enum CallError {
    Start(WorkerError),
    Request(RequestError),
    Closed,
    /// The worker's node, step or connection died (remote launchers): retried elsewhere.
    Lost(WorkerLoss),
}

fn closed() -> Unavailable {
    Unavailable("the worker pool was shut down".into())
}

/// Exclusive use of one build dir: the in-process lock, then the cross-process file lock that every
/// krefine process sharing the build cache takes (`<build dir>.lock`, next to the dir so that the
/// build itself never touches it). A concurrent run therefore never sees a half-written build.
struct BuildGuard {
    dir: PathBuf,
    _local: OwnedMutexGuard<()>,
    _file: crate::lock::FileLock,
}

impl Drop for BuildGuard {
    fn drop(&mut self) {
        // Before the locks (fields) are released: see release_build_dir.
        super::build_store::release_build_dir(&self.dir);
    }
}

impl CallError {
    /// Sort a failure: the candidate's (a verdict: `Ok`) or the machinery's (`Err`: no worker could
    /// be started, the pool was shut down), which leaves the turn unfinished for a resume.
    fn candidate_fault(self) -> Result<CallError, Fault> {
        match self {
            CallError::Start(e) => Err(Fault::Unavailable(Unavailable(format!(
                "no worker could be started: {e}"
            )))),
            CallError::Closed => Err(Fault::Unavailable(closed())),
            CallError::Lost(loss) => Err(Fault::Lost(loss)),
            other => Ok(other),
        }
    }
}

/// The success marker's content.
#[derive(Debug, Serialize, Deserialize)]
struct BuildMarker {
    key: String,
    torch: String,
    arch_list: Option<String>,
    feedback: String,
    duration_s: f64,
    /// How the build was made (`fast`, `plain`, `fallback:<why>`), reported again on a cache hit.
    #[serde(default)]
    build_path: Option<String>,
}

pub struct WorkerPool {
    settings: WorkerSettings,
    deadlines: Deadlines,
    /// torch version of the workers (part of the build key).
    torch: String,
    /// The first compile worker's toolchain (machine, libc, compilers; part of the build key). A
    /// worker that reports another one is refused.
    toolchain: Option<String>,
    /// The arch list builds use (settings, or derived from the GPUs).
    arch_list: Option<String>,
    compile_slots: Vec<Slot>,
    compile_free: StdMutex<Vec<usize>>,
    compile_permits: Semaphore,
    eval_slots: Vec<(DeviceId, Slot)>,
    build_locks: StdMutex<HashMap<PathBuf, Arc<Mutex<()>>>>,
    closed: AtomicBool,
    /// Stops the compile workers while the CPU device times a candidate.
    pauser: Arc<Pauser>,
    /// What the workers run in (recorded in every result's `env.sandbox`).
    sandbox_level: SandboxLevel,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("torch", &self.torch)
            .field("arch_list", &self.arch_list)
            .field("compile_workers", &self.compile_slots.len())
            .field(
                "devices",
                &self.eval_slots.iter().map(|(d, _)| d).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Returns a compile slot index to the free list when dropped (also on cancellation).
struct FreeSlot<'a> {
    free: &'a StdMutex<Vec<usize>>,
    index: usize,
}

impl Drop for FreeSlot<'_> {
    fn drop(&mut self) {
        if let Ok(mut free) = self.free.lock() {
            free.push(self.index);
        }
    }
}

impl WorkerPool {
    /// Start the pool: the evaluation worker of every device and the first compile worker are started
    /// (and must report `ready`) before this returns, so a broken Python or harness fails the run at
    /// once; the other compile workers start on first use.
    pub async fn start(settings: WorkerSettings) -> Result<Arc<WorkerPool>, WorkerError> {
        let deadlines = Deadlines::from(&settings.timeouts)?;
        if settings.compile_workers == 0 {
            return Err(WorkerError::Settings(
                "compile_workers must be at least 1".into(),
            ));
        }
        if settings.devices.is_empty() {
            return Err(WorkerError::Settings("no devices to evaluate on".into()));
        }
        for (i, d) in settings.devices.iter().enumerate() {
            if settings.devices[..i].contains(d) {
                return Err(WorkerError::Settings(format!("device {d} is listed twice")));
            }
        }
        for (dir, what) in [
            (&settings.scratch_root, "create scratch root"),
            (&settings.log_dir, "create worker log folder"),
            (&settings.build_cache, "create build cache"),
        ] {
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(|e| WorkerError::io(what, dir, e))?;
        }

        let sandbox_level = resolve_sandbox(&settings).await?;
        let confine = sandbox_level.is_confined();
        let visible = visible_dirs(&settings);
        let launcher = settings.launcher.clone();
        let remote = launcher.is_remote();
        let spec = |name: String, role, cvd: Option<String>, arch: Option<String>, at| SpawnSpec {
            sandbox: confine.then(|| worker_sandbox(&settings, &name, &visible)),
            remote: remote.then(|| Remote {
                launcher: launcher.clone(),
                placement: at,
            }),
            scratch: settings.scratch_root.join(&name),
            log_path: settings.log_dir.join(format!("{name}.log")),
            name,
            role,
            python: settings.python.clone(),
            harness_dir: settings.harness_dir.clone(),
            cuda_visible_devices: cvd,
            arch_list: arch,
            load_timeout: deadlines.load,
            extra_env: settings.extra_env.clone(),
        };
        let physical = |i: u32| {
            crate::gpu::worker_visible_device(i, settings.visible_devices.as_deref())
                .map_err(WorkerError::Settings)
        };
        let eval_specs: Vec<(DeviceId, SpawnSpec)> = settings
            .devices
            .iter()
            .map(|d| {
                let at = launcher.eval_placement(d);
                let s = match d {
                    // A Slurm step gets its GPU from Slurm; an SSH worker's is set remotely.
                    DeviceId::Gpu(i) if remote => spec(
                        format!("gpu-{i}"),
                        WorkerRole::Gpu,
                        None,
                        settings.arch_list.clone(),
                        at,
                    ),
                    DeviceId::Gpu(i) => spec(
                        format!("gpu-{i}"),
                        WorkerRole::Gpu,
                        Some(physical(*i)?),
                        settings.arch_list.clone(),
                        at,
                    ),
                    // An empty CUDA_VISIBLE_DEVICES hides every GPU: "cpu" means CPU only.
                    DeviceId::Cpu => spec(
                        "cpu-0".into(),
                        WorkerRole::Gpu,
                        Some(String::new()),
                        settings.arch_list.clone(),
                        at,
                    ),
                };
                Ok((d.clone(), s))
            })
            .collect::<Result<_, WorkerError>>()?;
        // Compile workers see the run's GPUs, as KernelBench's CPU pre-compile does: a candidate
        // that picks its sources with `torch.cuda.is_available()` at import must build here what
        // the device will load. They never run kernels; a candidate that allocates on the GPU at
        // import costs a CUDA context for the length of its build.
        // Remote compile workers run as CPU steps (or on hosts whose GPUs serve others): none.
        let run_gpus = if remote {
            String::new()
        } else {
            settings
                .devices
                .iter()
                .filter_map(|d| match d {
                    DeviceId::Gpu(i) => Some(physical(*i)),
                    DeviceId::Cpu => None,
                })
                .collect::<Result<Vec<_>, _>>()?
                .join(",")
        };
        let compile_specs: Vec<SpawnSpec> = (0..settings.compile_workers)
            .map(|i| {
                spec(
                    format!("compile-{i}"),
                    WorkerRole::Compile,
                    Some(run_gpus.clone()),
                    settings.arch_list.clone(),
                    launcher.compile_placement(i),
                )
            })
            .collect();

        // Start the device workers and the first compile worker concurrently (each imports torch).
        let first_compile = WorkerProcess::spawn(&compile_specs[0]);
        let evals =
            futures::future::join_all(eval_specs.iter().map(|(_, s)| WorkerProcess::spawn(s)));
        let (first_compile, evals) = tokio::join!(first_compile, evals);
        // On error, everything started so far is dropped here, which kills it.
        let first_compile = first_compile?;
        let evals: Vec<WorkerProcess> = evals.into_iter().collect::<Result<_, _>>()?;

        let torch = first_compile.ready().torch.clone();
        let toolchain = first_compile
            .ready()
            .placement
            .as_ref()
            .and_then(|p| p.toolchain.clone());
        for w in &evals {
            if let Some(why) = toolchain_mismatch(toolchain.as_deref(), w.ready()) {
                return Err(WorkerError::Start {
                    worker: w.name().to_string(),
                    detail: why,
                    log_tail: String::new(),
                });
            }
        }
        let arch_list = match &settings.arch_list {
            Some(a) => Some(a.clone()),
            None => {
                let mut caps: Vec<String> = Vec::new();
                for w in &evals {
                    if let Some(dev) = &w.ready().device
                        && let [major, minor, ..] = dev.capability[..]
                    {
                        let cap = format!("{major}.{minor}");
                        if !caps.contains(&cap) {
                            caps.push(cap);
                        }
                    }
                }
                (!caps.is_empty()).then(|| caps.join(";"))
            }
        };

        let make_slot = |spec: SpawnSpec, process: Option<WorkerProcess>| {
            let mut slot = Slot {
                pgid: Arc::new(AtomicU32::new(process.as_ref().map_or(0, |p| p.pid()))),
                spec,
                state: Mutex::new(SlotState {
                    process: None,
                    served: 0,
                }),
                hardware: StdMutex::new(None),
                ran_on: StdMutex::new(None),
                retired: AtomicBool::new(false),
            };
            if let Some(p) = process {
                slot.note_ready(&p, &launcher);
                slot.state.get_mut().process = Some(p);
            }
            slot
        };
        let mut compile_slots = Vec::with_capacity(compile_specs.len());
        let mut first = Some(first_compile);
        for s in compile_specs {
            compile_slots.push(make_slot(s, first.take()));
        }
        let eval_slots = eval_specs
            .into_iter()
            .zip(evals)
            .map(|((d, s), p)| (d, make_slot(s, Some(p))))
            .collect();
        let n = compile_slots.len();
        let pauser = Pauser::new(compile_slots.iter().map(|s| s.pgid.clone()).collect());
        Ok(Arc::new(WorkerPool {
            pauser,
            deadlines,
            torch,
            toolchain,
            arch_list,
            compile_free: StdMutex::new((0..n).rev().collect()),
            compile_permits: Semaphore::new(n),
            compile_slots,
            eval_slots,
            build_locks: StdMutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            settings,
            sandbox_level,
        }))
    }

    /// How many times the compile pool was paused for a CPU timing (for tests and diagnostics).
    pub fn build_pauses(&self) -> u32 {
        self.pauser.pauses()
    }

    /// The torch version the workers run (part of every build key).
    pub fn torch_version(&self) -> &str {
        &self.torch
    }

    /// The sandbox the workers run in.
    pub fn sandbox_level(&self) -> &SandboxLevel {
        &self.sandbox_level
    }

    /// The `TORCH_CUDA_ARCH_LIST` builds use.
    pub fn arch_list(&self) -> Option<&str> {
        self.arch_list.as_deref()
    }

    pub fn settings(&self) -> &WorkerSettings {
        &self.settings
    }

    /// Content-addressed build directory of a candidate source.
    pub fn build_dir_for(&self, source: &str) -> PathBuf {
        self.settings.build_cache.join(self.build_key(source))
    }

    fn build_key(&self, source: &str) -> String {
        let mut h = blake3::Hasher::new();
        let mut parts = vec![
            source,
            self.torch.as_str(),
            self.arch_list.as_deref().unwrap_or(""),
        ];
        // The toolchain builds were made with (machine, libc, compilers): a cache shared by nodes
        // or runs on other machines never hands a build to a worker it was not made for.
        if let Some(t) = &self.toolchain {
            parts.push(t.as_str());
        }
        // A plain build is its own artifact; fast builds keep the keys builds had before `eval.build`.
        if self.settings.build == BuildMode::Plain {
            parts.push("plain");
        }
        for part in parts {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().to_hex()[..16].to_string()
    }

    /// Process ids of the live workers (for tests and diagnostics).
    pub async fn worker_pids(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        for slot in self
            .compile_slots
            .iter()
            .chain(self.eval_slots.iter().map(|(_, s)| s))
        {
            let pid = slot.pgid.load(Ordering::SeqCst);
            if pid != 0 {
                pids.push(pid);
            }
        }
        pids
    }

    /// Ask every worker to exit (killing those that do not within a few seconds, and those busy with
    /// a request). Later requests fail with a clear message.
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let slots = self
            .compile_slots
            .iter()
            .chain(self.eval_slots.iter().map(|(_, s)| s));
        futures::future::join_all(slots.map(|slot| async move {
            match tokio::time::timeout(Duration::from_secs(1), slot.state.lock()).await {
                Ok(mut state) => {
                    if let Some(p) = state.process.take() {
                        p.shutdown(EXIT_GRACE).await;
                    }
                    slot.pgid.store(0, Ordering::SeqCst);
                }
                // Busy: the request in flight sees the worker die and reports it.
                Err(_) => kill_group(slot.pgid.load(Ordering::SeqCst)),
            }
        }))
        .await;
    }

    /// Lock a build dir for exclusive use (compile, or the load step of an evaluation, which also
    /// writes into it and clears torch's lock files there), in this process and across processes.
    async fn lock_build(&self, dir: &Path) -> Result<BuildGuard, Unavailable> {
        let lock = {
            let mut locks = match self.build_locks.lock() {
                Ok(l) => l,
                Err(poisoned) => poisoned.into_inner(),
            };
            // Drop locks nobody holds or waits for, so the map stays as small as the work in flight.
            locks.retain(|_, m| Arc::strong_count(m) > 1);
            locks.entry(dir.to_path_buf()).or_default().clone()
        };
        let local = lock.lock_owned().await;
        let mut path = dir.as_os_str().to_os_string();
        path.push(".lock");
        let path = PathBuf::from(path);
        if let Some(parent) = path.parent() {
            tokio::fs::create_dir_all(parent).await.map_err(|e| {
                Unavailable(format!(
                    "cannot create build cache {}: {e}",
                    parent.display()
                ))
            })?;
        }
        let file = crate::lock::lock_exclusive(&path)
            .await
            .map_err(|e| Unavailable(format!("cannot lock {}: {e}", path.display())))?;
        Ok(BuildGuard {
            dir: dir.to_path_buf(),
            _local: local,
            _file: file,
        })
    }

    /// Send one request through a slot, starting its worker if needed, and retire the worker when it
    /// crashed, timed out, reported a sticky error or served `recycle_after` requests. `counts`: the
    /// request is a candidate's, and counts towards recycling the worker.
    async fn call(
        &self,
        slot: &Slot,
        body: RequestBody,
        timeout: Duration,
        counts: bool,
    ) -> Result<ResponseBody, CallError> {
        self.call_within(slot, body, Budget::plain(timeout), counts)
            .await
            .0
    }

    /// [`Self::call`] under a [`Budget`]; also returns the time the worker spent in the reference
    /// work it announced.
    async fn call_within(
        &self,
        slot: &Slot,
        body: RequestBody,
        budget: Budget,
        counts: bool,
    ) -> (Result<ResponseBody, CallError>, Duration) {
        let mut state = slot.state.lock().await;
        if self.closed.load(Ordering::SeqCst) {
            return (Err(CallError::Closed), Duration::ZERO);
        }
        // Taken out of the slot for the duration: if this future is dropped mid-request, the process
        // is dropped with it (and killed), never put back half-used.
        let alive = state
            .process
            .take()
            .and_then(|mut p| (!p.exited_while_idle()).then_some(p));
        let mut process = match alive {
            Some(p) => p,
            None => {
                state.served = 0;
                slot.pgid.store(0, Ordering::SeqCst);
                let p = match self.spawn(slot).await {
                    Ok(p) => p,
                    Err(e) => return (Err(e), Duration::ZERO),
                };
                slot.note_ready(&p, &self.settings.launcher);
                p
            }
        };
        slot.pgid.store(process.pid(), Ordering::SeqCst);
        let timeout = budget.own;
        let result = if slot.spec.role == WorkerRole::Compile {
            // A build may be paused (stopped) while the CPU device times a candidate; its timeout
            // counts only the time it could run. The request's own bound is a far backstop.
            let backstop = timeout.saturating_add(Duration::from_secs(24 * 3600));
            tokio::select! {
                r = process.request(body, backstop) => r,
                () = self.pauser.deadline(timeout) => {
                    process.kill().await;
                    Err(RequestError::Timeout { after: timeout })
                }
            }
        } else {
            process.request_within(body, budget).await
        };
        let reference = process.reference_spent();
        if counts {
            state.served += 1;
        }
        let recycle =
            self.settings.recycle_after > 0 && state.served >= self.settings.recycle_after;
        match &result {
            Ok(resp) if resp.sticky() => {
                // The CUDA context is poisoned; nothing graceful is safe any more.
                process.kill().await;
            }
            Ok(_) | Err(RequestError::Harness { .. }) if !recycle => {
                state.process = Some(process);
            }
            Ok(_) | Err(RequestError::Harness { .. }) => {
                // Exits in the background: the caller (holding a device lease) need not wait.
                tokio::spawn(process.shutdown(EXIT_GRACE));
            }
            Err(_) => {} // already killed and reaped by `request`
        }
        if state.process.is_none() {
            slot.pgid.store(0, Ordering::SeqCst);
        }
        drop(state);
        let result = match result {
            Ok(r) => Ok(r),
            // `shutdown` killed it under our feet: say so rather than blame the candidate.
            Err(_) if self.closed.load(Ordering::SeqCst) => Err(CallError::Closed),
            Err(e) => match self.lost(slot, &e).await {
                Some(loss) => Err(CallError::Lost(loss)),
                None => Err(CallError::Request(e)),
            },
        };
        (result, reference)
    }

    /// Start the slot's worker. With a remote launcher, a worker that cannot be started (the host
    /// does not answer, the step is refused) or that reports another toolchain is a lost worker.
    async fn spawn(&self, slot: &Slot) -> Result<WorkerProcess, CallError> {
        if slot.retired.load(Ordering::SeqCst) {
            return Err(CallError::Start(WorkerError::Settings(format!(
                "worker {} is retired: its host was drained",
                slot.spec.name
            ))));
        }
        let started = WorkerProcess::spawn(&slot.spec).await;
        let remote = slot.spec.remote.is_some();
        let why = match started {
            Ok(mut p) => match toolchain_mismatch(self.toolchain.as_deref(), p.ready()) {
                None => return Ok(p),
                Some(why) => {
                    slot.note_ready(&p, &self.settings.launcher);
                    p.kill().await;
                    if !remote {
                        return Err(CallError::Start(WorkerError::Start {
                            worker: slot.spec.name.clone(),
                            detail: why,
                            log_tail: String::new(),
                        }));
                    }
                    why
                }
            },
            Err(e) if remote => format!("could not be started: {e}"),
            Err(e) => return Err(CallError::Start(e)),
        };
        Err(CallError::Lost(self.charge(slot, why)))
    }

    /// Is this failure a lost worker (remote launchers only)? Charges its host when it is.
    async fn lost(&self, slot: &Slot, err: &RequestError) -> Option<WorkerLoss> {
        let remote = slot.spec.remote.as_ref()?;
        let detail = match err {
            RequestError::Timeout { after } => {
                let host = slot.host()?;
                if remote.launcher.host_answers(&remote.placement, &host).await {
                    return None;
                }
                format!(
                    "no answer within {} s and host {host} no longer answers",
                    secs(*after)
                )
            }
            other => remote.launcher.loss(&remote.placement, other)?,
        };
        Some(self.charge(slot, detail))
    }

    /// Record a lost worker against its host; drain the host (and retire a slot bound to it) when
    /// it lost `resources.drain_after` workers.
    fn charge(&self, slot: &Slot, detail: String) -> WorkerLoss {
        let host = slot.host();
        let launcher = &self.settings.launcher;
        let drained = host.as_deref().is_some_and(|h| launcher.note_loss(h));
        let bound = slot
            .spec
            .remote
            .as_ref()
            .and_then(|r| launcher.placement_host(&r.placement));
        if bound.is_some_and(|b| launcher.is_drained(&b)) {
            slot.retired.store(true, Ordering::SeqCst);
        }
        tracing::warn!(
            "worker {} lost on {}: {detail}{}",
            slot.spec.name,
            host.as_deref().unwrap_or("an unknown host"),
            if drained { " (host drained)" } else { "" }
        );
        WorkerLoss {
            worker: slot.spec.name.clone(),
            host,
            detail,
            drained,
        }
    }

    /// Replace an evaluation worker whose view of the build cache was changed (see [`cow_tainted`]).
    async fn check_cow(&self, slot: &Slot) {
        let Some(overlay) = slot.spec.sandbox.as_ref().and_then(|s| s.overlays.first()) else {
            return;
        };
        let upper = overlay.upper.clone();
        let tainted = tokio::task::spawn_blocking(move || cow_tainted(&upper))
            .await
            .ok()
            .flatten();
        if let Some(path) = tainted {
            tracing::warn!(
                "worker {} changed its view of the build cache ({}); replacing it",
                slot.spec.name,
                path.display()
            );
            let mut state = slot.state.lock().await;
            if let Some(mut p) = state.process.take() {
                p.kill().await;
            }
            slot.pgid.store(0, Ordering::SeqCst);
        }
    }

    /// Build all of `problem`'s reference data on `device` in one request, as every evaluation did
    /// before preparation went step by step (kept for `krefine bench reference`'s "before" figure).
    pub async fn prepare_everything(
        &self,
        problem: &Problem,
        device: &DeviceId,
    ) -> Result<PrepareOutcome, Unavailable> {
        let Some(slot) = self.eval_slot(device) else {
            return Err(Unavailable(format!(
                "device {device} is not served by this worker pool"
            )));
        };
        let request = RequestBody::Prepare(self.prepare_request(problem, device));
        let started = Instant::now();
        let result = self
            .call(slot, request, self.deadlines.reference, false)
            .await;
        Ok(match result {
            Ok(ResponseBody::Prepare(r)) => super::reference::prepare_outcome(r),
            Ok(other) => super::reference::prepare_failed(
                format!("prepare answered with `{}`", other.kind()),
                started,
            ),
            Err(e) => match e.candidate_fault() {
                Ok(e) => {
                    super::reference::prepare_failed(super::reference::call_error_text(&e), started)
                }
                Err(Fault::Unavailable(u)) => return Err(u),
                Err(Fault::Lost(loss)) => super::reference::prepare_failed(
                    format!("worker lost: {}", loss.detail),
                    started,
                ),
            },
        })
    }

    /// The `prepare` request for `problem` on `device` (an evaluate is the same plus the candidate).
    fn prepare_request(&self, problem: &Problem, device: &DeviceId) -> PrepareRequest {
        PrepareRequest {
            problem: Self::problem_spec(problem),
            device: Self::worker_device(device).into(),
            precision: self.settings.precision.as_str().into(),
            mode: self.settings.mode.as_str().into(),
            seed: self.settings.seed,
            correct_trials: self.settings.correct_trials,
            timing: TimingSpec {
                measure: self.settings.timing_trials > 0,
                warmup: self.settings.warmup,
                trials: self.settings.timing_trials,
                // KernelBench's cuda_event defaults: drop the first timed call, flush L2 each time.
                discard_first: 1,
                l2_flush: true,
            },
            reference_runtime: self
                .settings
                .baseline
                .as_ref()
                .and_then(|b| b.reference_runtime(problem)),
            cast_integer_inputs: self.settings.cast_integer_inputs,
            steps: None,
            quiet: None,
        }
    }

    fn eval_slot(&self, device: &DeviceId) -> Option<&Slot> {
        self.eval_slots
            .iter()
            .find(|(d, _)| d == device)
            .map(|(_, s)| s)
    }

    fn problem_spec(problem: &Problem) -> ProblemSpec {
        ProblemSpec {
            key: problem.key.to_string(),
            code: problem.code.clone(),
            code_hash: problem.code_hash(),
        }
    }

    fn candidate_spec(&self, job: &ExecJob) -> (PathBuf, CandidateSpec) {
        let dir = match &job.build_dir {
            Some(d) => PathBuf::from(d),
            None => self.build_dir_for(&job.code),
        };
        let spec = CandidateSpec {
            source: job.code.clone(),
            build_dir: dir.to_string_lossy().into_owned(),
        };
        (dir, spec)
    }

    // ------------------------------------------------------------------------------------- compile

    async fn cached_compile(
        &self,
        build_dir: &Path,
        job: &CompileJob,
        started: Instant,
    ) -> Option<CompileOutcome> {
        let text = tokio::fs::read_to_string(build_dir.join(SUCCESS_MARKER))
            .await
            .ok()?;
        let marker: BuildMarker = serde_json::from_str(&text).ok()?;
        // The job's log says where the build came from, then repeats the original compiler log.
        let mut log = format!(
            "krefine: identical build found in {} (compiled earlier in {:.1} s); nothing was compiled.\n",
            build_dir.display(),
            marker.duration_s
        );
        if let Ok(original) = tokio::fs::read_to_string(build_dir.join(CACHED_LOG)).await {
            log.push_str("----- original compile log -----\n");
            log.push_str(&original);
        }
        let log_path = match write_file(&job.log_path, log.as_bytes()).await {
            Ok(()) => Some(job.log_path.to_string_lossy().into_owned()),
            Err(e) => {
                tracing::warn!("cannot write compile log {}: {e}", job.log_path.display());
                None
            }
        };
        Some(CompileOutcome {
            ran_on: None,
            worker_losses: Vec::new(),
            status: CompileStatus::Ok,
            cached: true,
            error_name: None,
            error: None,
            feedback: marker.feedback,
            log_path,
            build_dir: Some(build_dir.to_string_lossy().into_owned()),
            duration_ms: elapsed_ms(started),
            findings: Vec::new(),
            build_path: marker.build_path,
        })
    }

    async fn record_success(
        &self,
        build_dir: &Path,
        job: &CompileJob,
        feedback: &str,
        duration_s: f64,
        build_path: Option<String>,
    ) {
        if let Err(e) = tokio::fs::copy(&job.log_path, build_dir.join(CACHED_LOG)).await {
            tracing::warn!(
                "cannot keep compile log {} with the build: {e}",
                job.log_path.display()
            );
        }
        let marker = BuildMarker {
            key: build_dir
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
            torch: self.torch.clone(),
            arch_list: self.arch_list.clone(),
            feedback: feedback.to_string(),
            duration_s,
            build_path,
        };
        let result = match serde_json::to_vec_pretty(&marker) {
            Ok(bytes) => write_atomic(&build_dir.join(SUCCESS_MARKER), &bytes).await,
            Err(e) => Err(std::io::Error::other(e)),
        };
        if let Err(e) = result {
            // Not fatal: the build is fine, the next identical candidate just compiles again.
            tracing::warn!("cannot write build marker in {}: {e}", build_dir.display());
        }
        // Written once, read-only afterwards.
        let dir = build_dir.to_path_buf();
        let sealed = tokio::task::spawn_blocking(move || make_files_read_only(&dir)).await;
        if let Ok(Err(e)) = sealed {
            tracing::warn!("cannot make build {} read-only: {e}", build_dir.display());
        }
    }

    async fn compile_failure(
        &self,
        err: CallError,
        job: &CompileJob,
        build_dir: &Path,
        started: Instant,
    ) -> CompileOutcome {
        let log_path = job.log_path.to_string_lossy().into_owned();
        let (status, error, details) = match err {
            CallError::Request(
                RequestError::Timeout { after } | RequestError::ReferenceTimeout { after },
            ) => (
                CompileStatus::Timeout,
                format!(
                    "compilation exceeded {} s; the worker was killed",
                    secs(after)
                ),
                String::new(),
            ),
            CallError::Request(RequestError::Exited { exit, log_tail }) => (
                CompileStatus::Crashed,
                format!(
                    "the compile worker exited with {} while compiling",
                    exit.describe()
                ),
                log_tail,
            ),
            CallError::Request(RequestError::StreamClosed { log_tail }) => (
                CompileStatus::Crashed,
                "the compile worker closed its protocol stream while compiling; it was killed"
                    .to_string(),
                log_tail,
            ),
            CallError::Request(RequestError::Protocol { detail, log_tail }) => (
                CompileStatus::Crashed,
                format!("the compile worker broke the protocol ({detail}); it was killed"),
                log_tail,
            ),
            CallError::Request(RequestError::Harness { error }) => (
                CompileStatus::Crashed,
                format!("the compile harness failed: {error}"),
                String::new(),
            ),
            CallError::Start(e) => (
                CompileStatus::Crashed,
                format!("no compile worker could be started: {e}"),
                String::new(),
            ),
            CallError::Closed => (
                CompileStatus::Crashed,
                "the worker pool was shut down".to_string(),
                String::new(),
            ),
            // Retried by the caller, never turned into an outcome; kept total all the same.
            CallError::Lost(loss) => (
                CompileStatus::Crashed,
                format!("the compile worker was lost: {}", loss.detail),
                String::new(),
            ),
        };
        // What the build printed before it died is the most useful part for the model.
        let build_output = log_tail(&job.log_path, 0, TAIL_LINES).await;
        let _ = append_file(&job.log_path, format!("\nkrefine: {error}\n").as_bytes()).await;
        let mut feedback = error.clone();
        if !build_output.trim().is_empty() {
            feedback.push_str("\nlast lines of the compiler output:\n");
            feedback.push_str(&build_output);
        }
        if !details.trim().is_empty() {
            feedback.push_str("\nlast lines of the worker log:\n");
            feedback.push_str(&details);
        }
        CompileOutcome {
            ran_on: None,
            worker_losses: Vec::new(),
            status,
            cached: false,
            error_name: None,
            error: Some(error),
            feedback,
            log_path: Some(log_path),
            build_dir: Some(build_dir.to_string_lossy().into_owned()),
            duration_ms: elapsed_ms(started),
            findings: Vec::new(),
            build_path: None,
        }
    }

    // ------------------------------------------------------------------------------------- execute

    fn exec_failure(
        &self,
        err: CallError,
        device: &DeviceId,
        hardware: Option<String>,
        started: Instant,
    ) -> ExecOutcome {
        let dev = device.to_string();
        let wall = elapsed_ms(started);
        let (verdict, message, mut metadata) = match err {
            CallError::Request(
                RequestError::Timeout { after } | RequestError::ReferenceTimeout { after },
            ) => {
                let message = format!(
                    "evaluation exceeded {} s; the worker was killed",
                    secs(after)
                );
                let mut m = Map::new();
                // KernelBench's batch evaluator records exactly this for a timeout.
                m.insert("error".into(), json!("Evaluation timed out"));
                m.insert("timeout_s".into(), json!(after.as_secs_f64()));
                let mut o = ExecOutcome::failure(Verdict::Timeout, &dev, message, wall);
                o.metadata = m;
                o.compiled = false;
                return self.with_device(o, &dev, hardware);
            }
            CallError::Request(RequestError::Exited { exit, log_tail }) => {
                // SIGKILL that we did not send: almost always the kernel's out-of-memory killer.
                let oom = exit.signal == Some(9);
                let mut message =
                    format!("worker exited with {} while evaluating", exit.describe());
                if oom {
                    message.push_str(
                        " (killed from outside, most likely by the out-of-memory killer)",
                    );
                }
                let mut m = Map::new();
                if let Some(c) = exit.code {
                    m.insert("exit_code".into(), json!(c));
                }
                if let Some(s) = exit.signal {
                    m.insert("signal".into(), json!(s));
                }
                let verdict = if oom {
                    Verdict::OutOfMemory
                } else {
                    Verdict::Crashed
                };
                (verdict, with_tail(message, &log_tail), m)
            }
            CallError::Request(RequestError::StreamClosed { log_tail }) => (
                Verdict::Crashed,
                with_tail(
                    "worker closed its protocol stream while evaluating; it was killed".into(),
                    &log_tail,
                ),
                Map::new(),
            ),
            CallError::Request(RequestError::Protocol { detail, log_tail }) => (
                Verdict::Crashed,
                with_tail(
                    format!("worker broke the protocol while evaluating ({detail}); it was killed"),
                    &log_tail,
                ),
                Map::new(),
            ),
            CallError::Request(RequestError::Harness { error }) => {
                let mut m = Map::new();
                // KernelBench's batch script names escaped exceptions `other_error`.
                m.insert("other_error".into(), json!(error));
                m.insert("other_error_name".into(), json!("krefine.HarnessError"));
                let message = format!("the evaluation harness failed: {error}");
                let mut o = ExecOutcome::failure(Verdict::RuntimeError, &dev, message, wall);
                o.metadata = m;
                o.compiled = false;
                return self.with_device(o, &dev, hardware);
            }
            CallError::Start(e) => (
                Verdict::Crashed,
                format!("the evaluation worker could not be started: {e}"),
                Map::new(),
            ),
            CallError::Closed => (
                Verdict::Crashed,
                "the worker pool was shut down".to_string(),
                Map::new(),
            ),
            CallError::Lost(loss) => (
                Verdict::Crashed,
                format!("the evaluation worker was lost: {}", loss.detail),
                Map::new(),
            ),
        };
        metadata.insert("error".into(), json!(message));
        let mut o = ExecOutcome::failure(verdict, &dev, message, wall);
        o.metadata = metadata;
        self.with_device(o, &dev, hardware)
    }

    /// Preparing the reference ran out of time: not the candidate's fault, and no candidate code ran.
    fn reference_timeout(
        &self,
        after: Duration,
        device: &DeviceId,
        hardware: Option<String>,
        started: Instant,
    ) -> ExecOutcome {
        let dev = device.to_string();
        let message = format!(
            "preparing the reference (its inputs, outputs and timing) exceeded {} s, so the candidate \
             was not evaluated; the worker was killed. Raise eval.timeouts.reference_s for problems \
             this large",
            secs(after)
        );
        let mut o = ExecOutcome::failure(
            Verdict::ReferenceError,
            &dev,
            message.clone(),
            elapsed_ms(started),
        );
        o.metadata.insert("error".into(), json!(message));
        o.metadata
            .insert("reference_timeout_s".into(), json!(after.as_secs_f64()));
        o.compiled = false;
        self.with_device(o, &dev, hardware)
    }

    /// Orchestrator-made outcomes still say which device they concern.
    fn with_device(&self, mut o: ExecOutcome, dev: &str, hardware: Option<String>) -> ExecOutcome {
        // KernelBench's metadata always names the hardware and the device.
        if let Some(h) = hardware {
            o.metadata.insert("hardware".into(), json!(h));
            o.env.device_name = h;
        }
        o.metadata.insert("device".into(), json!(dev));
        o.env.driver = self.settings.driver.clone();
        o.env.precision = Some(self.settings.precision.as_str().into());
        o.env.mode = Some(self.settings.mode.as_str().into());
        o.env.sandbox = Some(self.sandbox_level.as_str().into());
        o
    }

    fn exec_outcome(
        &self,
        r: EvaluateResponse,
        device: &DeviceId,
        started: Instant,
    ) -> ExecOutcome {
        ExecOutcome {
            worker_losses: Vec::new(),
            verdict: r.status.verdict(),
            compiled: r.compiled,
            correctness: r.correctness,
            metadata: r.metadata,
            runtime_ms: r.runtime,
            runtime_stats: r.runtime_stats.map(Into::into),
            ref_runtime_ms: r.ref_runtime,
            ref_runtime_stats: r.ref_runtime_stats.map(Into::into),
            ref_source: r.ref_runtime_source,
            speedup: r.speedup,
            feedback: r.feedback,
            env: EvalEnv {
                sandbox: Some(self.sandbox_level.as_str().into()),
                ..r.env.to_eval_env(self.settings.driver.clone())
            },
            device: device.to_string(),
            wall_ms: elapsed_ms(started),
            phases: r.phases.to_map(),
            findings: r.findings,
            speedup_check: r.speedup_check,
        }
    }

    fn profile_outcome(r: ProfileResponse, started: Instant) -> ProfileOutcome {
        let ok = r.status == ProfileStatus::Ok;
        let error = if ok {
            None
        } else {
            let status = serde_json::to_value(r.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            Some(match &r.note {
                Some(note) => format!("profiling failed ({status}): {note}"),
                None => format!("profiling failed ({status})"),
            })
        };
        if ok && let Some(note) = &r.note {
            // Informational on success (e.g. ncu not installed); `error` stays for failures only.
            tracing::info!("profile note: {note}");
        }
        ProfileOutcome {
            worker_losses: Vec::new(),
            ok,
            table: r.table,
            ncu: r.ncu.and_then(|n| serde_json::to_value(n).ok()),
            error,
            duration_ms: elapsed_ms(started),
        }
    }

    fn profile_failure(err: CallError, started: Instant) -> ProfileOutcome {
        let error = match err {
            CallError::Request(
                RequestError::Timeout { after } | RequestError::ReferenceTimeout { after },
            ) => {
                format!(
                    "profiling exceeded {} s; the worker was killed",
                    secs(after)
                )
            }
            CallError::Request(RequestError::Exited { exit, log_tail }) => with_tail(
                format!("worker exited with {} while profiling", exit.describe()),
                &log_tail,
            ),
            CallError::Request(RequestError::StreamClosed { log_tail }) => with_tail(
                "worker closed its protocol stream while profiling; it was killed".into(),
                &log_tail,
            ),
            CallError::Request(RequestError::Protocol { detail, log_tail }) => with_tail(
                format!("worker broke the protocol while profiling ({detail}); it was killed"),
                &log_tail,
            ),
            CallError::Request(RequestError::Harness { error }) => {
                format!("the profiling harness failed: {error}")
            }
            CallError::Start(e) => format!("the evaluation worker could not be started: {e}"),
            CallError::Closed => "the worker pool was shut down".into(),
            CallError::Lost(loss) => format!("the evaluation worker was lost: {}", loss.detail),
        };
        ProfileOutcome {
            worker_losses: Vec::new(),
            ok: false,
            table: String::new(),
            ncu: None,
            error: Some(error),
            duration_ms: elapsed_ms(started),
        }
    }

    /// The excessive-speedup guard's inputs: the configured bound, and the GPU's peak numbers at
    /// the run's precision (TF32 for fp32 unless strict mode pins it off) when the GPU is known.
    fn integrity_spec(&self, hardware: Option<&str>) -> IntegritySpec {
        let spec = hardware.and_then(crate::prompt::gpu_specs::lookup);
        let strict = self.settings.mode == EvalMode::Strict;
        IntegritySpec {
            max_speedup: self.settings.max_speedup,
            peak_tflops: spec.map(|g| match self.settings.precision {
                Precision::Fp32 if strict => g.fp32_tflops,
                Precision::Fp32 => g.tf32_tflops.unwrap_or(g.fp32_tflops),
                Precision::Fp16 => g.fp16_tflops,
                Precision::Bf16 => g.bf16_tflops.unwrap_or(g.fp16_tflops),
            }),
            peak_bandwidth_gbs: spec.map(|g| f64::from(g.memory_bandwidth_gbs)),
        }
    }

    fn worker_device(device: &DeviceId) -> &'static str {
        match device {
            // The worker sees only its own GPU (CUDA_VISIBLE_DEVICES), as device 0.
            DeviceId::Gpu(_) => "cuda:0",
            DeviceId::Cpu => "cpu",
        }
    }
}

#[async_trait]
impl Compiler for WorkerPool {
    async fn compile(&self, job: CompileJob) -> Result<CompileOutcome, Unavailable> {
        let started = Instant::now();
        let build_dir = self.build_dir_for(&job.code);
        let _build = self.lock_build(&build_dir).await?;
        if let Some(outcome) = self.cached_compile(&build_dir, &job, started).await {
            return Ok(outcome);
        }
        let mut losses = Vec::new();
        loop {
            match self.compile_once(&job, &build_dir, started).await {
                Ok(mut outcome) => {
                    outcome.worker_losses = losses;
                    return Ok(outcome);
                }
                Err(Fault::Unavailable(u)) => return Err(u),
                Err(Fault::Lost(loss)) => {
                    losses.push(loss);
                    let retries = self.settings.launcher.loss_retries();
                    if let Some(u) = give_up(&losses, retries, false) {
                        return Err(u);
                    }
                }
            }
        }
    }

    async fn pause_builds(&self) -> Option<BuildPause> {
        // Remote builds run on other machines' cores (and stopping a local srun/ssh would not
        // stop them): the engine drains the compile pool instead.
        if self.settings.launcher.is_remote() {
            return None;
        }
        Some(BuildPause::new(self.pauser.pause().await))
    }
}

impl WorkerPool {
    /// One compile attempt on a free compile worker (the build dir is locked by the caller).
    async fn compile_once(
        &self,
        job: &CompileJob,
        build_dir: &Path,
        started: Instant,
    ) -> Result<CompileOutcome, Fault> {
        let no_workers = || {
            Fault::Unavailable(Unavailable(
                "no compile worker is left: the hosts of all of them were drained".into(),
            ))
        };
        let Ok(permit) = self.compile_permits.acquire().await else {
            return Err(if self.closed.load(Ordering::SeqCst) {
                Fault::Unavailable(closed())
            } else {
                no_workers()
            });
        };
        let index = match self.compile_free.lock() {
            Ok(mut free) => free.pop(),
            Err(poisoned) => poisoned.into_inner().pop(),
        };
        // The semaphore has as many permits as free slots, so a permit always finds one.
        let Some(index) = index else {
            return Err(Fault::Unavailable(closed()));
        };
        let slot_guard = FreeSlot {
            free: &self.compile_free,
            index,
        };
        // No build starts while the CPU device is timing.
        self.pauser.wait_unpaused().await;
        let slot = &self.compile_slots[index];
        // A sandboxed worker cannot write the run directory: it writes the compile log in its own
        // scratch, and we copy it to the run's log.
        let worker_log = match &slot.spec.sandbox {
            Some(_) => slot.spec.scratch.join(WORKER_COMPILE_LOG),
            None => job.log_path.clone(),
        };
        let request = RequestBody::Compile(CompileRequest {
            source: job.code.clone(),
            build_dir: build_dir.to_string_lossy().into_owned(),
            arch_list: self.arch_list.clone(),
            log_path: worker_log.to_string_lossy().into_owned(),
            build: Some(self.settings.build.as_str().into()),
        });
        let result = self.call(slot, request, self.deadlines.compile, true).await;
        if worker_log != job.log_path {
            copy_log(&worker_log, &job.log_path).await;
        }
        if slot.retired.load(Ordering::SeqCst) {
            // Its host was drained: the slot and its permit leave the pool.
            std::mem::forget(slot_guard);
            permit.forget();
            let live = self
                .compile_slots
                .iter()
                .filter(|s| !s.retired.load(Ordering::SeqCst))
                .count();
            if live == 0 {
                self.compile_permits.close();
            }
        } else {
            drop(slot_guard);
            drop(permit);
        }
        let ran_on = slot.ran_on();
        match result {
            Ok(ResponseBody::Compile(r)) => {
                let mut status = match r.status {
                    CompileStatusWire::Ok => CompileStatus::Ok,
                    CompileStatusWire::CompileError => CompileStatus::Error,
                };
                let mut feedback = r.feedback;
                let mut error = r.error;
                if status == CompileStatus::Ok
                    && let Some(sandbox) = &slot.spec.sandbox
                    && let Err(e) =
                        publish_build(sandbox, &self.settings.build_cache, build_dir).await
                {
                    status = CompileStatus::Error;
                    let message = format!("krefine could not store the build in the cache: {e}");
                    feedback = message.clone();
                    error = Some(message);
                }
                if status == CompileStatus::Ok {
                    self.record_success(
                        build_dir,
                        job,
                        &feedback,
                        r.duration_s,
                        r.build_path.clone(),
                    )
                    .await;
                }
                Ok(CompileOutcome {
                    ran_on,
                    worker_losses: Vec::new(),
                    status,
                    cached: false,
                    error_name: r.error_name,
                    error,
                    feedback,
                    log_path: Some(job.log_path.to_string_lossy().into_owned()),
                    build_dir: Some(build_dir.to_string_lossy().into_owned()),
                    duration_ms: elapsed_ms(started),
                    findings: Vec::new(),
                    build_path: r.build_path,
                })
            }
            // `request` checks that the response kind matches the op, so this cannot happen.
            Ok(other) => {
                let err = CallError::Request(RequestError::Protocol {
                    detail: format!("compile answered with `{}`", other.kind()),
                    log_tail: String::new(),
                });
                let mut o = self.compile_failure(err, job, build_dir, started).await;
                o.ran_on = ran_on;
                Ok(o)
            }
            Err(e) => {
                let e = e.candidate_fault()?;
                let mut o = self.compile_failure(e, job, build_dir, started).await;
                o.ran_on = ran_on;
                Ok(o)
            }
        }
    }
}

/// The compile log a sandboxed compile worker writes, in its scratch folder.
const WORKER_COMPILE_LOG: &str = "krefine-compile-job.log";
/// Where a worker's copy-on-write layer of the build cache lives: `<scratch_root>/<name>.cow/`.
const COW_SUFFIX: &str = "cow";

/// Decide what the workers run in: probe the namespaces sandbox unless it is off.
async fn resolve_sandbox(settings: &WorkerSettings) -> Result<SandboxLevel, WorkerError> {
    if settings.sandbox == SandboxMode::Off {
        return Ok(SandboxLevel::Off);
    }
    // The namespaces are entered between fork and exec of the local child, which for a remote
    // worker is `srun`/`ssh`, not the worker: remote workers run without them, and say so.
    let launcher = settings.launcher.kind().as_str();
    if settings.launcher.is_remote() {
        return match settings.sandbox {
            SandboxMode::Required => Err(WorkerError::Settings(format!(
                "eval.sandbox = \"required\" (the default in strict mode), but workers started by \
                 the {launcher} launcher run without krefine's namespaces sandbox (only the \
                 per-candidate confinement inside the harness applies); set eval.sandbox = \"auto\" \
                 or \"off\" to run them anyway"
            ))),
            _ => {
                tracing::warn!(
                    "workers started by the {launcher} launcher run WITHOUT the namespaces sandbox"
                );
                Ok(SandboxLevel::Unavailable(format!(
                    "the {launcher} launcher starts workers without the namespaces sandbox"
                )))
            }
        };
    }
    let python = settings.python.clone();
    // With the build cache as an overlay, as the workers will have it (overlayfs refuses some file
    // systems, e.g. NFS as the upper layer).
    let cow = settings.scratch_root.join(format!(".probe.{COW_SUFFIX}"));
    let overlay = Overlay {
        target: settings.build_cache.clone(),
        upper: cow.join("upper"),
        work: cow.join("work"),
    };
    for d in [&overlay.upper, &overlay.work] {
        tokio::fs::create_dir_all(d)
            .await
            .map_err(|e| WorkerError::io("create sandbox probe folder", d, e))?;
    }
    let probed = tokio::task::spawn_blocking(move || sandbox::probe(&python, Some(overlay)))
        .await
        .map_err(|e| WorkerError::Settings(format!("sandbox probe panicked: {e}")))?;
    let _ = tokio::fs::remove_dir_all(&cow).await;
    match (probed, settings.sandbox) {
        (Ok(_), _) => Ok(SandboxLevel::Namespaces),
        (Err(e), SandboxMode::Required) => Err(WorkerError::Settings(format!(
            "eval.sandbox = \"required\" (the default in strict mode), but this machine cannot \
             start a sandboxed worker: {e}"
        ))),
        (Err(e), _) => {
            tracing::warn!(
                "eval.sandbox = \"auto\": workers run WITHOUT a sandbox (candidate code has the \
                 user's rights): {e}"
            );
            Ok(SandboxLevel::Unavailable(e.to_string()))
        }
    }
}

/// Folders a worker must still read where they lie under a hidden one (the home): the Python
/// install, the harness, and the CUDA toolkit and library folders the environment names.
fn visible_dirs(settings: &WorkerSettings) -> Vec<PathBuf> {
    let mut dirs = sandbox::python_dirs(&settings.python);
    dirs.push(settings.harness_dir.clone());
    // The Hugging Face cache level-4 models load from (often under the hidden home).
    for (name, value) in &settings.extra_env {
        if name == "HF_HUB_CACHE" || name == "HF_HOME" {
            dirs.push(PathBuf::from(value));
        }
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.push(PathBuf::from(v));
        }
    }
    for var in ["PATH", "LD_LIBRARY_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.extend(std::env::split_paths(&v));
        }
    }
    dirs.retain(|d| d.is_absolute());
    dirs.sort();
    dirs.dedup();
    dirs
}

/// The file system view of worker `name`: everything read-only, its scratch writable, the other
/// workers' scratch folders, the home and `/tmp` hidden, and the build cache copy-on-write (its
/// writes stay in `<scratch_root>/<name>.cow`; compile results are published by [`publish_build`]).
fn worker_sandbox(settings: &WorkerSettings, name: &str, visible: &[PathBuf]) -> SandboxSpec {
    let scratch = settings.scratch_root.join(name);
    let cow = settings.scratch_root.join(format!("{name}.{COW_SUFFIX}"));
    let mut hidden = SandboxSpec::default_hidden();
    hidden.push(settings.scratch_root.clone());
    SandboxSpec {
        writable: vec![scratch.clone(), cow.clone()],
        visible: visible.to_vec(),
        hidden,
        overlays: vec![Overlay {
            target: settings.build_cache.clone(),
            upper: cow.join("upper"),
            work: cow.join("work"),
        }],
        cwd: scratch,
    }
}

/// Copy a sandboxed worker's compile log to the run's log (a missing one is left missing).
async fn copy_log(from: &Path, to: &Path) {
    if tokio::fs::metadata(from).await.is_err() {
        return;
    }
    if let Some(dir) = to.parent() {
        let _ = tokio::fs::create_dir_all(dir).await;
    }
    if let Err(e) = tokio::fs::copy(from, to).await {
        tracing::warn!("cannot copy compile log to {}: {e}", to.display());
    }
    let _ = tokio::fs::remove_file(from).await;
}

#[async_trait]
impl Executor for WorkerPool {
    async fn execute(&self, job: ExecJob, device: &DeviceId) -> Result<ExecOutcome, Unavailable> {
        let Some(slot) = self.eval_slot(device) else {
            return Err(Unavailable(format!(
                "device {device} is not served by this worker pool"
            )));
        };
        let mut losses = Vec::new();
        loop {
            match self.execute_once(&job, device, slot).await {
                Ok(mut o) => {
                    o.worker_losses = losses;
                    return Ok(o);
                }
                Err(Fault::Unavailable(u)) => return Err(u),
                Err(Fault::Lost(loss)) => {
                    losses.push(loss);
                    if let Some(u) = self.give_up(&losses, slot) {
                        return Err(u);
                    }
                }
            }
        }
    }

    async fn profile(
        &self,
        job: ExecJob,
        device: &DeviceId,
    ) -> Result<ProfileOutcome, Unavailable> {
        let Some(slot) = self.eval_slot(device) else {
            return Err(Unavailable(format!(
                "device {device} is not served by this worker pool"
            )));
        };
        let mut losses = Vec::new();
        loop {
            match self.profile_once(&job, device, slot).await {
                Ok(mut o) => {
                    o.worker_losses = losses;
                    return Ok(o);
                }
                Err(Fault::Unavailable(u)) => return Err(u),
                Err(Fault::Lost(loss)) => {
                    losses.push(loss);
                    if let Some(u) = self.give_up(&losses, slot) {
                        return Err(u);
                    }
                }
            }
        }
    }

    fn prepares_reference(&self) -> bool {
        true
    }

    async fn prepare_reference(
        &self,
        problem: Arc<Problem>,
        device: &DeviceId,
        quiet: bool,
    ) -> Result<PrepareOutcome, Unavailable> {
        let Some(slot) = self.eval_slot(device) else {
            return Err(Unavailable(format!(
                "device {device} is not served by this worker pool"
            )));
        };
        let mut request = self.prepare_request(&problem, device);
        request.steps = Some(1);
        request.quiet = Some(quiet);
        let started = Instant::now();
        // Not a candidate's request: it does not count towards recycling the worker.
        let result = self
            .call(
                slot,
                RequestBody::Prepare(request),
                self.deadlines.reference,
                false,
            )
            .await;
        Ok(match result {
            Ok(ResponseBody::Prepare(r)) => super::reference::prepare_outcome(r),
            Ok(other) => super::reference::prepare_failed(
                format!("prepare answered with `{}`", other.kind()),
                started,
            ),
            // A lost worker only delays the preparation: the candidate's own evaluation builds
            // what it needs, retried on another worker.
            Err(CallError::Lost(loss)) => {
                super::reference::prepare_failed(format!("worker lost: {}", loss.detail), started)
            }
            Err(e) => match e.candidate_fault() {
                Ok(e) => {
                    super::reference::prepare_failed(super::reference::call_error_text(&e), started)
                }
                Err(Fault::Unavailable(u)) => return Err(u),
                Err(Fault::Lost(loss)) => super::reference::prepare_failed(
                    format!("worker lost: {}", loss.detail),
                    started,
                ),
            },
        })
    }

    fn retired(&self, device: &DeviceId) -> bool {
        self.eval_slot(device)
            .is_some_and(|s| s.retired.load(Ordering::SeqCst))
    }
}

impl WorkerPool {
    fn give_up(&self, losses: &[WorkerLoss], slot: &Slot) -> Option<Unavailable> {
        give_up(
            losses,
            self.settings.launcher.loss_retries(),
            slot.retired.load(Ordering::SeqCst),
        )
    }

    /// One evaluation attempt: prepare the reference, then evaluate the candidate.
    async fn execute_once(
        &self,
        job: &ExecJob,
        device: &DeviceId,
        slot: &Slot,
    ) -> Result<ExecOutcome, Fault> {
        let started = Instant::now();
        let (build_dir, candidate) = self.candidate_spec(job);
        let _build = self
            .lock_build(&build_dir)
            .await
            .map_err(Fault::Unavailable)?;
        let integrity = self.integrity_spec(slot.hardware().as_deref());
        let request = RequestBody::Evaluate(
            self.prepare_request(&job.problem, device)
                .evaluate(candidate, Some(integrity)),
        );
        // The reference data the candidate's check reaches is built on demand, trial by trial, if
        // no background preparation (src/refprep.rs) built it already: that time runs on the
        // reference's allowance, never on the candidate's `execute_s`.
        let budget = Budget {
            own: self.deadlines.execute,
            reference: Some(self.deadlines.reference),
        };
        let (result, reference) = self.call_within(slot, request, budget, true).await;
        let mut outcome = match result {
            Ok(ResponseBody::Evaluate(r)) => self.exec_outcome(*r, device, started),
            Ok(other) => {
                let err = CallError::Request(RequestError::Protocol {
                    detail: format!("evaluate answered with `{}`", other.kind()),
                    log_tail: String::new(),
                });
                self.exec_failure(err, device, slot.hardware(), started)
            }
            Err(CallError::Request(RequestError::ReferenceTimeout { after })) => {
                self.reference_timeout(after, device, slot.hardware(), started)
            }
            Err(e) => {
                let e = e.candidate_fault()?;
                self.exec_failure(e, device, slot.hardware(), started)
            }
        };
        // A failure's wall time may be mostly the reference's (a fresh worker builds it again).
        if !outcome.phases.contains_key("reference_s")
            && let Some(n) = serde_json::Number::from_f64(reference.as_secs_f64())
        {
            outcome
                .phases
                .insert("reference_s".into(), Value::Number(n));
        }
        self.check_cow(slot).await;
        outcome.env.ran_on = slot.ran_on();
        Ok(outcome)
    }

    /// One profiling attempt.
    async fn profile_once(
        &self,
        job: &ExecJob,
        device: &DeviceId,
        slot: &Slot,
    ) -> Result<ProfileOutcome, Fault> {
        let started = Instant::now();
        let (build_dir, candidate) = self.candidate_spec(job);
        let _build = self
            .lock_build(&build_dir)
            .await
            .map_err(Fault::Unavailable)?;
        let request = RequestBody::Profile(ProfileRequest {
            problem: Self::problem_spec(&job.problem),
            candidate,
            device: Self::worker_device(device).into(),
            precision: self.settings.precision.as_str().into(),
            row_limit: self.settings.profile_rows,
            ncu: self.settings.ncu,
        });
        let result = self.call(slot, request, self.deadlines.profile, true).await;
        self.check_cow(slot).await;
        match result {
            Ok(ResponseBody::Profile(r)) => Ok(Self::profile_outcome(r, started)),
            Ok(other) => Ok(Self::profile_failure(
                CallError::Request(RequestError::Protocol {
                    detail: format!("profile answered with `{}`", other.kind()),
                    log_tail: String::new(),
                }),
                started,
            )),
            Err(e) => Ok(Self::profile_failure(e.candidate_fault()?, started)),
        }
    }
}

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Seconds for messages: `300`, or `2.5` when fractional.
fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}")
    } else {
        format!("{s}")
    }
}

fn with_tail(message: String, tail: &str) -> String {
    if tail.trim().is_empty() {
        message
    } else {
        format!("{message}\nlast lines of the worker log:\n{tail}")
    }
}

async fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir).await?;
    }
    tokio::fs::write(path, bytes).await
}

async fn append_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir).await?;
    }
    let mut f = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .await?;
    f.write_all(bytes).await?;
    f.flush().await
}

/// Write-then-rename, so a reader never sees a half-written marker (a crash mid-write leaves none).
async fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(format!(".tmp-{}", std::process::id()));
    tokio::fs::write(&tmp, bytes).await?;
    tokio::fs::rename(&tmp, path).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_read_naturally() {
        assert_eq!(secs(Duration::from_secs(300)), "300");
        assert_eq!(secs(Duration::from_millis(2500)), "2.5");
    }

    #[test]
    fn bad_timeouts_are_refused() {
        let t = Timeouts {
            execute_s: f64::NAN,
            ..Timeouts::default()
        };
        let e = Deadlines::from(&t).unwrap_err().to_string();
        assert!(e.contains("execute_s"), "{e}");
        let t = Timeouts {
            compile_s: -1.0,
            ..Timeouts::default()
        };
        assert!(Deadlines::from(&t).is_err());
    }
}
