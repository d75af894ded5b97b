//! One worker process: spawn with a scrubbed environment in its own process group, wait for `ready`,
//! send requests with a deadline, and kill the whole group when anything goes wrong.
//!
//! Ownership does the cleanup: dropping a [`WorkerProcess`] (including dropping a future that was in
//! the middle of a request) SIGKILLs its process group, so a cancelled or panicking caller never leaves
//! a half-used worker or an orphan behind.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncSeekExt, AsyncWriteExt, BufReader,
};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};
use tokio::sync::watch;

use super::WorkerError;
use super::harness::HARNESS_ENTRY;
use super::protocol::{
    OkResponse, Ready, ReferencePhase, Request, RequestBody, Response, ResponseBody, WorkerRole,
    parse_response,
};
use super::sandbox::SandboxSpec;
use crate::launcher::{Launcher, Placement};

/// Longest response line accepted. Real responses are kilobytes (feedback is trimmed to ~4 KB,
/// tracebacks and metadata a few more); anything this long is a broken or hostile stream.
const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// A worker log is rotated (to `.log.1`) at spawn once it is this big: print floods must not fill the
/// disk over a long run.
const LOG_ROTATE_BYTES: u64 = 64 * 1024 * 1024;
/// What one request (or the start-up) may add to the worker log: everything a candidate prints goes
/// there, and a candidate that prints without end must not fill the disk. The rest is dropped with a
/// note; the next request starts a fresh allowance.
pub const LOG_BYTES_PER_REQUEST: u64 = 8 * 1024 * 1024;
/// How long reading a dead worker's log tail waits for its output to be written out.
const LOG_SETTLE: Duration = Duration::from_secs(2);
/// How long to wait for a killed process to be reaped. SIGKILL is immediate unless the process is in
/// uninterruptible sleep (a wedged driver call); then we give up and let tokio reap it later.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);
/// After the protocol stream ends, how long to wait for the exit status that says why.
const EXIT_STATUS_WAIT: Duration = Duration::from_secs(5);

/// Environment variables passed through from the orchestrator when set. Everything else is dropped.
const PASS_THROUGH: [&str; 12] = [
    "PATH",
    // The build switches the harness documents (README "Builds"): a user's own nvcc wrapper, and
    // turning off the overlapped nvcc or the split C++ build.
    "PYTORCH_NVCC",
    "KREFINE_NVCC_OVERLAP",
    "KREFINE_SPLIT_CPP",
    // The order in which the driver numbers devices must match the orchestrator's, or a worker's
    // CUDA_VISIBLE_DEVICES index names another GPU.
    "CUDA_DEVICE_ORDER",
    "LANG",
    "LC_ALL",
    "CUDA_HOME",
    "CUDA_PATH",
    "LD_LIBRARY_PATH",
    "CC",
    "CXX",
];
/// Names that never reach a worker, whatever an allowlist says.
const SECRET_MARKERS: [&str; 5] = ["KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL"];

/// Send `signal` to every process of the worker's session `sid` (the worker is its session and
/// group leader): its process group, then each other member found in /proc. ninja starts each
/// compiler in a process group of its own, so signalling the worker's group alone would miss
/// `cc1plus`/`nvcc`; every descendant stays in the session unless it calls `setsid` itself. Refuses 0
/// and 1 (our own group / init), which a bug must never turn into "signal everything".
///
/// Reads /proc synchronously: call it off the async runtime ([`signal_session_async`]).
pub fn signal_session(sid: u32, signal: Signal) {
    let Some(sid) = session_pid(sid) else {
        return;
    };
    // ESRCH (already gone) is the common, harmless case; nothing useful to do on error.
    let _ = killpg(sid, signal);
    for pid in session_members(sid.as_raw()) {
        let _ = kill(Pid::from_raw(pid), signal);
    }
}

/// [`signal_session`] on a blocking thread; returns once every member was signalled.
pub async fn signal_session_async(sid: u32, signal: Signal) {
    if session_pid(sid).is_none() {
        return;
    }
    let _ = tokio::task::spawn_blocking(move || signal_session(sid, signal)).await;
}

/// SIGKILL the worker's session now, from synchronous code (Drop): the group is killed at once; the
/// /proc scan for members in other groups runs on a blocking thread when a runtime is there.
pub fn kill_group(sid: u32) {
    let Some(pgid) = session_pid(sid) else {
        return;
    };
    let _ = killpg(pgid, Signal::SIGKILL);
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn_blocking(move || signal_session(sid, Signal::SIGKILL));
        }
        Err(_) => signal_session(sid, Signal::SIGKILL),
    }
}

