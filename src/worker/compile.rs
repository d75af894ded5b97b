//! The compile room: one compile job, answered from the build cache or built on a free compile worker
//! (retried when the worker is lost). [`CompileRoom`] borrows the pool's parts it works through (the
//! slots, the call room, the build room); the pool as [`Compiler`] only hands it the job.

use std::path::Path;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::build_cache::{Builds, FailedBuild, append_file};
use super::build_store::publish_build;
use super::call::Calls;
use super::config::BuildMode;
use super::loss::{Fault, retry_lost};
use super::outcome::{CallError, Failure, FailureKind, Phase, closed, elapsed_ms, failure};
use super::pool::WorkerPool;
use super::protocol::{
    CompileRequest, CompileStatusWire, RequestBody, ResponseBody, WarmHeadersRequest,
};
use super::slot::{NoLease, Slots};
use super::worker_log::log_tail;
use crate::services::{BuildPause, CompileJob, Compiler, Unavailable};
use crate::types::RequestError;
use crate::types::{BuildCpu, CompileOutcome, CompileStatus};

#[async_trait]
impl Compiler for WorkerPool {
    async fn compile(&self, job: CompileJob) -> Result<CompileOutcome, Unavailable> {
        self.compile_room().compile(job).await
    }

    async fn cached(&self, job: &CompileJob) -> Option<CompileOutcome> {
        // No lock: markers appear whole (written, then renamed) and a build dir is never unsealed;
        // a miss here is looked up again under the build dir's lock.
        let build_dir = self.builds.dir_for(&job.code);
        self.builds.cached(&build_dir, job, Instant::now()).await
    }

    fn uses_warm_headers(&self, job: &CompileJob) -> bool {
        self.settings.build == BuildMode::Fast && cuda_build_with_default_flags(&job.code)
    }

    async fn warm_headers(&self, wait: Duration) {
        self.compile_room().warm_headers(wait).await;
    }

    async fn pause_builds(&self) -> Option<BuildPause> {
        // Remote builds run on other machines' cores (and stopping a local srun/ssh would not
        // stop them): the engine drains the compile pool instead.
        if self.settings.launcher.is_remote() {
            return None;
        }
        Some(BuildPause::new(self.calls.pauser().pause().await))
    }
}

/// Whether a candidate's source builds a CUDA extension with torch's default flags, the build the
/// warmed headers are made for (`kb_pch.warm_requests`): it names `load_inline` (or `cpp_extension`)
/// and `cuda_sources`, and none of the arguments that change a header's flags. Read from the text,
/// not run: a candidate that passes them some other way only waits for headers it then does not use.
/// A C++-only extension does not wait: without torch's CUDA headers its build is short, and a header
/// would not pay for the wait.
fn cuda_build_with_default_flags(code: &str) -> bool {
    const FLAG_ARGUMENTS: [&str; 4] = [
        "extra_cflags",
        "extra_cuda_cflags",
        "extra_include_paths",
        "with_cuda",
    ];
    (code.contains("load_inline") || code.contains("cpp_extension"))
        && code.contains("cuda_sources")
        && !FLAG_ARGUMENTS.iter().any(|a| code.contains(a))
}

impl WorkerPool {
    /// The parts of the pool a compile job (or a header warm-up) works through.
    fn compile_room(&self) -> CompileRoom<'_> {
        CompileRoom {
            slots: &self.slots,
            calls: &self.calls,
            builds: &self.builds,
            mode: self.settings.build,
            deadline: self.deadlines.compile,
            retries: self.settings.launcher.loss_retries(),
        }
    }
}

/// The compile room: what one compile job works through.
struct CompileRoom<'a> {
    slots: &'a Slots,
    calls: &'a Calls,
    builds: &'a Builds,
    /// How builds are made (`eval.build`), sent with every compile request.
    mode: BuildMode,
    /// A build's deadline (`eval.timeouts.compile_s`), counting only the time it was not paused.
    deadline: Duration,
    /// Lost workers retried before the job gives up (`resources.loss_retries`).
    retries: u32,
}

