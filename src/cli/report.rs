//! `krefine report`: read run directories, fold their logs, print metrics (and optionally plot or
//! export a leaderboard submission).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::interchange::submission::{self, SubmissionMeta, SubmissionPick};
use crate::report::{Format, LoadedRun, RunReport, equal_attempts_table, load_run, plot, render};

#[derive(clap::Args)]
pub struct ReportArgs {
    /// Run directories.
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// text, md, json or csv.
    #[arg(long, default_value = "text")]
    format: Format,
    /// fast_p thresholds shown besides KernelBench's (0, 0.5, 0.8, 1, 1.5, 2): columns `fast_<p>` in
    /// every format, and a line over all of a run's candidates (text and md); a comma-separated list,
    /// empty for none. Default: the run's `report.fast_p` (1.2 unless its config set it).
    #[arg(long, value_name = "P,...", value_delimiter = ',')]
    fast_p: Option<Vec<String>>,
    /// Draw fast_p@N curves and the speedup distribution into this file (`.svg` or `.png`; one run).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Write the run's kernels as a leaderboard submission JSON (one run).
    #[arg(long, value_name = "FILE")]
    submission: Option<PathBuf>,
    /// Which candidate of each problem the submission holds.
    #[arg(long, value_enum, default_value = "best", requires = "submission")]
    pick: SubmissionPick,
    /// The submission's `metadata.display_name` (default: the run name).
    #[arg(long, requires = "submission")]
    display_name: Option<String>,
    /// The submission's `metadata.organization`.
    #[arg(long, requires = "submission")]
    organization: Option<String>,
    /// The submission's `metadata.notes` (default: what produced it).
    #[arg(long, requires = "submission")]
    notes: Option<String>,
}

