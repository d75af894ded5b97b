//! `krefine repair RUN_DIR [--line N]`: cut a run's log at a line no reader accepts (or at line N),
//! after copying the whole log to a backup next to it (`crate::store::repair`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::lock;
use crate::store::{self, RunDir};

#[derive(clap::Args)]
pub struct RepairArgs {
    /// The run directory whose `events.jsonl` to cut.
    run: PathBuf,
    /// Cut before this line (from 1) instead of before the first line that is not a record.
    #[arg(long, value_name = "N")]
    line: Option<usize>,
}

pub fn repair(args: RepairArgs) -> anyhow::Result<ExitCode> {
    let dir = RunDir::existing(&args.run)?;
    // A run that still writes the log must not have it cut under it.
    let _lock = lock::lock_run_dir(dir.root())?;
    let path = dir.events_path();
    let Some(done) = store::repair(&path, args.line)
        .with_context(|| format!("cannot repair {}", path.display()))?
    else {
        let records = store::read_log(&path)?.records.len();
        super::print_out(&format!(
            "{} reads whole ({records} records): nothing to cut",
            path.display()
        ))?;
        return Ok(ExitCode::SUCCESS);
    };
    let c = &done.cut;
    super::print_out(&format!(
        "cut {} before line {}: {}\n\
         kept {} record(s); removed {} line(s), {} bytes\n\
         the whole log as it was: {}\n\
         `krefine run CONFIG --out {} --resume` redoes what the removed lines recorded",
        path.display(),
        c.line,
        c.why,
        c.kept_records,
        c.removed_lines,
        c.removed_bytes,
        done.backup.display(),
        dir.root().display()
    ))?;
    Ok(ExitCode::SUCCESS)
}
