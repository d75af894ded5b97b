//! Why a request to a worker got no usable response ([`RequestError`]) and how its process ended
//! ([`ExitInfo`]). A leaf: the launcher reads these to tell a lost worker from a candidate's failure.

use std::process::ExitStatus;
use std::time::Duration;

/// How a worker process ended, in words and numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl ExitInfo {
    pub fn from_status(status: ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        ExitInfo {
            code: status.code(),
            signal: status.signal(),
        }
    }

    /// `exit code 3`, `signal 11 (SIGSEGV)`.
    pub fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("signal {s} ({})", signal_name(s)),
            (None, None) => "an unknown status".into(),
        }
    }
}

pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        31 => "SIGSYS",
        _ => "unknown signal",
    }
}

/// Why a request got no usable response. Except for `Harness`, the worker is dead (killed and reaped)
/// when this is returned.
#[derive(Debug, Clone)]
pub enum RequestError {
    /// The deadline passed; the worker was killed.
    Timeout { after: Duration },
    /// Reference work the worker announced (progress notices) used up its own allowance
    /// (`eval.timeouts.reference_s`); the worker was killed. Not the candidate's time.
    ReferenceTimeout { after: Duration },
    /// The worker ended on its own (crash, `os._exit`, OOM killer).
    Exited { exit: ExitInfo, log_tail: String },
    /// The worker closed its protocol stream but would not exit; it was killed.
    StreamClosed { log_tail: String },
    /// The worker wrote something that is not a valid response; it was killed.
    Protocol { detail: String, log_tail: String },
    /// `ok: false`: the harness refused the request or failed internally. The worker is kept.
    Harness { error: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_descriptions() {
        let segv = ExitInfo {
            code: None,
            signal: Some(11),
        };
        assert_eq!(segv.describe(), "signal 11 (SIGSEGV)");
        let three = ExitInfo {
            code: Some(3),
            signal: None,
        };
        assert_eq!(three.describe(), "exit code 3");
    }
}