pub fn report(args: ReportArgs) -> anyhow::Result<ExitCode> {
    if (args.plot.is_some() || args.submission.is_some()) && args.runs.len() != 1 {
        bail!(
            "--plot and --submission take one run directory; use `krefine compare --plot` for several"
        );
    }
    // A file the plot cannot be written to is said before anything is printed.
    if let Some(path) = &args.plot {
        plot::check_target(path)?;
    }
    let given = args.fast_p.as_deref().map(parse_thresholds).transpose()?;
    let runs = load_runs(&args.runs)?;
    let out = render_runs(&runs, given, args.format)?;
    super::print_out(&out)?;
    if let (Some(path), Some(run)) = (&args.plot, runs.first()) {
        plot::write_plot(path, &plot::run_svg(run)?)?;
        eprintln!("plot written to {}", path.display());
    }
    if let (Some(path), Some(run)) = (&args.submission, runs.first()) {
        let meta = SubmissionMeta {
            display_name: args.display_name.clone(),
            organization: args.organization.clone(),
            notes: args.notes.clone(),
        };
        let (value, summary) = submission::export(run, args.pick, &meta);
        std::fs::write(path, serde_json::to_string_pretty(&value)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!(
            "submission written to {}: {} kernel(s), {} correct{}",
            path.display(),
            summary.kernels,
            summary.correct,
            if summary.without_code.is_empty() {
                String::new()
            } else {
                format!(
                    "; no code for {} (left out, KernelBench counts them as failed)",
                    summary.without_code.join(", ")
                )
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `--fast-p` values: finite numbers, empty entries ignored.
pub fn parse_thresholds(given: &[String]) -> anyhow::Result<Vec<f64>> {
    given
        .iter()
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .map(|t| match t.parse::<f64>() {
            Ok(p) if p.is_finite() && p >= 0.0 => Ok(p),
            _ => bail!("--fast-p {t:?}: expected speedup thresholds like 1.2 or 3 (>= 0)"),
        })
        .collect()
}

/// The thresholds to show: those given with `--fast-p`, else the runs' own `report.fast_p` (several
/// runs show every threshold any of them asked for, in increasing order).
pub fn thresholds_of(given: Option<Vec<f64>>, runs: &[LoadedRun]) -> anyhow::Result<Vec<f64>> {
    if let Some(given) = given {
        return Ok(given);
    }
    let mut all = Vec::new();
    for run in runs {
        all.extend_from_slice(run.configured_fast_p().map_err(anyhow::Error::msg)?);
    }
    all.sort_by(f64::total_cmp);
    all.dedup();
    Ok(all)
}

/// One line per run: fast_p at the extra thresholds over all its candidates (empty for none).
pub fn extra_fast_p(runs: &[LoadedRun], thresholds: &[f64]) -> String {
    if thresholds.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    for run in runs {
        let r = &run.report;
        let input = crate::metrics::RunInput {
            method: r.method,
            axis: r.metrics.axis,
            problems: &r.metrics.problems,
            turns: &run.turns,
        };
        let values = crate::metrics::fast_p_at(&input, thresholds);
        let parts: Vec<String> = thresholds
            .iter()
            .zip(values)
            .map(|(p, v)| format!("fast_{p} {:.1}%", 100.0 * v))
            .collect();
        out.push_str(&format!(
            "{}: {} (all candidates, beyond KernelBench's thresholds)\n",
            r.run,
            parts.join(", ")
        ));
        if let Some(line) = sol_line(run) {
            out.push_str(&line);
        }
    }
    out
}

/// `run: 2 of 9 timed result(s) had an unsteady timing ...`, when any did (`metadata.timing_unsteady`,
/// set by the worker pool: see `worker::execute`).
fn unsteady_line(run: &LoadedRun) -> Option<String> {
    let timed: Vec<&crate::types::ExecOutcome> = run
        .turns
        .values()
        .flatten()
        .filter_map(|t| t.exec.as_ref())
        .filter(|e| e.runtime_stats.is_some())
        .collect();
    let unsteady = timed
        .iter()
        .filter(|e| e.metadata.contains_key("timing_unsteady"))
        .count();
    (unsteady > 0).then(|| {
        format!(
            "{}: {unsteady} of {} timed result(s) had an unsteady timing (a median or mean call more \
             than 3x apart from the fastest, after re-timing): their speedups may be off \
             (metadata.timing_unsteady)\n",
            run.report.run,
            timed.len()
        )
    })
}

/// `run: mean fraction of speed of light 61.9% over 3 correct candidates with a roofline`, when any
/// correct candidate's profile recorded one.
fn sol_line(run: &LoadedRun) -> Option<String> {
    let sols: Vec<f64> = run
        .turns
        .values()
        .flatten()
        .filter_map(crate::metrics::extra::candidate_sol)
        .collect();
    if sols.is_empty() {
        return None;
    }
    let mean = sols.iter().sum::<f64>() / sols.len() as f64;
    Some(format!(
        "{}: mean fraction of speed of light {:.1}% over {} correct candidate(s) with a roofline\n",
        run.report.run,
        100.0 * mean,
        sols.len()
    ))
}

/// Read and fold run directories, warning about torn log tails.
pub fn load_runs(dirs: &[PathBuf]) -> anyhow::Result<Vec<LoadedRun>> {
    dirs.iter()
        .map(|d| {
            let run = load_run(d)?;
            for w in run.torn_tail.iter().chain(&run.provenance_warning) {
                eprintln!("warning: {w}");
            }
            Ok(run)
        })
        .collect()
}

/// The report of loaded runs in one format, at the `--fast-p` thresholds `given`, else the runs'
/// own `report.fast_p`: the columns and lines `krefine report` shows.
fn render_runs(
    runs: &[LoadedRun],
    given: Option<Vec<f64>>,
    format: Format,
) -> anyhow::Result<String> {
    let thresholds = thresholds_of(given, runs)?;
    let reports: Vec<RunReport> = runs.iter().map(|r| r.with_extra(&thresholds)).collect();
    let mut out = render_reports(&reports, format);
    if matches!(format, Format::Text | Format::Md) {
        out.push_str(&extra_fast_p(runs, &thresholds));
        for line in runs.iter().filter_map(unsteady_line) {
            out.push_str(&line);
        }
    }
    Ok(out)
}

/// The report of run directories in one format, as `krefine report DIR...` prints it (a run's own
/// `report.fast_p` thresholds included): what `krefine run` prints at its end.
pub fn render_dirs(dirs: &[PathBuf], format: Format) -> anyhow::Result<String> {
    render_runs(&load_runs(dirs)?, None, format)
}

fn render_reports(reports: &[RunReport], format: Format) -> String {
    let provenances: Vec<(&str, &crate::report::provenance::Provenance)> = reports
        .iter()
        .filter_map(|r| r.provenance.as_ref().map(|p| (r.run.as_str(), p)))
        .collect();
    for m in crate::report::provenance::mismatches(&provenances) {
        eprintln!("WARNING: {m}: their numbers are not comparable as they stand");
    }
    let mut out = render(reports, format);
    if matches!(format, Format::Text | Format::Md)
        && let Some(table) = equal_attempts_table(reports, format)
    {
        out.push_str(&table);
    }
    out
}
