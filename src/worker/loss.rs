//! Lost workers: what the pool does when a worker's node, Slurm step or SSH connection dies (see
//! [`crate::launcher`] for how a loss is recognised), or a worker of this machine dies while idle
//! (the OOM killer, `kill -9`: found before the request reached it, see `call.rs`).
//!
//! A loss is never a verdict. The request is retried (a fresh worker: a new step wherever Slurm
//! puts it, the drained nodes excluded, or the same SSH host until it is drained), at most
//! `resources.loss_retries` times; every loss is recorded with the result the retry produced
//! (`worker_losses`). When the retries run out, or the device's host was drained, the step is
//! [`Unavailable`]: the engine defers it, or runs it on another device.

use crate::services::Unavailable;
use crate::types::WorkerLoss;

use super::protocol::Ready;

/// Why an attempt produced no outcome.
pub(super) enum Fault {
    /// The machinery cannot serve the request (no worker, pool shut down): no verdict.
    Unavailable(Unavailable),
    /// The worker was lost: retry.
    Lost(WorkerLoss),
}

/// After `losses`, is there an attempt left? `None`: yes; `Some(why not)`: no, give up.
pub(super) fn give_up(losses: &[WorkerLoss], retries: u32, retired: bool) -> Option<Unavailable> {
    let last = losses.last()?;
    let where_ = last.host.as_deref().unwrap_or("an unknown host");
    if retired {
        return Some(Unavailable(format!(
            "worker {} lost on {where_} ({}); the device is retired (its host drained or the \
             device lost)",
            last.worker, last.detail
        )));
    }
    (losses.len() > retries as usize).then(|| {
        Unavailable(format!(
            "{} worker(s) lost while serving this request (last: {} on {where_}: {}); \
             resources.loss_retries = {retries}",
            losses.len(),
            last.worker,
            last.detail
        ))
    })
}

/// Run `attempt` until it gives an outcome or the machinery gives up: after each lost worker it is
/// tried again, until [`give_up`] says no attempt is left (`retired` is asked after each loss).
/// The one retry loop of compile, execute and profile; returns the outcome and the losses it took.
pub(super) async fn retry_lost<T, Fut>(
    retries: u32,
    retired: impl Fn() -> bool,
    mut attempt: impl FnMut() -> Fut,
) -> Result<(T, Vec<WorkerLoss>), Unavailable>
where
    Fut: Future<Output = Result<T, Fault>>,
{
    let mut losses = Vec::new();
    loop {
        match attempt().await {
            Ok(outcome) => return Ok((outcome, losses)),
            Err(Fault::Unavailable(u)) => return Err(u),
            Err(Fault::Lost(loss)) => {
                losses.push(loss);
                if let Some(u) = give_up(&losses, retries, retired()) {
                    return Err(u);
                }
            }
        }
    }
}

/// A worker whose toolchain differs from the one the run's builds are made with cannot load them.
pub(super) fn toolchain_mismatch(want: Option<&str>, ready: &Ready) -> Option<String> {
    let want = want?;
    let p = ready.placement.as_ref()?;
    let got = p.toolchain.as_deref()?;
    (got != want).then(|| {
        format!(
            "the worker on {} has toolchain `{got}`, but this run's builds are made with `{want}`",
            p.host
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loss(n: u32) -> WorkerLoss {
        WorkerLoss {
            worker: "gpu-0".into(),
            host: Some(format!("n{n}")),
            detail: "STEP CANCELLED".into(),
            drained: false,
        }
    }

    #[test]
    fn retries_are_bounded() {
        assert!(give_up(&[], 0, false).is_none());
        assert!(give_up(&[loss(1)], 1, false).is_none());
        let e = give_up(&[loss(1), loss(2)], 1, false).unwrap().0;
        assert!(e.contains("2 worker(s) lost") && e.contains("n2"), "{e}");
        assert!(give_up(&[loss(1)], 3, true).unwrap().0.contains("retired"));
    }
}
