//! The call room: one request through a slot, starting its worker when needed, retiring it when it
//! crashed, timed out or served enough, and charging lost workers to their host. [`Calls`] owns what
//! that takes beyond the slot itself (whether the pool is closed, the compile pauser, the launcher).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::WorkerError;
use super::budget::Budget;
use super::build_store::cow_tainted;
use super::loss::toolchain_mismatch;
use super::outcome::{CallError, secs};
use super::pause::Pauser;
use super::process::WorkerProcess;
use super::protocol::{RequestBody, ResponseBody, WorkerRole};
use super::slot::Slot;
use crate::launcher::Launcher;
use crate::types::RequestError;
use crate::types::WorkerLoss;

/// How long a worker asked to exit (recycling, shutdown) may take before it is killed.
pub(super) const EXIT_GRACE: Duration = Duration::from_secs(5);
/// How long a sandboxed worker's supervisor may take to pass on a death seen inside the sandbox before
/// the loss is recorded without the cause.
const SUPERVISOR_SETTLE: Duration = Duration::from_secs(5);

/// What sending requests through the pool's slots takes, besides the slots.
pub(super) struct Calls {
    /// Set by `shutdown`: a later request fails with [`CallError::Closed`], and one whose worker
    /// was killed under it says so instead of blaming its candidate.
    closed: AtomicBool,
    /// Stops the compile workers while the CPU device times a candidate: a build's deadline counts
    /// only the time it could run.
    pauser: Arc<Pauser>,
    /// Where workers run: recognises lost workers, charges and drains their hosts, bounds retries.
    launcher: Arc<Launcher>,
    /// Replace a worker after this many candidate requests (0: never).
    recycle_after: u32,
    /// The first compile worker's toolchain: a worker that reports another one is refused.
    toolchain: Option<String>,
}

impl Calls {
    pub(super) fn new(
        pauser: Arc<Pauser>,
        launcher: Arc<Launcher>,
        recycle_after: u32,
        toolchain: Option<String>,
    ) -> Calls {
        Calls {
            closed: AtomicBool::new(false),
            pauser,
            launcher,
            recycle_after,
            toolchain,
        }
    }

    /// From now on every request fails with [`CallError::Closed`].
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// The compile pool's pauser.
    pub(super) fn pauser(&self) -> &Arc<Pauser> {
        &self.pauser
    }

    /// Send one request through a slot, starting its worker if needed, and retire the worker when it
    /// crashed, timed out, reported a sticky error or served `recycle_after` requests. `counts`: the
    /// request is a candidate's, and counts towards recycling the worker.
    pub(super) async fn call(
        &self,
        slot: &Slot,
        body: RequestBody,
        timeout: Duration,
        counts: bool,
    ) -> Result<ResponseBody, CallError> {
        self.call_within(slot, body, Budget::plain(timeout), counts)
            .await
            .0
    }

