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

use nix::sys::signal::Signal;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::watch;

use super::WorkerError;
use super::budget::Clock;
use super::harness::HARNESS_ENTRY;
use super::protocol::{
    OkResponse, Ready, Request, RequestBody, Response, ResponseBody, WorkerRole, parse_response,
};
use super::worker_log::{open_log, pump_log};
// The pieces a worker process is made of, where callers have always found them.
pub use super::budget::Budget;
use super::session::{die_with_parent, lower_priority};
pub use super::session::{kill_group, signal_session, signal_session_async};
pub use super::spawn_spec::{Remote, SpawnSpec, worker_env};
pub use super::worker_log::{LOG_BYTES_PER_REQUEST, log_tail};
pub use crate::types::{ExitInfo, RequestError, signal_name};

/// Longest response line accepted. Real responses are kilobytes (feedback is trimmed to ~4 KB,
/// tracebacks and metadata a few more); anything this long is a broken or hostile stream.
const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// How long reading a dead worker's log tail waits for its output to be written out.
const LOG_SETTLE: Duration = Duration::from_secs(2);
/// How long to wait for a killed process to be reaped. SIGKILL is immediate unless the process is in
/// uninterruptible sleep (a wedged driver call); then we give up and let tokio reap it later.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);
/// After the protocol stream ends, how long to wait for the exit status that says why.
const EXIT_STATUS_WAIT: Duration = Duration::from_secs(5);

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
    /// Started in the namespaces sandbox on this machine: the process krefine holds is the
    /// sandbox's supervisor, and the worker is its only child (see [`Self::gone_inside`]).
    supervised: bool,
    /// Time the last request spent in reference work the worker announced (see [`Budget`]).
    reference_spent: Duration,
    /// The last request never reached the worker: it was already stopped, or writing it found the
    /// pipe closed (the worker died, or closed its input, before the request). See [`Self::unsent`].
    unsent: bool,
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
        reset_overlays(spec).await?;
        let (log_file, log_start) = open_log(spec).await?;
        let cmd = command(spec)?;
        let mut child =
            super::session::spawn_tied(cmd)
                .await
                .map_err(|source| WorkerError::Spawn {
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
        let worker = WorkerProcess {
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
            unsent: false,
            alive: true,
            line: Vec::new(),
            remote: spec.remote.clone(),
            supervised: spec.sandbox.is_some() && spec.remote.is_none(),
        };
        Self::await_ready(worker, spec).await
    }

    /// Wait (up to `spec.load_timeout`) for the worker's `ready` line, for the role asked; a worker
    /// that sends anything else, or nothing in time, is killed and its log's tail reported.
    async fn await_ready(mut worker: Self, spec: &SpawnSpec) -> Result<WorkerProcess, WorkerError> {
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
        !self.alive || self.ended_while_idle().is_some()
    }

    /// How the worker ended, when it ended on its own while idle since the last check (the group is
    /// cleaned up); None while it runs, and for a worker we ended ourselves. A remote worker's end is
    /// a lost worker when its launcher says so (the pool asks it, as for a death during a request).
    pub fn ended_while_idle(&mut self) -> Option<ExitInfo> {
        if !self.alive {
            return None;
        }
        match self.child.try_wait() {
            Ok(Some(status)) => Some(self.ended_idle(status)),
            Ok(None) => None,
            // Cannot tell: treat it as alive; a real problem shows up as a failed request.
            Err(_) => None,
        }
    }

    /// Record an end found while idle: the group cleaned up, the end logged.
    fn ended_idle(&mut self, status: ExitStatus) -> ExitInfo {
        self.alive = false;
        kill_group(self.pid);
        let exit = ExitInfo::from_status(status);
        tracing::warn!(
            "worker {} (pid {}) ended while idle with {}",
            self.name,
            self.pid,
            exit.describe()
        );
        exit
    }

    /// How a sandboxed worker ended, once its supervisor has passed the death on by exiting (it dies
    /// of the worker's signal: sandbox_enter), waiting at most `within` for that (the group is cleaned
    /// up); None when the supervisor is still there by then (held up, e.g. stopped) or already reaped.
    pub async fn ended_within(&mut self, within: Duration) -> Option<ExitInfo> {
        if !self.alive {
            return None;
        }
        let status = tokio::time::timeout(within, self.child.wait())
            .await
            .ok()?
            .ok()?;
        Some(self.ended_idle(status))
    }

    /// True when a sandboxed worker's own process is gone while the supervisor krefine holds still
    /// runs: between its child's death and its own exit it passes the death on, and until then
    /// [`Self::ended_while_idle`] cannot see it (nor if the supervisor is held up, e.g. stopped). Read
    /// from /proc on a blocking thread; false where that cannot be told.
    pub async fn gone_inside(&self) -> bool {
        if !self.alive || !self.supervised {
            return false;
        }
        let pid = self.pid;
        tokio::task::spawn_blocking(move || supervisor_childless(pid))
            .await
            .unwrap_or(false)
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

    /// True when the last request failed before it reached the worker: the worker was already
    /// stopped, or its input pipe was closed when the request was written. Nothing of the request ran,
    /// so the failure says nothing about its candidate: a worker that died while idle (the OOM killer,
    /// `kill -9`) in the moment between the pool's idle check and the write (or whose sandbox
    /// supervisor had not yet passed its child's death on) ends up here.
    pub fn unsent(&self) -> bool {
        self.unsent
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
        self.unsent = false;
        if !self.alive {
            self.unsent = true;
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
            // Broken pipe: the worker is gone (or closed its input) before the request reached it;
            // find out how it ended.
            Ok(Err(_)) => {
                self.unsent = true;
                return Err(self.ended().await);
            }
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
            r.launcher.kill_remote(
                &r.placement,
                self.ready.placement.as_deref(),
                self.ready.pid,
            );
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

/// Whether the supervisor `pid` (single-threaded: a fork of krefine that never `exec`s) has no
/// child that still runs (none, or only a zombie). False when /proc cannot tell.
fn supervisor_childless(pid: u32) -> bool {
    let Ok(children) = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) else {
        return false;
    };
    !children
        .split_whitespace()
        .filter_map(|c| c.parse::<u32>().ok())
        .any(|c| {
            std::fs::read_to_string(format!("/proc/{c}/stat")).is_ok_and(|stat| {
                // The state follows the command name, which may hold spaces: after the last ')'.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .is_some_and(|state| state != "Z" && state != "X")
            })
        })
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

/// The worker's command line: the harness's entry point in `serve` mode for the role, in its scratch
/// folder, with a clean environment (or through the remote launcher), in a session of its own that
/// dies with krefine, and inside the sandbox when there is one.
fn command(spec: &SpawnSpec) -> Result<tokio::process::Command, WorkerError> {
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
    // worker, see `kill_group`. And the worker dies with krefine, stopped or not (before the
    // sandbox's fork, so that its supervisor, the process we start, is the one tied to us).
    let krefine = std::process::id() as libc::pid_t;
    // Builds yield the cores to the evaluation workers' timings and to input makers (see `BUILD_NICE`).
    let background = spec.role == WorkerRole::Compile;
    // SAFETY: between fork and exec only the async-signal-safe `setsid`, `getpriority`,
    // `setpriority`, `prctl` and `getppid`.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            if background {
                lower_priority();
            }
            die_with_parent(krefine)
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
    Ok(cmd)
}

/// Overlay layers live in the scratch folder, which was just emptied; they start empty at every
/// spawn: nothing one incarnation wrote survives.
async fn reset_overlays(spec: &SpawnSpec) -> Result<(), WorkerError> {
    let Some(sandbox) = &spec.sandbox else {
        return Ok(());
    };
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
