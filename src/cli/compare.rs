//! `krefine compare`: several runs at matched budgets (LLM calls, tokens, USD, device seconds), with
//! bootstrap intervals over the problems they share.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;

use crate::metrics::compare::CompareSettings;
use crate::report::{
    Format, RunInfo, compare_runs_at, plot, reference_time_warnings, render_comparison, run_labels,
};

#[derive(clap::Args)]
pub struct CompareArgs {
    /// Run directories (two or more; the first is the one differences are taken against).
    #[arg(required = true, num_args = 2..)]
    runs: Vec<PathBuf>,
    /// text, md, json or csv.
    #[arg(long, default_value = "text")]
    format: Format,
    /// fast_p thresholds shown besides KernelBench's: a column `fast_<p>` at every budget (every
    /// format; no intervals), and a line per run over all its candidates (text and md); a
    /// comma-separated list, empty for none. Default: the runs' `report.fast_p` (every threshold any
    /// of them set; 1.2 unless set).
    #[arg(long, value_name = "P,...", value_delimiter = ',')]
    fast_p: Option<Vec<String>>,
    /// Also draw the comparison (fast_1 against every budget axis, speedup distributions) into this
    /// file: `.svg` or `.png`.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Bootstrap resamples over problems (0: no intervals).
    #[arg(long, default_value_t = 1000)]
    resamples: u32,
    /// Seed of the bootstrap (the same seed gives the same intervals).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Coverage of the intervals, in (0, 1).
    #[arg(long, default_value_t = 0.95)]
    level: f64,
}

pub fn compare_cmd(args: CompareArgs) -> anyhow::Result<ExitCode> {
    if !(args.level > 0.0 && args.level < 1.0) {
        bail!(
            "--level {}: expected a coverage between 0 and 1, like 0.95",
            args.level
        );
    }
    // A file the plot cannot be written to is said before anything is printed.
    if let Some(path) = &args.plot {
        plot::check_target(path)?;
    }
    let given = args
        .fast_p
        .as_deref()
        .map(super::report::parse_thresholds)
        .transpose()?;
    let runs = super::report::load_runs(&args.runs)?;
    let thresholds = super::report::thresholds_of(given, &runs)?;
    let settings = CompareSettings {
        resamples: args.resamples,
        seed: args.seed,
        level: args.level,
    };
    let refs: Vec<_> = runs.iter().collect();
    let c = compare_runs_at(&refs, settings, &thresholds)?;
    // Runs of one config share its name: the comparison's labels tell them apart.
    let labels = run_labels(&refs);
    let warnings = reference_time_warnings(&refs, &labels);
    let infos: Vec<RunInfo> = runs
        .iter()
        .zip(labels)
        .map(|(r, label)| RunInfo {
            run: label,
            ..r.info.clone()
        })
        .collect();
    let mut out = render_comparison(&c, &infos, &warnings, args.format);
    if args.format == Format::Csv {
        for w in &warnings {
            eprintln!("WARNING: {}", w.message());
        }
    }
    if matches!(args.format, Format::Text | Format::Md) {
        out.push_str(&super::report::extra_fast_p(&runs, &thresholds));
    }
    super::print_out(&out)?;
    if let Some(path) = &args.plot {
        let svg = plot::comparison_svg(&c, &runs)?;
        plot::write_plot(path, &svg)?;
        eprintln!("plot written to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
