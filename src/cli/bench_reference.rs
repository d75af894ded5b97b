//! `krefine bench reference`: how long after its compile a problem's first candidate is executed,
//! before and after reference data came off the critical path, side by side in one run.
//!
//! Every candidate is compiled once, then evaluated on a cold reference (the problem's code with a
//! comment added, so the worker's reference cache has nothing of it) in each of the ways below. Each
//! krefine way has the same timeline: the problem is new at its start, and the candidate has compiled
//! `--head-start-s` later (its answer was generated and compiled meanwhile); the ways differ only in
//! what the worker does during that time.
//! - `kernelbench`: KernelBench's own order in a fresh process (`bench/reference/kernelbench_order.py`:
//!   trials made as they are reached, the candidate timed if correct, the reference timed always);
//! - `before`: what krefine did before: every reference step prepared, then the candidate evaluated;
//! - `lazy`: the candidate evaluated at once, building only the reference data its check reaches;
//! - `ahead`: preparation started `--head-start-s` before the candidate compiled (its answer being
//!   generated and compiled meanwhile), as the engine does (`crate::refprep`), then the candidate;
//! - `later`: the same candidate again on that now warm reference (a later candidate of the problem).
//!
//! Each figure is the wall time from "compiled" to the verdict, through the real worker pool. The
//! verdicts of the four krefine ways must agree (the last column says so).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::gpu::{DeviceInfo, DevicePool};
use crate::refprep::{Ended, PrepServices, prepare_problem};
use crate::services::{CompileJob, Compiler, DeviceId, EventSink, ExecJob, Executor};
use crate::types::{CompileStatus, ExecOutcome, Problem, ProblemKey, TaskId};
use crate::worker::{WorkerPool, WorkerSettings, deploy_harness, find_python};

/// KernelBench's order, run by `python` in a fresh process for the `kernelbench` column.
const KERNELBENCH_ORDER: &str = include_str!("../../bench/reference/kernelbench_order.py");

