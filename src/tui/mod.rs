//! The live terminal UI (ratatui) for a run in this process, a run in another process (`watch`) and a
//! recorded run (`replay`).
//!
//! - [`source`]: where records come from (engine broadcast, a growing log file, a recorded log);
//!   it lives with the view ([`crate::view::source`]), since the progress line reads it too.
//! - [`app`]: the display's state ([`crate::view::RunView`] plus selection, sort, filters, scroll) and
//!   key handling.
//! - [`ui`]: drawing, one file per panel, a pure function of the app and the clock it is given.
//! - [`gpu_stats`]: NVML utilisation and memory, when a driver is there.
//!
//! The loop here selects over the source, keys (read on their own thread), a 10 Hz tick and SIGINT.
//! Records are applied as they come and frames are drawn on the tick (and after a key), so a flood of
//! events costs frames, never events, and the engine never waits for the screen. Nothing may write to
//! stdout or stderr while the screen is up; the terminal is restored on every way out, panics included
//! (ratatui's panic hook).

pub mod app;
pub mod gpu_stats;
pub use crate::view::source;
pub mod ui;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use ratatui::crossterm::event::{self, Event as TermEvent, KeyEvent};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use app::{Action, App, ReplayCmd, ReplayStatus};
use source::{Feed, Replay};

/// Where the loop's records come from.
pub enum Input {
    /// Batches from a live or watched source.
    Feed(mpsc::UnboundedReceiver<Feed>),
    /// A recorded log, paced by the loop's clock.
    Replay(Replay),
}

/// How the person left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// `q` (or Ctrl-C) once there was nothing left to stop.
    Quit,
    /// A second `q` or Ctrl-C while the live run was still stopping.
    Forced,
}

/// Frames per second at most (and the replay clock's resolution).
const TICK: Duration = Duration::from_millis(100);

/// Restores the terminal when dropped, whatever way the loop ends.
struct Screen {
    terminal: ratatui::DefaultTerminal,
}

impl Screen {
    fn open() -> anyhow::Result<Self> {
        // Raw mode, the alternate screen, and a panic hook that restores both before printing.
        match ratatui::try_init() {
            Ok(terminal) => Ok(Screen { terminal }),
            Err(e) => {
                ratatui::restore();
                Err(anyhow::anyhow!("cannot open the terminal UI: {e}"))
            }
        }
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// Run the UI until the person quits. `cancel` is the live run's cancellation (`None` for watch and
/// replay).
pub async fn run(
    mut app: App,
    input: Input,
    cancel: Option<CancellationToken>,
) -> anyhow::Result<Exit> {
    let mut screen = Screen::open()?;
    let stop = Arc::new(AtomicBool::new(false));
    let (key_tx, key_rx) = mpsc::unbounded_channel();
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || read_keys(&stop, &key_tx))
    };
    if let Input::Replay(r) = &input {
        app.replay = Some(status(r));
    }
    let result = event_loop(&mut screen.terminal, app, input, cancel, key_rx).await;
    stop.store(true, Ordering::SeqCst);
    drop(screen);
    // The reader notices `stop` within one poll interval.
    let _ = tokio::task::spawn_blocking(move || reader.join()).await;
    result
}

