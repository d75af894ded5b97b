//! A [`Compiler`] that runs the static checks first: a candidate with an error finding is rejected
//! without being built; otherwise the inner compiler builds it and the findings (warnings) are
//! recorded in front of the compiler's own.

use std::sync::Arc;

use async_trait::async_trait;

use crate::services::{BuildPause, CompileJob, Compiler, Unavailable};
use crate::types::{CompileOutcome, CompileStatus, Severity};

use super::{StaticChecks, finding_line, has_error};

/// `error_name` of a candidate rejected by static checks.
pub const REJECTED_ERROR_NAME: &str = "StaticCheckError";

pub struct CheckedCompiler {
    inner: Arc<dyn Compiler>,
    checks: StaticChecks,
}

impl CheckedCompiler {
    pub fn new(inner: Arc<dyn Compiler>, checks: StaticChecks) -> Self {
        CheckedCompiler { inner, checks }
    }
}

#[async_trait]
impl Compiler for CheckedCompiler {
    async fn compile(&self, job: CompileJob) -> Result<CompileOutcome, Unavailable> {
        let checks = self.checks.clone();
        let code = job.code.clone();
        // Regexes over a model-written file are fast, but they are CPU work all the same.
        let findings = match tokio::task::spawn_blocking(move || checks.check(&code)).await {
            Ok(f) => f,
            Err(e) => {
                // Skipping the checks would let a strict run pass what it must reject.
                return Ok(CompileOutcome {
                    error_name: Some(REJECTED_ERROR_NAME.into()),
                    error: Some(format!("the static checker failed: {e}")),
                    ..outcome(CompileStatus::Crashed)
                });
            }
        };
        if has_error(&findings) {
            let errors: Vec<String> = findings
                .iter()
                .filter(|f| f.severity == Severity::Error)
                .map(|f| finding_line("static", f))
                .collect();
            return Ok(CompileOutcome {
                error_name: Some(REJECTED_ERROR_NAME.into()),
                error: Some(errors.join("\n")),
                findings,
                ..outcome(CompileStatus::Rejected)
            });
        }
        let mut out = self.inner.compile(job).await?;
        if !findings.is_empty() {
            let compiler_findings = std::mem::replace(&mut out.findings, findings);
            out.findings.extend(compiler_findings);
        }
        Ok(out)
    }

    /// The wrapped compiler's pause: the checks themselves are not a build.
    async fn pause_builds(&self) -> Option<BuildPause> {
        self.inner.pause_builds().await
    }

    fn uses_warm_headers(&self, job: &CompileJob) -> bool {
        self.inner.uses_warm_headers(job)
    }

    async fn warm_headers(&self, wait: std::time::Duration) {
        self.inner.warm_headers(wait).await
    }
}

fn outcome(status: CompileStatus) -> CompileOutcome {
    CompileOutcome {
        ran_on: None,
        worker_losses: Vec::new(),
        status,
        cached: false,
        error_name: None,
        error: None,
        feedback: String::new(),
        log_path: None,
        build_dir: None,
        duration_ms: 0,
        findings: Vec::new(),
        build_path: None,
        cpu: None,
    }
}
