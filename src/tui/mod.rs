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
//! The loop here selects over the source, keys (read on their own thread), a 10 Hz tick, and either
//! the live run's stop ([`RunStop`]: the loop asks it to stop for `q` and Ctrl-C, and follows what
//! the signals asked of it; the process's one signal stream is read by whoever drives the run) or,
//! for `watch` and `replay`, the signals themselves (any of SIGINT, SIGTERM, SIGHUP leaves).
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
use tokio::sync::{mpsc, watch};

use crate::engine::{Escalation, RunStop, Signals, StopReason, StopState};

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
    /// A second `q`, Ctrl-C or signal while the live run was still stopping.
    Forced,
}

/// Frames per second at most (and the replay clock's resolution).
const TICK: Duration = Duration::from_millis(100);

/// Whether this process is in the foreground process group of its terminal (stdout's, and stdin's
/// when stdin is one): only then may it draw and read keys. A background process (`cmd &`, or under
/// `timeout`, which runs its command in a process group of its own) that set the terminal's modes
/// or read from it would be stopped by the kernel (SIGTTOU/SIGTTIN) until brought to the foreground.
pub fn in_foreground() -> bool {
    use std::io::IsTerminal;
    // SAFETY: getpgrp and tcgetpgrp take and return plain integers; no memory is shared.
    let group = unsafe { libc::getpgrp() };
    let owns = |fd: libc::c_int| {
        // SAFETY: as above: an integer in, an integer out.
        unsafe { libc::tcgetpgrp(fd) == group }
    };
    owns(libc::STDOUT_FILENO) && (!std::io::stdin().is_terminal() || owns(libc::STDIN_FILENO))
}

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

/// Run the UI until the person quits. `stop` is the live run's stop (`None` for watch and replay).
/// A live run stopped by SIGTERM or SIGHUP leaves the UI by itself once the run has ended (nobody
/// asked at this terminal; whoever sent it waits for the process to end).
pub async fn run(mut app: App, input: Input, run_stop: Option<RunStop>) -> anyhow::Result<Exit> {
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
    let result = event_loop(&mut screen.terminal, app, input, run_stop, key_rx).await;
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

/// What stops the loop besides keys: the live run's stop, or the signals (watch and replay).
enum Stops {
    Live(RunStop, watch::Receiver<StopState>),
    Signals(Signals),
}

impl Stops {
    /// The next change: the live run's stop state, or a signal (which for watch and replay only
    /// means leave).
    async fn next(&mut self) -> Option<StopState> {
        match self {
            Stops::Live(_, rx) => match rx.changed().await {
                Ok(()) => Some(rx.borrow_and_update().clone()),
                // The run's stop is gone: nothing more will come from it.
                Err(_) => std::future::pending().await,
            },
            Stops::Signals(s) => match s.recv().await {
                Some(_) => Some(StopState {
                    reason: Some(StopReason::Interrupted),
                    forced: false,
                }),
                None => std::future::pending().await,
            },
        }
    }
}

async fn event_loop(
    terminal: &mut ratatui::DefaultTerminal,
    mut app: App,
    mut input: Input,
    stop: Option<RunStop>,
    mut keys: mpsc::UnboundedReceiver<KeyEvent>,
) -> anyhow::Result<Exit> {
    let mut stops = match stop {
        Some(stop) => {
            let rx = stop.watch();
            Stops::Live(stop, rx)
        }
        None => Stops::Signals(Signals::new().context("cannot listen for signals")?),
    };
    // A live run stopped by a signal from outside: leave once it has ended.
    let mut leave_when_over = false;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let probe = gpu_stats::Probe::start().await;
    let mut gpu_tick = tokio::time::interval(Duration::from_secs(1));
    let mut last = Instant::now();
    let mut feed_open = true;
    let mut draw_now = true;
    loop {
        if leave_when_over && app.run_over() {
            return Ok(Exit::Quit);
        }
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
            state = stops.next() => {
                draw_now = true;
                match (&stops, state) {
                    (Stops::Signals(_), Some(_)) => Some(Action::Quit),
                    (Stops::Live(..), Some(st)) if st.forced => return Ok(Exit::Forced),
                    (Stops::Live(..), Some(st)) => {
                        app.stopping |= st.reason.as_ref().is_some_and(StopReason::cancels_steps);
                        leave_when_over |= matches!(st.reason, Some(StopReason::Signal(_)));
                        None
                    }
                    (_, None) => None,
                }
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
            // The first `q` or Ctrl-C stops the run cleanly; the second (or one after a signal
            // stopped it) stops it now: the run's stop escalates, the same as for signals.
            Some(Action::Cancel | Action::ForceQuit) => {
                if let Stops::Live(stop, _) = &stops
                    && stop.request(StopReason::Interrupted) == Escalation::Now
                {
                    return Ok(Exit::Forced);
                }
            }
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
