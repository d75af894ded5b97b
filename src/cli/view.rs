//! `krefine watch RUN_DIR` and `krefine replay RUN_DIR`: the terminal UI over another process's run
//! (following its log as it grows) or over a recorded run (played back in recorded time). Both only
//! read the run directory.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;

use crate::config::Config;
use crate::store::{CONFIG_FILE, EVENTS_FILE, read_log};
use crate::tui::app::{App, Meta, Mode};
use crate::tui::source::{Replay, Tail};
use crate::tui::{self, Input};

#[derive(clap::Args)]
pub struct WatchArgs {
    /// The run directory (holding `events.jsonl`).
    run_dir: PathBuf,
}

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// The run directory (holding `events.jsonl`).
    run_dir: PathBuf,
    /// Playback speed: recorded time runs this many times faster (a large value shows the end at once).
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// Start paused at the first event.
    #[arg(long)]
    paused: bool,
}

/// How often a watched log is read for new lines.
const WATCH_POLL: Duration = Duration::from_millis(250);

pub fn watch(args: WatchArgs) -> anyhow::Result<ExitCode> {
    let events = events_file(&args.run_dir)?;
    need_terminal("watch")?;
    let app = App::new(Mode::Watch, meta(&args.run_dir));
    super::runtime()?.block_on(async move {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(Tail::new(&events).forward(WATCH_POLL, tx));
        tui::run(app, Input::Feed(rx), None).await
    })?;
    Ok(ExitCode::SUCCESS)
}

pub fn replay(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    if !(args.speed.is_finite() && args.speed > 0.0) {
        bail!("--speed must be a positive number, got {}", args.speed);
    }
    let events = events_file(&args.run_dir)?;
    let log = read_log(&events)?;
    if log.records.is_empty() {
        bail!("{}: the run has no events yet", events.display());
    }
    need_terminal("replay")?;
    let mut app = App::new(Mode::Replay, meta(&args.run_dir));
    app.warning = log.torn_tail.clone();
    let mut replay = Replay::new(log.records, args.speed);
    replay.paused = args.paused;
    super::runtime()?.block_on(tui::run(app, Input::Replay(replay), None))?;
    Ok(ExitCode::SUCCESS)
}

fn events_file(run_dir: &Path) -> anyhow::Result<PathBuf> {
    let events = run_dir.join(EVENTS_FILE);
    if !events.is_file() {
        bail!(
            "{} is not a run directory (no {EVENTS_FILE})",
            run_dir.display()
        );
    }
    Ok(events)
}

fn need_terminal(command: &str) -> anyhow::Result<()> {
    if !std::io::stdout().is_terminal() {
        bail!(
            "krefine {command} draws in a terminal and stdout is not one; `krefine report RUN_DIR` prints a run's results"
        );
    }
    Ok(())
}

/// What the run's frozen config says beyond its log; a missing or unreadable config only leaves
/// these out.
fn meta(run_dir: &Path) -> Meta {
    let cfg: Option<Config> = std::fs::read_to_string(run_dir.join(CONFIG_FILE))
        .ok()
        .and_then(|t| toml::from_str(&t).ok());
    let mut m = Meta {
        run_dir: Some(run_dir.to_path_buf()),
        ..Meta::default()
    };
    if let Some(c) = cfg {
        m.model = (!c.model.name.is_empty()).then(|| c.model.name.clone());
        m.compile_workers = Some(c.resources.compile_workers());
        m.llm_concurrency = Some(c.resources.llm_concurrency);
    }
    m
}

/// The same facts for a run in this process.
pub(crate) fn meta_of(cfg: &Config, run_dir: &Path) -> Meta {
    Meta {
        model: (!cfg.model.name.is_empty()).then(|| cfg.model.name.clone()),
        compile_workers: Some(cfg.resources.compile_workers()),
        llm_concurrency: Some(cfg.resources.llm_concurrency),
        run_dir: Some(run_dir.to_path_buf()),
    }
}
