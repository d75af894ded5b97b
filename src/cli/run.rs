//! `krefine run`: load the config and dataset, pick devices, start services, drive the engine.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};

use crate::checks::{CheckedCompiler, StaticChecks};
use crate::config::{self, Config, ExecutorKind, LoadedConfig};
use crate::engine::{Engine, EngineParts, RunPlan, RunStop, Signals, StopReason};
use crate::gpu::{self, DeviceInfo};
use crate::launcher::{self, Launcher};
use crate::prompt::{PromptSettings, Prompts};
use crate::services::{Compiler, DeviceId, Executor};
use crate::sim::SimServices;
use crate::store::{ReadLog, RunDir, read_log};
use crate::tui::app::{App, Mode};
use crate::tui::source::Live;
use crate::tui::{self, Exit, Input};
use crate::types::{FeedbackMode, MethodKind};
use crate::view::RunView;
use crate::worker::{self, BaselineTable, LEASE_TRACE_ENV, WorkerPool, WorkerSettings};
use crate::{llm, lock, progress, provenance};

/// Exit status of a run that ended with tasks waiting on the LLM endpoint or on workers.
pub const EXIT_INCOMPLETE: u8 = 3;

#[derive(clap::Args)]
pub struct RunArgs {
    /// Experiment config (TOML).
    pub(super) config: PathBuf,
    /// Run directory (default: `<output.dir>/<run name>`).
    #[arg(long)]
    pub(super) out: Option<PathBuf>,
    /// Continue the run in --out (or the default run directory) from its event log.
    #[arg(long)]
    pub(super) resume: bool,
    /// Plain progress output instead of the live terminal UI.
    #[arg(long)]
    pub(super) no_tui: bool,
    /// Override a config key, e.g. `--set method.turns=5` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub(super) sets: Vec<String>,
    /// Serve the LLM answers recorded in this run directory instead of calling a model.
    #[arg(long, value_name = "RUN_DIR")]
    pub(super) replay_llm: Option<PathBuf>,
    /// Leave the report off stdout at the end (commands that run an evaluation and print their own
    /// output, such as `krefine recheck`).
    #[arg(skip)]
    pub(super) quiet_report: bool,
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let loaded = config::load(&args.config, &args.sets)?;
    run_loaded(args, loaded)
}

/// Run (or resume) an experiment whose config is already loaded (`krefine eval` builds its own).
pub(super) fn run_loaded(args: RunArgs, loaded: LoadedConfig) -> anyhow::Result<ExitCode> {
    let cfg = &loaded.config;
    // Everything that can be checked is checked before a run directory exists.
    let dataset_path = loaded.resolve(&cfg.dataset.path);
    let problems = super::preflight::problems(&loaded).map_err(anyhow::Error::msg)?;
    // Every planned turn has its scripted answer (checked once a resume is known to be the same
    // experiment: a changed one is better told by the keys that changed).
    let answers_cover = || match &args.replay_llm {
        Some(_) => Ok(()),
        None => super::preflight::scripted_answers(&loaded, &problems)
            .map(|_| ())
            .map_err(anyhow::Error::msg),
    };
    if cfg.eval.executor == ExecutorKind::Worker {
        let hf_cache = hf_cache_dir(&loaded);
        cfg.eval.hf.check_models(hf_cache.as_deref(), &problems)?;
    }
    let discovery = gpu::discover();
    // Remote workers: the devices are the launcher's GPU slots, not this machine's GPUs.
    let planned = match cfg.eval.executor {
        ExecutorKind::Worker => {
            launcher::planned_devices(&cfg.resources).map_err(anyhow::Error::msg)?
        }
        ExecutorKind::Simulated => None,
    };
    let devices = match planned {
        Some(d) => d,
        None => gpu::select(&cfg.resources.devices, &discovery).map_err(anyhow::Error::msg)?,
    };
    let out = match &args.out {
        Some(o) => o.clone(),
        // Output goes where the user runs krefine, not next to the config.
        None => cfg.output.dir.join(loaded.run_name()),
    };
    // One process writes a run directory at a time: the lock is taken before anything in it is
    // read or written, and held until this process ends (the OS releases it however we end).
    let (dir, prior, _lock) = if args.resume {
        let dir = RunDir::open(&out)?;
        let lock = lock::lock_run_dir(dir.root())?;
        check_frozen_config(&dir, &loaded)?;
        answers_cover()?;
        let prior = read_resumable(&dir)?;
        (dir, Some(prior), lock)
    } else {
        answers_cover()?;
        std::fs::create_dir_all(&out)
            .with_context(|| format!("cannot create run directory {}", out.display()))?;
        let lock = lock::lock_run_dir(&out)?;
        (RunDir::create(&out, &loaded.effective_toml)?, None, lock)
    };
    let fresh = prior.is_none();
    let result = record_provenance(
        &dir,
        &loaded,
        &dataset_path,
        &problems,
        &devices,
        &discovery,
    )
    .and_then(|()| {
        start(
            args,
            loaded,
            dir.clone(),
            prior,
            problems,
            devices,
            discovery,
        )
    });
    if fresh && result.is_err() {
        remove_if_unstarted(&dir);
    }
    result
}

