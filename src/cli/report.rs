//! `krefine report`: read run directories, fold their logs, print metrics.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;

use crate::config::Config;
use crate::engine::fold_records;
use crate::metrics::{RunInput, equal_attempts, ledger, run_metrics, run_problems};
use crate::report::{Format, RunReport, render};
use crate::store::{RunDir, read_log};
use crate::types::{Event, MethodKind};

#[derive(clap::Args)]
pub struct ReportArgs {
    /// Run directories.
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// text, md, json or csv.
    #[arg(long, default_value = "text")]
    format: Format,
}

pub fn report(args: ReportArgs) -> anyhow::Result<ExitCode> {
    super::print_out(&render_dirs(&args.runs, args.format)?)?;
    Ok(ExitCode::SUCCESS)
}

/// Render the reports of several run directories in one format.
pub fn render_dirs(dirs: &[PathBuf], format: Format) -> anyhow::Result<String> {
    let reports = dirs
        .iter()
        .map(|d| load_report(d))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let provenances: Vec<(&str, &crate::report::provenance::Provenance)> = reports
        .iter()
        .filter_map(|r| r.provenance.as_ref().map(|p| (r.run.as_str(), p)))
        .collect();
    for m in crate::report::provenance::mismatches(&provenances) {
        eprintln!("WARNING: {m}: their numbers are not comparable as they stand");
    }
    let mut out = render(&reports, format);
    if matches!(format, Format::Text | Format::Md)
        && let Some(table) = equal_attempts_table(&reports, format)
    {
        out.push_str(&table);
    }
    Ok(out)
}

/// Refinement against repeated sampling at equal attempts, when the runs hold one of each.
fn equal_attempts_table(reports: &[RunReport], format: Format) -> Option<String> {
    let refine = reports.iter().find(|r| r.method == MethodKind::Refine)?;
    let sampling = reports.iter().find(|r| r.method == MethodKind::Sampling)?;
    let rows = equal_attempts(&refine.metrics, &sampling.metrics).ok()?;
    let md = format == Format::Md;
    let mut s = format!(
        "\n{}equal attempts: {} (refine) vs {} (sampling), fast_1 and geomean speedup\n",
        if md { "### " } else { "" },
        refine.run,
        sampling.run
    );
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    let geo = |g: Option<f64>| g.map(|g| format!("{g:.3}")).unwrap_or_else(|| "-".into());
    if md {
        s.push_str("\n| attempts | refine fast_1 | sampling fast_1 | refine geomean | sampling geomean |\n|---|---|---|---|---|\n");
    } else {
        s.push_str("attempts  refine_fast_1  sampling_fast_1  refine_geomean  sampling_geomean\n");
    }
    for r in rows {
        let (a, b) = (r.refine.fast_p.0[3], r.sampling.fast_p.0[3]);
        if md {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                r.attempts,
                pct(a),
                pct(b),
                geo(r.refine.geomean_speedup),
                geo(r.sampling.geomean_speedup)
            ));
        } else {
            s.push_str(&format!(
                "{:>8}  {:>13}  {:>15}  {:>14}  {:>16}\n",
                r.attempts,
                pct(a),
                pct(b),
                geo(r.refine.geomean_speedup),
                geo(r.sampling.geomean_speedup)
            ));
        }
    }
    Some(s)
}

/// Metrics and ledger of one run, as pure functions of its log.
pub fn load_report(dir: &Path) -> anyhow::Result<RunReport> {
    let run = RunDir::open(dir)?;
    let log = read_log(&run.events_path())?;
    if let Some(w) = &log.torn_tail {
        eprintln!("warning: {w}");
    }
    let (started, turns) = fold_records(&log.records).with_context(|| {
        format!(
            "{} does not fold into task states",
            run.events_path().display()
        )
    })?;
    let Some(Event::RunStarted {
        run: name,
        method,
        feedback,
        task_ids,
        turns: n_turns,
        samples,
        ..
    }) = started
    else {
        anyhow::bail!(
            "{}: the log has no run_started record",
            run.events_path().display()
        );
    };
    let config = std::fs::read_to_string(run.config_path())
        .ok()
        .and_then(|t| toml::from_str::<Config>(&t).ok());
    let model = config
        .as_ref()
        .map(|c| c.model.name.clone())
        .unwrap_or_default();
    // A damaged provenance.json must not hide the run's numbers: say so and report without it.
    let recorded = crate::provenance::read(dir).unwrap_or_else(|e| {
        eprintln!("warning: {e}");
        None
    });
    let provenance = crate::report::provenance::provenance(
        &crate::report::provenance::Started {
            method,
            turns: n_turns,
            samples,
            feedback,
        },
        config.as_ref(),
        recorded.as_ref(),
        turns.values().flatten().filter_map(|t| t.exec.as_ref()),
    );
    let axis = match method {
        MethodKind::Refine => n_turns,
        MethodKind::Sampling => samples,
        MethodKind::OneShot => 1,
    };
    let problems = run_problems(&task_ids);
    let metrics = run_metrics(&RunInput {
        method,
        axis,
        problems: &problems,
        turns: &turns,
    });
    let complete = matches!(
        log.records.last().map(|r| &r.event),
        Some(Event::RunEnded { reason }) if reason == "finished"
    );
    Ok(RunReport {
        run: name,
        method,
        feedback: (method == MethodKind::Refine).then_some(feedback).flatten(),
        model,
        metrics,
        ledger: ledger(&log.records),
        complete,
        provenance: Some(provenance),
    })
}
