//! The pool's side of preparing reference data ahead of candidates: turning a `prepare` response, or
//! the reason there is none, into the [`PrepareOutcome`] the engine logs (see `src/refprep.rs`).

use std::time::Instant;

use super::outcome::CallError;
use super::process::RequestError;
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
    match e {
        CallError::Request(RequestError::Timeout { after })
        | CallError::Request(RequestError::ReferenceTimeout { after }) => format!(
            "preparing the reference exceeded eval.timeouts.reference_s ({} s); the worker was killed",
            after.as_secs_f64()
        ),
        CallError::Request(RequestError::Exited { exit, .. }) => {
            format!("the worker exited with {} while preparing", exit.describe())
        }
        CallError::Request(RequestError::StreamClosed { .. }) => {
            "the worker closed its protocol stream while preparing; it was killed".into()
        }
        CallError::Request(RequestError::Protocol { detail, .. }) => {
            format!("the worker broke the protocol while preparing ({detail}); it was killed")
        }
        CallError::Request(RequestError::Harness { error }) => {
            format!("the harness failed while preparing: {error}")
        }
        CallError::Start(e) => format!("no worker could be started: {e}"),
        CallError::Closed => "the worker pool was shut down".into(),
        CallError::Lost(loss) => format!("the worker was lost: {}", loss.detail),
    }
}
