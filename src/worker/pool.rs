//! [`WorkerPool`]: the real `Compiler` and `Executor`, and the slots it is made of.
//!
//! - Compile: N persistent CPU workers (role `compile`, GPUs hidden), one job each at a time. Builds
//!   are content-addressed (see `build_cache`); a per-build-dir async lock keeps two jobs from ever
//!   using one build dir at once.
//! - Execute/profile: one persistent evaluation worker per device (role `gpu`,
//!   `CUDA_VISIBLE_DEVICES=<index>`, device `cuda:0` inside; `cpu` for the CPU device). The engine
//!   holds the device lease while it calls, so each worker sees one request at a time.
//! - Every request has a deadline. Timeouts, crashes, protocol violations and sticky CUDA errors kill
//!   the worker's process group; the next request starts a fresh worker. The job gets a verdict that
//!   says what happened, in KernelBench's metadata shape where one applies.
//!
//! This file holds the pool itself: a thin owner of its parts (the slots, the call room, the build
//! room, the input stores), started and shut down here. The parts own their state and live below it
//! (`slot`, `call`, `build_cache`, `inputs`). The jobs live above it, in rooms that borrow the parts
//! and copy the few settings they need: the compile room (`compile`) and the evaluation room
//! (`eval_room`, whose jobs are in `execute` and `prepare`). The pool's `Compiler` and `Executor`
//! only build a room and hand it the job.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::WorkerError;
use super::build_cache::{Builds, sweep_build_cache};
use super::build_store::PCH_DIR;
use super::call::{Calls, EXIT_GRACE};
use super::inputs::{InputStores, InputTiers};
use super::loss::toolchain_mismatch;
use super::pause::Pauser;
use super::probes::ProbeSummaries;
use super::process::WorkerProcess;
use super::protocol::WorkerRole;
use super::sandbox::SandboxLevel;
use super::sandbox_spec::{resolve_sandbox, visible_dirs, worker_sandbox};
use super::session::kill_group;
use super::settings::{Deadlines, WorkerSettings};
use super::slot::{Slot, Slots};
use super::spawn_spec::{Remote, SpawnSpec};
use crate::launcher::Placement;
use crate::services::DeviceId;

pub struct WorkerPool {
    /// What the pool was started with; a room copies the values its requests need when it is built.
    pub(super) settings: WorkerSettings,
    /// The settings' timeouts, validated once at start (each request's deadline).
    pub(super) deadlines: Deadlines,
    /// The build cache, its keys and locks (the build room).
    pub(super) builds: Builds,
    /// The worker positions: compile slots (leased per job) and one evaluation slot per device.
    pub(super) slots: Slots,
    /// Sending requests through the slots (closing, pausing builds, lost workers).
    pub(super) calls: Calls,
    /// What the workers run in (recorded in every result's `env.sandbox`).
    pub(super) sandbox_level: SandboxLevel,
    /// The stores of CPU-made reference inputs (the inputs room).
    pub(super) inputs: InputStores,
    /// The precision probes' summaries, kept across runs in the reference cache.
    pub(super) probes: ProbeSummaries,
}

impl std::fmt::Debug for WorkerPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPool")
            .field("torch", &self.builds.torch())
            .field("arch_list", &self.builds.arch_list())
            .field("compile_workers", &self.slots.compile().len())
            .field("devices", &self.slots.devices().collect::<Vec<_>>())
            .finish()
    }
}

impl WorkerPool {
    /// Start the pool: the evaluation worker of every device and the first compile worker are started
    /// (and must report `ready`) before this returns, so a broken Python or harness fails the run at
    /// once; the other compile workers start on first use.
    pub async fn start(settings: WorkerSettings) -> Result<Arc<WorkerPool>, WorkerError> {
        let deadlines = Deadlines::from(&settings.timeouts)?;
        check_settings(&settings)?;
        make_folders(&settings).await?;
        let sandbox_level = resolve_sandbox(&settings).await?;
        let specs = Specs {
            settings: &settings,
            visible: visible_dirs(&settings),
            confine: sandbox_level.is_confined(),
            load_timeout: deadlines.load,
        };
        let input_tiers =
            InputTiers::open(&settings, deadlines.reference, || specs.inputs_generator()).await?;
        let eval_specs = specs.eval()?;
        let compile_specs = specs.compile()?;

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
            None => arch_list_of(&evals),
        };

