//! The run's shared-header warm-up: the first build that would use the precompiled headers a compiler
//! makes ahead ([`Compiler::warm_headers`]) has them made, on a compile slot and cores of the CPU
//! budget, and every other such build waits for them (at most [`WARM_WAIT`]) before it takes a slot
//! or cores. On a cold build cache each of a run's first builds otherwise compiled torch's headers
//! itself: in issue 36's cold batch on the GPU host the 25 builds that started before the header was
//! made took 23.5 CPU s (median) against 12.4 for the 23 after, and they held the cores the first
//! problems' input makers waited for.
//!
//! The waiting builds leave one at a time, each taking its place on the compile gate before the
//! next may: woken all at once, they raced for it, and a problem's candidates were built in
//! different waves (on the GPU host 1/43's three at 62, 79 and 98 s), so its reference data was
//! prepared on the device again between them. They leave in the order they came, except that while
//! a problem's inputs wait for room in the input store, the builds of the problems whose entries
//! hold that room leave first ([`DevicePool::prefer`], which orders their leases too): in a cold
//! batch on the GPU host the last of 1/93's candidates was built at 84 s, and the inputs of 1/43 and
//! 1/49, which waited for its room, were made at 94 and 139 s; the pass ended at 153 s.
//!
//! [`Compiler::warm_headers`]: crate::services::Compiler::warm_headers

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex as StdMutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{AcquireError, Semaphore, SemaphorePermit, oneshot};

use super::Shared;
use crate::cpu_budget::{CORE, Claim};
use crate::gpu::DevicePool;
use crate::services::CompileJob;
use crate::types::ProblemKey;

/// The longest a build waits for the warmed headers; past it, it builds without them. One header is
/// one compiler process of 40-60 CPU s; a cold batch's headers were made 48-53 s into its run.
const WARM_WAIT: Duration = Duration::from_secs(120);
/// The cores a warm-up claims: one per header it builds at once (`kb_pch.warm_requests`: two where
/// torch builds CUDA).
const WARM_CORES: u64 = 2 * CORE;

pub(super) struct HeaderWarm {
    /// A build has started the warm-up (only one does, for the run).
    started: AtomicBool,
    /// The builds waiting for the warm-up, and whose turn it is.
    line: StdMutex<Line>,
}

/// The line of builds waiting for the warm-up. Closed from the start until the warm-up ends; then
/// one build at a time has the turn: it takes its place on the compile gate and hands the turn on.
#[derive(Default)]
struct Line {
    open: bool,
    /// A build has the turn and has not handed it on yet.
    turn_out: bool,
    next_seq: u64,
    waiting: Vec<Waiter>,
}

struct Waiter {
    seq: u64,
    problem: ProblemKey,
    wake: oneshot::Sender<()>,
}

impl Line {
    /// Hand the turn to the next build: the first of `first`'s problems that has one waiting (the
    /// problems whose input-store entries hold the room another problem's inputs wait for: the
    /// sooner their candidates are built and run, the sooner those inputs are made), else the one
    /// that came first. A build no longer waiting (its run step cancelled) is passed over.
    fn pass(&mut self, first: &[ProblemKey]) {
        let rank = |w: &Waiter| {
            (
                first
                    .iter()
                    .position(|p| *p == w.problem)
                    .unwrap_or(usize::MAX),
                w.seq,
            )
        };
        self.turn_out = false;
        while let Some(i) = (0..self.waiting.len()).min_by_key(|&i| rank(&self.waiting[i])) {
            let waiter = self.waiting.swap_remove(i);
            if waiter.wake.send(()).is_ok() {
                self.turn_out = true;
                return;
            }
        }
    }
}

/// The turn, held by the build that has it until it has taken its place on the compile gate;
/// handed on however that build's future ends (cancelled with the run too), so no build waits for
/// a turn that is gone.
struct Turn<'a> {
    warm: &'a HeaderWarm,
    devices: &'a DevicePool,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let first = self.devices.preferred();
        self.warm.lock().pass(&first);
    }
}