/// The log of a run to resume. A line that is not a record this krefine reads stops the resume
/// with its number; the log is left as it is, and `krefine repair` is the way past it.
fn read_resumable(dir: &RunDir) -> anyhow::Result<ReadLog> {
    read_log(&dir.events_path()).map_err(|e| match e {
        crate::store::StoreError::Corrupt { line, .. } if line > 0 => anyhow::anyhow!(
            "{e}\nthe log was left as it is; `krefine repair {dir}` cuts it before line {line} \
             (the whole log is kept as a backup), then --resume redoes what the lines from there \
             on recorded",
            dir = dir.root().display()
        ),
        e => e.into(),
    })
}

/// Write the run's `provenance.json` (dataset revision, baseline hash, machine, build). A resumed
/// run keeps the one it started with and says so loudly when the problems or baseline changed since.
fn record_provenance(
    dir: &RunDir,
    loaded: &LoadedConfig,
    dataset_path: &std::path::Path,
    problems: &[crate::types::Problem],
    devices: &[DeviceInfo],
    discovery: &gpu::Discovery,
) -> anyhow::Result<()> {
    let cfg = &loaded.config;
    let worker = cfg.eval.executor == ExecutorKind::Worker;
    let baseline = cfg.eval.baseline.as_deref().map(|b| loaded.resolve(b));
    let now = provenance::collect(&provenance::Inputs {
        dataset_path,
        level: cfg.dataset.level,
        selection: &cfg.dataset.problems,
        problems,
        baseline: baseline.as_deref(),
        devices,
        discovery,
        hf_cache: if worker { hf_cache_dir(loaded) } else { None },
        hf_offline: worker.then_some(cfg.eval.hf.offline),
        evaluation: Some(evaluation_of(&cfg.eval)),
    })?;
    match provenance::read(dir.root())? {
        None => provenance::write(dir.root(), &now)?,
        Some(first) => {
            if first.dataset.content_hash != now.dataset.content_hash {
                eprintln!(
                    "WARNING: the problems changed since this run started ({} then, {} now); the run's provenance.json keeps the first",
                    first.dataset.content_hash, now.dataset.content_hash
                );
            }
            if first.baseline.as_ref().map(|b| &b.hash) != now.baseline.as_ref().map(|b| &b.hash) {
                eprintln!(
                    "WARNING: the baseline file changed since this run started; the run's provenance.json keeps the first"
                );
            }
        }
    }
    Ok(())
}

/// How the run judges and times results, for `provenance.json`.
fn evaluation_of(e: &crate::config::EvalSection) -> provenance::Evaluation {
    provenance::Evaluation {
        mode: e.mode.as_str().into(),
        precision: e.precision.as_str().into(),
        timing_method: e.timing_method.as_str().into(),
        tolerance: e.tolerance_in_effect(),
        reference: match e.reference {
            crate::worker::config::ReferenceMode::Eager => "eager".into(),
            crate::worker::config::ReferenceMode::Compile => "compile".into(),
        },
        inputs: e.inputs.as_str().into(),
        correct_trials: e.correct_trials,
        timing_trials: e.timing_trials,
        warmup: e.warmup,
        seed: e.seed,
        simulated: e.executor == ExecutorKind::Simulated,
    }
}

/// A new run that failed before its first event (no Python with torch, a missing API key, ...)
/// leaves no directory behind, so fixing the cause and running again needs no `--resume`.
fn remove_if_unstarted(dir: &RunDir) {
    let empty = std::fs::metadata(dir.events_path())
        .map(|m| m.len() == 0)
        .unwrap_or(false);
    if empty {
        let _ = std::fs::remove_dir_all(dir.root());
    }
}

