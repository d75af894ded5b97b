//! [`EndReason`]: why a run ended, as its `run_ended` record says, and [`StopReason`]: why a run
//! stops before every task finished, as the engine, the signal handling and the displays pass it
//! around. A leaf of the log's types ([`crate::types`] re-exports both): the engine writes the end,
//! the reducer folds it, the report and the displays read it, all through these types rather than by
//! comparing strings. In the log the end stays a string, as it always was.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The log's word for a run whose every task finished.
const FINISHED: &str = "finished";

/// Why a run ended. In the log it is a string, as it always was: `"finished"`, or what stopped the
/// run and what it left incomplete, joined by `"; "`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum EndReason {
    /// Every task finished.
    Finished,
    /// The run ended before every task finished (cancelled, stopped by a budget, tasks left waiting
    /// on an outage): the words the log holds.
    Stopped(String),
}

impl EndReason {
    /// The reason of a run that stopped for `stopped` and/or left `incomplete` work; `Finished` when
    /// neither. In the log both are one string, joined by `"; "` (as logs have always said it).
    pub fn of(stopped: Option<&StopReason>, incomplete: Option<&str>) -> EndReason {
        match (stopped, incomplete) {
            (Some(s), Some(i)) => EndReason::Stopped(format!("{s}; {i}")),
            (Some(s), None) => EndReason::Stopped(s.to_string()),
            (None, Some(i)) => EndReason::Stopped(i.to_string()),
            (None, None) => EndReason::Finished,
        }
    }

    pub fn is_finished(&self) -> bool {
        matches!(self, EndReason::Finished)
    }

    /// The log's text of it.
    pub fn as_str(&self) -> &str {
        match self {
            EndReason::Finished => FINISHED,
            EndReason::Stopped(s) => s,
        }
    }
}

impl From<String> for EndReason {
    fn from(s: String) -> Self {
        if s == FINISHED {
            EndReason::Finished
        } else {
            EndReason::Stopped(s)
        }
    }
}

impl From<&str> for EndReason {
    fn from(s: &str) -> Self {
        EndReason::from(s.to_string())
    }
}

impl From<EndReason> for String {
    fn from(r: EndReason) -> String {
        match r {
            EndReason::Finished => FINISHED.to_string(),
            EndReason::Stopped(s) => s,
        }
    }
}

impl std::ops::Deref for EndReason {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq<str> for EndReason {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for EndReason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A signal that asks a run to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ShutdownSignal {
    /// SIGHUP: the terminal went away.
    Hangup,
    /// SIGTERM: a scheduler, `kill`, `timeout`.
    Terminate,
    /// SIGINT: Ctrl-C at a terminal (or `kill -INT`).
    Interrupt,
}

impl ShutdownSignal {
    /// The signal's name (`SIGTERM`).
    pub fn name(self) -> &'static str {
        match self {
            ShutdownSignal::Hangup => "SIGHUP",
            ShutdownSignal::Terminate => "SIGTERM",
            ShutdownSignal::Interrupt => "SIGINT",
        }
    }

    /// The shell's status for a process this signal ended: 128 + its number.
    pub fn exit_status(self) -> u8 {
        match self {
            ShutdownSignal::Hangup => 129,
            ShutdownSignal::Interrupt => 130,
            ShutdownSignal::Terminate => 143,
        }
    }
}

/// Why a run stops before every task finished. The order is severity (nextest's `CancelReason`
/// is the model): a reason replaces a recorded one only when it is more severe, so a Ctrl-C after
/// the budget ran out says "interrupted", and a budget reached while stopping changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StopReason {
    /// No new LLM request may start (the budget was reached, the provider refused for good: a bad
    /// key, an unknown model); steps already under way finish and are recorded.
    LlmStopped(String),
    /// A task's driver failed; every other task stops too.
    Failed(String),
    /// Cancelled by whoever drives the engine, without a reason (tests, programs embedding it).
    Cancelled,
    /// Ctrl-C, SIGINT, or `q` in the terminal UI: stop cleanly, the log stays valid.
    Interrupted,
    /// SIGTERM or SIGHUP: stop cleanly, the log stays valid.
    Signal(ShutdownSignal),
    /// A second stop request while the run was stopping: stop now, without waiting for the steps
    /// under way (their results are not recorded; a resume redoes them).
    SecondSignal,
}

