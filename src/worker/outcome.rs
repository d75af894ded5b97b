//! Failures of a call to a worker ([`CallError`]) and the one mapping from a failure to the words of
//! a verdict ([`failure`]): every phase (compile, evaluate, profile, prepare) reads the error arms
//! through it, and builds its own outcome type from the [`Failure`] it returns.

use std::time::{Duration, Instant};

use super::WorkerError;
use super::loss::Fault;
use crate::services::Unavailable;
use crate::types::WorkerLoss;
use crate::types::{ExitInfo, RequestError};

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

/// The request a failure interrupted: it picks the wording (each phase's messages are what its
/// verdicts have always said).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Compile,
    Evaluate,
    Profile,
    Prepare,
}

/// What kind of failure it was, for the phases that record more than the message.
pub(super) enum FailureKind {
    /// The deadline (or the reference's allowance) passed; the worker was killed.
    Timeout(Duration),
    /// The worker ended on its own.
    Exited(ExitInfo),
    /// `ok: false` from the harness; the worker is kept.
    Harness(String),
    /// The worker broke its stream or the protocol, could not be started, was lost, or the pool was
    /// shut down.
    Broken,
}

/// A failure in words: the message, and the worker log's last lines where the worker left some.
pub(super) struct Failure {
    pub(super) kind: FailureKind,
    pub(super) message: String,
    pub(super) log_tail: String,
}

/// The one mapping from a call's error to what a verdict says about it.
pub(super) fn failure(err: &CallError, phase: Phase) -> Failure {
    use Phase::{Compile, Evaluate, Prepare, Profile};
    let (kind, message, log_tail) = match err {
        CallError::Request(
            RequestError::Timeout { after } | RequestError::ReferenceTimeout { after },
        ) => {
            let message = match phase {
                Compile => format!(
                    "compilation exceeded {} s; the worker was killed",
                    secs(*after)
                ),
                Evaluate => format!(
                    "evaluation exceeded {} s; the worker was killed",
                    secs(*after)
                ),
                Profile => format!(
                    "profiling exceeded {} s; the worker was killed",
                    secs(*after)
                ),
                Prepare => format!(
                    "preparing the reference exceeded eval.timeouts.reference_s ({} s); the worker \
                     was killed",
                    after.as_secs_f64()
                ),
            };
            (FailureKind::Timeout(*after), message, String::new())
        }
        CallError::Request(RequestError::Exited { exit, log_tail }) => {
            let how = exit.describe();
            let message = match phase {
                Compile => format!("the compile worker exited with {how} while compiling"),
                Evaluate => format!("worker exited with {how} while evaluating"),
                Profile => format!("worker exited with {how} while profiling"),
                Prepare => format!("the worker exited with {how} while preparing"),
            };
            (FailureKind::Exited(exit.clone()), message, log_tail.clone())
        }
        CallError::Request(RequestError::StreamClosed { log_tail }) => {
            let message = match phase {
                Compile => "the compile worker closed its protocol stream while compiling; it was \
                            killed"
                    .to_string(),
                Evaluate => {
                    "worker closed its protocol stream while evaluating; it was killed".into()
                }
                Profile => {
                    "worker closed its protocol stream while profiling; it was killed".into()
                }
                Prepare => {
                    "the worker closed its protocol stream while preparing; it was killed".into()
                }
            };
            (FailureKind::Broken, message, log_tail.clone())
        }
        CallError::Request(RequestError::Protocol { detail, log_tail }) => {
            let message = match phase {
                Compile => {
                    format!("the compile worker broke the protocol ({detail}); it was killed")
                }
                Evaluate => {
                    format!("worker broke the protocol while evaluating ({detail}); it was killed")
                }
                Profile => {
                    format!("worker broke the protocol while profiling ({detail}); it was killed")
                }
                Prepare => format!(
                    "the worker broke the protocol while preparing ({detail}); it was killed"
                ),
            };
            (FailureKind::Broken, message, log_tail.clone())
        }
        CallError::Request(RequestError::Harness { error }) => {
            let message = match phase {
                Compile => format!("the compile harness failed: {error}"),
                Evaluate => format!("the evaluation harness failed: {error}"),
                Profile => format!("the profiling harness failed: {error}"),
                Prepare => format!("the harness failed while preparing: {error}"),
            };
            (FailureKind::Harness(error.clone()), message, String::new())
        }
        CallError::Start(e) => {
            let message = match phase {
                Compile => format!("no compile worker could be started: {e}"),
                Evaluate | Profile => format!("the evaluation worker could not be started: {e}"),
                Prepare => format!("no worker could be started: {e}"),
            };
            (FailureKind::Broken, message, String::new())
        }
        CallError::Closed => (FailureKind::Broken, closed().0, String::new()),
        // Retried by the callers, never turned into an outcome; kept total all the same.
        CallError::Lost(loss) => {
            let message = match phase {
                Compile => format!("the compile worker was lost: {}", loss.detail),
                Evaluate | Profile => format!("the evaluation worker was lost: {}", loss.detail),
                Prepare => format!("the worker was lost: {}", loss.detail),
            };
            (FailureKind::Broken, message, String::new())
        }
    };
    Failure {
        kind,
        message,
        log_tail,
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

    fn timeout() -> CallError {
        CallError::Request(RequestError::Timeout {
            after: Duration::from_secs(300),
        })
    }

    #[test]
    fn each_phase_words_a_timeout_as_its_verdicts_always_did() {
        let said = |phase| failure(&timeout(), phase).message;
        assert_eq!(
            said(Phase::Compile),
            "compilation exceeded 300 s; the worker was killed"
        );
        assert_eq!(
            said(Phase::Evaluate),
            "evaluation exceeded 300 s; the worker was killed"
        );
        assert_eq!(
            said(Phase::Profile),
            "profiling exceeded 300 s; the worker was killed"
        );
        assert_eq!(
            said(Phase::Prepare),
            "preparing the reference exceeded eval.timeouts.reference_s (300 s); the worker was \
             killed"
        );
        assert!(matches!(
            failure(&timeout(), Phase::Evaluate).kind,
            FailureKind::Timeout(d) if d == Duration::from_secs(300)
        ));
    }

    #[test]
    fn a_crash_keeps_its_exit_and_the_log_tail() {
        let err = CallError::Request(RequestError::Exited {
            exit: ExitInfo {
                code: Some(3),
                signal: None,
            },
            log_tail: "Traceback".into(),
        });
        let f = failure(&err, Phase::Evaluate);
        assert_eq!(f.message, "worker exited with exit code 3 while evaluating");
        assert_eq!(f.log_tail, "Traceback");
        assert!(matches!(
            f.kind,
            FailureKind::Exited(ExitInfo { code: Some(3), .. })
        ));
        let closed = CallError::Request(RequestError::StreamClosed {
            log_tail: String::new(),
        });
        assert_eq!(
            failure(&closed, Phase::Compile).message,
            "the compile worker closed its protocol stream while compiling; it was killed"
        );
        let harness = CallError::Request(RequestError::Harness {
            error: "bad request".into(),
        });
        let f = failure(&harness, Phase::Prepare);
        assert_eq!(f.message, "the harness failed while preparing: bad request");
        assert!(matches!(f.kind, FailureKind::Harness(e) if e == "bad request"));
        assert_eq!(
            failure(&CallError::Closed, Phase::Profile).message,
            "the worker pool was shut down"
        );
    }
}