fn start(
    args: RunArgs,
    loaded: LoadedConfig,
    dir: RunDir,
    prior: Option<ReadLog>,
    problems: Vec<crate::types::Problem>,
    devices: Vec<DeviceInfo>,
    discovery: gpu::Discovery,
) -> anyhow::Result<ExitCode> {
    let cfg = &loaded.config;
    let _trace_guard = init_tracing(&dir)?;
    let plan = RunPlan {
        run: loaded.run_name(),
        method: cfg.method.kind,
        // Profiles only feed a next turn, so single-turn methods skip them.
        feedback: match cfg.method.kind {
            MethodKind::Refine => cfg.method.feedback,
            MethodKind::OneShot | MethodKind::Sampling => FeedbackMode::GE,
        },
        turns: cfg.method.turns_per_task(),
        samples: cfg.method.samples_per_problem(),
        problems: problems.into_iter().map(Arc::new).collect(),
        simulated: cfg.eval.executor == ExecutorKind::Simulated,
    };
    eprintln!(
        "krefine {}: {} {} on {} problem(s), {} task(s), devices: {}{}",
        plan.run,
        plan.method,
        if plan.method == MethodKind::Refine {
            format!("{} turns {}", plan.turns, plan.feedback)
        } else {
            format!("k={}", plan.samples)
        },
        plan.problems.len(),
        plan.problems.len() as u32 * plan.samples,
        devices
            .iter()
            .map(|d| format!("{} ({})", d.id, d.name))
            .collect::<Vec<_>>()
            .join(", "),
        if plan.simulated {
            " [SIMULATED executor: verdicts and timings are scripted, not measured]"
        } else {
            ""
        }
    );
    eprintln!("run directory: {}", dir.root().display());
    let rt = super::runtime()?;
    match rt.block_on(drive(args, loaded, dir, prior, plan, devices, discovery))? {
        Driven::Ended(code) => Ok(code),
        Driven::Forced(code) => {
            // Nothing is waited for: tasks still running (a step under way, a worker's shutdown)
            // end with the process. Said here, not by a task of the runtime, which may be dropped
            // before it printed.
            rt.shutdown_background();
            super::run_display::say_forced();
            Ok(code)
        }
    }
}

/// What the run's display and engine came to.
enum Driven {
    /// The run ended (finished, stopped cleanly or left incomplete): its exit status.
    Ended(ExitCode),
    /// The second stop request came: the process leaves at once, without waiting for the steps
    /// under way or shutting the workers down (they die with it: `PR_SET_PDEATHSIG`).
    Forced(ExitCode),
}