impl StopReason {
    /// The reason a signal gives when it is the first to stop the run.
    pub fn from_signal(sig: ShutdownSignal) -> StopReason {
        match sig {
            ShutdownSignal::Interrupt => StopReason::Interrupted,
            other => StopReason::Signal(other),
        }
    }

    /// Whether the steps under way are cancelled (everything but [`StopReason::LlmStopped`], which
    /// only keeps new LLM requests from starting).
    pub fn cancels_steps(&self) -> bool {
        !matches!(self, StopReason::LlmStopped(_))
    }

    /// Whether it came from outside the run (a signal, a key), as opposed to the run itself; the
    /// first such request stops the run cleanly and the second stops it at once.
    pub fn is_shutdown(&self) -> bool {
        matches!(
            self,
            StopReason::Interrupted | StopReason::Signal(_) | StopReason::SecondSignal
        )
    }

    /// `krefine run`'s exit status for a run that stopped for this reason: the shell's status for
    /// the signal (130 for an interrupt), 1 for a stop from within the run.
    pub fn exit_status(&self) -> u8 {
        match self {
            StopReason::LlmStopped(_) | StopReason::Failed(_) => 1,
            StopReason::Cancelled | StopReason::Interrupted | StopReason::SecondSignal => 130,
            StopReason::Signal(sig) => sig.exit_status(),
        }
    }
}

/// The log's words for it (`run_ended`'s `reason`, before any incomplete work).
impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::LlmStopped(why) | StopReason::Failed(why) => f.write_str(why),
            StopReason::Cancelled => f.write_str("cancelled"),
            StopReason::Interrupted => f.write_str("interrupted"),
            StopReason::Signal(sig) => write!(f, "stopped by {}", sig.name()),
            StopReason::SecondSignal => f.write_str("stopped at once by a second signal"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_to_the_logs_strings() {
        let finished = serde_json::to_string(&EndReason::of(None, None)).unwrap();
        assert_eq!(finished, "\"finished\"");
        let both = EndReason::of(
            Some(&StopReason::Cancelled),
            Some("2 tasks wait on the LLM endpoint"),
        );
        let text = serde_json::to_string(&both).unwrap();
        assert_eq!(text, "\"cancelled; 2 tasks wait on the LLM endpoint\"");
        assert_eq!(serde_json::from_str::<EndReason>(&text).unwrap(), both);
        let back: EndReason = serde_json::from_str("\"finished\"").unwrap();
        assert!(back.is_finished());
        assert!(!EndReason::from("stopped").is_finished());
    }

    #[test]
    fn reasons_are_ordered_by_severity_and_say_their_exit_status() {
        let budget = StopReason::LlmStopped("budget exhausted: usd".into());
        let term = StopReason::from_signal(ShutdownSignal::Terminate);
        assert!(budget < StopReason::Interrupted && StopReason::Interrupted < term);
        assert!(term < StopReason::SecondSignal);
        assert_eq!(
            StopReason::from_signal(ShutdownSignal::Interrupt),
            StopReason::Interrupted
        );
        assert!(!budget.cancels_steps() && !budget.is_shutdown());
        assert!(term.cancels_steps() && term.is_shutdown());
        assert_eq!(
            (
                budget.exit_status(),
                StopReason::Interrupted.exit_status(),
                term.exit_status()
            ),
            (1, 130, 143)
        );
        assert_eq!(term.to_string(), "stopped by SIGTERM");
        assert_eq!(budget.to_string(), "budget exhausted: usd");
    }
}
