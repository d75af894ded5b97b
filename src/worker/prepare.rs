//! Reference preparation, a job of the evaluation room (`eval_room`): the `prepare` request,
//! preparing a problem's reference data ahead of its candidates (see `src/refprep/`), and the verdict
//! when preparing ran out of time. Its CPU stage (the inputs made off the lease) is the inputs room's
//! (`inputs`).

use std::time::{Duration, Instant};

use serde_json::json;

use super::eval_room::EvalRoom;
use super::loss::Fault;
use super::outcome::{CallError, elapsed_ms, secs};
use super::pool::WorkerPool;
use super::protocol::{PrepareRequest, RequestBody, ResponseBody};
use crate::services::{DeviceId, Unavailable};
use crate::types::{ExecOutcome, PrepareOutcome, Problem, Verdict};

impl WorkerPool {
    /// Build all of `problem`'s reference data on `device` in one request, as every evaluation did
    /// before preparation went step by step (kept for `krefine bench reference`'s "before" figure).
    pub async fn prepare_everything(
        &self,
        problem: &Problem,
        device: &DeviceId,
    ) -> Result<PrepareOutcome, Unavailable> {
        self.eval_room().prepare_everything(problem, device).await
    }
}

impl EvalRoom<'_> {
    /// Everything of `problem`'s reference data on `device`, in one request.
    async fn prepare_everything(
        &self,
        problem: &Problem,
        device: &DeviceId,
    ) -> Result<PrepareOutcome, Unavailable> {
        let slot = self.eval_slot(device)?;
        let request = RequestBody::Prepare(self.prepare_request(problem, device));
        let started = Instant::now();
        let result = self
            .calls
            .call(slot, request, self.deadlines.reference, false)
            .await;
        Ok(match result {
            Ok(ResponseBody::Prepare(r)) => super::reference::prepare_outcome(r),
            Ok(other) => super::reference::prepare_failed(
                format!("prepare answered with `{}`", other.kind()),
                started,
            ),
            Err(e) => match e.candidate_fault() {
                Ok(e) => {
                    super::reference::prepare_failed(super::reference::call_error_text(&e), started)
                }
                Err(Fault::Unavailable(u)) => return Err(u),
                Err(Fault::Lost(loss)) => super::reference::prepare_failed(
                    format!("worker lost: {}", loss.detail),
                    started,
                ),
            },
        })
    }

    /// The `prepare` request for `problem` on `device`: everything (no step limit, timed).
    fn prepare_request(&self, problem: &Problem, device: &DeviceId) -> PrepareRequest {
        PrepareRequest {
            reference: self.reference_spec(problem, device),
            steps: None,
            quiet: None,
        }
    }

    /// Preparing the reference ran out of time: not the candidate's fault, and no candidate code ran.
    pub(super) fn reference_timeout(
        &self,
        after: Duration,
        device: &DeviceId,
        hardware: Option<String>,
        started: Instant,
    ) -> ExecOutcome {
        let dev = device.to_string();
        let message = format!(
            "preparing the reference (its inputs, outputs and timing) exceeded {} s, so the candidate \
             was not evaluated; the worker was killed. Raise eval.timeouts.reference_s for problems \
             this large",
            secs(after)
        );
        let mut o = ExecOutcome::failure(
            Verdict::ReferenceError,
            &dev,
            message.clone(),
            elapsed_ms(started),
        );
        o.metadata.insert("error".into(), json!(message));
        o.metadata
            .insert("reference_timeout_s".into(), json!(after.as_secs_f64()));
        o.compiled = false;
        self.with_device(o, &dev, hardware)
    }

    /// One step of preparing `problem`'s reference data on `device` (see `src/refprep/`).
    pub(super) async fn prepare_step(
        &self,
        problem: &Problem,
        device: &DeviceId,
        quiet: bool,
    ) -> Result<PrepareOutcome, Unavailable> {
        let slot = self.eval_slot(device)?;
        let mut request = self.prepare_request(problem, device);
        request.steps = Some(1);
        request.quiet = Some(quiet);
        let started = Instant::now();
        // Not a candidate's request: it does not count towards recycling the worker.
        let result = self
            .calls
            .call(
                slot,
                RequestBody::Prepare(request),
                self.deadlines.reference,
                false,
            )
            .await;
        Ok(match result {
            Ok(ResponseBody::Prepare(r)) => super::reference::prepare_outcome(r),
            Ok(other) => super::reference::prepare_failed(
                format!("prepare answered with `{}`", other.kind()),
                started,
            ),
            // A lost worker only delays the preparation: the candidate's own evaluation builds
            // what it needs, retried on another worker.
            Err(CallError::Lost(loss)) => {
                super::reference::prepare_failed(format!("worker lost: {}", loss.detail), started)
            }
            Err(e) => match e.candidate_fault() {
                Ok(e) => {
                    super::reference::prepare_failed(super::reference::call_error_text(&e), started)
                }
                Err(Fault::Unavailable(u)) => return Err(u),
                Err(Fault::Lost(loss)) => super::reference::prepare_failed(
                    format!("worker lost: {}", loss.detail),
                    started,
                ),
            },
        })
    }
}
