//! The command-line surface: argument parsing and dispatch to one module per command.

mod baseline;
mod bench;
mod bench_compile;
mod bench_pch;
mod bench_reference;
mod bench_sandbox;
mod bench_throughput;
mod bench_tui;
mod check;
mod compare;
mod doctor;
mod doctor_launcher;
mod eval;
mod lease_trace;
mod preflight;
mod recheck;
mod repair;
mod report;
mod run;
mod run_display;
mod view;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "krefine",
    version,
    about = "Run, report and compare LLM kernel-refinement experiments on KernelBench problems"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run an experiment from a TOML config (or resume one).
    Run(run::RunArgs),
    /// Follow a run (running or finished, in any process) in the terminal UI; read-only.
    Watch(view::WatchArgs),
    /// Play a recorded run back in the terminal UI, in recorded time scaled by --speed.
    Replay(view::ReplayArgs),
    /// Print fast_p@N, geomean speedup, correct rate, tokens and cost of run directories.
    Report(report::ReportArgs),
    /// Compare runs at matched budgets (LLM calls, tokens, USD, device seconds) with bootstrap
    /// intervals over the problems they share.
    Compare(compare::CompareArgs),
    /// Evaluate existing generations (a leaderboard submission JSON or a KernelBench runs folder)
    /// without an LLM, into a run directory plus KernelBench's eval_results.json.
    Eval(eval::EvalArgs),
    /// Re-evaluate a run's candidates under today's checks into a new run directory and report what
    /// changed (exit status 1 when a credited result no longer stands); the run is not written.
    Recheck(recheck::RecheckArgs),
    /// Time the references of a dataset's levels into a KernelBench baseline JSON (eager or
    /// torch.compile), for `eval.baseline`.
    Baseline(baseline::BaselineArgs),
    /// Show what this machine offers: GPUs, the worker Python (torch, ninja, nvcc), the LLM endpoint.
    Doctor {
        /// A config whose Python and LLM endpoint to check.
        config: Option<PathBuf>,
    },
    /// Cut a run's event log at a line that is not a record this krefine reads (or at --line),
    /// keeping the whole log as a backup, so that the run can be resumed.
    Repair(repair::RepairArgs),
    /// Run the static checks on candidate files (exit status 1 when one has an error).
    Check(check::CheckArgs),
    /// Benchmarks of krefine itself.
    #[command(subcommand)]
    Bench(bench::BenchCmd),
}

pub fn main() -> ExitCode {
    // Other processes of this user (a candidate that escaped its sandbox, or any program when the
    // sandbox is off) must not read our memory or /proc/<pid>/environ, where API keys live.
    if let Err(e) = crate::worker::sandbox::make_non_dumpable() {
        eprintln!("warning: cannot make krefine non-dumpable: {e}");
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Run(args) => run::run(args),
        Cmd::Watch(args) => view::watch(args),
        Cmd::Replay(args) => view::replay(args),
        Cmd::Report(args) => report::report(args),
        Cmd::Compare(args) => compare::compare_cmd(args),
        Cmd::Eval(args) => eval::eval(args),
        Cmd::Recheck(args) => recheck::recheck(args),
        Cmd::Baseline(args) => baseline::baseline(args),
        Cmd::Doctor { config } => doctor::doctor(config.as_deref()),
        Cmd::Check(args) => check::check(args),
        Cmd::Repair(args) => repair::repair(args),
        Cmd::Bench(cmd) => bench::bench(cmd),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Print to stdout; a closed pipe (`krefine report ... | head`) is not an error.
fn print_out(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// A multi-threaded tokio runtime for the async commands.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}
