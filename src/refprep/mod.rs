//! Reference data off the critical path: a problem's reference inputs, outputs, timing inputs and
//! reference timing are built while its first answer is still being generated and compiled.
//!
//! - When a task's LLM request starts, its problem is *coming* ([`Preparer::coming`]); when the task
//!   reaches its execute (or ends its turn some other way) it has *arrived* ([`Preparer::arrived`]).
//! - Two stages, one background loop ([`run`]):
//!   - **CPU** ([`Executor::make_inputs`]): the problem's inputs are made on the CPU into the on-disk
//!     store (`worker::input_store`), in a process of their own, **holding no device lease**. Every
//!     problem of the run is sized first ([`Executor::plan_inputs`]: one planner process, nothing
//!     made); every coming problem is then taken, the largest first (they take longest),
//!     [`cpu_ahead`] at once (each one fans out over several processes when its inputs are large, and
//!     claims from the CPU budget the processes its maker runs): how far ahead this runs adapts to
//!     what is queued, not to a fixed count. Logged as [`Event::InputsPrepared`].
//!   - **Device** (one problem at a time on each device, the devices side by side): once its inputs
//!     are made, a problem is prepared step by step ([`Executor::prepare_reference`]: the next
//!     trial, the timing inputs, the reference timing; the inputs are read from the store). Prepared
//!     data is per (problem, device): each device's worker keeps its own (its tensors and the CUDA
//!     IPC handles it gives candidate processes live on that device), while the inputs on disk are
//!     made once for all devices. Candidates take whichever device is free, so a problem is prepared
//!     on as many devices as it has tasks coming (at most all of them), each device holding at most
//!     `ahead` problems prepared and not yet arrived (`resources.prepare_ahead`: a worker keeps the
//!     reference data of a few problems only).
//! - A candidate about to take a lease for a problem whose inputs are still being made (or queued to
//!   be) waits for them off the lease ([`Preparer::inputs_ready`], which moves that problem to the
//!   front), rather than making them again on the device.
//! - Every step holds that device's lease, taken only while no candidate waits for a device
//!   ([`DevicePool::acquire_idle`]), so preparation never overlaps a timing and never delays a
//!   candidate by more than the one step in flight. On the CPU device the reference is timed only
//!   while the builds are paused, as a candidate's timing is. Each step is logged as
//!   [`Event::ReferencePrepared`] (run-level, informational).
//! - A problem whose candidate arrives first simply builds what its check reaches, trial by trial
//!   (the harness stops at the first failing trial where KernelBench does); preparation never
//!   changes a verdict, only when the work is done.
//!
//! - A device found lost during a step (its worker no longer starts there) is retired, logged as
//!   [`Event::DeviceRetired`]; its problems go to the devices left.
//!
//! Nothing here is folded on resume: a resumed run's workers start empty, and problems are prepared
//! again as their tasks go on.
//!
//! The room is cut by job: [`queue`] (which problems to prepare, where and in which order, and the
//! [`Preparer`] the task drivers and the loop share) and [`stages`] (the background loop: the CPU
//! stage, each device's stage, and one problem's preparation).
//!
//! [`Executor::make_inputs`]: crate::services::Executor::make_inputs
//! [`Executor::plan_inputs`]: crate::services::Executor::plan_inputs
//! [`Executor::prepare_reference`]: crate::services::Executor::prepare_reference
//! [`DevicePool::acquire_idle`]: crate::gpu::DevicePool::acquire_idle
//! [`Event::InputsPrepared`]: crate::types::Event::InputsPrepared
//! [`Event::ReferencePrepared`]: crate::types::Event::ReferencePrepared
//! [`Event::DeviceRetired`]: crate::types::Event::DeviceRetired

pub mod queue;
pub mod stages;

pub use queue::{MAX_AHEAD, PrepQueue, Preparer, cpu_ahead};
pub use stages::{Ended, Made, PrepServices, make_inputs, prepare_problem, run};