/// What the command was asked to do.
pub struct ReferenceBench {
    pub problem: PathBuf,
    pub candidates: Vec<PathBuf>,
    pub python: Option<PathBuf>,
    pub device: String,
    pub head_start_s: f64,
    pub timing_trials: u32,
    pub warmup: u32,
    pub repeat: u32,
    pub work_dir: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
struct KernelBenchReport {
    seconds: f64,
    status: String,
    #[serde(default)]
    phases: std::collections::BTreeMap<String, f64>,
}

/// One candidate's figures (seconds from compiled to verdict).
struct Row {
    name: String,
    verdict: String,
    /// The medians of the ways the module doc names.
    kernelbench: f64,
    before: f64,
    lazy: f64,
    ahead: f64,
    /// What the head start had prepared when the candidate arrived.
    prepared: String,
    later: f64,
    /// The four krefine ways gave the same verdict.
    same: bool,
}

pub fn run(args: ReferenceBench) -> anyhow::Result<String> {
    let rt = super::runtime()?;
    let python = rt
        .block_on(find_python(args.python.as_deref(), None))
        .context("finding the worker Python")?;
    let (work, temporary) = match &args.work_dir {
        Some(dir) => (dir.clone(), false),
        None => (
            std::env::temp_dir().join(format!("krefine-bench-reference-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&work).with_context(|| format!("create {}", work.display()))?;
    let result = rt.block_on(bench(&args, &python, &work));
    if temporary {
        let _ = std::fs::remove_dir_all(&work);
    }
    result
}

fn device_of(name: &str) -> anyhow::Result<DeviceId> {
    if name == "cpu" {
        return Ok(DeviceId::Cpu);
    }
    name.parse::<u32>()
        .map(DeviceId::Gpu)
        .with_context(|| format!("--device {name:?}: expected `cpu` or a GPU index such as 0"))
}

async fn bench(args: &ReferenceBench, python: &Path, work: &Path) -> anyhow::Result<String> {
    let device = device_of(&args.device)?;
    let code = std::fs::read_to_string(&args.problem)
        .with_context(|| format!("read the problem {}", args.problem.display()))?;
    let harness = deploy_harness(&work.join("harness")).await?;
    let script = work.join("kernelbench_order.py");
    std::fs::write(&script, KERNELBENCH_ORDER)
        .with_context(|| format!("write {}", script.display()))?;
    let mut settings = WorkerSettings::new(python.to_path_buf(), harness.clone(), work);
    settings.devices = vec![device.clone()];
    settings.timing_trials = args.timing_trials;
    settings.warmup = args.warmup;
    let pool = WorkerPool::start(settings).await?;
    let info = DeviceInfo {
        id: device.clone(),
        name: device.to_string(),
        capability: None,
        total_memory_bytes: None,
    };
    let devices = DevicePool::new(vec![info]);
    let mut rows = Vec::new();
    let mut fresh = 0u32;
    for path in &args.candidates {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        let source = std::fs::read_to_string(path)
            .with_context(|| format!("read the candidate {}", path.display()))?;
        let compiled = pool
            .compile(CompileJob {
                task: task(0),
                turn: 1,
                code: source.clone(),
                log_path: work.join(format!("logs/{name}.compile.log")),
            })
            .await
            .map_err(|e| anyhow::anyhow!("compiling {name}: {e}"))?;
        if compiled.status != CompileStatus::Ok {
            bail!("{name} does not compile: {}", compiled.feedback);
        }
        let build_dir = compiled.build_dir.clone();
        eprintln!("{name}: compiled; measuring");
        // Each way gets a problem the worker has never seen (another hash, the same semantics).
        let mut cold = || {
            fresh += 1;
            Arc::new(Problem {
                key: ProblemKey {
                    level: 0,
                    problem_id: fresh,
                },
                name: format!("{fresh}_bench.py"),
                code: format!("{code}\n# krefine bench reference: cold copy {fresh}\n"),
            })
        };
        let job = |problem: Arc<Problem>| ExecJob {
            task: task(problem.key.problem_id),
            turn: 1,
            problem,
            code: source.clone(),
            build_dir: build_dir.clone(),
        };

        let problem_file = work.join(format!("{name}.problem.py"));
        std::fs::write(&problem_file, &cold().code)?;
        let candidate_file = work.join(format!("{name}.candidate.py"));
        std::fs::write(&candidate_file, &source)?;
        let mut figures: Vec<[f64; 5]> = Vec::new();
        let mut prepared = Vec::new();
        let mut outcomes = Vec::new();
        for round in 0..args.repeat.max(1) {
            let kb = kernelbench(
                python,
                &script,
                &harness,
                &problem_file,
                &candidate_file,
                build_dir.as_deref().unwrap_or(""),
                &device,
                args,
            )?;
            let t = Timeline {
                pool: &pool,
                devices: &devices,
                head_start: Duration::from_secs_f64(args.head_start_s.max(0.0)),
            };
            let (before_outcome, before) = t.before(job(cold())).await?;
            let (lazy_outcome, lazy) = t.lazy(job(cold())).await?;
            let warm = cold();
            let (ahead_outcome, ahead, ended) = t.ahead(job(warm.clone())).await?;
            let (later_outcome, later) = t.lazy(job(warm)).await?;
            eprintln!(
                "{name} round {}: kernelbench {:.2} s ({}), before {before:.2}, lazy {lazy:.2}, ahead {ahead:.2} (prepared: {ended:?}), later {later:.2}",
                round + 1,
                kb.seconds,
                kb.status
            );
            // Where the time went (stderr, with the progress lines).
            eprintln!("  kernelbench phases {:?}", kb.phases);
            for (what, o) in [
                ("before", &before_outcome),
                ("lazy", &lazy_outcome),
                ("ahead", &ahead_outcome),
                ("later", &later_outcome),
            ] {
                eprintln!("  {what} phases {}", phases_line(o));
            }
            figures.push([kb.seconds, before, lazy, ahead, later]);
            prepared.push(ended);
            outcomes.push([before_outcome, lazy_outcome, ahead_outcome, later_outcome]);
        }
        let median = |i: usize| {
            let mut v: Vec<f64> = figures.iter().map(|f| f[i]).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let first = &outcomes[0][0];
        let same = outcomes.iter().flatten().all(|o| same_verdict(o, first));
        let all_prepared = prepared.iter().all(|e| *e == Ended::Done);
        rows.push(Row {
            name,
            verdict: first.verdict.to_string(),
            kernelbench: median(0),
            before: median(1),
            lazy: median(2),
            ahead: median(3),
            prepared: if all_prepared {
                "all".into()
            } else {
                format!("{prepared:?}")
            },
            later: median(4),
            same,
        });
    }
    pool.shutdown().await;
    Ok(table(args, &rows))
}

/// One candidate's arrival, the same in every way measured: its problem is new at the start, and the
/// candidate has compiled `head_start` later (its answer generated and compiled meanwhile). Each way
/// returns the outcome and the seconds from compiled to verdict.
struct Timeline<'a> {
    pool: &'a Arc<WorkerPool>,
    devices: &'a DevicePool,
    head_start: Duration,
}

impl Timeline<'_> {
    /// Lease the device (as the engine does) and evaluate.
    async fn execute(&self, job: ExecJob) -> anyhow::Result<ExecOutcome> {
        let lease = self
            .devices
            .acquire()
            .await
            .ok_or_else(|| anyhow::anyhow!("no device left to lease"))?;
        Ok(self.pool.execute(job, &lease.device.id).await?)
    }

    /// Nothing meanwhile; the candidate builds what its check reaches.
    async fn lazy(&self, job: ExecJob) -> anyhow::Result<(ExecOutcome, f64)> {
        tokio::time::sleep(self.head_start).await;
        let t = Instant::now();
        let outcome = self.execute(job).await?;
        Ok((outcome, t.elapsed().as_secs_f64()))
    }

    /// Before this change: at the candidate's arrival, the whole reference, then the candidate.
    async fn before(&self, job: ExecJob) -> anyhow::Result<(ExecOutcome, f64)> {
        tokio::time::sleep(self.head_start).await;
        let t = Instant::now();
        let lease = self
            .devices
            .acquire()
            .await
            .ok_or_else(|| anyhow::anyhow!("no device left to lease"))?;
        self.pool
            .prepare_everything(&job.problem, &lease.device.id)
            .await?;
        drop(lease);
        let outcome = self.execute(job).await?;
        Ok((outcome, t.elapsed().as_secs_f64()))
    }

    /// Preparation from the start, as the engine does, until the candidate arrives.
    async fn ahead(&self, job: ExecJob) -> anyhow::Result<(ExecOutcome, f64, Ended)> {
        let arrived = AtomicBool::new(false);
        let cancel = CancellationToken::new();
        let sink = EventSink::discard();
        let problems: HashMap<ProblemKey, Arc<Problem>> = HashMap::new();
        let services = PrepServices {
            devices: self.devices,
            executor: &**self.pool,
            compiler: &**self.pool,
            problems: &problems,
            sink: &sink,
            cpu: None,
        };
        let problem = job.problem.clone();
        // The bench's pool has one device.
        let device = self
            .devices
            .devices()
            .next()
            .map_or(crate::services::DeviceId::Cpu, |d| d.id.clone());
        let preparing = prepare_problem(
            &services,
            problem,
            &device,
            || !arrived.load(Ordering::SeqCst),
            &cancel,
        );
        let candidate = async {
            tokio::time::sleep(self.head_start).await;
            let t = Instant::now();
            arrived.store(true, Ordering::SeqCst);
            let outcome = self.execute(job).await;
            (outcome, t.elapsed().as_secs_f64())
        };
        let (ended, (outcome, seconds)) = tokio::join!(preparing, candidate);
        Ok((outcome?, seconds, ended))
    }
}

/// `reference_s 1.23, correctness_s 0.45, ...` (the worker's phases, nonzero ones).
fn phases_line(o: &ExecOutcome) -> String {
    o.phases
        .iter()
        .filter_map(|(k, v)| {
            v.as_f64()
                .filter(|s| *s >= 0.005)
                .map(|s| format!("{k} {s:.2}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn task(problem_id: u32) -> TaskId {
    TaskId {
        problem: ProblemKey {
            level: 0,
            problem_id,
        },
        sample: 0,
    }
}

/// Verdict, correctness and KernelBench's metadata (the traceback's file paths aside).
fn same_verdict(a: &ExecOutcome, b: &ExecOutcome) -> bool {
    let meta = |o: &ExecOutcome| {
        let mut m = o.metadata.clone();
        m.remove("runtime_error_traceback");
        m
    };
    (a.verdict, a.compiled, a.correctness) == (b.verdict, b.compiled, b.correctness)
        && meta(a) == meta(b)
}

#[allow(
    clippy::too_many_arguments,
    reason = "the paths of one script's command line, each its own argument; one call site"
)]
fn kernelbench(
    python: &Path,
    script: &Path,
    harness: &Path,
    problem: &Path,
    candidate: &Path,
    build_dir: &str,
    device: &DeviceId,
    args: &ReferenceBench,
) -> anyhow::Result<KernelBenchReport> {
    let (visible, name) = match device {
        DeviceId::Cpu => (String::new(), "cpu".to_string()),
        DeviceId::Gpu(i) => (i.to_string(), "cuda:0".to_string()),
    };
    let out = std::process::Command::new(python)
        .arg(script)
        .arg(harness)
        .arg(problem)
        .arg(candidate)
        .arg(build_dir)
        .arg(&name)
        .args([
            "5".to_string(),
            args.timing_trials.to_string(),
            args.warmup.to_string(),
        ])
        .env("CUDA_VISIBLE_DEVICES", visible)
        .output()
        .with_context(|| format!("run {}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rev().find(|l| l.starts_with('{'));
    match line {
        Some(l) if out.status.success() => serde_json::from_str(l)
            .with_context(|| format!("the KernelBench-order run printed {l:?}")),
        _ => bail!(
            "the KernelBench-order run failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

fn table(args: &ReferenceBench, rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "reference benchmark: {} on {}, 5 correctness trials, {} timed trials, head start {} s, median of {} round(s)",
        args.problem.display(),
        args.device,
        args.timing_trials,
        args.head_start_s,
        args.repeat.max(1)
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "seconds from compiled to verdict; ratios against KernelBench's own order (goal: first candidate <= 1.0)"
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "| candidate | verdict | KernelBench order | before (prepare all, then evaluate) | lazy (no head start) | ahead (head start) | prepared at arrival | later candidate | before / KB | lazy / KB | ahead / KB | same verdicts |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let ratio = |x: f64| {
            if r.kernelbench > 0.0 {
                format!("{:.2}", x / r.kernelbench)
            } else {
                "-".into()
            }
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.2} | {} | {} | {} | {} |",
            r.name,
            r.verdict,
            r.kernelbench,
            r.before,
            r.lazy,
            r.ahead,
            r.prepared,
            r.later,
            ratio(r.before),
            ratio(r.lazy),
            ratio(r.ahead),
            if r.same { "yes" } else { "NO" }
        );
    }
    out
}
