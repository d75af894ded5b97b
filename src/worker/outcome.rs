//! Failures of a call to a worker ([`CallError`]) and the helpers that word them for a verdict.

use std::time::{Duration, Instant};

use super::WorkerError;
use super::loss::Fault;
use super::process::RequestError;
use crate::services::Unavailable;
use crate::types::WorkerLoss;

/// Why a slot could not produce a response.
pub(super) enum CallError {
    Start(WorkerError),
    Request(RequestError),
    Closed,
    /// The worker's node, step or connection died (remote launchers): retried elsewhere.
    Lost(WorkerLoss),
}

pub(super) fn closed() -> Unavailable {
    Unavailable("the worker pool was shut down".into())
}

impl CallError {
    /// Sort a failure: the candidate's (a verdict: `Ok`) or the machinery's (`Err`: no worker could
    /// be started, the pool was shut down), which leaves the turn unfinished for a resume.
    pub(super) fn candidate_fault(self) -> Result<CallError, Fault> {
        match self {
            CallError::Start(e) => Err(Fault::Unavailable(Unavailable(format!(
                "no worker could be started: {e}"
            )))),
            CallError::Closed => Err(Fault::Unavailable(closed())),
            CallError::Lost(loss) => Err(Fault::Lost(loss)),
            other => Ok(other),
        }
    }
}

pub(super) fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Seconds for messages: `300`, or `2.5` when fractional.
pub(super) fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}")
    } else {
        format!("{s}")
    }
}

pub(super) fn with_tail(message: String, tail: &str) -> String {
    if tail.trim().is_empty() {
        message
    } else {
        format!("{message}\nlast lines of the worker log:\n{tail}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_read_naturally() {
        assert_eq!(secs(Duration::from_secs(300)), "300");
        assert_eq!(secs(Duration::from_millis(2500)), "2.5");
    }
}