fn session_pid(sid: u32) -> Option<Pid> {
    let sid = i32::try_from(sid).ok()?;
    (sid > 1).then(|| Pid::from_raw(sid))
}

/// Processes whose session id is `sid`, from /proc (empty where /proc is unavailable).
fn session_members(sid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid > 1 && session_of(*pid) == Some(sid))
        .collect()
}

fn session_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')':
    // state ppid pgrp session ...
    let rest = stat.rsplit_once(')')?.1;
    rest.split_whitespace().nth(3)?.parse().ok()
}

/// How to start one worker.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    /// `compile-0`, `gpu-1`, `cpu-0`: names the log file and scratch folder.
    pub name: String,
    pub role: WorkerRole,
    pub python: PathBuf,
    pub harness_dir: PathBuf,
    /// The worker's own folder (HOME, TMPDIR, working directory); emptied at every spawn.
    pub scratch: PathBuf,
    /// stderr (and everything candidates print) goes here, appended across respawns.
    pub log_path: PathBuf,
    /// `Some("3")` for the worker of GPU 3, `Some("")` to hide every GPU.
    pub cuda_visible_devices: Option<String>,
    /// `TORCH_CUDA_ARCH_LIST`; `None` passes the orchestrator's own value through, if any.
    pub arch_list: Option<String>,
    pub load_timeout: Duration,
    /// Variables set on purpose by the orchestrator (the Hugging Face cache and offline mode);
    /// still subject to the secret filter.
    pub extra_env: Vec<(String, OsString)>,
    /// The namespaces sandbox to start the worker in (`None`: unconfined). See [`super::sandbox`].
    pub sandbox: Option<SandboxSpec>,
    /// Start the worker through a launcher (`srun`, `ssh`) instead of as a child process of its
    /// own (`None`). See [`crate::launcher`].
    pub remote: Option<Remote>,
}

/// A worker started through a remote launcher, at a placement.
#[derive(Debug, Clone)]
pub struct Remote {
    pub launcher: Arc<Launcher>,
    pub placement: Placement,
}

/// The complete environment of a worker: an allowlist, never anything that looks like a secret.
pub fn worker_env(spec: &SpawnSpec) -> Vec<(String, OsString)> {
    worker_env_from(spec, |name| std::env::var_os(name))
}