    /// [`Self::call`] under a [`Budget`]; also returns the time the worker spent in the reference
    /// work it announced.
    pub(super) async fn call_within(
        &self,
        slot: &Slot,
        body: RequestBody,
        budget: Budget,
        counts: bool,
    ) -> (Result<ResponseBody, CallError>, Duration) {
        let mut state = slot.state.lock().await;
        if self.closed.load(Ordering::SeqCst) {
            return (Err(CallError::Closed), Duration::ZERO);
        }
        // Taken out of the slot for the duration: if this future is dropped mid-request, the process
        // is dropped with it (and killed), never put back half-used.
        let mut alive = state.process.take();
        if let Some(p) = alive.as_mut()
            && let Some(exit) = p.ended_while_idle()
        {
            // A worker that died between requests (the OOM killer, `kill -9`, a remote step or
            // connection lost) is a lost worker, as one that dies during a request is: the request is
            // retried on a fresh worker, never blamed on its candidate; a remote worker's host is
            // charged when its launcher recognises the loss.
            let how = exit.describe();
            let died = RequestError::Exited {
                exit,
                log_tail: p.log_tail(20).await,
            };
            alive = None;
            slot.pgid.store(0, Ordering::SeqCst);
            let loss = match slot.spec.remote {
                Some(_) => self.lost(slot, &died).await,
                None => Some(Self::local_loss(
                    slot,
                    format!("ended while idle with {how}"),
                )),
            };
            if let Some(loss) = loss {
                state.served = 0;
                return (Err(CallError::Lost(loss)), Duration::ZERO);
            }
        }
        if let Some(p) = alive.as_mut()
            && p.gone_inside().await
        {
            // A local sandboxed worker died while idle and its supervisor has not passed it on
            // yet: the same loss, seen a moment earlier. The supervisor is given a moment to pass it
            // on (on a loaded machine it can take hundreds of milliseconds), so that the loss says how
            // the worker ended; one held up longer is killed with the rest of the session.
            let how = match p.ended_within(SUPERVISOR_SETTLE).await {
                Some(exit) => format!("ended while idle with {}", exit.describe()),
                None => {
                    p.kill().await;
                    "its process ended while idle (inside the sandbox)".into()
                }
            };
            slot.pgid.store(0, Ordering::SeqCst);
            state.served = 0;
            let loss = Self::local_loss(slot, how);
            return (Err(CallError::Lost(loss)), Duration::ZERO);
        }
        let alive = alive.and_then(|mut p| (!p.exited_while_idle()).then_some(p));
        let mut process = match alive {
            Some(p) => p,
            None => {
                state.served = 0;
                slot.pgid.store(0, Ordering::SeqCst);
                let p = match self.spawn(slot).await {
                    Ok(p) => p,
                    Err(e) => return (Err(e), Duration::ZERO),
                };
                slot.note_ready(&p, &self.launcher);
                p
            }
        };
        slot.pgid.store(process.pid(), Ordering::SeqCst);
        let timeout = budget.own;
        let result = if slot.spec.role == WorkerRole::Compile {
            // A build may be paused (stopped) while the CPU device times a candidate; its timeout
            // counts only the time it could run. The request's own bound is a far backstop.
            let backstop = timeout.saturating_add(Duration::from_secs(24 * 3600));
            tokio::select! {
                r = process.request(body, backstop) => r,
                () = self.pauser.deadline(timeout) => {
                    process.kill().await;
                    Err(RequestError::Timeout { after: timeout })
                }
            }
        } else {
            process.request_within(body, budget).await
        };
        let reference = process.reference_spent();
        // Nothing of the request reached the worker: whatever ended it, its candidate did not.
        let unsent = process.unsent();
        if counts {
            state.served += 1;
        }
        let recycle = self.recycle_after > 0 && state.served >= self.recycle_after;
        match &result {
            Ok(resp) if resp.sticky() => {
                // The CUDA context is poisoned; nothing graceful is safe any more.
                process.kill().await;
            }
            Ok(_) | Err(RequestError::Harness { .. }) if !recycle => {
                state.process = Some(process);
            }
            Ok(_) | Err(RequestError::Harness { .. }) => {
                // Exits in the background: the caller (holding a device lease) need not wait.
                tokio::spawn(process.shutdown(EXIT_GRACE));
            }
            Err(_) => {} // already killed and reaped by `request`
        }
        if state.process.is_none() {
            slot.pgid.store(0, Ordering::SeqCst);
        }
        // A local device's worker that died with its request (timeout, crash, sticky error) is
        // replaced now, under the same lease: if no worker starts on the device any more, the
        // device is lost, and the request is a lost worker's (retried on another device), not the
        // candidate's verdict.
        let mut device_lost = None;
        let died = matches!(&result, Err(e) if !matches!(e, RequestError::Harness { .. }))
            || matches!(&result, Ok(resp) if resp.sticky());
        if died && Self::local_device(slot) && !self.closed.load(Ordering::SeqCst) {
            match self.spawn(slot).await {
                Ok(p) => {
                    slot.note_ready(&p, &self.launcher);
                    slot.pgid.store(p.pid(), Ordering::SeqCst);
                    state.served = 0;
                    state.process = Some(p);
                }
                Err(CallError::Lost(loss)) => device_lost = Some(loss),
                // The next request tries again.
                Err(_) => {}
            }
        }
        drop(state);
        let result = match (result, device_lost) {
            (_, Some(loss)) => Err(CallError::Lost(loss)),
            (Ok(r), None) => Ok(r),
            // `shutdown` killed it under our feet: say so rather than blame the candidate.
            (Err(_), None) if self.closed.load(Ordering::SeqCst) => Err(CallError::Closed),
            (Err(e), None) => match self.lost(slot, &e).await {
                Some(loss) => Err(CallError::Lost(loss)),
                // Dead (or its input closed) before the request was written: the worker died while
                // idle in the moment after the idle check (or its sandbox's supervisor had not yet
                // passed its child's death on), a loss of the worker, not a verdict.
                None if unsent => Err(CallError::Lost(Self::local_loss(
                    slot,
                    format!("gone before the request reached it ({})", unsent_why(&e)),
                ))),
                None => Err(CallError::Request(e)),
            },
        };
        (result, reference)
    }

