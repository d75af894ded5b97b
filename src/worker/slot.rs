//! One worker position of the pool: how to start its process, the process while it lives, where it ran;
//! and [`Slots`], the pool's positions (compile and evaluation), with the lease of a free compile slot.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex as StdMutex};

use tokio::sync::{Mutex, Semaphore, SemaphorePermit};

use super::process::WorkerProcess;
use super::spawn_spec::SpawnSpec;
use crate::launcher::Launcher;
use crate::services::DeviceId;
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
    /// A slot for `spec`, holding `process` when one was started already (it reported `ready`).
    pub(super) fn new(
        spec: SpawnSpec,
        process: Option<WorkerProcess>,
        launcher: &Launcher,
    ) -> Slot {
        let mut slot = Slot {
            pgid: Arc::new(AtomicU32::new(process.as_ref().map_or(0, |p| p.pid()))),
            spec,
            state: Mutex::new(SlotState {
                process: None,
                served: 0,
            }),
            hardware: StdMutex::new(None),
            ran_on: StdMutex::new(None),
            retired: AtomicBool::new(false),
        };
        if let Some(p) = process {
            slot.note_ready(&p, launcher);
            slot.state.get_mut().process = Some(p);
        }
        slot
    }

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
struct FreeSlot<'a> {
    free: &'a StdMutex<Vec<usize>>,
    index: usize,
}

impl Drop for FreeSlot<'_> {
    fn drop(&mut self) {
        if let Ok(mut free) = self.free.lock() {
            free.push(self.index);
        }
    }
}

/// The pool's worker positions: N compile slots leased one job at a time, and one evaluation slot
/// per device (the engine's device lease keeps it to one request at a time).
pub(super) struct Slots {
    compile: Vec<Slot>,
    /// Indices of the compile slots no job holds.
    compile_free: StdMutex<Vec<usize>>,
    /// One permit per free compile slot, so a job that gets a permit always finds a slot; closed
    /// when every compile slot is retired (their hosts drained).
    compile_permits: Semaphore,
    eval: Vec<(DeviceId, Slot)>,
}

/// Why no compile slot was leased.
pub(super) enum NoLease {
    /// The permits were closed: every compile slot is retired.
    Closed,
    /// A permit found no free slot (cannot happen while permits and free slots match).
    NoFreeSlot,
}

impl Slots {
    pub(super) fn new(compile: Vec<Slot>, eval: Vec<(DeviceId, Slot)>) -> Slots {
        let n = compile.len();
        Slots {
            compile_free: StdMutex::new((0..n).rev().collect()),
            compile_permits: Semaphore::new(n),
            compile,
            eval,
        }
    }

    /// The compile slots, leased or not.
    pub(super) fn compile(&self) -> &[Slot] {
        &self.compile
    }

    /// The devices served, in the order of the settings.
    pub(super) fn devices(&self) -> impl Iterator<Item = &DeviceId> {
        self.eval.iter().map(|(d, _)| d)
    }

    /// Every slot: the compile slots, then the evaluation slots.
    pub(super) fn all(&self) -> impl Iterator<Item = &Slot> {
        self.compile.iter().chain(self.eval.iter().map(|(_, s)| s))
    }

    /// The evaluation slot of `device`, if the pool serves it.
    pub(super) fn eval(&self, device: &DeviceId) -> Option<&Slot> {
        self.eval.iter().find(|(d, _)| d == device).map(|(_, s)| s)
    }

    /// Wait for a free compile slot and hold it until the lease is released (or dropped).
    pub(super) async fn lease_compile(&self) -> Result<CompileLease<'_>, NoLease> {
        let Ok(permit) = self.compile_permits.acquire().await else {
            return Err(NoLease::Closed);
        };
        let index = match self.compile_free.lock() {
            Ok(mut free) => free.pop(),
            Err(poisoned) => poisoned.into_inner().pop(),
        };
        let Some(index) = index else {
            return Err(NoLease::NoFreeSlot);
        };
        Ok(CompileLease {
            slots: self,
            index,
            free: FreeSlot {
                free: &self.compile_free,
                index,
            },
            permit,
        })
    }
}

/// One compile slot held by one job. Dropped (also on cancellation), the slot and its permit go
/// back to the pool; [`CompileLease::release`] also retires them when the slot was retired.
pub(super) struct CompileLease<'a> {
    slots: &'a Slots,
    index: usize,
    // Dropped in this order: the slot goes back before its permit does.
    free: FreeSlot<'a>,
    permit: SemaphorePermit<'a>,
}

impl<'a> CompileLease<'a> {
    pub(super) fn slot(&self) -> &'a Slot {
        &self.slots.compile[self.index]
    }

    /// Give the slot back; a slot whose host was drained leaves the pool with its permit instead
    /// (and the last one to leave closes the permits).
    pub(super) fn release(self) {
        let CompileLease {
            slots,
            index,
            free,
            permit,
        } = self;
        if slots.compile[index].retired.load(Ordering::SeqCst) {
            std::mem::forget(free);
            permit.forget();
            let live = slots
                .compile
                .iter()
                .filter(|s| !s.retired.load(Ordering::SeqCst))
                .count();
            if live == 0 {
                slots.compile_permits.close();
            }
        } else {
            drop(free);
            drop(permit);
        }
    }
}
