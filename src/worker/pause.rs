//! Pausing the compile pool while the CPU device times a candidate.
//!
//! On the CPU device, builds would run on the cores being timed. Waiting for the running builds to
//! end before timing (what the engine does for compilers that cannot pause) lets one hung build (a
//! candidate that sleeps at import) hold every timing back for its whole compile timeout. Instead,
//! the compile workers' sessions are stopped (SIGSTOP) for the length of the timing lease and
//! continued (SIGCONT) after it; new builds wait for the pause to end. A build's timeout counts only
//! the time it was not paused, so a build paused for long stretches is not blamed for it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::time::Instant;

use super::session::signal_session_async;

/// When the continue that ends a pause is sent again. A process forked while a stop and then a
/// continue were sent to its session (a compile worker forks a child per compile) is born with both
/// pending and can be left stopped, its parent running: the build then hangs until its timeout (CI's
/// `engine_refprep` tests, a compile child stopped for 300 s; a process forking in a loop was left
/// stopped by 237 of 2,000 stop-continue pairs). A continue sent after the fork has ended wakes it
/// (and one sent before it acts discards the pending stop); a fork lasts milliseconds.
const CONTINUE_AGAIN: [Duration; 4] = [
    Duration::from_millis(10),
    Duration::from_millis(100),
    Duration::from_secs(1),
    Duration::from_secs(5),
];

/// Whether builds are paused now, and for how long they were paused before.
#[derive(Debug, Clone, Copy, Default)]
pub struct PauseState {
    since: Option<Instant>,
    total: Duration,
}

impl PauseState {
    /// Paused time up to `now`, the current pause included.
    fn paused_total(&self, now: Instant) -> Duration {
        self.total
            + self
                .since
                .map_or(Duration::ZERO, |s| now.saturating_duration_since(s))
    }
}

/// The pause switch of a set of worker sessions.
pub struct Pauser {
    state: watch::Sender<PauseState>,
    /// Leases asking for a pause right now (one CPU device: 0 or 1, but nesting is safe).
    depth: StdMutex<u32>,
    /// Serialises the signalling, so stops and continues are applied in the order asked.
    signal_lock: tokio::sync::Mutex<()>,
    /// Session ids of the live workers to pause (0: none), shared with their slots.
    sessions: Vec<Arc<AtomicU32>>,
    /// Pauses so far (for tests and diagnostics).
    pauses: AtomicU32,
}

/// Builds stay paused while this lives.
pub struct PauseGuard {
    pauser: Arc<Pauser>,
}

impl Pauser {
    pub fn new(sessions: Vec<Arc<AtomicU32>>) -> Arc<Pauser> {
        Arc::new(Pauser {
            state: watch::Sender::new(PauseState::default()),
            depth: StdMutex::new(0),
            signal_lock: tokio::sync::Mutex::new(()),
            sessions,
            pauses: AtomicU32::new(0),
        })
    }

    fn depth(&self) -> std::sync::MutexGuard<'_, u32> {
        self.depth.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stop the workers' sessions; returns once every one was signalled.
    pub async fn pause(self: &Arc<Self>) -> PauseGuard {
        let first = {
            let mut d = self.depth();
            *d += 1;
            *d == 1
        };
        if first {
            self.pauses.fetch_add(1, Ordering::SeqCst);
            self.state.send_modify(|s| s.since = Some(Instant::now()));
        }
        // The guard exists before anything is awaited: a caller dropped while the sessions are being
        // stopped still ends its pause (else the depth would stay raised and builds stopped for good).
        let guard = PauseGuard {
            pauser: self.clone(),
        };
        // The signalling runs as its own task: a caller dropped half-way cannot leave a stopping pass
        // running outside the lock, landing after the continue that follows it.
        let me = self.clone();
        let _ = tokio::spawn(async move { me.reconcile().await }).await;
        guard
    }

    fn resume(self: &Arc<Self>) {
        let last = {
            let mut d = self.depth();
            *d = d.saturating_sub(1);
            *d == 0
        };
        if !last {
            return;
        }
        self.state.send_modify(|s| {
            if let Some(since) = s.since.take() {
                s.total += since.elapsed();
            }
        });
        let me = self.clone();
        // No runtime (a test dropping the pool at exit): nothing is running to continue.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                me.reconcile().await;
                for delay in CONTINUE_AGAIN {
                    tokio::time::sleep(delay).await;
                    // A pause in force again stops the sessions (once more): nothing to repeat.
                    if me.reconcile().await == Signal::SIGSTOP {
                        break;
                    }
                }
            });
        }
    }

    /// Bring the sessions to the state asked for now. Every change of the depth is followed by one
    /// of these, and they run one at a time, so the last to run applies the latest state whatever
    /// order they were scheduled in. Returns the signal sent.
    async fn reconcile(&self) -> Signal {
        let _one_at_a_time = self.signal_lock.lock().await;
        let signal = if *self.depth() > 0 {
            Signal::SIGSTOP
        } else {
            Signal::SIGCONT
        };
        for s in &self.sessions {
            let sid = s.load(Ordering::SeqCst);
            if sid != 0 {
                signal_session_async(sid, signal).await;
            }
        }
        signal
    }

    /// Pauses so far.
    pub fn pauses(&self) -> u32 {
        self.pauses.load(Ordering::SeqCst)
    }

    /// Wait until no pause is in force.
    pub async fn wait_unpaused(&self) {
        let mut rx = self.state.subscribe();
        // The sender lives as long as `self`, so this only ends when unpaused.
        let _ = rx.wait_for(|s| s.since.is_none()).await;
    }

    /// Complete once `budget` of unpaused time has passed from now.
    pub async fn deadline(&self, budget: Duration) {
        let mut rx = self.state.subscribe();
        let start = Instant::now();
        let paused_before = rx.borrow().paused_total(start);
        loop {
            let now = Instant::now();
            let state = *rx.borrow_and_update();
            let paused = state.paused_total(now).saturating_sub(paused_before);
            let active = now.saturating_duration_since(start).saturating_sub(paused);
            if active >= budget {
                return;
            }
            if state.since.is_some() {
                let _ = rx.changed().await;
            } else {
                tokio::select! {
                    () = tokio::time::sleep(budget - active) => {}
                    _ = rx.changed() => {}
                }
            }
        }
    }
}

impl Drop for PauseGuard {
    fn drop(&mut self) {
        self.pauser.resume();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn deadline_counts_only_unpaused_time() {
        let p = Pauser::new(Vec::new());
        let d = {
            let p = p.clone();
            tokio::spawn(async move { p.deadline(Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_secs(4)).await;
        let guard = p.pause().await;
        // 4 s used; 30 s paused must not count.
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!d.is_finished());
        drop(guard);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!d.is_finished(), "9 s of the 10 s budget used");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(d.is_finished());
        assert_eq!(p.pauses(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn new_work_waits_for_the_pause_to_end() {
        let p = Pauser::new(Vec::new());
        let guard = p.pause().await;
        let w = {
            let p = p.clone();
            tokio::spawn(async move { p.wait_unpaused().await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!w.is_finished());
        drop(guard);
        w.await.unwrap();
    }
}