    /// A device's evaluation worker started on this machine (not through a remote launcher).
    pub(super) fn local_device(slot: &Slot) -> bool {
        slot.spec.role == WorkerRole::Gpu && slot.spec.remote.is_none()
    }

    /// Start a local device's worker, trying `resources.drain_after` times in a row; when none
    /// starts, the device is lost: its slot is retired (so the engine retires the device and moves
    /// its work to the others) and the failure is a lost worker's.
    async fn spawn_on_device(&self, slot: &Slot) -> Result<WorkerProcess, CallError> {
        let tries = self.launcher.drain_after();
        let mut last = None;
        for _ in 0..tries {
            match WorkerProcess::spawn(&slot.spec).await {
                Ok(p) => match toolchain_mismatch(self.toolchain.as_deref(), p.ready()) {
                    None => return Ok(p),
                    Some(why) => {
                        let mut p = p;
                        p.kill().await;
                        last = Some(why);
                    }
                },
                Err(e) => last = Some(e.to_string()),
            }
            if self.closed.load(Ordering::SeqCst) {
                return Err(CallError::Closed);
            }
        }
        let why = last.unwrap_or_default();
        slot.retired.store(true, Ordering::SeqCst);
        let detail = format!(
            "no worker starts on the device any more ({tries} start(s) in a row failed; last: {why})"
        );
        tracing::warn!(
            "worker {} lost: {detail}; its device is retired",
            slot.spec.name
        );
        Err(CallError::Lost(WorkerLoss {
            worker: slot.spec.name.clone(),
            host: slot.host(),
            detail,
            // The device is lost, not its host: nothing else on the host is drained.
            drained: false,
        }))
    }

    /// Start the slot's worker. With a remote launcher, a worker that cannot be started (the host
    /// does not answer, the step is refused) or that reports another toolchain is a lost worker.
    pub(super) async fn spawn(&self, slot: &Slot) -> Result<WorkerProcess, CallError> {
        if slot.retired.load(Ordering::SeqCst) {
            return Err(CallError::Start(WorkerError::Settings(format!(
                "worker {} is retired: its host was drained or its device lost",
                slot.spec.name
            ))));
        }
        if Self::local_device(slot) {
            return self.spawn_on_device(slot).await;
        }
        let started = WorkerProcess::spawn(&slot.spec).await;
        let remote = slot.spec.remote.is_some();
        let why = match started {
            Ok(mut p) => match toolchain_mismatch(self.toolchain.as_deref(), p.ready()) {
                None => return Ok(p),
                Some(why) => {
                    slot.note_ready(&p, &self.launcher);
                    p.kill().await;
                    if !remote {
                        return Err(CallError::Start(WorkerError::Start {
                            worker: slot.spec.name.clone(),
                            detail: why,
                            log_tail: String::new(),
                        }));
                    }
                    why
                }
            },
            Err(e) if remote => format!("could not be started: {e}"),
            Err(e) => return Err(CallError::Start(e)),
        };
        Err(CallError::Lost(self.charge(slot, why)))
    }