        let launcher = &settings.launcher;
        let mut first = Some(first_compile);
        let compile_slots = compile_specs
            .into_iter()
            .map(|s| Slot::new(s, first.take(), launcher))
            .collect();
        let eval_slots = eval_specs
            .into_iter()
            .zip(evals)
            .map(|((d, s), p)| (d, Slot::new(s, Some(p), launcher)))
            .collect();
        let slots = Slots::new(compile_slots, eval_slots);
        let inputs = input_tiers.for_entries(&settings, &torch);
        let pauser = Pauser::new(slots.compile().iter().map(|s| s.pgid.clone()).collect());
        // The toolchain goes to both rooms: the call room refuses a worker that reports another one,
        // the build room keys builds by it. Set once here and never changed, so the copies cannot
        // disagree; neither room can borrow it from the other without the pool referring to itself.
        let calls = Calls::new(
            pauser,
            settings.launcher.clone(),
            settings.recycle_after,
            toolchain.clone(),
        );
        Ok(Arc::new(WorkerPool {
            slots,
            calls,
            deadlines,
            builds: Builds::new(
                settings.build_cache.clone(),
                settings.build,
                torch,
                toolchain,
                arch_list,
            ),
            probes: ProbeSummaries::new(settings.reference_cache.as_deref()),
            settings,
            sandbox_level,
            inputs,
        }))
    }

    /// How many times the compile pool was paused for a CPU timing (for tests and diagnostics).
    pub fn build_pauses(&self) -> u32 {
        self.calls.pauser().pauses()
    }

    /// The torch version the workers run (part of every build key).
    pub fn torch_version(&self) -> &str {
        self.builds.torch()
    }

    /// The sandbox the workers run in.
    pub fn sandbox_level(&self) -> &SandboxLevel {
        &self.sandbox_level
    }

    /// The `TORCH_CUDA_ARCH_LIST` builds use.
    pub fn arch_list(&self) -> Option<&str> {
        self.builds.arch_list()
    }

    /// Content-addressed build directory of a candidate source.
    pub fn build_dir_for(&self, source: &str) -> PathBuf {
        self.builds.dir_for(source)
    }

    pub fn settings(&self) -> &WorkerSettings {
        &self.settings
    }

    /// Process ids of the live workers (for tests and diagnostics).
    pub async fn worker_pids(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        for slot in self.slots.all() {
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
        self.calls.close();
        let mut took = futures::future::join_all(self.slots.all().map(|slot| async move {
            let began = std::time::Instant::now();
            match tokio::time::timeout(Duration::from_secs(1), slot.state.lock()).await {
                Ok(mut state) => {
                    if let Some(p) = state.process.take() {
                        p.shutdown(EXIT_GRACE).await;
                    }
                    slot.pgid.store(0, Ordering::SeqCst);
                    // The headers it finished since its last build, before its layer goes.
                    if slot.spec.role == WorkerRole::Compile {
                        let exited = began.elapsed();
                        self.builds.publish_pchs_of(slot).await;
                        return (began.elapsed(), exited, slot.spec.name.as_str());
                    }
                }
                // Busy: the request in flight sees the worker die and reports it.
                Err(_) => kill_group(slot.pgid.load(Ordering::SeqCst)),
            }
            (began.elapsed(), began.elapsed(), slot.spec.name.as_str())
        }))
        .await;
        // The slowest workers' exits (and header publications) bound the end of every run: named in
        // the run's log, so a slow end can be traced to a worker.
        took.sort_by_key(|t| std::cmp::Reverse(t.0));
        let slowest: Vec<String> = took
            .iter()
            .take(3)
            .filter(|(all, ..)| all.as_secs_f64() >= 1.0)
            .map(|(all, exited, name)| {
                format!(
                    "{name} {:.1} s (exited after {:.1} s)",
                    all.as_secs_f64(),
                    exited.as_secs_f64()
                )
            })
            .collect();
        if !slowest.is_empty() {
            tracing::info!("slowest worker shutdowns: {}", slowest.join(", "));
        }
    }
}

/// Settings no pool can start with: no compile worker, no device, a device listed twice.
fn check_settings(settings: &WorkerSettings) -> Result<(), WorkerError> {
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
    Ok(())
}

/// The folders the pool writes (scratch, logs, the build cache, swept of a dead publisher's
/// leftovers) and the input store's, before any worker or sandbox is made.
async fn make_folders(settings: &WorkerSettings) -> Result<(), WorkerError> {
    for (dir, what) in [
        (&settings.scratch_root, "create scratch root"),
        (&settings.log_dir, "create worker log folder"),
        (&settings.build_cache, "create build cache"),
    ] {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| WorkerError::io(what, dir, e))?;
    }
    // The shared precompiled headers' folder, there before any worker's copy-on-write view of the
    // cache is mounted: a sandboxed compile child that looked for a folder missing from that view
    // would never see it appear (overlayfs keeps the miss; kb_pch.lookup_pch).
    let pch = settings.build_cache.join(PCH_DIR);
    tokio::fs::create_dir_all(&pch)
        .await
        .map_err(|e| WorkerError::io("create precompiled header folder", &pch, e))?;
    sweep_build_cache(&settings.build_cache).await;
    if let Some(dir) = &settings.reference_cache {
        // Before the sandboxes are made: they show it to the workers (read-only).
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| WorkerError::io("create reference input store", dir, e))?;
    }
    Ok(())
}

