//! How `krefine run` shows a run and takes its signals: the terminal UI or plain progress, and the
//! one stream of signals (SIGINT, SIGTERM, SIGHUP) that stops it, the same with the UI and without.
//!
//! The signals are read from the start of the run (workers and a Slurm allocation starting
//! included) to its end by one task ([`listen`]), which hands each to the run's [`RunStop`]: the
//! first stops the run cleanly (the log stays valid, `--resume` goes on), a second stops it at once.
//! The displays only follow the stop: the UI shows it and leaves when the second comes (or, for a
//! SIGTERM or SIGHUP, once the run has ended); without the UI, [`notices`] says it on stderr.

use std::io::IsTerminal;

use crate::engine::{RunStop, Signals, StopReason, StopState};

/// Hand every signal to the run's stop until the process ends.
pub(super) fn listen(mut signals: Signals, stop: RunStop) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(sig) = signals.recv().await {
            stop.request(StopReason::from_signal(sig));
        }
    })
}

/// Say on stderr what the stop does, as it happens (only while no screen is up).
pub(super) fn notices(stop: &RunStop) -> tokio::task::JoinHandle<()> {
    let mut rx = stop.watch();
    tokio::spawn(async move {
        let mut said = StopState::default();
        while rx.changed().await.is_ok() {
            let now = rx.borrow_and_update().clone();
            // The stop at once is said by whoever drives the run, once the runtime let go
            // ([`say_forced`]): a task of the runtime may be dropped before it prints.
            if now.forced {
                break;
            }
            if now.reason != said.reason
                && let Some(r) = now.reason.as_ref().filter(|r| r.cancels_steps())
            {
                eprintln!(
                    "\n{r}: stopping; the event log stays valid, resume with --resume \
                     (again to stop at once)"
                );
            }
            said = now;
        }
    })
}

/// Say that the run stopped at once (the second stop request), from the thread that drove it.
pub(super) fn say_forced() {
    eprintln!(
        "\n{}: stopping now, without waiting for the steps under way (they are not recorded); \
         the event log stays valid, resume with --resume",
        StopReason::SecondSignal
    );
}

/// Where the run is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Display {
    /// The terminal UI.
    Tui,
    /// Plain progress on stderr; `why` says why the UI was not opened when it was expected.
    Plain { why: Option<&'static str> },
}

/// The UI when stdout is a terminal this process may draw on: `--no-tui` not given, and the
/// process in the terminal's foreground process group. A process in the background (`cmd &`, or
/// under `timeout`, which puts its command in a group of its own) that touched the terminal would
/// be stopped by the kernel (SIGTTOU, state T) until someone brought it to the foreground; it gets
/// plain progress instead.
pub(super) fn display(no_tui: bool) -> Display {
    if no_tui || !std::io::stdout().is_terminal() {
        return Display::Plain { why: None };
    }
    if !crate::tui::in_foreground() {
        return Display::Plain {
            why: Some(
                "not in the terminal's foreground process group (in the background, or under \
                 `timeout`): plain progress instead of the terminal UI",
            ),
        };
    }
    Display::Tui
}