    /// Is this failure a lost worker (remote launchers only)? Charges its host when it is.
    pub(super) async fn lost(&self, slot: &Slot, err: &RequestError) -> Option<WorkerLoss> {
        let remote = slot.spec.remote.as_ref()?;
        let detail = match err {
            RequestError::Timeout { after } => {
                let host = slot.host()?;
                if remote.launcher.host_answers(&remote.placement, &host).await {
                    return None;
                }
                format!(
                    "no answer within {} s and host {host} no longer answers",
                    secs(*after)
                )
            }
            other => remote.launcher.loss(&remote.placement, other)?,
        };
        Some(self.charge(slot, detail))
    }

    /// A worker lost with nothing to charge to a host (a local worker, or a remote one whose
    /// launcher does not recognise the failure): retried like any loss, bounded by
    /// `resources.loss_retries`, and never drains a host.
    fn local_loss(slot: &Slot, detail: String) -> WorkerLoss {
        tracing::warn!(
            "worker {} lost: {detail}; the request goes to a fresh worker",
            slot.spec.name
        );
        WorkerLoss {
            worker: slot.spec.name.clone(),
            host: slot.host(),
            detail,
            drained: false,
        }
    }

    /// Record a lost worker against its host; drain the host (and retire a slot bound to it) when
    /// it lost `resources.drain_after` workers.
    pub(super) fn charge(&self, slot: &Slot, detail: String) -> WorkerLoss {
        let host = slot.host();
        let launcher = &self.launcher;
        let drained = host.as_deref().is_some_and(|h| launcher.note_loss(h));
        let bound = slot
            .spec
            .remote
            .as_ref()
            .and_then(|r| launcher.placement_host(&r.placement));
        if bound.is_some_and(|b| launcher.is_drained(&b)) {
            slot.retired.store(true, Ordering::SeqCst);
        }
        tracing::warn!(
            "worker {} lost on {}: {detail}{}",
            slot.spec.name,
            host.as_deref().unwrap_or("an unknown host"),
            if drained { " (host drained)" } else { "" }
        );
        WorkerLoss {
            worker: slot.spec.name.clone(),
            host,
            detail,
            drained,
        }
    }

    /// Replace an evaluation worker whose view of the build cache was changed (see [`cow_tainted`]).
    pub(super) async fn check_cow(&self, slot: &Slot) {
        let Some(overlay) = slot.spec.sandbox.as_ref().and_then(|s| s.overlays.first()) else {
            return;
        };
        let upper = overlay.upper.clone();
        let tainted = tokio::task::spawn_blocking(move || cow_tainted(&upper))
            .await
            .ok()
            .flatten();
        if let Some(path) = tainted {
            tracing::warn!(
                "worker {} changed its view of the build cache ({}); replacing it",
                slot.spec.name,
                path.display()
            );
            let mut state = slot.state.lock().await;
            if let Some(mut p) = state.process.take() {
                p.kill().await;
            }
            slot.pgid.store(0, Ordering::SeqCst);
        }
    }
}

/// How a request that never reached its worker failed, in a few words.
fn unsent_why(err: &RequestError) -> String {
    match err {
        RequestError::Exited { exit, .. } => format!("it ended with {}", exit.describe()),
        RequestError::StreamClosed { .. } => "its input was closed".into(),
        RequestError::Timeout { after } | RequestError::ReferenceTimeout { after } => {
            format!("writing it took over {}", secs(*after))
        }
        RequestError::Protocol { detail, .. } => detail.clone(),
        RequestError::Harness { error } => error.clone(),
    }
}
