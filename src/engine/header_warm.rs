//! The run's shared-header warm-up: the first build that would use the precompiled headers a compiler
//! makes ahead ([`Compiler::warm_headers`]) has them made, on a compile slot and cores of the CPU
//! budget, and every other such build waits for them (at most [`WARM_WAIT`]) before it takes a slot
//! or cores. On a cold build cache each of a run's first builds otherwise compiled torch's headers
//! itself: in issue 36's cold batch on the GPU host the 25 builds that started before the header was
//! made took 23.5 CPU s (median) against 12.4 for the 23 after, and they held the cores the first
//! problems' input makers waited for.
//!
//! The waiting builds leave in the order they came, each taking its place on the compile gate
//! before the next may, as the gate serves builds without a warm-up: woken all at once, they raced
//! for it, and a problem's candidates were built in different waves (on the GPU host 1/43's three at
//! 62, 79 and 98 s), so its reference data was prepared on the device again between them.
//!
//! [`Compiler::warm_headers`]: crate::services::Compiler::warm_headers

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{AcquireError, Mutex, OwnedMutexGuard, Semaphore, SemaphorePermit};

use super::Shared;
use crate::cpu_budget::{CORE, Claim};
use crate::services::CompileJob;

/// The longest a build waits for the warmed headers; past it, it builds without them. One header is
/// one compiler process of 40-60 CPU s; a cold batch's headers were made 48-53 s into its run.
const WARM_WAIT: Duration = Duration::from_secs(120);
/// The cores a warm-up claims: one per header it builds at once (`kb_pch.warm_requests`: two where
/// torch builds CUDA).
const WARM_CORES: u64 = 2 * CORE;

pub(super) struct HeaderWarm {
    /// A build has started the warm-up (only one does, for the run).
    started: AtomicBool,
    /// The line of builds waiting for the warm-up: locked from the start until the warm-up ends,
    /// and fair, so the waiting builds get it in the order they came.
    line: Arc<Mutex<()>>,
    /// The lock that keeps `line` closed, dropped when the warm-up ends.
    closed: StdMutex<Option<OwnedMutexGuard<()>>>,
}

/// Opens the line however the warm-up's future ends (cancelled with the run too), so no build waits
/// for a warm-up that is gone.
struct Opens<'a>(&'a HeaderWarm);

impl Drop for Opens<'_> {
    fn drop(&mut self) {
        let mut closed = match self.0.closed.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        closed.take();
    }
}

impl HeaderWarm {
    pub(super) fn new() -> HeaderWarm {
        let line = Arc::new(Mutex::new(()));
        // A lock no one else holds yet: it cannot fail.
        let closed = line.clone().try_lock_owned().ok();
        HeaderWarm {
            started: AtomicBool::new(false),
            line,
            closed: StdMutex::new(closed),
        }
    }

    /// `job`'s permit of the compile gate. A build that uses no warmed header takes it at once; the
    /// run's first build that does has the headers made first; every other one waits for them (at
    /// most [`WARM_WAIT`]) and takes its place in the order it came.
    pub(super) async fn gate<'a>(
        &self,
        shared: &'a Shared,
        job: &CompileJob,
    ) -> Result<SemaphorePermit<'a>, AcquireError> {
        if !shared.compiler.uses_warm_headers(job) {
            return shared.compile_gate.acquire().await;
        }
        if !self.started.swap(true, Ordering::SeqCst) {
            let opens = Opens(self);
            {
                // The warm-up's own slot and cores, as a build's: its compiler processes are work
                // the budget shares out like any other.
                let _permit = shared.compile_gate.acquire().await;
                let _cores = match &shared.cpu {
                    Some(cpu) => Some(cpu.claim(Claim::Build, WARM_CORES).await),
                    None => None,
                };
                shared.compiler.warm_headers(WARM_WAIT).await;
            }
            // First in line for its own build.
            return in_turn(&shared.compile_gate, opens).await;
        }
        let turn = tokio::time::timeout(WARM_WAIT, self.line.lock()).await;
        in_turn(&shared.compile_gate, turn).await
    }
}

/// A permit of `gate`: its place in the gate's line is taken while `turn` is held (the next build in
/// line waits for it), then waited for.
async fn in_turn<T>(gate: &Semaphore, turn: T) -> Result<SemaphorePermit<'_>, AcquireError> {
    let mut permit = std::pin::pin!(gate.acquire());
    // The first poll puts the request in the gate's line (first come, first served).
    let now = futures::poll!(permit.as_mut());
    drop(turn);
    match now {
        Poll::Ready(p) => p,
        Poll::Pending => permit.await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds that waited for the warm-up reach the compile gate in the order they came, however
    /// the runtime wakes them.
    #[tokio::test(flavor = "current_thread")]
    async fn the_builds_that_waited_take_the_gate_in_the_order_they_came() {
        let warm = Arc::new(HeaderWarm::new());
        let gate = Arc::new(Semaphore::new(0));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for n in 0..8u32 {
            let (warm, gate, tx) = (warm.clone(), gate.clone(), tx.clone());
            tokio::spawn(async move {
                let turn = warm.line.lock().await;
                let permit = in_turn(&gate, turn).await.expect("an open gate");
                tx.send(n).expect("the test listens");
                drop(permit);
            });
            // Each one in the line before the next comes.
            tokio::task::yield_now().await;
        }
        drop(Opens(&warm));
        // One build at a time through the gate, so the order it serves is the order they leave.
        gate.add_permits(1);
        let mut left = Vec::new();
        for _ in 0..8 {
            left.push(rx.recv().await.expect("every build leaves"));
        }
        assert_eq!(left, (0..8).collect::<Vec<_>>());
    }
}