/// A build's place in the line while it waits: leaving the line (timed out, or its future dropped)
/// removes it, or hands on the turn it was given meanwhile.
struct InLine<'a> {
    turn: Option<Turn<'a>>,
    seq: u64,
}

impl<'a> InLine<'a> {
    /// Leave the line: the turn when this build was given it (under the line's lock), to hand on
    /// once it has its place on the gate; none when it was still waiting (it is taken out).
    fn leave(&mut self) -> Option<Turn<'a>> {
        let turn = self.turn.take()?;
        let was_waiting = {
            let mut line = turn.warm.lock();
            let at = line.waiting.iter().position(|w| w.seq == self.seq);
            at.map(|i| line.waiting.swap_remove(i)).is_some()
        };
        if was_waiting {
            // Never given the turn: nothing to hand on.
            std::mem::forget(turn);
            return None;
        }
        Some(turn)
    }
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        // A turn given meanwhile is handed on as it drops here.
        drop(self.leave());
    }
}

impl HeaderWarm {
    pub(super) fn new() -> HeaderWarm {
        HeaderWarm {
            started: AtomicBool::new(false),
            line: StdMutex::new(Line::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Line> {
        match self.line.lock() {
            Ok(line) => line,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The warm-up ended (however): the line opens, and the first build in it has the turn.
    fn open(&self, devices: &DevicePool) {
        let first = devices.preferred();
        let mut line = self.lock();
        line.open = true;
        if !line.turn_out {
            line.pass(&first);
        }
    }

    /// `job`'s permit of the compile gate. A build that uses no warmed header takes it at once; the
    /// run's first build that does has the headers made first; every other one waits for them (at
    /// most [`WARM_WAIT`]) and takes its place one at a time: the builds of the problems whose
    /// input-store entries hold room another problem waits for first, then in the order they came.
    pub(super) async fn gate<'a>(
        &'a self,
        shared: &'a Shared,
        job: &CompileJob,
    ) -> Result<SemaphorePermit<'a>, AcquireError> {
        if !shared.compiler.uses_warm_headers(job) {
            return shared.compile_gate.acquire().await;
        }
        if !self.started.swap(true, Ordering::SeqCst) {
            let opens = Opens {
                warm: self,
                devices: &shared.devices,
            };
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
            // First on the gate for its own build, then the line opens.
            return in_turn(&shared.compile_gate, opens).await;
        }
        self.wait_in_line(&shared.compile_gate, &shared.devices, job.task.problem)
            .await
    }

    /// A build's wait for the warm-up and its turn (see [`Self::gate`]).
    async fn wait_in_line<'a>(
        &'a self,
        gate: &'a Semaphore,
        devices: &'a DevicePool,
        problem: ProblemKey,
    ) -> Result<SemaphorePermit<'a>, AcquireError> {
        let (wake, woken) = oneshot::channel();
        let place = {
            let mut line = self.lock();
            if line.open && !line.turn_out && line.waiting.is_empty() {
                None
            } else {
                let seq = line.next_seq;
                line.next_seq += 1;
                line.waiting.push(Waiter { seq, problem, wake });
                Some(seq)
            }
        };
        let Some(seq) = place else {
            // No one in line: straight to the gate, as a build without a warm-up.
            return gate.acquire().await;
        };
        let mut place = InLine {
            turn: Some(Turn {
                warm: self,
                devices,
            }),
            seq,
        };
        // Given the turn, or past the longest wait: either way this build goes on (leaving the
        // line, or handing the turn on once it has its place on the gate).
        let _ = tokio::time::timeout(WARM_WAIT, woken).await;
        let turn = place.leave();
        in_turn(gate, turn).await
    }
}

/// Opens the line however the warm-up's future ends (cancelled with the run too), so no build waits
/// for a warm-up that is gone.
struct Opens<'a> {
    warm: &'a HeaderWarm,
    devices: &'a DevicePool,
}