impl CompileRoom<'_> {
    async fn compile(&self, job: CompileJob) -> Result<CompileOutcome, Unavailable> {
        let started = Instant::now();
        let build_dir = self.builds.dir_for(&job.code);
        let _build = self.builds.lock(&build_dir).await?;
        if let Some(outcome) = self.builds.cached(&build_dir, &job, started).await {
            return Ok(outcome);
        }
        Builds::forget_failure(&build_dir).await;
        let attempt = || self.compile_once(&job, &build_dir, started);
        let (mut outcome, losses) = retry_lost(self.retries, || false, attempt).await?;
        outcome.worker_losses = losses;
        Ok(outcome)
    }

    /// The outcome of a compile request that failed (timed out, crashed, broke the protocol): the
    /// error, and the last lines of the build's and the worker's output.
    async fn failure(
        err: CallError,
        job: &CompileJob,
        build_dir: &Path,
        started: Instant,
    ) -> CompileOutcome {
        let log_path = job.log_path.to_string_lossy().into_owned();
        let Failure {
            kind,
            message: error,
            log_tail: details,
        } = failure(&err, Phase::Compile);
        let status = match kind {
            FailureKind::Timeout(_) => CompileStatus::Timeout,
            _ => CompileStatus::Crashed,
        };
        // What the build printed before it died is the most useful part for the model.
        let build_output = log_tail(&job.log_path, 0, TAIL_LINES).await;
        let _ = append_file(&job.log_path, format!("\nkrefine: {error}\n").as_bytes()).await;
        let mut feedback = error.clone();
        if !build_output.trim().is_empty() {
            feedback.push_str("\nlast lines of the compiler output:\n");
            feedback.push_str(&build_output);
        }
        if !details.trim().is_empty() {
            feedback.push_str("\nlast lines of the worker log:\n");
            feedback.push_str(&details);
        }
        CompileOutcome {
            ran_on: None,
            worker_losses: Vec::new(),
            status,
            cached: false,
            error_name: None,
            error: Some(error),
            feedback,
            log_path: Some(log_path),
            build_dir: Some(build_dir.to_string_lossy().into_owned()),
            duration_ms: elapsed_ms(started),
            findings: Vec::new(),
            build_path: None,
            cpu: None,
        }
    }

    /// [`Compiler::warm_headers`] on the next free compile worker, which becomes the run's header
    /// builder (one worker builds a run's headers: [`Builds::pch_background_for`]). A failure only
    /// costs speed: logged.
    async fn warm_headers(&self, wait: Duration) {
        let started = Instant::now();
        let Ok(lease) = self.slots.lease_compile().await else {
            return;
        };
        let slot = lease.slot();
        if !self
            .builds
            .pch_background_for(&slot.spec.name, slot.spec.sandbox.is_some(), true)
        {
            // Another worker builds the run's headers already.
            lease.release();
            return;
        }
        // Like a build, not while the CPU device is timing.
        self.calls.pauser().wait_unpaused().await;
        let request = RequestBody::WarmHeaders(WarmHeadersRequest {
            build_dir: self.builds.dir_for("").to_string_lossy().into_owned(),
            wait_s: wait.as_secs_f64(),
        });
        // The worker answers when the headers are made or `wait` has passed; the margin is its
        // start-up and answer.
        let result = self
            .calls
            .call(slot, request, wait + WARM_ANSWER_MARGIN, false)
            .await;
        let answer = match &result {
            Ok(ResponseBody::WarmHeaders(a)) => Some(*a),
            _ => None,
        };
        let started_any = answer.is_some_and(|a| a.started > 0);
        self.builds.pch_answer(&slot.spec.name, started_any);
        self.builds.publish_pchs_of(slot).await;
        if answer.is_some_and(|a| a.pending > 0) {
            self.builds.watch_pchs_of(slot);
        }
        lease.release();
        match (answer, result) {
            (Some(a), _) => tracing::info!(
                "shared precompiled headers warmed on {} in {} ms: {} built, {} still building",
                slot.spec.name,
                elapsed_ms(started),
                a.started - a.pending.min(a.started),
                a.pending
            ),
            (None, Err(e)) => tracing::warn!(
                "could not warm the shared precompiled headers on {}: {}",
                slot.spec.name,
                failure(&e, Phase::Compile).message
            ),
            (None, Ok(other)) => tracing::warn!(
                "warm_headers on {} answered with `{}`",
                slot.spec.name,
                other.kind()
            ),
        }
    }

    /// One compile attempt on a free compile worker (the build dir is locked by the caller).
    async fn compile_once(
        &self,
        job: &CompileJob,
        build_dir: &Path,
        started: Instant,
    ) -> Result<CompileOutcome, Fault> {
        let no_workers = || {
            Fault::Unavailable(Unavailable(
                "no compile worker is left: the hosts of all of them were drained".into(),
            ))
        };
        let lease = match self.slots.lease_compile().await {
            Ok(lease) => lease,
            Err(NoLease::Closed) if self.calls.is_closed() => {
                return Err(Fault::Unavailable(closed()));
            }
            Err(NoLease::Closed) => return Err(no_workers()),
            Err(NoLease::NoFreeSlot) => return Err(Fault::Unavailable(closed())),
        };
        // No build starts while the CPU device is timing.
        self.calls.pauser().wait_unpaused().await;
        let slot = lease.slot();
        // A sandboxed worker cannot write the run directory: it writes the compile log in its own
        // scratch, and we copy it to the run's log.
        let worker_log = match &slot.spec.sandbox {
            Some(_) => slot.spec.scratch.join(WORKER_COMPILE_LOG),
            None => job.log_path.clone(),
        };
        let request = RequestBody::Compile(CompileRequest {
            source: job.code.clone(),
            build_dir: build_dir.to_string_lossy().into_owned(),
            arch_list: self.builds.arch_list().map(str::to_string),
            log_path: worker_log.to_string_lossy().into_owned(),
            build: Some(self.mode.as_str().into()),
            pch_background: (!self.builds.pch_background_for(
                &slot.spec.name,
                slot.spec.sandbox.is_some(),
                job.code.contains("load_inline") || job.code.contains("cpp_extension"),
            ))
            .then_some(false),
        });
        let result = self.calls.call(slot, request, self.deadline, true).await;
        let pch_started = matches!(&result, Ok(ResponseBody::Compile(r)) if r.pch_started);
        self.builds.pch_answer(&slot.spec.name, pch_started);
        self.builds.publish_pchs_of(slot).await;
        if pch_started {
            self.builds.watch_pchs_of(slot);
        }
        if worker_log != job.log_path {
            copy_log(&worker_log, &job.log_path).await;
        }
        // A slot whose host was drained leaves the pool with its permit.
        lease.release();
        let ran_on = slot.ran_on();
        match result {
            Ok(ResponseBody::Compile(r)) => {
                let mut status = match r.status {
                    CompileStatusWire::Ok => CompileStatus::Ok,
                    CompileStatusWire::CompileError => CompileStatus::Error,
                };
                let mut feedback = r.feedback;
                let mut error = r.error;
                if status == CompileStatus::Ok
                    && let Some(sandbox) = &slot.spec.sandbox
                    && let Err(e) = publish_build(sandbox, self.builds.root(), build_dir).await
                {
                    status = CompileStatus::Error;
                    let message = format!("krefine could not store the build in the cache: {e}");
                    feedback = message.clone();
                    error = Some(message);
                }
                if status == CompileStatus::Ok {
                    self.builds
                        .record_success(
                            build_dir,
                            job,
                            &feedback,
                            r.duration_s,
                            r.build_path.clone(),
                        )
                        .await;
                } else if r.status == CompileStatusWire::CompileError {
                    // The candidate's own code failed to build: kept, so no request of the same
                    // source pays for it again.
                    let failed = FailedBuild {
                        error_name: r.error_name.as_deref(),
                        error: error.as_deref(),
                        feedback: &feedback,
                        duration_s: r.duration_s,
                        build_path: r.build_path.as_deref(),
                    };
                    self.builds.record_failure(build_dir, job, failed).await;
                }
                Ok(CompileOutcome {
                    ran_on,
                    worker_losses: Vec::new(),
                    status,
                    cached: false,
                    error_name: r.error_name,
                    error,
                    feedback,
                    log_path: Some(job.log_path.to_string_lossy().into_owned()),
                    build_dir: Some(build_dir.to_string_lossy().into_owned()),
                    duration_ms: elapsed_ms(started),
                    findings: Vec::new(),
                    build_path: r.build_path,
                    cpu: r.cpu_s.map(|cpu_s| BuildCpu {
                        cpu_ms: (cpu_s * 1000.0) as u64,
                        wall_ms: (r.duration_s * 1000.0) as u64,
                    }),
                })
            }
            // `request` checks that the response kind matches the op, so this cannot happen.
            Ok(other) => {
                let err = CallError::Request(RequestError::Protocol {
                    detail: format!("compile answered with `{}`", other.kind()),
                    log_tail: String::new(),
                });
                let mut o = Self::failure(err, job, build_dir, started).await;
                o.ran_on = ran_on;
                Ok(o)
            }
            Err(e) => {
                let e = e.candidate_fault()?;
                let mut o = Self::failure(e, job, build_dir, started).await;
                o.ran_on = ran_on;
                Ok(o)
            }
        }
    }
}