/// The arch list of the devices the evaluation workers reported (their compute capabilities, each
/// once); `None` when none reported one (a CPU-only pool).
fn arch_list_of(evals: &[WorkerProcess]) -> Option<String> {
    let mut caps: Vec<String> = Vec::new();
    for w in evals {
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

/// How this pool's workers are started: one [`SpawnSpec`] per worker, made from the settings.
struct Specs<'a> {
    settings: &'a WorkerSettings,
    /// The folders every worker's sandbox shows read-only (see `visible_dirs`).
    visible: Vec<PathBuf>,
    /// The workers run in a sandbox (the resolved level confines them).
    confine: bool,
    /// How long a worker may take to report `ready`.
    load_timeout: Duration,
}

impl Specs<'_> {
    fn worker(
        &self,
        name: String,
        role: WorkerRole,
        cvd: Option<String>,
        arch: Option<String>,
        at: Placement,
    ) -> SpawnSpec {
        let settings = self.settings;
        let launcher = &settings.launcher;
        SpawnSpec {
            sandbox: self
                .confine
                .then(|| worker_sandbox(settings, &name, &self.visible)),
            remote: launcher.is_remote().then(|| Remote {
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
            load_timeout: self.load_timeout,
            extra_env: settings.extra_env.clone(),
        }
    }

    /// The physical index of the orchestrator's GPU `i` (see [`crate::gpu::worker_visible_device`]).
    fn physical(&self, i: u32) -> Result<String, WorkerError> {
        crate::gpu::worker_visible_device(i, self.settings.visible_devices.as_deref())
            .map_err(WorkerError::Settings)
    }

    /// The input store's generator: the CPU, every GPU hidden.
    fn inputs_generator(&self) -> SpawnSpec {
        self.worker(
            "inputs".into(),
            WorkerRole::Compile,
            Some(String::new()),
            None,
            self.settings.launcher.compile_placement(0),
        )
    }

    /// One evaluation worker per device.
    fn eval(&self) -> Result<Vec<(DeviceId, SpawnSpec)>, WorkerError> {
        let settings = self.settings;
        let remote = settings.launcher.is_remote();
        let arch = || settings.arch_list.clone();
        settings
            .devices
            .iter()
            .map(|d| {
                let at = settings.launcher.eval_placement(d);
                let s = match d {
                    // A Slurm step gets its GPU from Slurm; an SSH worker's is set remotely.
                    DeviceId::Gpu(i) if remote => {
                        self.worker(format!("gpu-{i}"), WorkerRole::Gpu, None, arch(), at)
                    }
                    DeviceId::Gpu(i) => self.worker(
                        format!("gpu-{i}"),
                        WorkerRole::Gpu,
                        Some(self.physical(*i)?),
                        arch(),
                        at,
                    ),
                    // An empty CUDA_VISIBLE_DEVICES hides every GPU: "cpu" means CPU only.
                    DeviceId::Cpu => self.worker(
                        "cpu-0".into(),
                        WorkerRole::Gpu,
                        Some(String::new()),
                        arch(),
                        at,
                    ),
                };
                Ok((d.clone(), s))
            })
            .collect()
    }

    /// The compile workers (`compile_workers` of them).
    fn compile(&self) -> Result<Vec<SpawnSpec>, WorkerError> {
        let settings = self.settings;
        // Compile workers see the run's GPUs, as KernelBench's CPU pre-compile does: a candidate
        // that picks its sources with `torch.cuda.is_available()` at import must build here what
        // the device will load. They never run kernels; a candidate that allocates on the GPU at
        // import costs a CUDA context for the length of its build.
        // Remote compile workers run as CPU steps (or on hosts whose GPUs serve others): none.
        let run_gpus = if settings.launcher.is_remote() {
            String::new()
        } else {
            settings
                .devices
                .iter()
                .filter_map(|d| match d {
                    DeviceId::Gpu(i) => Some(self.physical(*i)),
                    DeviceId::Cpu => None,
                })
                .collect::<Result<Vec<_>, _>>()?
                .join(",")
        };
        Ok((0..settings.compile_workers)
            .map(|i| {
                self.worker(
                    format!("compile-{i}"),
                    WorkerRole::Compile,
                    Some(run_gpus.clone()),
                    settings.arch_list.clone(),
                    settings.launcher.compile_placement(i),
                )
            })
            .collect())
    }
}
