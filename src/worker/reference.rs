//! The pool's side of preparing reference data ahead of candidates: turning a `prepare` response, or
//! the reason there is none, into the [`PrepareOutcome`] the engine logs (see `src/refprep/`).

use std::time::Instant;

use super::outcome::{CallError, Phase, failure};
use super::protocol::{PrepareResponse, PrepareStatus as WireStatus};
use crate::types::{PrepareOutcome, PrepareStatus};

/// A step the harness answered.
pub(super) fn prepare_outcome(r: PrepareResponse) -> PrepareOutcome {
    let failed = r.status == WireStatus::ReferenceError;
    PrepareOutcome {
        status: if failed {
            PrepareStatus::ReferenceError
        } else {
            PrepareStatus::Ready
        },
        built: r.built,
        trials_ready: r.trials_ready,
        done: r.done,
        next: r.next,
        duration_ms: (r.seconds.max(0.0) * 1000.0) as u64,
        error: failed.then_some(r.feedback),
    }
}

/// A step that got no answer (the worker was killed or died, or the harness failed): nothing more
/// is prepared for the problem; its candidates build what they need themselves.
pub(super) fn prepare_failed(error: String, started: Instant) -> PrepareOutcome {
    PrepareOutcome {
        status: PrepareStatus::Failed,
        built: Vec::new(),
        trials_ready: 0,
        done: true,
        next: None,
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        error: Some(error),
    }
}

/// What went wrong with a call, in one line (the worker log keeps the rest).
pub(super) fn call_error_text(e: &CallError) -> String {
    failure(e, Phase::Prepare).message
}