async fn drive(
    args: RunArgs,
    loaded: LoadedConfig,
    dir: RunDir,
    prior: Option<ReadLog>,
    plan: RunPlan,
    devices: Vec<DeviceInfo>,
    discovery: gpu::Discovery,
) -> anyhow::Result<Driven> {
    let stop = RunStop::new();
    let cancel = stop.token().clone();
    // One stream of signals for the whole run, services starting included: SIGTERM (a scheduler,
    // `kill`, `timeout`) and SIGHUP stop it the way Ctrl-C does, so that the workers, and an
    // allocation krefine asked for, are released on the way out; a second signal stops it at once.
    let _signals = super::run_display::listen(
        Signals::new().context("cannot listen for signals")?,
        stop.clone(),
    );
    let display = super::run_display::display(args.no_tui);
    if let super::run_display::Display::Plain { why: Some(why) } = display {
        eprintln!("krefine: {why}");
    }
    // Until a screen is up, what the stop does is said on stderr.
    let startup_notices = super::run_display::notices(&stop);
    let (llm, ledger) = llm::build_with_ledger(
        &loaded.llm_parts(),
        args.replay_llm.as_deref(),
        cancel.clone(),
    )?;
    // What the log held before this process continued it, folded once: the displays start from
    // it, and what it spent counts against the budget (budgets cover the whole run).
    let prior_view = RunView::from_records(prior.iter().flat_map(|p| &p.records));
    ledger.restore(&prior_view.budget_spend);
    let services = tokio::select! {
        s = build_eval_services(&loaded, &dir, &devices, &discovery, &cancel) => s,
        () = stop.forced() => return Ok(Driven::Forced(ExitCode::from(130))),
    };
    let (compiler, executor, pool, launcher, scratch) = match services {
        Ok(s) => s,
        Err(e) if cancel.is_cancelled() => {
            eprintln!("{e:#}");
            let status = stop.reason().map_or(130, |r| r.exit_status());
            return Ok(Driven::Ended(ExitCode::from(status)));
        }
        Err(e) => return Err(e),
    };
    if display == super::run_display::Display::Tui {
        startup_notices.abort();
    }
    let result = drive_engine(
        &loaded,
        dir,
        prior,
        prior_view,
        plan,
        devices,
        &stop,
        display,
        llm,
        compiler,
        executor,
        args.quiet_report,
    )
    .await;
    if matches!(result, Ok(Driven::Forced(_))) {
        return result;
    }
    let shutdown = async {
        #[cfg(debug_assertions)]
        test_hold_shutdown().await;
        let began = std::time::Instant::now();
        if let Some(pool) = pool {
            pool.shutdown().await;
        }
        if let Some(l) = launcher {
            l.release().await;
        }
        let (workers_s, removing) = (began.elapsed().as_secs_f64(), std::time::Instant::now());
        // The workers are gone: their scratch goes too (gigabytes of copy-on-write layers on a
        // GPU run), off the runtime's threads.
        if let Some(scratch) = scratch {
            let _ = tokio::task::spawn_blocking(move || drop(scratch)).await;
        }
        // The end of a run is part of its wall time (`bench throughput` counts it): where it went.
        let scratch_s = removing.elapsed().as_secs_f64();
        tracing::info!(
            "after the run: workers shut down in {workers_s:.1} s, scratch removed in {scratch_s:.1} s"
        );
    };
    // A second signal while the workers shut down (or an allocation is given back) leaves at once.
    tokio::select! {
        () = shutdown => result,
        () = stop.forced() => Ok(Driven::Forced(ExitCode::from(130))),
    }
}

/// Tests only (debug builds): `KREFINE_TEST_HOLD_SHUTDOWN_S=N` makes the shutdown after the run
/// take N seconds longer, as a slow worker or cluster would, so that a test can show that a second
/// signal does not wait for it.
#[cfg(debug_assertions)]
async fn test_hold_shutdown() {
    let hold = std::env::var("KREFINE_TEST_HOLD_SHUTDOWN_S")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0);
    if let Some(s) = hold {
        tokio::time::sleep(std::time::Duration::from_secs_f64(s)).await;
    }
}