fn worker_env_from(
    spec: &SpawnSpec,
    ours: impl Fn(&str) -> Option<OsString>,
) -> Vec<(String, OsString)> {
    let mut env: Vec<(String, OsString)> = Vec::new();
    for name in PASS_THROUGH {
        if let Some(v) = ours(name) {
            env.push((name.to_string(), v));
        }
    }
    let scratch = spec.scratch.as_os_str().to_os_string();
    env.push(("HOME".into(), scratch.clone()));
    env.push(("TMPDIR".into(), scratch));
    env.push((
        "TORCH_EXTENSIONS_DIR".into(),
        spec.scratch.join("torch_extensions").into_os_string(),
    ));
    if let Some(cvd) = &spec.cuda_visible_devices {
        env.push(("CUDA_VISIBLE_DEVICES".into(), cvd.into()));
    }
    match &spec.arch_list {
        Some(a) => env.push(("TORCH_CUDA_ARCH_LIST".into(), a.into())),
        None => {
            if let Some(v) = std::env::var_os("TORCH_CUDA_ARCH_LIST") {
                env.push(("TORCH_CUDA_ARCH_LIST".into(), v));
            }
        }
    }
    env.extend(spec.extra_env.iter().cloned());
    env.retain(|(k, _)| {
        let upper = k.to_ascii_uppercase();
        !SECRET_MARKERS.iter().any(|m| upper.contains(m))
    });
    env
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

enum LineRead {
    Line,
    Eof,
    TooLong,
}

/// Read one `\n`-terminated line into `buf` (without the newline), refusing lines over `max` bytes.
///
/// Kept by hand rather than tokio-util's `LinesCodec`: it reads bytes (a stray non-UTF-8 byte is a
/// protocol error with the line quoted, not a decoder failure), stops at the first overlong line
/// instead of discarding up to the next newline, and is a dozen lines with its own test.
async fn read_line_capped<R: AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<LineRead> {
    buf.clear();
    loop {
        let available = r.fill_buf().await?;
        if available.is_empty() {
            return Ok(LineRead::Eof);
        }
        if let Some(i) = available.iter().position(|&b| b == b'\n') {
            buf.extend_from_slice(&available[..i]);
            r.consume(i + 1);
            return Ok(LineRead::Line);
        }
        let n = available.len();
        buf.extend_from_slice(available);
        r.consume(n);
        if buf.len() > max {
            return Ok(LineRead::TooLong);
        }
    }
}

/// The last `max_lines` lines written to `path` after byte `from` (this incarnation's part of a log
/// shared across respawns), each clipped, for verdict feedback.
pub async fn log_tail(path: &Path, from: u64, max_lines: usize) -> String {
    const WINDOW: u64 = 16 * 1024;
    const LINE_CHARS: usize = 300;
    let Ok(mut f) = tokio::fs::File::open(path).await else {
        return String::new();
    };
    let Ok(meta) = f.metadata().await else {
        return String::new();
    };
    let start = from.max(meta.len().saturating_sub(WINDOW));
    if start >= meta.len() || f.seek(std::io::SeekFrom::Start(start)).await.is_err() {
        return String::new();
    }
    let mut bytes = Vec::new();
    if f.read_to_end(&mut bytes).await.is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let first = lines.len().saturating_sub(max_lines);
    lines[first..]
        .iter()
        .map(|l| {
            if l.chars().count() > LINE_CHARS {
                let cut: String = l.chars().take(LINE_CHARS).collect();
                format!("{cut} ... [line truncated]")
            } else {
                (*l).to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A running worker.
pub struct WorkerProcess {
    name: String,
    child: Child,
    pid: u32,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    log_path: PathBuf,
    log_start: u64,
    /// Bytes of output the current request has sent to the log (reset per request).
    log_used: Arc<AtomicU64>,
    /// Becomes true once the log pump has written everything the worker's stderr carried.
    log_done: watch::Receiver<bool>,
    ready: Ready,
    next_id: u64,
    /// False once the group was killed or the process exited; Drop then has nothing to do.
    alive: bool,
    line: Vec<u8>,
    /// The launcher that started it remotely: killing the local `srun`/`ssh` is not enough.
    remote: Option<Remote>,
    /// Time the last request spent in reference work the worker announced (see [`Budget`]).
    reference_spent: Duration,
}

/// How long a request may take. `own` is the request's timeout; `reference`, when given, is a separate
/// allowance for reference work the worker announces with `progress` notices (building trial data a
/// candidate asked for, timing the reference): while such work runs, `own` stands still and
/// `reference` runs down instead, so a candidate is never charged for the reference. Without it,
/// notices change nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub own: Duration,
    pub reference: Option<Duration>,
}

impl Budget {
    pub fn plain(own: Duration) -> Budget {
        Budget {
            own,
            reference: None,
        }
    }
}

/// The two clocks of a request under a [`Budget`]: the request's own, which runs except while the
/// worker says it is doing reference work, and the reference allowance, which runs only then.
struct Clock {
    own_left: Duration,
    reference_left: Option<Duration>,
    /// When the running clock last started.
    since: tokio::time::Instant,
    /// The reference clock is the running one.
    in_reference: bool,
}

impl Clock {
    fn new(own_left: Duration, reference_left: Option<Duration>) -> Clock {
        Clock {
            own_left,
            reference_left,
            since: tokio::time::Instant::now(),
            in_reference: false,
        }
    }

    /// Time left on the running clock, and whether that is the reference's.
    fn remaining(&self) -> (Duration, bool) {
        let ran = self.since.elapsed();
        match (self.in_reference, self.reference_left) {
            (true, Some(left)) => (left.saturating_sub(ran), true),
            _ => (self.own_left.saturating_sub(ran), false),
        }
    }

    /// A notice arrived: charge the running clock what it ran and start the other. A repeated notice
    /// changes nothing; without an allowance for reference work, notices are ignored.
    fn switch(&mut self, phase: ReferencePhase) {
        let Some(reference_left) = self.reference_left else {
            return;
        };
        let start = phase == ReferencePhase::Start;
        if start == self.in_reference {
            return;
        }
        let now = tokio::time::Instant::now();
        let ran = now - self.since;
        if self.in_reference {
            self.reference_left = Some(reference_left.saturating_sub(ran));
        } else {
            self.own_left = self.own_left.saturating_sub(ran);
        }
        self.in_reference = start;
        self.since = now;
    }

    /// Reference time used so far (zero without an allowance).
    fn spent(&self, budget: Budget) -> Duration {
        match (budget.reference, self.reference_left) {
            (Some(total), Some(left)) => {
                let running = if self.in_reference {
                    self.since.elapsed()
                } else {
                    Duration::ZERO
                };
                total.saturating_sub(left).saturating_add(running)
            }
            _ => Duration::ZERO,
        }
    }
}

impl std::fmt::Debug for WorkerProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerProcess")
            .field("name", &self.name)
            .field("pid", &self.pid)
            .field("alive", &self.alive)
            .finish()
    }
}

impl WorkerProcess {
    /// Start a worker and wait (up to `spec.load_timeout`) for its `ready` line.
    pub async fn spawn(spec: &SpawnSpec) -> Result<WorkerProcess, WorkerError> {
        prepare_scratch(&spec.scratch).await?;
        if let Some(sandbox) = &spec.sandbox {
            // Overlay layers live in the scratch folder, which was just emptied.
            // Overlay layers start empty at every spawn: nothing one incarnation wrote survives.
            for o in &sandbox.overlays {
                if let Some(parent) = o.upper.parent() {
                    reset_dir(parent)
                        .await
                        .map_err(|e| WorkerError::io("reset overlay folder", parent, e))?;
                }
                for dir in [&o.upper, &o.work] {
                    reset_dir(dir)
                        .await
                        .map_err(|e| WorkerError::io("reset overlay folder", dir, e))?;
                }
            }
        }
        let (log_file, log_start) = open_log(spec).await?;

        let script = spec.harness_dir.join(HARNESS_ENTRY);
        let args: Vec<OsString> = vec![
            "-u".into(),
            script.into_os_string(),
            "serve".into(),
            "--role".into(),
            spec.role.as_str().into(),
            "--scratch".into(),
            spec.scratch.clone().into_os_string(),
        ];
        let mut cmd = match &spec.remote {
            None => {
                let mut c = tokio::process::Command::new(&spec.python);
                c.args(&args).env_clear().envs(worker_env(spec));
                c
            }
            Some(r) => r
                .launcher
                .command(
                    &r.placement,
                    &spec.name,
                    &spec.python,
                    &args,
                    &worker_env(spec),
                )
                .map_err(|e| WorkerError::Spawn {
                    worker: spec.name.clone(),
                    program: spec.python.clone(),
                    source: std::io::Error::other(e),
                })?,
        };
        cmd.current_dir(&spec.scratch)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Through a pipe and a capped pump rather than straight into the file: see
            // LOG_BYTES_PER_REQUEST.
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // Own session (and process group): ninja, nvcc and anything a candidate forks die with the
        // worker, see `kill_group`.
        // SAFETY: between fork and exec only the async-signal-safe `setsid` is called.
        unsafe {
            cmd.pre_exec(|| {
                nix::unistd::setsid().map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        // The sandbox, entered after `setsid` so the supervisor it leaves outside keeps the pid, the
        // session and the process group we kill.
        if let Some(sandbox) = &spec.sandbox {
            let mut prepared = sandbox.prepare().map_err(|e| WorkerError::Spawn {
                worker: spec.name.clone(),
                program: spec.python.clone(),
                source: std::io::Error::other(e),
            })?;
            // SAFETY: `enter` makes only async-signal-safe system calls on data prepared above.
            unsafe {
                cmd.pre_exec(move || prepared.enter());
            }
        }
        let mut child = cmd.spawn().map_err(|source| WorkerError::Spawn {
            worker: spec.name.clone(),
            program: spec.python.clone(),
            source,
        })?;
        let pid = child.id().unwrap_or(0);
        let log_used = Arc::new(AtomicU64::new(0));
        let (done_tx, log_done) = watch::channel(false);
        if let Some(stderr) = child.stderr.take() {
            let file = tokio::fs::File::from_std(log_file);
            tokio::spawn(pump_log(stderr, file, log_used.clone(), done_tx));
        } else {
            let _ = done_tx.send(true);
        }
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            signal_session_async(pid, Signal::SIGKILL).await;
            return Err(WorkerError::Start {
                worker: spec.name.clone(),
                detail: "stdin/stdout pipes were not created".into(),
                log_tail: String::new(),
            });
        };
        let mut worker = WorkerProcess {
            name: spec.name.clone(),
            child,
            pid,
            stdin,
            stdout: BufReader::with_capacity(64 * 1024, stdout),
            log_path: spec.log_path.clone(),
            log_start,
            log_used,
            log_done,
            ready: Ready {
                role: spec.role,
                python: String::new(),
                torch: String::new(),
                cuda: None,
                cuda_available: false,
                device: None,
                pid,
                placement: None,
            },
            next_id: 1,
            reference_spent: Duration::ZERO,
            alive: true,
            line: Vec::new(),
            remote: spec.remote.clone(),
        };
        match worker.read_response(spec.load_timeout).await {
            Ok(Response::Ok(r)) if r.id == 0 => match r.body {
                ResponseBody::Ready(ready) => {
                    if ready.role != spec.role {
                        worker.kill().await;
                        return Err(worker
                            .start_error(format!(
                                "asked for role {}, worker says {}",
                                spec.role.as_str(),
                                ready.role.as_str()
                            ))
                            .await);
                    }
                    worker.ready = ready;
                    Ok(worker)
                }
                other => {
                    worker.kill().await;
                    Err(worker
                        .start_error(format!(
                            "first message is `{}`, expected `ready`",
                            other.kind()
                        ))
                        .await)
                }
            },
            Ok(other) => {
                worker.kill().await;
                Err(worker
                    .start_error(format!("first message is not a ready message: {other:?}"))
                    .await)
            }
            Err(e) => {
                let detail = match &e {
                    RequestError::Timeout { after } | RequestError::ReferenceTimeout { after } => {
                        format!(
                            "no `ready` within {} s (load timeout); the worker was killed",
                            after.as_secs_f64()
                        )
                    }
                    RequestError::Exited { exit, .. } => {
                        format!("exited with {} before it was ready", exit.describe())
                    }
                    RequestError::StreamClosed { .. } => {
                        "closed its protocol stream before it was ready".into()
                    }
                    RequestError::Protocol { detail, .. } => detail.clone(),
                    RequestError::Harness { error } => error.clone(),
                };
                Err(worker.start_error(detail).await)
            }
        }
    }

    async fn start_error(&self, detail: String) -> WorkerError {
        WorkerError::Start {
            worker: self.name.clone(),
            detail,
            log_tail: self.log_tail(20).await,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Process id, which is also the process group id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn ready(&self) -> &Ready {
        &self.ready
    }

    pub fn is_alive(&self) -> bool {
        self.alive
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// True (and the group is cleaned up) when the worker ended while idle, e.g. killed by the
    /// out-of-memory killer between requests. Checked before each request so that the next candidate
    /// is not blamed for it.
    pub fn exited_while_idle(&mut self) -> bool {
        if !self.alive {
            return true;
        }
        match self.child.try_wait() {
            Ok(Some(status)) => {
                self.alive = false;
                kill_group(self.pid);
                tracing::warn!(
                    "worker {} (pid {}) ended while idle with {}",
                    self.name,
                    self.pid,
                    ExitInfo::from_status(status).describe()
                );
                true
            }
            Ok(None) => false,
            // Cannot tell: treat it as alive; a real problem shows up as a failed request.
            Err(_) => false,
        }
    }

    /// The last lines this incarnation wrote to its log.
    pub async fn log_tail(&self, max_lines: usize) -> String {
        if !self.alive {
            // The pump may still hold the last lines a dead worker wrote.
            let mut done = self.log_done.clone();
            let _ = tokio::time::timeout(LOG_SETTLE, done.wait_for(|d| *d)).await;
        }
        log_tail(&self.log_path, self.log_start, max_lines).await
    }

    /// Send one request and wait for its response. Every failure but `Harness` leaves the worker dead.
    pub async fn request(
        &mut self,
        body: RequestBody,
        timeout: Duration,
    ) -> Result<ResponseBody, RequestError> {
        self.request_within(body, Budget::plain(timeout)).await
    }

    /// Time the last request spent in announced reference work (zero without an allowance for it).
    pub fn reference_spent(&self) -> Duration {
        self.reference_spent
    }

    /// Send one request and read its response within `budget` (see [`Budget`]).
    pub async fn request_within(
        &mut self,
        body: RequestBody,
        budget: Budget,
    ) -> Result<ResponseBody, RequestError> {
        self.reference_spent = Duration::ZERO;
        if !self.alive {
            return Err(RequestError::StreamClosed {
                log_tail: "the worker was already stopped".into(),
            });
        }
        let timeout = budget.own;
        let id = self.next_id;
        self.next_id += 1;
        let op = body.op();
        self.log_used.store(0, Ordering::SeqCst);
        let line = match serde_json::to_string(&Request { id, body }) {
            Ok(mut s) => {
                s.push('\n');
                s
            }
            // Our own types always serialize; if that ever breaks, say so instead of panicking.
            Err(e) => {
                return Err(RequestError::Harness {
                    error: format!("cannot encode {op} request: {e}"),
                });
            }
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let write = tokio::time::timeout_at(deadline, async {
            self.stdin.write_all(line.as_bytes()).await?;
            self.stdin.flush().await
        })
        .await;
        match write {
            Err(_) => {
                self.kill().await;
                return Err(RequestError::Timeout { after: timeout });
            }
            // Broken pipe: the worker is gone; find out how it ended.
            Ok(Err(_)) => return Err(self.ended().await),
            Ok(Ok(())) => {}
        }
        let mut clock = Clock::new(
            deadline.saturating_duration_since(tokio::time::Instant::now()),
            budget.reference,
        );
        let resp = loop {
            let (remaining, in_reference) = clock.remaining();
            let resp = match self.read_response(remaining).await {
                Err(RequestError::Timeout { .. }) => {
                    self.reference_spent = clock.spent(budget);
                    return Err(match (in_reference, budget.reference) {
                        (true, Some(after)) => RequestError::ReferenceTimeout { after },
                        _ => RequestError::Timeout { after: timeout },
                    });
                }
                Err(e) => {
                    self.reference_spent = clock.spent(budget);
                    return Err(e);
                }
                Ok(resp) => resp,
            };
            match resp {
                Response::Ok(OkResponse {
                    id: notice_id,
                    body: ResponseBody::Progress(notice),
                    ..
                }) if notice_id == id => clock.switch(notice.reference),
                other => break other,
            }
        };
        self.reference_spent = clock.spent(budget);
        if resp.id() != id {
            self.kill().await;
            return Err(RequestError::Protocol {
                detail: format!("response id {} does not match request id {id}", resp.id()),
                log_tail: self.log_tail(20).await,
            });
        }
        match resp {
            Response::Error(e) => Err(RequestError::Harness { error: e.error }),
            Response::Ok(r) if r.body.kind() != op => {
                self.kill().await;
                Err(RequestError::Protocol {
                    detail: format!("`{op}` request answered with a `{}`", r.body.kind()),
                    log_tail: self.log_tail(20).await,
                })
            }
            Response::Ok(r) => Ok(r.body),
        }
    }

    /// Read the next response line within `timeout`, noticing a worker that dies while we wait.
    async fn read_response(&mut self, timeout: Duration) -> Result<Response, RequestError> {
        let read = tokio::time::timeout(timeout, async {
            loop {
                // Biased: when the worker wrote a line and then exited, the line wins.
                let outcome = tokio::select! {
                    biased;
                    r = read_line_capped(&mut self.stdout, &mut self.line, MAX_LINE_BYTES) => Ok(r),
                    status = self.child.wait() => Err(status),
                };
                match outcome {
                    Ok(Ok(LineRead::Line)) => {
                        let text = String::from_utf8_lossy(&self.line);
                        if text.trim().is_empty() {
                            continue;
                        }
                        return ReadOutcome::Line(text.into_owned());
                    }
                    Ok(Ok(LineRead::TooLong)) => return ReadOutcome::TooLong,
                    Ok(Ok(LineRead::Eof)) | Ok(Err(_)) => return ReadOutcome::Eof,
                    Err(status) => return ReadOutcome::Exited(status.ok()),
                }
            }
        })
        .await;
        match read {
            Err(_) => {
                self.kill().await;
                Err(RequestError::Timeout { after: timeout })
            }
            Ok(ReadOutcome::Line(text)) => match parse_response(&text) {
                Ok(resp) => Ok(resp),
                Err(why) => {
                    self.kill().await;
                    Err(RequestError::Protocol {
                        detail: format!("unparseable response line ({why}): {}", clip(&text, 300)),
                        log_tail: self.log_tail(20).await,
                    })
                }
            },
            Ok(ReadOutcome::TooLong) => {
                self.kill().await;
                Err(RequestError::Protocol {
                    detail: format!("response line longer than {MAX_LINE_BYTES} bytes"),
                    log_tail: self.log_tail(20).await,
                })
            }
            Ok(ReadOutcome::Eof) => Err(self.ended().await),
            Ok(ReadOutcome::Exited(Some(status))) => {
                self.alive = false;
                // The leader is reaped; candidates' children may still hold the group.
                signal_session_async(self.pid, Signal::SIGKILL).await;
                Err(RequestError::Exited {
                    exit: ExitInfo::from_status(status),
                    log_tail: self.log_tail(20).await,
                })
            }
            Ok(ReadOutcome::Exited(None)) => {
                self.kill().await;
                Err(RequestError::StreamClosed {
                    log_tail: self.log_tail(20).await,
                })
            }
        }
    }

    /// The protocol stream ended: wait briefly for the exit status that explains it, then make sure
    /// the whole group is gone.
    async fn ended(&mut self) -> RequestError {
        match tokio::time::timeout(EXIT_STATUS_WAIT, self.child.wait()).await {
            Ok(Ok(status)) => {
                self.alive = false;
                signal_session_async(self.pid, Signal::SIGKILL).await;
                RequestError::Exited {
                    exit: ExitInfo::from_status(status),
                    log_tail: self.log_tail(20).await,
                }
            }
            _ => {
                self.kill().await;
                RequestError::StreamClosed {
                    log_tail: self.log_tail(20).await,
                }
            }
        }
    }

    /// SIGKILL the process group and reap the worker. Killing before reaping matters: an unreaped
    /// leader keeps its pid (and so the group id) from being reused by an unrelated process.
    pub async fn kill(&mut self) {
        if !self.alive {
            return;
        }
        // Every member is signalled before the leader is reaped (see above).
        signal_session_async(self.pid, Signal::SIGKILL).await;
        let _ = tokio::time::timeout(REAP_TIMEOUT, self.child.wait()).await;
        self.alive = false;
        self.kill_remote();
    }

    /// The far side of a remote worker (its Slurm step, its process group on the SSH host).
    fn kill_remote(&self) {
        if let Some(r) = &self.remote {
            r.launcher.kill_remote(&r.placement, &self.ready);
        }
    }

    /// The launcher and placement of a remote worker.
    pub fn remote(&self) -> Option<&Remote> {
        self.remote.as_ref()
    }

    /// Ask the worker to exit; kill it if it has not within `grace`.
    pub async fn shutdown(mut self, grace: Duration) {
        if !self.alive {
            return;
        }
        let asked = self.request(RequestBody::Shutdown, grace).await;
        if asked.is_ok() {
            match tokio::time::timeout(grace, self.child.wait()).await {
                Ok(Ok(_)) => {
                    self.alive = false;
                    // Anything the worker left running in its group goes too.
                    signal_session_async(self.pid, Signal::SIGKILL).await;
                }
                _ => self.kill().await,
            }
        } else {
            self.kill().await;
        }
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if self.alive {
            // No await in Drop: signal the group now; tokio (kill_on_drop) reaps the leader.
            kill_group(self.pid);
            self.kill_remote();
        }
    }
}

enum ReadOutcome {
    Line(String),
    TooLong,
    Eof,
    Exited(Option<ExitStatus>),
}

fn clip(s: &str, max_chars: usize) -> String {
    if s.chars().count() <= max_chars {
        s.to_string()
    } else {
        let cut: String = s.chars().take(max_chars).collect();
        format!("{cut} ... [truncated]")
    }
}

/// Copy the worker's stderr into its log, at most [`LOG_BYTES_PER_REQUEST`] per request (`used` is
/// reset by each request); beyond that the output is read and dropped, so the worker never blocks
/// on a full pipe. Says `true` on `done` once the stream has ended and everything is written.
async fn pump_log(
    mut from: ChildStderr,
    mut to: tokio::fs::File,
    used: Arc<AtomicU64>,
    done: watch::Sender<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let before = used.fetch_add(n as u64, Ordering::SeqCst);
        let room = LOG_BYTES_PER_REQUEST.saturating_sub(before);
        if room == 0 {
            continue;
        }
        let keep = n.min(usize::try_from(room).unwrap_or(usize::MAX));
        let mut write = to.write_all(&buf[..keep]).await;
        if keep < n && write.is_ok() {
            let note = format!(
                "\n[krefine: more than {} MiB of output in one request; the rest of it is dropped]\n",
                LOG_BYTES_PER_REQUEST / (1024 * 1024)
            );
            write = to.write_all(note.as_bytes()).await;
        }
        // Flushed per read so a log tail read right after sees it (tokio's File buffers writes).
        if write.is_err() || to.flush().await.is_err() {
            // The log cannot be written (disk full?): keep draining so the worker never blocks.
            used.store(u64::MAX / 2, Ordering::SeqCst);
        }
    }
    let _ = to.flush().await;
    let _ = done.send(true);
}

/// Empty the worker's scratch folder: what one incarnation (or its candidates) left must not leak into
/// the next, nor pile up over a long run.
async fn prepare_scratch(scratch: &Path) -> Result<(), WorkerError> {
    match tokio::fs::remove_dir_all(scratch).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(WorkerError::io("clear scratch folder", scratch, e)),
    }
    tokio::fs::create_dir_all(scratch)
        .await
        .map_err(|e| WorkerError::io("create scratch folder", scratch, e))
}

/// Remove and re-create `dir`. overlayfs leaves a `work/work` folder with mode 000, which a normal
/// user cannot remove until it is made writable again.
async fn reset_dir(dir: &Path) -> std::io::Result<()> {
    let d = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        if let Err(e) = std::fs::remove_dir_all(&d) {
            match e.kind() {
                std::io::ErrorKind::NotFound => {}
                std::io::ErrorKind::PermissionDenied => {
                    make_dirs_writable(&d);
                    std::fs::remove_dir_all(&d)?;
                }
                _ => return Err(e),
            }
        }
        std::fs::create_dir_all(&d)
    })
    .await
    .map_err(std::io::Error::other)?
}

fn make_dirs_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                make_dirs_writable(&e.path());
            }
        }
    }
}

