//! `krefine bench compile --across-runs`: does a short run's precompiled header serve the next run's
//! first build? Real compile workers, as a run has them (sandboxed where the machine allows it): a
//! first pool builds the first candidate (missing the header, which its worker then builds) and shuts
//! down once the header is done, publishing it into the shared build cache; a second pool, with fresh
//! workers and scratch and the same cache, builds each other candidate (never seen before) as its
//! first build. Each is set beside the plain `load_inline` build of the same candidate, cold.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::bench_compile::{CompileBench, Mode, Runner, collect};
use crate::services::{CompileJob, Compiler, DeviceId};
use crate::types::{CompileStatus, ProblemKey, TaskId};
use crate::worker::sandbox::SandboxLevel;
use crate::worker::{WorkerPool, WorkerSettings, deploy_harness, find_python};

/// How long the first run waits for its worker's headers.
const PCH_WAIT: Duration = Duration::from_secs(1800);
/// The compile log line of a build that used a published header (kb_build.py).
const FROM_SHARED: &str = "from the shared build cache";

pub fn run(args: CompileBench) -> anyhow::Result<String> {
    let candidates = collect(&args.paths)?;
    anyhow::ensure!(
        candidates.len() >= 2,
        "--across-runs needs two candidates or more: the first warms the cache, the others are the next run's"
    );
    let rt = super::runtime()?;
    let python = rt
        .block_on(find_python(args.python.as_deref(), None))
        .context("finding the worker Python")?;
    let (work, temporary) = match &args.work_dir {
        Some(dir) => (dir.clone(), false),
        None => (
            std::env::temp_dir().join(format!("krefine-bench-pch-{}", std::process::id())),
            true,
        ),
    };
    let _ = std::fs::remove_dir_all(&work);
    let builds = work.join("builds");
    std::fs::create_dir_all(&builds).with_context(|| format!("creating {}", builds.display()))?;
    let harness = rt
        .block_on(deploy_harness(&work.join("harness")))
        .context("deploying the harness")?;
    let cache = work.join("build-cache");
    let settings = |run: &str| {
        let mut s = WorkerSettings::new(python.clone(), harness.clone(), &work.join(run));
        s.build_cache = cache.clone();
        s.devices = vec![DeviceId::Cpu];
        s.compile_workers = 1;
        s.arch_list = args.arch.clone();
        s
    };
    let logs = work.join("logs");
    std::fs::create_dir_all(&logs)?;
    let job = |n: u32, path: &Path| -> anyhow::Result<CompileJob> {
        Ok(CompileJob {
            task: TaskId {
                problem: ProblemKey {
                    level: 1,
                    problem_id: 1,
                },
                sample: 0,
            },
            turn: n,
            code: std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?,
            log_path: logs.join(format!("{n}.compile.log")),
        })
    };

    // The short run: one build, and its worker's headers.
    let (warm_name, warm_path) = &candidates[0];
    let first = rt.block_on(async {
        let pool = WorkerPool::start(settings("run1")).await?;
        let started = Instant::now();
        let out = pool.compile(job(0, warm_path)?).await;
        let built_s = started.elapsed().as_secs_f64();
        let pch = match pool.sandbox_level() {
            SandboxLevel::Namespaces => work.join("run1/scratch/compile-0.cow/upper/pch"),
            _ => cache.join("pch"),
        };
        let settled = settle(&pch).await;
        pool.shutdown().await;
        let out = out.map_err(|e| anyhow::anyhow!("{e}"))?;
        anyhow::ensure!(
            out.status == CompileStatus::Ok,
            "the warm-up candidate {warm_name} did not build: {}",
            out.feedback
        );
        anyhow::Ok((built_s, settled?, pool.sandbox_level().as_str().to_string()))
    })?;
    let (warm_s, pch_wait_s, sandbox) = first;
    let published = std::fs::read_dir(cache.join("pch"))
        .map(|d| d.flatten().filter(|e| e.path().is_dir()).count())
        .unwrap_or(0);

    // The next run: fresh workers and scratch, the same cache; each candidate its first build there.
    let mut rows = Vec::new();
    for (n, (name, path)) in candidates.iter().enumerate().skip(1) {
        let job = job(n as u32, path)?;
        let log_path = job.log_path.clone();
        let next = rt.block_on(async {
            let pool = WorkerPool::start(settings(&format!("run{}", n + 1))).await?;
            let started = Instant::now();
            let out = pool.compile(job).await;
            let s = started.elapsed().as_secs_f64();
            pool.shutdown().await;
            let out = out.map_err(|e| anyhow::anyhow!("{e}"))?;
            anyhow::Ok((s, out))
        })?;
        let (next_s, out) = next;
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let runner = Runner::new(python.clone(), harness.join("kb_bench.py"), &args, &builds);
        let plain = runner.build(name, path, Mode::Plain)?;
        eprintln!(
            "{name}: next run's first build {next_s:.1} s ({}), plain {:.1} s",
            out.build_path.as_deref().unwrap_or("-"),
            plain.seconds
        );
        // The build itself as the worker timed it (like-for-like with the plain build, which also
        // runs in a process that has torch imported), and its compilers' CPU time (steadier on a
        // busy machine); end to end adds starting the worker.
        let (build_s, cpu_s) = out.cpu.as_ref().map_or((f64::NAN, f64::NAN), |c| {
            (c.wall_ms as f64 / 1000.0, c.cpu_ms as f64 / 1000.0)
        });
        let ok = plain.ok && out.status == CompileStatus::Ok && plain.seconds > 0.0;
        let ratio = |a: f64, b: f64| {
            if ok && b > 0.0 && a.is_finite() {
                format!("{:.2}x", a / b)
            } else {
                "-".into()
            }
        };
        rows.push(format!(
            "| {name} | {} | {} | {build_s:.1} s ({cpu_s:.1} s CPU) | {next_s:.1} s | {:.1} s ({:.1} s CPU) | {} ({} CPU) |",
            out.build_path.as_deref().unwrap_or("failed"),
            if log.contains(FROM_SHARED) { "shared cache" } else { "none" },
            plain.seconds,
            plain.cpu_seconds,
            ratio(build_s, plain.seconds),
            ratio(cpu_s, plain.cpu_seconds),
        ));
    }
    if temporary {
        let _ = std::fs::remove_dir_all(&work);
    }
    Ok(format!(
        "precompiled headers across runs: python {}, sandbox {sandbox}\nshort run: {warm_name} built in {warm_s:.1} s; its worker's headers done {pch_wait_s:.1} s later; {published} published into the shared cache\n\n| candidate | path | header | next run's first build | end to end (with the worker's start) | plain load_inline | ratio |\n|---|---|---|---|---|---|---|\n{}",
        python.display(),
        rows.join("\n")
    ))
}

/// Wait until every header whose build started in `pch` (`<key>.lock`) is complete (`<key>/`
/// holds its `.gch`) and nothing new started for five seconds; the seconds waited.
async fn settle(pch: &Path) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut quiet = 0;
    while quiet < 10 {
        let (locks, done) = headers(pch);
        quiet = if !locks.is_empty() && done == locks.len() {
            quiet + 1
        } else {
            0
        };
        anyhow::ensure!(
            started.elapsed() < PCH_WAIT,
            "the worker's precompiled headers were not done within {} s ({})",
            PCH_WAIT.as_secs(),
            pch.display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(started.elapsed().as_secs_f64() - 5.0)
}

/// (headers whose build started, complete headers) in `pch`.
fn headers(pch: &Path) -> (Vec<PathBuf>, usize) {
    let Ok(entries) = std::fs::read_dir(pch) else {
        return (Vec::new(), 0);
    };
    let names: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    let locks: Vec<PathBuf> = names
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "lock"))
        .cloned()
        .collect();
    let done = names
        .iter()
        .filter(|p| p.extension().is_none() && p.join("krefine_pch.h.gch").is_file())
        .count();
    (locks, done)
}