/// Lines of the compiler's output quoted in a failed build's feedback.
const TAIL_LINES: usize = 20;

/// What a `warm_headers` answer may take beyond its wait (the request's way and the answer's).
const WARM_ANSWER_MARGIN: Duration = Duration::from_secs(30);

/// The compile log a sandboxed compile worker writes, in its scratch folder.
pub(super) const WORKER_COMPILE_LOG: &str = "krefine-compile-job.log";

/// Copy a sandboxed worker's compile log to the run's log (a missing one is left missing).
pub(super) async fn copy_log(from: &Path, to: &Path) {
    if tokio::fs::metadata(from).await.is_err() {
        return;
    }
    if let Some(dir) = to.parent() {
        let _ = tokio::fs::create_dir_all(dir).await;
    }
    if let Err(e) = tokio::fs::copy(from, to).await {
        tracing::warn!("cannot copy compile log to {}: {e}", to.display());
    }
    let _ = tokio::fs::remove_file(from).await;
}

#[cfg(test)]
mod tests {
    use super::cuda_build_with_default_flags;

    #[test]
    fn only_a_cuda_load_inline_that_names_no_flag_argument_waits_for_the_warmed_headers() {
        let call = |args: &str| {
            format!(
                "from torch.utils.cpp_extension import load_inline\n\
                 ext = load_inline(name='x', cpp_sources=decl, {args}functions=['f'])\n"
            )
        };
        assert!(cuda_build_with_default_flags(&call("cuda_sources=src, ")));
        for flags in [
            "extra_cflags=['-O3'], ",
            "extra_cuda_cflags=['-O3', '--use_fast_math'], ",
            "extra_include_paths=['/x'], ",
            "with_cuda=True, ",
        ] {
            let code = call(&format!("cuda_sources=src, {flags}"));
            assert!(!cuda_build_with_default_flags(&code), "{flags}");
        }
        // A C++-only extension, and a candidate in plain PyTorch.
        assert!(!cuda_build_with_default_flags(&call("")));
        assert!(!cuda_build_with_default_flags(
            "import torch\nclass ModelNew(torch.nn.Module): pass\n"
        ));
    }
}