/// Forward key presses until `stop` is set or the loop is gone.
fn read_keys(stop: &AtomicBool, tx: &mpsc::UnboundedSender<KeyEvent>) {
    while !stop.load(Ordering::SeqCst) {
        match event::poll(Duration::from_millis(50)) {
            Ok(true) => match event::read() {
                Ok(TermEvent::Key(k)) => {
                    if tx.send(k).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => return,
            },
            Ok(false) => {}
            Err(_) => return,
        }
    }
}

fn status(r: &Replay) -> ReplayStatus {
    let (played, total) = r.position();
    ReplayStatus {
        paused: r.paused,
        speed: r.speed,
        played,
        total,
    }
}

async fn event_loop(
    terminal: &mut ratatui::DefaultTerminal,
    mut app: App,
    mut input: Input,
    cancel: Option<CancellationToken>,
    mut keys: mpsc::UnboundedReceiver<KeyEvent>,
) -> anyhow::Result<Exit> {
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("cannot listen for SIGINT")?;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let probe = gpu_stats::Probe::start().await;
    let mut gpu_tick = tokio::time::interval(Duration::from_secs(1));
    let mut last = Instant::now();
    let mut feed_open = true;
    let mut draw_now = true;
    loop {
        if draw_now {
            app.before_draw();
            let now = match &input {
                Input::Replay(r) => r.now_ms(),
                Input::Feed(_) => crate::store::now_ms(),
            };
            terminal.draw(|f| ui::draw(f, &app, now))?;
            draw_now = false;
        }
        let action = tokio::select! {
            _ = tick.tick() => {
                if let Input::Replay(r) = &mut input {
                    let real = last.elapsed();
                    for rec in r.advance(real) {
                        app.apply(&rec);
                    }
                    app.replay = Some(status(r));
                }
                last = Instant::now();
                draw_now = true;
                None
            }
            feed = recv_feed(&mut input), if feed_open => {
                match feed {
                    Some(f) => {
                        apply_feed(&mut app, f);
                        // Everything already queued goes in before the next frame.
                        if let Input::Feed(rx) = &mut input {
                            while let Ok(f) = rx.try_recv() {
                                apply_feed(&mut app, f);
                            }
                        }
                    }
                    None => {
                        feed_open = false;
                        app.closed = true;
                    }
                }
                None
            }
            key = keys.recv() => {
                draw_now = true;
                match key {
                    Some(k) => app.handle_key(k),
                    // The key reader stopped (no terminal input): only a signal can end the loop.
                    None => {
                        std::future::pending::<()>().await;
                        None
                    }
                }
            }
            _ = sigint.recv() => {
                draw_now = true;
                Some(app.interrupt())
            }
            _ = gpu_tick.tick(), if probe.is_some() => {
                if let Some(p) = &probe {
                    let names: Vec<String> = app.view.devices.keys().cloned().collect();
                    app.gpus = p.sample(names).await;
                }
                None
            }
        };
        match action {
            None => {}
            Some(Action::Cancel) => {
                if let Some(c) = &cancel {
                    c.cancel();
                }
            }
            Some(Action::ForceQuit) => return Ok(Exit::Forced),
            Some(Action::Quit) => return Ok(Exit::Quit),
            Some(Action::Replay(cmd)) => {
                if let Input::Replay(r) = &mut input {
                    replay_cmd(&mut app, r, cmd);
                    last = Instant::now();
                    app.replay = Some(status(r));
                }
            }
        }
    }
}

async fn recv_feed(input: &mut Input) -> Option<Feed> {
    match input {
        Input::Feed(rx) => rx.recv().await,
        Input::Replay(_) => std::future::pending().await,
    }
}

fn apply_feed(app: &mut App, feed: Feed) {
    match feed {
        Feed::Records(recs) => {
            for r in recs {
                app.apply(&r);
            }
        }
        Feed::Rebuilt(view) => app.reset(*view),
        Feed::Warning(w) => app.warning = Some(w),
        Feed::Closed => app.closed = true,
    }
}

/// Carry out a replay key on the recorded log.
pub fn replay_cmd(app: &mut App, r: &mut Replay, cmd: ReplayCmd) {
    let mut until = |app: &mut App, done: &dyn Fn(&App) -> bool| {
        r.paused = true;
        while !done(app) {
            match r.step() {
                Some(rec) => app.apply(&rec),
                None => break,
            }
        }
    };
    let task_turns = |app: &App, t| {
        app.view
            .tasks
            .get(&t)
            .map_or(0, crate::view::TaskView::finished_turns)
    };
    match cmd {
        ReplayCmd::TogglePause => r.paused = !r.paused,
        ReplayCmd::Step => {
            r.paused = true;
            if let Some(rec) = r.step() {
                app.apply(&rec);
            }
        }
        ReplayCmd::NextTurn => {
            let from = app.view.finished_turns();
            until(app, &|a: &App| a.view.finished_turns() > from);
        }
        ReplayCmd::TaskTurn(t) => {
            let from = task_turns(app, t);
            until(app, &|a: &App| task_turns(a, t) > from);
        }
        ReplayCmd::TaskTurnN(t, n) => {
            until(app, &|a: &App| {
                a.view.tasks.get(&t).is_none_or(|tv| {
                    tv.turns()
                        .get(n as usize - 1)
                        .is_some_and(|rec| rec.verdict.is_some())
                        || tv.stage == crate::view::Stage::Done
                })
            });
        }
        ReplayCmd::End => {
            for rec in r.to_end() {
                app.apply(&rec);
            }
        }
        ReplayCmd::Faster => r.speed = (r.speed * 2.0).min(1e6),
        ReplayCmd::Slower => r.speed = (r.speed / 2.0).max(1.0 / 64.0),
    }
}
