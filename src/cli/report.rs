//! `krefine report`: read run directories, fold their logs, print metrics.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::engine::fold_records;
use crate::report::Format;
use crate::store::read_log;

#[derive(clap::Args)]
pub struct ReportArgs {
    /// Run directories.
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    #[arg(long, default_value = "text")]
    format: Format,
}

pub fn report(args: ReportArgs) -> anyhow::Result<ExitCode> {
    println!("{}", render_dirs(&args.runs, args.format)?);
    Ok(ExitCode::SUCCESS)
}

pub fn render_dirs(dirs: &[PathBuf], _format: Format) -> anyhow::Result<String> {
    let mut out = String::new();
    for d in dirs {
        out.push_str(&summary(d)?);
    }
    Ok(out)
}

fn summary(dir: &Path) -> anyhow::Result<String> {
    let log = read_log(&dir.join(crate::store::EVENTS_FILE))?;
    let (_, tasks) = fold_records(&log.records)?;
    let mut s = String::new();
    for (t, turns) in tasks {
        s.push_str(&format!(
            "{t}: {}\n",
            turns
                .iter()
                .map(|r| r.verdict.map(|v| v.to_string()).unwrap_or_default())
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    Ok(s)
}