/// The run itself, once the services stand; the caller shuts the workers down and releases the
/// launcher however this ends (unless it was forced).
#[allow(
    clippy::too_many_arguments,
    reason = "what `drive` has built, handed over whole once; one call site"
)]
async fn drive_engine(
    loaded: &LoadedConfig,
    dir: RunDir,
    prior: Option<ReadLog>,
    prior_view: RunView,
    plan: RunPlan,
    devices: Vec<DeviceInfo>,
    stop: &RunStop,
    display: super::run_display::Display,
    llm: Arc<dyn crate::services::Llm>,
    compiler: Arc<dyn Compiler>,
    executor: Arc<dyn Executor>,
    quiet_report: bool,
) -> anyhow::Result<Driven> {
    let cfg = &loaded.config;
    let prompts = Prompts::load(
        cfg.prompt
            .templates
            .as_deref()
            .map(|p| loaded.resolve(p))
            .as_deref(),
    )?;
    let gpu_name = devices
        .iter()
        .find(|d| d.id != DeviceId::Cpu)
        .map(|d| d.name.as_str());
    let prompt_settings = PromptSettings::from_config(
        &cfg.prompt,
        cfg.method.history,
        cfg.eval.precision,
        gpu_name,
    );
    // Template errors in user overrides surface now, not in the middle of a run.
    prompts.check(&prompt_settings)?;
    // Static checks run on every candidate before it is built, for the backend the prompt asks for.
    let checks = StaticChecks::new(
        &cfg.eval.checks,
        cfg.eval.mode,
        prompt_settings.backend,
        cfg.eval.precision,
    );
    let compiler: Arc<dyn Compiler> = Arc::new(CheckedCompiler::new(compiler, checks));
    // What the devices' locks say (another krefine process times on a device): shown by the UI, or
    // on stderr.
    let (notices, mut notice_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    // The engine leases the CPU when no GPU was selected.
    let device_names: Vec<String> = if devices.is_empty() {
        vec![DeviceId::Cpu.to_string()]
    } else {
        devices.iter().map(|d| d.id.to_string()).collect()
    };
    let host_locks = host_locks(cfg, &dir, &devices, notices);
    let parts = EngineParts {
        llm,
        compiler,
        executor,
        devices,
        prompts,
        prompt_settings,
        llm_concurrency: cfg.resources.llm_concurrency as usize,
        compile_workers: cfg.resources.compile_workers() as usize,
        cpu_budget: cpu_budget(cfg),
        prepare_ahead: cfg.resources.prepare_ahead as usize,
        host_locks,
    };
    let total_turns = plan.problems.len() as u64 * plan.samples as u64 * plan.turns as u64;
    let engine = Engine::prepare(
        plan,
        parts,
        dir.clone(),
        prior,
        cfg.output.fsync,
        stop.clone(),
    )
    .await?;
    if let Some(w) = engine.torn_tail() {
        eprintln!("warning: {w}");
        tracing::warn!("{w}");
    }
    let live = Live::new(engine.subscribe(), dir.events_path());
    let forced = || Ok(Driven::Forced(ExitCode::from(130)));
    let summary = if display == super::run_display::Display::Tui {
        let mut app = App::new(Mode::Live, super::view::meta_of(cfg, dir.root()));
        app.reset(prior_view);
        app.set_devices(device_names);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let to_ui = tx.clone();
        tokio::spawn(async move {
            while let Some(n) = notice_rx.recv().await {
                let _ = to_ui.send(crate::view::source::Feed::Warning(n));
            }
        });
        tokio::spawn(live.forward(tx));
        let engine_task = tokio::spawn(engine.run());
        // `q` and Ctrl-C in the UI, and the signals, go to the run's stop: the first stops the run
        // cleanly, the second leaves at once.
        match tui::run(app, Input::Feed(rx), Some(stop.clone())).await {
            // `q` is only accepted once the run is over.
            Ok(Exit::Quit) => {}
            // Said once the runtime let go, as every stop at once.
            Ok(Exit::Forced) => return forced(),
            Err(e) => {
                stop.request(StopReason::Failed(format!("the terminal UI failed: {e}")));
                let _ = engine_task.await;
                return Err(e);
            }
        }
        engine_task
            .await
            .map_err(|e| anyhow::anyhow!("the engine task failed: {e}"))?
    } else {
        tokio::spawn(async move {
            while let Some(n) = notice_rx.recv().await {
                eprintln!("{n}");
            }
        });
        let style = progress::Style::for_stderr();
        let progress = tokio::spawn(progress::follow(live, total_turns, prior_view, style));
        let summary = tokio::select! {
            s = engine.run() => s,
            () = stop.forced() => return forced(),
        };
        let _ = progress.await;
        summary
    };
    Ok(Driven::Ended(finish(summary?, &dir, quiet_report)?))
}

/// Say how the run ended, print its report, and give its exit status.
fn finish(
    summary: crate::engine::RunSummary,
    dir: &RunDir,
    quiet_report: bool,
) -> anyhow::Result<ExitCode> {
    eprintln!(
        "{} of {} task(s) finished{}",
        summary.finished,
        summary.tasks,
        match &summary.stopped {
            Some(r) => format!("; stopped: {r}"),
            None => String::new(),
        }
    );
    if let Some(incomplete) = summary.incomplete_reason() {
        eprintln!(
            "{incomplete}; nothing was recorded for their pending steps: run again with --resume \
             (same config and --out) to redo exactly those"
        );
    }
    if !quiet_report {
        match super::report::render_dirs(&[dir.root().to_path_buf()], crate::report::Format::Text) {
            Ok(text) => super::print_out(&text)?,
            Err(e) => eprintln!("warning: could not build the report: {e:#}"),
        }
    }
    Ok(match &summary.stopped {
        // 130 for an interrupt, 143 for SIGTERM, 129 for SIGHUP, 1 for a stop from within.
        Some(reason) => ExitCode::from(reason.exit_status()),
        // Tasks wait on the LLM endpoint or on workers (an outage): see README, "Exit status".
        None if summary.incomplete() => ExitCode::from(EXIT_INCOMPLETE),
        None => ExitCode::SUCCESS,
    })
}

/// The devices' locks shared by every krefine process on this machine, when this run times on
/// local devices (real evaluations with the local launcher; remote workers' devices are other
/// hosts', and simulated timings are no timings). Waits for another process are said on `notices`.
fn host_locks(
    cfg: &Config,
    dir: &RunDir,
    devices: &[DeviceInfo],
    notices: tokio::sync::mpsc::UnboundedSender<String>,
) -> Option<gpu::HostLocks> {
    let local = cfg.resources.launcher == crate::launcher::config::LauncherKind::Local;
    if !local || cfg.eval.executor != ExecutorKind::Worker {
        return None;
    }
    let devices = if devices.is_empty() {
        vec![DeviceInfo::cpu()]
    } else {
        devices.to_vec()
    };
    let run = std::path::absolute(dir.root()).unwrap_or_else(|_| dir.root().to_path_buf());
    let holder = format!("pid {}, run {}", std::process::id(), run.display());
    Some(gpu::HostLocks::new(lock::device_lock_dir(), holder, &devices).with_notices(notices))
}

/// The compiler, the executor, and what must be shut down and released at the end.
type EvalServices = (
    Arc<dyn Compiler>,
    Arc<dyn Executor>,
    Option<Arc<WorkerPool>>,
    Option<Arc<Launcher>>,
    Option<crate::scratch::Scratch>,
);

/// The compile and execute services the config asks for; the worker pool is returned for shutdown,
/// The CPU budget the engine and the background preparation share: workers on this machine only
/// (remote builds run on their hosts' cores, which krefine does not share out), and none for the
/// simulated executor.
fn cpu_budget(cfg: &Config) -> Option<Arc<crate::cpu_budget::CpuBudget>> {
    let local = cfg.resources.launcher == crate::launcher::config::LauncherKind::Local;
    (local && cfg.eval.executor == ExecutorKind::Worker)
        .then(|| Arc::new(crate::cpu_budget::CpuBudget::new(cfg.resources.cpu_cores())))
}

/// the launcher for release (an allocation krefine asked for).
async fn build_eval_services(
    loaded: &LoadedConfig,
    dir: &RunDir,
    devices: &[DeviceInfo],
    discovery: &gpu::Discovery,
    cancel: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<EvalServices> {
    let cfg = &loaded.config;
    match cfg.eval.executor {
        ExecutorKind::Simulated => {
            let sim = Arc::new(SimServices::new(cfg.eval.simulated.clone()));
            Ok((sim.clone(), sim, None, None, None))
        }
        ExecutorKind::Worker => {
            let configured = cfg.resources.python.as_deref().map(|p| loaded.resolve(p));
            let python = worker::find_python(configured.as_deref(), loaded.path.parent()).await?;
            // Workers run in their own scratch folders, so every path they get is absolute.
            let out_dir = std::path::absolute(&cfg.output.dir)?;
            let harness_dir = worker::deploy_harness(&out_dir.join(".harness")).await?;
            // The run's scratch, removed when it ends; dead runs' scratch is swept first.
            let scratch = crate::scratch::Scratch::claim(&std::env::temp_dir(), "krefine-")
                .context("cannot create the run's scratch folder")?;
            let mut s = WorkerSettings::new(python, harness_dir, scratch.path());
            s.log_dir = std::path::absolute(dir.logs_dir().join("workers"))?;
            // Builds are content-addressed, so runs share one cache.
            s.build_cache = out_dir.join(".build-cache");
            s.apply_eval(&cfg.eval);
            if let Some(p) = &cfg.eval.build_cache {
                s.build_cache = std::path::absolute(p)?;
            }
            // Problems' CPU-made inputs, next to the build cache (shared by runs the same way).
            if cfg.resources.reference_cache_gb != Some(0.0) {
                let dir = match &cfg.eval.reference_cache {
                    Some(p) => std::path::absolute(p)?,
                    None => out_dir.join(".reference-cache"),
                };
                s.reference_cache = Some(dir);
                // Unset: no bound but the file system's free space (`input_store::effective_cap`).
                s.reference_cache_bytes = cfg
                    .resources
                    .reference_cache_gb
                    .map_or(u64::MAX, |gb| (gb * 1e9) as u64);
                s.reference_ram_bytes = match cfg.resources.reference_ram_gb {
                    Some(gb) => (gb * 1e9) as u64,
                    None => crate::worker::input_store::default_ram_bytes(),
                };
                s.reference_ram_keep = cfg.resources.reference_ram_keep;
            } else {
                s.reference_cache = None;
            }
            s.compile_workers = cfg.resources.compile_workers() as usize;
            s.devices = devices.iter().map(|d| d.id.clone()).collect();
            if s.arch_list.is_none() {
                s.arch_list = gpu::arch_list(devices);
            }
            s.driver = discovery.driver_version.clone();
            s.extra_env = cfg.eval.hf.worker_env(hf_cache_dir(loaded).as_deref());
            let trace = cfg
                .eval
                .lease_trace
                .then(|| (LEASE_TRACE_ENV.into(), "1".into()));
            s.extra_env.extend(trace);
            if let Some(b) = &cfg.eval.baseline {
                s.baseline = Some(Arc::new(BaselineTable::load(&loaded.resolve(b)).await?));
            }
            let launcher = Arc::new(Launcher::start(&cfg.resources, cancel).await?);
            if launcher.is_remote() {
                eprintln!("launcher: {}", launcher.describe());
            }
            s.launcher = launcher.clone();
            let started = tokio::select! {
                p = WorkerPool::start(s) => p.map_err(anyhow::Error::from),
                _ = cancel.cancelled() => Err(anyhow::anyhow!("interrupted while the workers started")),
            };
            let pool = match started {
                Ok(p) => p,
                Err(e) => {
                    launcher.release().await;
                    return Err(e);
                }
            };
            eprintln!(
                "workers: {} compile, {} device; torch {}; TORCH_CUDA_ARCH_LIST {}",
                cfg.resources.compile_workers(),
                devices.len(),
                pool.torch_version(),
                pool.arch_list().unwrap_or("(cpu)")
            );
            Ok((
                pool.clone(),
                pool.clone(),
                Some(pool),
                Some(launcher),
                Some(scratch),
            ))
        }
    }
}

/// The Hugging Face cache the workers get: `eval.hf.cache` (resolved like every input path), else
/// the user's.
pub(crate) fn hf_cache_dir(loaded: &LoadedConfig) -> Option<PathBuf> {
    let hf = &loaded.config.eval.hf;
    hf.cache_dir(hf.cache.as_deref().map(|p| loaded.resolve(p)))
        .map(|p| std::path::absolute(&p).unwrap_or(p))
}

/// A resumed run must be the same experiment: everything but resources, budget and output must
/// match the frozen config in the run directory. A refusal names each differing key with the run's
/// value and the given one.
fn check_frozen_config(dir: &RunDir, loaded: &LoadedConfig) -> anyhow::Result<()> {
    let path = dir.config_path();
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read the run's frozen config {}", path.display()))?;
    let mut frozen: Config = toml::from_str(&text)
        .with_context(|| format!("the run's frozen config {} is not valid", path.display()))?;
    // Runs frozen before paths were written absolute name them as the config that started them
    // did: read those relative to the config given now, as that run read them.
    config::freeze(&mut frozen, &loaded.path);
    let differs = config::differences(&frozen, &loaded.config, &["resources", "output", "budget"]);
    if !differs.is_empty() {
        let unset = || "(unset)".to_string();
        let lines: Vec<String> = differs
            .iter()
            .map(|d| {
                format!(
                    "  {}: the run has {}, the config gives {}",
                    d.key,
                    d.before.clone().unwrap_or_else(unset),
                    d.after.clone().unwrap_or_else(unset)
                )
            })
            .collect();
        bail!(
            "cannot resume {}: the config differs from the run's frozen config {} in {} key(s):\n{}\n\
             only [resources], [budget] and [output] may change on resume; to continue the run as it \
             was, resume with its own config: krefine run {} --out {} --resume",
            dir.root().display(),
            path.display(),
            differs.len(),
            lines.join("\n"),
            path.display(),
            dir.root().display()
        );
    }
    Ok(())
}

/// Tracing to `krefine.log` in the run directory (level from `KREFINE_LOG`, default info).
fn init_tracing(dir: &RunDir) -> anyhow::Result<tracing_appender::non_blocking::WorkerGuard> {
    let path = dir.trace_log_path();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let (writer, guard) = tracing_appender::non_blocking(file);
    let filter = tracing_subscriber::EnvFilter::try_from_env("KREFINE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A second run in the same process (tests) keeps the first subscriber; that is fine.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(false)
        .try_init();
    Ok(guard)
}
