//! [`EndReason`]: why a run ended, as its `run_ended` record says. A leaf of the log's types
//! ([`crate::types`] re-exports it): the engine writes it, the reducer folds it, the report and the
//! displays read it, all through this one type rather than by comparing strings.

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
    /// neither.
    pub fn of(stopped: Option<&str>, incomplete: Option<&str>) -> EndReason {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_to_the_logs_strings() {
        let finished = serde_json::to_string(&EndReason::of(None, None)).unwrap();
        assert_eq!(finished, "\"finished\"");
        let both = EndReason::of(Some("cancelled"), Some("2 tasks wait on the LLM endpoint"));
        let text = serde_json::to_string(&both).unwrap();
        assert_eq!(text, "\"cancelled; 2 tasks wait on the LLM endpoint\"");
        assert_eq!(serde_json::from_str::<EndReason>(&text).unwrap(), both);
        let back: EndReason = serde_json::from_str("\"finished\"").unwrap();
        assert!(back.is_finished());
        assert!(!EndReason::from("stopped").is_finished());
    }
}
