//! The run's shared-header warm-up: the first build that would use the precompiled headers a compiler
//! makes ahead ([`Compiler::warm_headers`]) has them made, on a compile slot and cores of the CPU
//! budget, and every other such build waits for them (at most [`WARM_WAIT`]) before it takes a slot
//! or cores. On a cold build cache each of a run's first builds otherwise compiled torch's headers
//! itself: in issue 36's cold batch on the GPU host the 25 builds that started before the header was
//! made took 23.5 CPU s (median) against 12.4 for the 23 after, and they held the cores the first
//! problems' input makers waited for.
//!
//! [`Compiler::warm_headers`]: crate::services::Compiler::warm_headers

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use super::Shared;
use crate::cpu_budget::{CORE, Claim};
use crate::services::CompileJob;

/// The longest a build waits for the warmed headers; past it, it builds without them. One header is
/// one compiler process of 40-60 CPU s; a cold batch's headers were made 50-63 s into its run.
pub(super) const WARM_WAIT: Duration = Duration::from_secs(120);
/// The cores a warm-up claims: one per header it builds at once (`kb_pch.warm_requests`: two where
/// torch builds CUDA).
pub(super) const WARM_CORES: u64 = 2 * CORE;

pub(super) struct HeaderWarm {
    /// A build has started the warm-up (only one does, for the run).
    started: AtomicBool,
    /// True once the warm-up ended (made, failed or given up).
    done: watch::Sender<bool>,
}

/// Marks the warm-up ended however its future ends (cancelled with the run too), so no build waits
/// for a warm-up that is gone.
struct Ended<'a>(&'a watch::Sender<bool>);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

impl HeaderWarm {
    pub(super) fn new() -> HeaderWarm {
        HeaderWarm {
            started: AtomicBool::new(false),
            done: watch::channel(false).0,
        }
    }

    /// Before `job` takes a compile slot: nothing when its build uses no warmed header; the warm-up
    /// when it is the run's first build that does; otherwise wait for the warm-up, at most
    /// [`WARM_WAIT`].
    pub(super) async fn before(&self, shared: &Shared, job: &CompileJob) {
        if !shared.compiler.uses_warm_headers(job) {
            return;
        }
        let mut done = self.done.subscribe();
        if !self.started.swap(true, Ordering::SeqCst) {
            let _ended = Ended(&self.done);
            // The warm-up's own slot and cores, as a build's: its compiler processes are work the
            // budget shares out like any other.
            let _permit = shared.compile_gate.acquire().await;
            let _cores = match &shared.cpu {
                Some(cpu) => Some(cpu.claim(Claim::Build, WARM_CORES).await),
                None => None,
            };
            shared.compiler.warm_headers(WARM_WAIT).await;
            return;
        }
        let _ = tokio::time::timeout(WARM_WAIT, done.wait_for(|ended| *ended)).await;
    }
}
