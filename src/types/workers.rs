//! What a worker process tells the rooms that start it (the worker pool and the launcher): where it
//! runs, as it sees it ([`WorkerPlacement`], in its `ready` line), how its process ended
//! ([`ExitInfo`]) and why a request to it got no usable response ([`RequestError`]). A leaf of
//! [`super`]: the launcher reads these to record where a worker ran, to kill its far side and to tell
//! a lost worker from a candidate's failure, without importing the worker room that sits above it.

use std::process::ExitStatus;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Where a worker runs, as it sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerPlacement {
    /// `socket.gethostname()`.
    pub host: String,
    /// `SLURM_JOB_ID` and `SLURM_STEP_ID` of a worker started as a Slurm step.
    #[serde(default)]
    pub slurm_job_id: Option<String>,
    #[serde(default)]
    pub slurm_step_id: Option<String>,
    /// The GPU's UUID (GPU workers on a CUDA device).
    #[serde(default)]
    pub gpu_uuid: Option<String>,
    /// What builds depend on besides torch and the arch list: machine, libc, C++ compiler and
    /// nvcc versions (part of the build key).
    #[serde(default)]
    pub toolchain: Option<String>,
}

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