/// Open the worker log for appending (rotating an oversized one) and write a header; returns the file
/// for the child's stderr and the offset where this incarnation's output starts.
async fn open_log(spec: &SpawnSpec) -> Result<(std::fs::File, u64), WorkerError> {
    let path = &spec.log_path;
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| WorkerError::io("create log folder", dir, e))?;
    }
    if let Ok(meta) = tokio::fs::metadata(path).await
        && meta.len() > LOG_ROTATE_BYTES
    {
        let mut rotated = path.as_os_str().to_os_string();
        rotated.push(".1");
        tokio::fs::rename(path, &rotated)
            .await
            .map_err(|e| WorkerError::io("rotate worker log", path, e))?;
    }
    let mut file = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .await
        .map_err(|e| WorkerError::io("open worker log", path, e))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let header = format!(
        "===== krefine: starting worker {} (role {}, python {}) at unix time {now} =====\n",
        spec.name,
        spec.role.as_str(),
        spec.python.display()
    );
    file.write_all(header.as_bytes())
        .await
        .map_err(|e| WorkerError::io("write worker log", path, e))?;
    file.flush()
        .await
        .map_err(|e| WorkerError::io("write worker log", path, e))?;
    let start = file
        .metadata()
        .await
        .map_err(|e| WorkerError::io("stat worker log", path, e))?
        .len();
    Ok((file.into_std().await, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SpawnSpec {
        SpawnSpec {
            name: "gpu-0".into(),
            role: WorkerRole::Gpu,
            python: "/usr/bin/python3".into(),
            harness_dir: "/h".into(),
            scratch: "/s/gpu-0".into(),
            log_path: "/l/gpu-0.log".into(),
            cuda_visible_devices: Some("0".into()),
            arch_list: Some("9.0".into()),
            load_timeout: Duration::from_secs(1),
            extra_env: vec![
                ("HF_HUB_OFFLINE".into(), "1".into()),
                ("HF_TOKEN".into(), "hf_secret".into()),
            ],
            sandbox: None,
            remote: None,
        }
    }

    #[test]
    fn env_is_an_allowlist_with_our_values() {
        let env = worker_env(&spec());
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("HOME"), Some("/s/gpu-0".into()));
        assert_eq!(get("TMPDIR"), Some("/s/gpu-0".into()));
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), Some("0".into()));
        assert_eq!(get("TORCH_CUDA_ARCH_LIST"), Some("9.0".into()));
        assert_eq!(get("HF_HUB_OFFLINE"), Some("1".into()));
        assert_eq!(get("HF_TOKEN"), None);
        for (k, _) in &env {
            let allowed = PASS_THROUGH.contains(&k.as_str())
                || [
                    "HOME",
                    "TMPDIR",
                    "TORCH_EXTENSIONS_DIR",
                    "CUDA_VISIBLE_DEVICES",
                    "TORCH_CUDA_ARCH_LIST",
                    "HF_HUB_OFFLINE",
                ]
                .contains(&k.as_str());
            assert!(allowed, "unexpected variable {k}");
        }
    }

    #[test]
    fn the_build_switches_reach_the_worker_and_nothing_else_does() {
        let ours = |name: &str| -> Option<OsString> {
            match name {
                "KREFINE_SPLIT_CPP" | "KREFINE_NVCC_OVERLAP" => Some("0".into()),
                "PYTORCH_NVCC" => Some("ccache nvcc".into()),
                "OPENAI_API_KEY" => Some("sk-secret".into()),
                _ => None,
            }
        };
        let env = worker_env_from(&spec(), ours);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("KREFINE_SPLIT_CPP"), Some("0".into()));
        assert_eq!(get("KREFINE_NVCC_OVERLAP"), Some("0".into()));
        assert_eq!(get("PYTORCH_NVCC"), Some("ccache nvcc".into()));
        assert_eq!(get("OPENAI_API_KEY"), None);
    }

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

    #[test]
    fn kill_group_refuses_own_group_and_init() {
        // Would be catastrophic if it did anything; with the guard it returns without a syscall.
        kill_group(0);
        kill_group(1);
    }

    #[tokio::test]
    async fn capped_reader_splits_lines_and_refuses_long_ones() {
        let data: &[u8] = b"{\"a\":1}\n\nabcdefghij\n";
        let mut r = BufReader::with_capacity(4, data);
        let mut buf = Vec::new();
        assert!(matches!(
            read_line_capped(&mut r, &mut buf, 100).await.unwrap(),
            LineRead::Line
        ));
        assert_eq!(buf, b"{\"a\":1}");
        assert!(matches!(
            read_line_capped(&mut r, &mut buf, 100).await.unwrap(),
            LineRead::Line
        ));
        assert!(buf.is_empty());
        assert!(matches!(
            read_line_capped(&mut r, &mut buf, 5).await.unwrap(),
            LineRead::TooLong
        ));
    }
}