impl Drop for Opens<'_> {
    fn drop(&mut self) {
        self.warm.open(self.devices);
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
    use std::sync::Arc;

    fn problem(id: u32) -> ProblemKey {
        ProblemKey {
            level: 1,
            problem_id: id,
        }
    }

    /// `builds` (problem ids) wait in the line in this order while the warm-up runs, `first` is the
    /// devices' preference when it ends; the order in which they leave the compile gate, one at a
    /// time.
    async fn leave_order(builds: &[u32], first: &[u32]) -> Vec<u32> {
        let warm = Arc::new(HeaderWarm::new());
        let gate = Arc::new(Semaphore::new(0));
        let devices = Arc::new(DevicePool::new(Vec::new()));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for &id in builds {
            let (warm, gate, devices, tx) =
                (warm.clone(), gate.clone(), devices.clone(), tx.clone());
            tokio::spawn(async move {
                let permit = warm
                    .wait_in_line(&gate, &devices, problem(id))
                    .await
                    .expect("an open gate");
                tx.send(id).expect("the test listens");
                drop(permit);
            });
            // Each one in the line before the next comes.
            tokio::task::yield_now().await;
        }
        devices.prefer(first.iter().map(|&id| problem(id)).collect());
        warm.open(&devices);
        // One build at a time through the gate, so the order it serves is the order they leave.
        gate.add_permits(1);
        let mut left = Vec::new();
        for _ in builds {
            left.push(rx.recv().await.expect("every build leaves"));
        }
        left
    }

    /// Builds that waited for the warm-up reach the compile gate in the order they came, however
    /// the runtime wakes them.
    #[tokio::test(flavor = "current_thread")]
    async fn the_builds_that_waited_take_the_gate_in_the_order_they_came() {
        let builds: Vec<u32> = (1..=8).collect();
        assert_eq!(leave_order(&builds, &[]).await, builds);
    }

    /// While a problem's inputs wait for room in the input store, the builds of the problems whose
    /// entries hold that room go first, in the devices' order of preference, then the rest as they
    /// came (in a cold batch on the GPU host 1/93's last candidate was built at 84 s, and 1/43's and
    /// 1/49's inputs, which waited for 1/93's room, were made at 94 and 139 s).
    #[tokio::test(flavor = "current_thread")]
    async fn the_builds_of_the_problems_holding_room_go_first() {
        let left = leave_order(&[8, 93, 14, 43, 93, 8, 43], &[43, 93]).await;
        assert_eq!(left, vec![43, 43, 93, 93, 8, 14, 8]);
    }

    /// A build whose run step was dropped while it waited holds no one up, nor one dropped just
    /// after it was given the turn (it hands the turn on); once the line has emptied, a build goes
    /// straight to the gate.
    #[tokio::test(flavor = "current_thread")]
    async fn a_build_dropped_in_line_holds_no_one_up() {
        let warm = HeaderWarm::new();
        let gate = Semaphore::new(4);
        let devices = DevicePool::new(Vec::new());
        let mut waiting = Box::pin(warm.wait_in_line(&gate, &devices, problem(1)));
        let mut turned = Box::pin(warm.wait_in_line(&gate, &devices, problem(2)));
        let mut kept = std::pin::pin!(warm.wait_in_line(&gate, &devices, problem(3)));
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        assert!(futures::poll!(turned.as_mut()).is_pending());
        assert!(futures::poll!(kept.as_mut()).is_pending());
        // The first one's step is cancelled while the line is closed.
        drop(waiting);
        // The line opens: the second has the turn, and its step is cancelled before it takes it.
        warm.open(&devices);
        drop(turned);
        let permit = futures::poll!(kept.as_mut());
        assert!(matches!(permit, Poll::Ready(Ok(_))));
        drop(permit);
        // The line is empty and open: the next build does not wait.
        let mut next = std::pin::pin!(warm.wait_in_line(&gate, &devices, problem(4)));
        assert!(futures::poll!(next.as_mut()).is_ready());
    }
}
