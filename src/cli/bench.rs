//! `krefine bench scheduler`: the engine against simulated services, time scaled down, to measure how
//! close the schedule comes to its lower bound and what the orchestrator itself costs.
//! `krefine bench compile` (in `bench_compile`): plain and fast builds of real candidates side by side.
//! `krefine bench reference` (in `bench_reference`): a problem's first candidate from compiled to
//! verdict, with and without its reference data prepared ahead, against KernelBench's own order.
//! `krefine bench throughput` (in `bench_throughput`): a runs folder or submission evaluated cold and
//! warm, candidates per GPU-hour and where the time went.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::Subcommand;
use tokio_util::sync::CancellationToken;

use crate::config::{Backend, HistoryPolicy, PromptStyle, SimulatedSection};
use crate::engine::{Engine, EngineParts, RunPlan};
use crate::gpu::DeviceInfo;
use crate::prompt::{PromptSettings, Prompts};
use crate::services::DeviceId;
use crate::sim::{SimLlm, SimServices};
use crate::state::RunState;
use crate::state::times::Times;
use crate::store::{RunDir, read_log};
use crate::types::{FeedbackMode, MethodKind, Precision, Problem, ProblemKey};

#[derive(Subcommand)]
pub enum BenchCmd {
    /// Scheduler benchmark: simulated LLM, compile pool and GPUs.
    Scheduler {
        #[arg(long, default_value_t = 250)]
        tasks: u32,
        #[arg(long, default_value_t = 10)]
        turns: u32,
        /// GPUs in all (spread over the nodes).
        #[arg(long, default_value_t = 8)]
        gpus: u32,
        /// Compile slots per node (the compile pool of each node; with the slurm launcher every
        /// compile step takes the next free slot on any node, so the pools add up).
        #[arg(long, default_value_t = 16)]
        compile_slots: u32,
        /// Nodes (a compile pool of `--compile-slots` on each). Above 1 the scale-out goals apply:
        /// makespan <= 1.03 x the lower bound, orchestrator <= 200 MB RSS and <= 60 s CPU.
        #[arg(long, default_value_t = 1)]
        nodes: u32,
        /// Median LLM latency in simulated seconds (log-normal, sigma 0.5).
        #[arg(long, default_value_t = 20.0)]
        llm_median_s: f64,
        #[arg(long, default_value_t = 40.0)]
        compile_s: f64,
        #[arg(long, default_value_t = 2.0)]
        execute_min_s: f64,
        #[arg(long, default_value_t = 15.0)]
        execute_max_s: f64,
        /// Simulated seconds per real second.
        #[arg(long, default_value_t = 200.0)]
        scale: f64,
    },
    /// Compile benchmark: each candidate built the plain load_inline way and krefine's fast way, cold,
    /// side by side in one run, with the ratio.
    Compile {
        /// Candidate files, or folders of them (`*.py`).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// The Python with torch (default: the first python3/python on PATH that imports torch).
        #[arg(long)]
        python: Option<PathBuf>,
        /// TORCH_CUDA_ARCH_LIST for the builds (for example 9.0).
        #[arg(long)]
        arch: Option<String>,
        /// Builds at once, each a fresh Python process with its own build folder.
        #[arg(long, default_value_t = 1)]
        jobs: usize,
        /// Also compare the machine code of both builds (cuobjdump -sass for CUDA objects, objdump -d
        /// for host objects).
        #[arg(long)]
        compare_code: bool,
        /// Build here and keep the builds (default: a temporary folder, removed afterwards).
        #[arg(long)]
        work_dir: Option<PathBuf>,
        /// Precompiled headers across runs: the first candidate is a short run's build (its compile
        /// worker's headers are published into a fresh shared build cache); each other candidate is
        /// the next run's first build, through real compile workers, beside its plain load_inline.
        #[arg(long)]
        across_runs: bool,
    },
    /// Reference benchmark: each candidate's time from compiled to verdict on a cold reference, the way
    /// krefine did before (prepare everything, then evaluate), without and with preparation ahead, and
    /// as a later candidate, next to KernelBench's own order in a fresh process.
    Reference {
        /// The problem (a KernelBench-format `.py`).
        problem: PathBuf,
        /// Candidate files (`.py` with `ModelNew`).
        #[arg(required = true)]
        candidates: Vec<PathBuf>,
        /// The Python with torch (default: the first python3/python on PATH that imports torch).
        #[arg(long)]
        python: Option<PathBuf>,
        /// `cpu` or a GPU index.
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Seconds from the start of preparation to the candidate's compile finishing (its answer
        /// generated and compiled meanwhile).
        #[arg(long, default_value_t = 60.0)]
        head_start_s: f64,
        #[arg(long, default_value_t = 100)]
        timing_trials: u32,
        #[arg(long, default_value_t = 3)]
        warmup: u32,
        /// Rounds per candidate; the table shows the medians.
        #[arg(long, default_value_t = 1)]
        repeat: u32,
        /// Work here and keep it (default: a temporary folder, removed afterwards).
        #[arg(long)]
        work_dir: Option<PathBuf>,
    },
    /// Terminal UI benchmark: fold a synthetic run's log, then draw frames of it in memory.
    Tui {
        #[arg(long, default_value_t = 250)]
        tasks: u32,
        #[arg(long, default_value_t = 10)]
        turns: u32,
        #[arg(long, default_value_t = 200)]
        width: u16,
        #[arg(long, default_value_t = 60)]
        height: u16,
        #[arg(long, default_value_t = 100)]
        frames: u32,
    },
    /// Throughput: evaluate a runs folder or submission as `krefine eval` does, cold (empty caches)
    /// then warm (reference inputs stored), and print candidates per GPU-hour, time to first result,
    /// per-stage totals and GPU busy (measured work next to lease-held time).
    Throughput {
        /// A submission JSON or a KernelBench runs folder.
        src: PathBuf,
        /// The problems the generations are for (as `krefine eval --dataset`).
        #[arg(long)]
        dataset: PathBuf,
        /// The level to evaluate when the generations span several.
        #[arg(long)]
        level: Option<u32>,
        /// Override a key of both passes' config, e.g. `--set resources.compile_workers=16`.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
        /// The warm pass reuses the cold pass's builds too (default: it builds again, so only the
        /// reference data differs).
        #[arg(long)]
        warm_builds: bool,
        /// Only the cold pass.
        #[arg(long)]
        cold_only: bool,
        /// Put the passes' run directories and caches here and keep them (must not hold `cold/` or
        /// `warm/` yet; default: a temporary folder, removed afterwards).
        #[arg(long)]
        work_dir: Option<PathBuf>,
    },
    /// Sandbox cost: a worker start with and without the namespaces sandbox, and the per-candidate
    /// Landlock layer.
    Sandbox {
        /// Python with torch (default: as `krefine run` finds it).
        #[arg(long)]
        python: Option<std::path::PathBuf>,
        #[arg(long, default_value_t = 30)]
        runs: u32,
    },
}

