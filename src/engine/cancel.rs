//! Stopping a run: one handle that records why ([`StopReason`], typed and ordered) and escalates,
//! and the one stream of the signals that ask for it ([`Signals`]).
//!
//! nextest's `signal.rs` and `runner/dispatcher.rs` are the model. Every request to stop goes
//! through [`RunStop::request`]: the engine's own (the LLM budget reached, a task driver failed),
//! the signals (SIGINT, SIGTERM, SIGHUP, read from one stream by whoever drives the run) and the
//! terminal UI's keys. The first request from outside the run (a signal, a key) stops it cleanly:
//! the steps under way are cancelled, nothing more starts, the log stays valid and a resume goes
//! on. A second one while it is stopping escalates to [`StopReason::SecondSignal`]: stop now,
//! without waiting for anything ([`RunStop::forced`]). The same in the terminal UI and without it.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use crate::run_end::{ShutdownSignal, StopReason};

/// Where a run's stop stands, as displays watch it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopState {
    /// The most severe reason requested so far; `None` while the run goes on.
    pub reason: Option<StopReason>,
    /// The second request from outside came: stop now.
    pub forced: bool,
}

/// What a request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Escalation {
    /// The run stops for it (the first request, or one more severe than the one recorded).
    Stopping,
    /// The run was already stopping for a reason at least as severe; nothing changed.
    Unchanged,
    /// The second request from outside: stop now.
    Now,
}

/// The stop of one run, shared by the engine, the signal stream's reader and the displays.
#[derive(Debug, Clone)]
pub struct RunStop {
    /// Cancelled once a reason that cancels steps is recorded: the engine's drivers and services
    /// wait on it.
    steps: CancellationToken,
    /// Cancelled on the second request from outside: whoever drives the run stops waiting.
    now: CancellationToken,
    /// The state, written only under its own lock (the watch channel's sender), read by displays.
    state: Arc<Mutex<watch::Sender<StopState>>>,
}

impl Default for RunStop {
    fn default() -> Self {
        RunStop::new()
    }
}

impl RunStop {
    pub fn new() -> RunStop {
        RunStop::with_token(CancellationToken::new())
    }

    /// A stop whose cancellation of steps is `steps`: cancelling the token from outside (as tests
    /// and programs embedding the engine do) stops the run for [`StopReason::Cancelled`].
    pub fn with_token(steps: CancellationToken) -> RunStop {
        let (tx, _) = watch::channel(StopState::default());
        RunStop {
            steps,
            now: CancellationToken::new(),
            state: Arc::new(Mutex::new(tx)),
        }
    }

    /// Ask the run to stop for `reason` (see the module docs for the escalation).
    pub fn request(&self, reason: StopReason) -> Escalation {
        let tx = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut escalation = Escalation::Unchanged;
        tx.send_modify(|st| {
            if st.forced {
                return;
            }
            let shutdown_again =
                reason.is_shutdown() && st.reason.as_ref().is_some_and(StopReason::is_shutdown);
            if shutdown_again {
                st.reason = Some(StopReason::SecondSignal);
                st.forced = true;
                escalation = Escalation::Now;
            } else if st.reason.as_ref().is_none_or(|r| *r < reason) {
                st.reason = Some(reason.clone());
                escalation = Escalation::Stopping;
            }
        });
        let cancels = tx
            .borrow()
            .reason
            .as_ref()
            .is_some_and(StopReason::cancels_steps);
        drop(tx);
        if cancels {
            self.steps.cancel();
        }
        if escalation == Escalation::Now {
            self.now.cancel();
        }
        escalation
    }

    /// Why the run stops: the reason recorded, else [`StopReason::Cancelled`] when the token was
    /// cancelled from outside; `None` while it goes on.
    pub fn reason(&self) -> Option<StopReason> {
        let recorded = self
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .borrow()
            .reason
            .clone();
        recorded.or_else(|| self.steps.is_cancelled().then_some(StopReason::Cancelled))
    }

    /// Whether the steps under way are to stop (see [`StopReason::cancels_steps`]).
    pub fn is_cancelled(&self) -> bool {
        self.steps.is_cancelled()
    }

    /// The cancellation the engine's steps wait on.
    pub fn token(&self) -> &CancellationToken {
        &self.steps
    }

    /// Whether the run is to stop now (the second request from outside).
    pub fn is_forced(&self) -> bool {
        self.now.is_cancelled()
    }

    /// Resolves when the run is to stop now.
    pub async fn forced(&self) {
        self.now.cancelled().await
    }

    /// The state as it changes, for displays.
    pub fn watch(&self) -> watch::Receiver<StopState> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .subscribe()
    }
}

impl From<CancellationToken> for RunStop {
    fn from(token: CancellationToken) -> RunStop {
        RunStop::with_token(token)
    }
}

/// The signals that ask a run to stop (SIGINT, SIGTERM, SIGHUP), as one stream. Created once per
/// process that drives a run; while it exists, the signals no longer end the process by themselves.
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// The next signal; `None` once none can come any more.
    pub async fn recv(&mut self) -> Option<ShutdownSignal> {
        tokio::select! {
            s = self.int.recv() => s.map(|()| ShutdownSignal::Interrupt),
            s = self.term.recv() => s.map(|()| ShutdownSignal::Terminate),
            s = self.hup.recv() => s.map(|()| ShutdownSignal::Hangup),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_shutdown_stops_cleanly_and_the_second_stops_now() {
        let stop = RunStop::new();
        let seen = stop.watch();
        assert_eq!(stop.reason(), None);
        let budget = StopReason::LlmStopped("budget exhausted: tokens".into());
        assert_eq!(stop.request(budget.clone()), Escalation::Stopping);
        // The budget only keeps new LLM requests from starting.
        assert!(!stop.is_cancelled());
        assert_eq!(stop.request(budget.clone()), Escalation::Unchanged);
        let term = StopReason::from_signal(ShutdownSignal::Terminate);
        assert_eq!(stop.request(term.clone()), Escalation::Stopping);
        assert!(stop.is_cancelled() && !stop.is_forced());
        assert_eq!(stop.reason(), Some(term));
        assert_eq!(seen.borrow().reason, stop.reason());
        // The run itself failing while it stops is no second signal.
        assert_eq!(
            stop.request(StopReason::Failed("x".into())),
            Escalation::Unchanged
        );
        assert_eq!(stop.request(StopReason::Interrupted), Escalation::Now);
        assert!(stop.is_forced());
        assert_eq!(stop.reason(), Some(StopReason::SecondSignal));
        assert!(seen.borrow().forced);
        assert_eq!(stop.request(StopReason::Interrupted), Escalation::Unchanged);
    }

    #[test]
    fn a_token_cancelled_from_outside_reads_as_cancelled() {
        let token = CancellationToken::new();
        let stop = RunStop::from(token.clone());
        token.cancel();
        assert!(stop.is_cancelled());
        assert_eq!(stop.reason(), Some(StopReason::Cancelled));
        // A failure recorded after it is what the log says.
        stop.request(StopReason::Failed("a task driver failed".into()));
        assert_eq!(
            stop.reason(),
            Some(StopReason::Failed("a task driver failed".into()))
        );
    }
}
