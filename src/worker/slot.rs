//! One worker position of the pool: how to start its process, the process while it lives, where it ran.

use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::Mutex;

use super::process::WorkerProcess;
use super::spawn_spec::SpawnSpec;
use crate::launcher::Launcher;
use crate::types::RanOn;

/// One worker position: how to start its process, and the process while it lives.
pub(super) struct Slot {
    pub(super) spec: SpawnSpec,
    pub(super) state: Mutex<SlotState>,
    /// Process group of the live process (0: none), readable without the lock so `shutdown` can kill
    /// a worker that is busy with a request (and the pauser can stop a compile worker mid-build).
    pub(super) pgid: Arc<AtomicU32>,
    /// The device name the worker reported (GPUs only), for outcomes the orchestrator writes itself.
    pub(super) hardware: StdMutex<Option<String>>,
    /// Where its current (or last) worker ran.
    pub(super) ran_on: StdMutex<Option<RanOn>>,
    /// The slot's host was drained and the slot is bound to it (SSH): it serves nothing more.
    pub(super) retired: AtomicBool,
}

impl Slot {
    pub(super) fn ran_on(&self) -> Option<RanOn> {
        match self.ran_on.lock() {
            Ok(r) => r.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The host its worker runs on: the one it reported, else the one it is bound to.
    pub(super) fn host(&self) -> Option<String> {
        self.ran_on()
            .map(|r| r.host)
            .filter(|h| !h.is_empty())
            .or_else(|| {
                let r = self.spec.remote.as_ref()?;
                r.launcher.placement_host(&r.placement)
            })
    }

    pub(super) fn hardware(&self) -> Option<String> {
        match self.hardware.lock() {
            Ok(h) => h.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub(super) fn note_ready(&self, process: &WorkerProcess, launcher: &Launcher) {
        let here = launcher.ran_on(process.ready().placement.as_deref());
        match self.ran_on.lock() {
            Ok(mut r) => *r = Some(here),
            Err(poisoned) => *poisoned.into_inner() = Some(here),
        }
        if let Some(dev) = &process.ready().device {
            let mut h = match self.hardware.lock() {
                Ok(h) => h,
                Err(poisoned) => poisoned.into_inner(),
            };
            *h = Some(dev.name.clone());
        }
    }
}

#[derive(Default)]
pub(super) struct SlotState {
    pub(super) process: Option<WorkerProcess>,
    /// Requests the current process has served (for recycling).
    pub(super) served: u32,
}

/// Returns a compile slot index to the free list when dropped (also on cancellation).
pub(super) struct FreeSlot<'a> {
    pub(super) free: &'a StdMutex<Vec<usize>>,
    pub(super) index: usize,
}

impl Drop for FreeSlot<'_> {
    fn drop(&mut self) {
        if let Ok(mut free) = self.free.lock() {
            free.push(self.index);
        }
    }
}