pub fn bench(cmd: BenchCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        BenchCmd::Compile {
            paths,
            python,
            arch,
            jobs,
            compare_code,
            work_dir,
            across_runs,
        } => {
            let args = super::bench_compile::CompileBench {
                paths,
                python,
                arch,
                jobs,
                compare_code,
                work_dir,
            };
            // A short run's precompiled headers, then the next run's first builds (bench_pch.rs).
            let out = if across_runs {
                super::bench_pch::run(args)?
            } else {
                super::bench_compile::run(args)?
            };
            super::print_out(&out)?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCmd::Reference {
            problem,
            candidates,
            python,
            device,
            head_start_s,
            timing_trials,
            warmup,
            repeat,
            work_dir,
        } => {
            let out = super::bench_reference::run(super::bench_reference::ReferenceBench {
                problem,
                candidates,
                python,
                device,
                head_start_s,
                timing_trials,
                warmup,
                repeat,
                work_dir,
            })?;
            super::print_out(&out)?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCmd::Tui {
            tasks,
            turns,
            width,
            height,
            frames,
        } => {
            let r = super::bench_tui::run(tasks, turns, width, height, frames)?;
            super::print_out(&r)?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCmd::Sandbox { python, runs } => super::bench_sandbox::bench_sandbox(python, runs),
        BenchCmd::Throughput {
            src,
            dataset,
            level,
            sets,
            warm_builds,
            cold_only,
            work_dir,
        } => {
            let out = super::bench_throughput::run(super::bench_throughput::ThroughputBench {
                src,
                dataset,
                level,
                sets,
                warm_builds,
                cold_only,
                work_dir,
            })?;
            super::print_out(&out)?;
            Ok(ExitCode::SUCCESS)
        }
        BenchCmd::Scheduler {
            tasks,
            turns,
            gpus,
            compile_slots,
            nodes,
            llm_median_s,
            compile_s,
            execute_min_s,
            execute_max_s,
            scale,
        } => {
            if nodes == 0 || gpus == 0 || compile_slots == 0 || tasks == 0 || turns == 0 {
                anyhow::bail!(
                    "--tasks, --turns, --gpus, --compile-slots and --nodes must be at least 1"
                );
            }
            let sim = SimulatedSection {
                compile_s,
                execute_min_s,
                execute_max_s,
                profile_s: 0.0,
                time_scale: scale,
            };
            let rt = super::runtime()?;
            let r = rt.block_on(scheduler(
                tasks,
                turns,
                gpus,
                Nodes {
                    nodes,
                    compile_slots: compile_slots * nodes,
                },
                llm_median_s,
                sim,
            ))?;
            super::print_out(&r)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The cluster shape: nodes, and the compile slots of all of them together.
struct Nodes {
    nodes: u32,
    compile_slots: u32,
}

async fn scheduler(
    tasks: u32,
    turns: u32,
    gpus: u32,
    cluster: Nodes,
    llm_median_s: f64,
    sim: SimulatedSection,
) -> anyhow::Result<String> {
    let scale = sim.time_scale;
    let Nodes {
        nodes,
        compile_slots,
    } = cluster;
    let scale_out = nodes > 1;
    let root = std::env::temp_dir().join(format!("krefine-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dir = RunDir::create(&root, "# scheduler benchmark\n")?;
    let problems = (1..=tasks)
        .map(|i| {
            Arc::new(Problem {
                key: ProblemKey {
                    level: 1,
                    problem_id: i,
                },
                name: format!("{i}_Synthetic.py"),
                code: format!(
                    "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x * {i}\n"
                ),
            })
        })
        .collect();
    let plan = RunPlan {
        run: "bench-scheduler".into(),
        method: MethodKind::Refine,
        feedback: FeedbackMode::GE,
        turns,
        samples: 1,
        problems,
        simulated: true,
    };
    let services = Arc::new(SimServices::new(sim));
    let llm = Arc::new(SimLlm::new(llm_median_s, 0.5, scale).map_err(anyhow::Error::msg)?);
    let devices = (0..gpus)
        .map(|i| DeviceInfo {
            id: DeviceId::Gpu(i),
            name: format!("simulated GPU {i}"),
            capability: Some((9, 0)),
            total_memory_bytes: None,
        })
        .collect();
    let parts = EngineParts {
        llm,
        compiler: services.clone(),
        executor: services.clone(),
        devices,
        prompts: Prompts::load(None)?,
        prompt_settings: PromptSettings {
            style: PromptStyle::OneShot,
            backend: Backend::Cuda,
            history: HistoryPolicy::Last,
            precision: Precision::Fp32,
            hardware: None,
        },
        llm_concurrency: tasks as usize,
        compile_workers: compile_slots as usize,
        // The simulated executor has no reference data to prepare.
        cpu_budget: None,
        prepare_ahead: 0,
        host_locks: None,
    };
    let (cpu0, _) = proc_usage();
    let started = Instant::now();
    let engine = Engine::prepare(
        plan,
        parts,
        dir.clone(),
        None,
        false,
        CancellationToken::new(),
    )
    .await?;
    let summary = engine.run().await?;
    let wall = started.elapsed().as_secs_f64();
    let (cpu1, peak_kb) = proc_usage();
    let run = RunState::from_records(&read_log(&dir.events_path())?.records);
    let _ = std::fs::remove_dir_all(&root);

    let a = analyse(&run, gpus as f64);
    let makespan = wall * scale;
    let lower = a
        .chain_s
        .max(a.compile_s / compile_slots as f64)
        .max(a.execute_s / gpus as f64);
    let mut out = String::new();
    let on_nodes = if scale_out {
        format!(
            " over {nodes} nodes ({} compile slots each)",
            compile_slots / nodes
        )
    } else {
        String::new()
    };
    out.push_str(&format!(
        "scheduler benchmark: {tasks} tasks x {turns} turns, LLM log-normal median {llm_median_s} s, compile {} s on {compile_slots} slots, execute {}-{} s on {gpus} GPUs{on_nodes}, time scale {scale}x\n\n",
        services_cfg_compile(&a),
        a.exec_min_s,
        a.exec_max_s
    ));
    out.push_str("| figure | value | goal |\n|---|---|---|\n");
    out.push_str(&format!(
        "| tasks finished | {} / {} | all |\n",
        summary.finished, summary.tasks
    ));
    out.push_str(&format!(
        "| makespan (simulated) | {makespan:.0} s | |\n| lower bound | {lower:.0} s (longest chain {:.0} s, compile {:.0} s / {compile_slots}, execute {:.0} s / {gpus}) | |\n",
        a.chain_s, a.compile_s, a.execute_s
    ));
    let (ratio_goal, rss_goal, cpu_goal) = if scale_out {
        ("<= 1.03", "<= 200 MB", "<= 60 s")
    } else {
        ("<= 1.05", "<= 100 MB", "")
    };
    out.push_str(&format!(
        "| makespan / lower bound | {:.3} | {ratio_goal} |\n",
        makespan / lower
    ));
    out.push_str(&format!(
        "| GPU occupancy while executions were queued | {:.3} | >= 0.95 |\n",
        a.occupancy_when_queued
    ));
    out.push_str(&format!(
        "| orchestrator CPU time | {:.2} s (wall {wall:.1} s) | {cpu_goal} |\n| peak memory (RSS) | {:.1} MB | {rss_goal} |\n| events logged | {} | |\n",
        cpu1 - cpu0,
        peak_kb as f64 / 1024.0,
        run.applied
    ));
    Ok(out)
}

fn services_cfg_compile(a: &Analysis) -> String {
    format!("{:.0}", a.compile_each_s)
}

/// What the lower bound and the table are made of, in simulated seconds.
struct Analysis {
    /// The longest task's own chain: its answers, builds and executions one after another.
    chain_s: f64,
    /// All builds' time, and one build's on average.
    compile_s: f64,
    compile_each_s: f64,
    /// All executions' time, and the shortest and longest one.
    execute_s: f64,
    exec_min_s: f64,
    exec_max_s: f64,
    /// The GPUs' busy share over the time executions waited for a lease.
    occupancy_when_queued: f64,
}

/// Work totals (simulated seconds) and GPU occupancy while executions waited for a lease, from the
/// run as the reducer folded it.
fn analyse(run: &RunState, gpus: f64) -> Analysis {
    let secs = |ms: u64| ms as f64 / 1000.0;
    let mut chain_s = 0.0f64;
    let (mut compile_s, mut execute_s) = (0.0, 0.0);
    let (mut n_compile, mut exec_min, mut exec_max) = (0.0, None::<f64>, 0.0f64);
    for task in run.tasks.values() {
        // The task's own chain: each turn's answer, build and execution, one after another.
        let mut chain = 0.0;
        for turn in task.turns() {
            if let Some(answer) = &turn.answer {
                chain += secs(answer.latency_ms);
            }
            if let Some(c) = &turn.compile {
                let s = secs(c.duration_ms);
                compile_s += s;
                n_compile += 1.0;
                chain += s;
            }
            if let Some(e) = &turn.exec {
                let s = secs(e.wall_ms);
                execute_s += s;
                exec_min = Some(exec_min.map_or(s, |m| m.min(s)));
                exec_max = exec_max.max(s);
                chain += s;
            }
        }
        chain_s = chain_s.max(chain);
    }
    Analysis {
        chain_s,
        compile_s,
        compile_each_s: if n_compile > 0.0 {
            compile_s / n_compile
        } else {
            0.0
        },
        execute_s,
        exec_min_s: exec_min.unwrap_or(0.0),
        exec_max_s: exec_max,
        occupancy_when_queued: occupancy_when_queued(run.times(), gpus),
    }
}

/// The share of the GPUs busy over the time at least one execution waited for a lease (1 when none
/// ever waited).
fn occupancy_when_queued(times: &Times, gpus: f64) -> f64 {
    // (time ms, change in waiting, change in busy)
    let mut edges: Vec<(u64, i64, i64)> = Vec::new();
    for &(from, to) in &times.lease_waits {
        edges.push((from, 1, 0));
        edges.push((to, -1, 0));
    }
    for &(from, to) in &times.lease_holds {
        edges.push((from, 0, 1));
        edges.push((to, 0, -1));
    }
    edges.sort_unstable();
    let (mut waiting, mut busy) = (0i64, 0i64);
    let (mut queued_ms, mut busy_when_queued) = (0.0, 0.0);
    let mut last = edges.first().map(|e| e.0).unwrap_or(0);
    for (t, dw, db) in edges {
        let span = (t - last) as f64;
        if waiting > 0 && span > 0.0 {
            queued_ms += span;
            busy_when_queued += span * (busy as f64 / gpus).min(1.0);
        }
        waiting += dw;
        busy += db;
        last = t;
    }
    if queued_ms > 0.0 {
        busy_when_queued / queued_ms
    } else {
        1.0
    }
}

/// (CPU seconds used by this process, peak resident set in KiB), from /proc on Linux.
fn proc_usage() -> (f64, u64) {
    let cpu = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name (which may hold spaces) start after the last ')'.
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = f.get(11)?.parse().ok()?;
            let stime: f64 = f.get(12)?.parse().ok()?;
            Some((utime + stime) / 100.0)
        })
        .unwrap_or(0.0);
    let peak = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0);
    (cpu, peak)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// The figures of the committed fixture run (4 tasks x 3 turns, simulated, on the CPU device),
    /// as the benchmark computed them before it read the log through the reducer.
    #[test]
    fn the_figures_of_a_recorded_run() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/runs/quickstart-sim/events.jsonl");
        let run = RunState::from_records(&read_log(&path).unwrap().records);
        // "events logged"
        assert_eq!(run.applied, 103);
        let a = analyse(&run, 2.0);
        // The longest task's own chain: its answers', builds' and executions' times.
        assert!(close(a.chain_s, 0.265), "{}", a.chain_s);
        assert!(close(a.compile_s, 0.55), "{}", a.compile_s);
        assert!(close(a.compile_each_s, 0.05), "{}", a.compile_each_s);
        assert!(close(a.execute_s, 0.378), "{}", a.execute_s);
        assert_eq!((a.exec_min_s, a.exec_max_s), (0.02, 0.048));
        assert!(
            close(a.occupancy_when_queued, 0.287_346_221_441_124_76),
            "{}",
            a.occupancy_when_queued
        );
        // The same leases on one device keep it twice as busy.
        let one = analyse(&run, 1.0);
        assert!(close(one.occupancy_when_queued, 0.574_692_442_882_249_5));
    }
}
