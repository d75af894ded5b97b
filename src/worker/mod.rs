//! Python worker processes: the harness shipped in the binary, CPU compile pool, per-device evaluation
//! workers, timeouts, crash containment and respawn.
//!
//! Floors, bottom up (each file imports only from files above it in this list, never back):
//!
//! - [`protocol`]: the JSON-lines messages (docs/worker-protocol.md) as serde types.
//! - [`harness`]: the Python harness embedded with `include_str!` and written to a cache folder.
//! - [`python`]: finding an interpreter that imports torch.
//! - `session`: signalling a worker's whole session; `budget`: a request's two clocks;
//!   `spawn_spec`: how to start one worker and its scrubbed environment; `worker_log`: the worker
//!   log, its per-request cap and its tail.
//! - `sandbox_enter`: entering the namespaces between `fork` and `exec` (the id maps, the mounts,
//!   PID 1 and the supervisor left outside it).
//! - [`sandbox`]: the namespaces every worker runs in (no other process, no network, a read-only
//!   file system view with its own scratch writable): the spec, its preparation, the probe.
//! - [`process`]: one worker process: own process group, `ready`, requests under a deadline, kill,
//!   reap (re-exports the pieces above where callers have always found them).
//! - `loss`: lost workers (remote launchers), when to give up retrying.
//! - `outcome`: [`pool`]'s call failures and the one mapping from a failure to a verdict's words.
//! - `reference`: outcomes of preparing a problem's reference data ahead of its candidates.
//! - [`input_store`]: the on-disk store of reference inputs made on the CPU, off the device lease.
//! - [`input_admission`]: how large that store may grow and which entries go to make room.
//! - `build_store`: publishing builds into the shared cache, sealing them, the copy-on-write taint
//!   check.
//! - [`pause`]: stopping the compile pool while the CPU device times a candidate.
//! - `settings`: [`WorkerSettings`] and the validated deadlines; `slot`: one worker position, and the
//!   pool's positions with the lease of a compile slot; `sandbox_spec`: probing the sandbox and each
//!   worker's file system view.
//! - `inputs`: the inputs room: this pool's input stores (disk and in-memory tiers), what their
//!   entries are made of, and the CPU stage of reference preparation.
//! - `build_cache`: the build room (`Builds`: the content-addressed build cache, its keys, the build
//!   dirs' locks and markers).
//! - `call`: the call room (`Calls`: one request through a slot, closing, lost workers).
//! - [`pool`]: [`WorkerPool`] itself, the owner of the parts above (start, shutdown); above it the
//!   rooms that do its jobs through them: `compile` (the compile room, the `Compiler`); `eval_room`
//!   (the evaluation room: what a job on a device's worker works through, and the settings that make
//!   a reference spec), with its jobs `prepare` (reference preparation) and `execute` (evaluate,
//!   profile; the `Executor`).
//! - [`baseline`]: KernelBench baseline timing files.

pub mod baseline;
mod budget;
mod build_cache;
mod build_store;
mod call;
mod compile;
pub mod config;
mod eval_room;
mod execute;
pub mod harness;
pub mod input_admission;
pub mod input_store;
mod inputs;
mod loss;
mod outcome;
pub mod pause;
pub mod pool;
mod prepare;
mod probes;
pub mod process;
pub mod protocol;
pub mod python;
mod reference;
pub mod sandbox;
mod sandbox_enter;
mod sandbox_spec;
mod session;
mod settings;
mod slot;
mod spawn_spec;
mod worker_log;

use std::path::PathBuf;

pub use baseline::{BaselineEntry, BaselineTable};
pub use harness::{HARNESS_ENTRY, HARNESS_FILES, deploy_harness, harness_digest};
pub use pool::WorkerPool;
pub use python::find_python;
pub use settings::WorkerSettings;
pub use spawn_spec::LEASE_TRACE_ENV;

/// Why the worker machinery could not do its job (as opposed to a candidate failing, which is a verdict).
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no Python interpreter that imports torch was found; tried: {tried}")]
    PythonNotFound { tried: String },
    #[error("Python interpreter {python} cannot be used: {detail}")]
    PythonUnusable { python: PathBuf, detail: String },
    #[error("cannot start worker {worker} ({program}): {source}")]
    Spawn {
        worker: String,
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("worker {worker} failed to start: {detail}{}", tail_suffix(.log_tail))]
    Start {
        worker: String,
        detail: String,
        log_tail: String,
    },
    #[error("baseline {path}: {key}: {detail}")]
    Baseline {
        path: PathBuf,
        key: String,
        detail: String,
    },
    #[error("worker settings: {0}")]
    Settings(String),
}

fn tail_suffix(tail: &str) -> String {
    if tail.trim().is_empty() {
        String::new()
    } else {
        format!("\nlast lines of the worker log:\n{tail}")
    }
}

impl WorkerError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        WorkerError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
