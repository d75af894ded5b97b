//! A [`Compiler`] that runs the static checks first: a candidate with an error finding is rejected
//! without being built; otherwise the inner compiler builds it and the findings (warnings) are
//! recorded in front of the compiler's own.

use std::sync::Arc;

use async_trait::async_trait;

use crate::services::{BuildPause, CompileJob, Compiler, Unavailable};
use crate::types::{CompileOutcome, CompileStatus, Finding, Severity};

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

impl CheckedCompiler {
    /// The candidate's findings, or the outcome that rejects it without a build (an error finding,
    /// or a checker that failed: skipping the checks would let a strict run pass what it must
    /// reject).
    async fn checked(&self, job: &CompileJob) -> Result<Vec<Finding>, CompileOutcome> {
        let checks = self.checks.clone();
        let code = job.code.clone();
        // Regexes over a model-written file are fast, but they are CPU work all the same.
        let findings = match tokio::task::spawn_blocking(move || checks.check(&code)).await {
            Ok(f) => f,
            Err(e) => {
                return Err(CompileOutcome {
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
            return Err(CompileOutcome {
                error_name: Some(REJECTED_ERROR_NAME.into()),
                error: Some(errors.join("\n")),
                findings,
                ..outcome(CompileStatus::Rejected)
            });
        }
        Ok(findings)
    }
}

/// `out` with the static findings in front of the compiler's own.
fn with_findings(mut out: CompileOutcome, findings: Vec<Finding>) -> CompileOutcome {
    if !findings.is_empty() {
        let compiler_findings = std::mem::replace(&mut out.findings, findings);
        out.findings.extend(compiler_findings);
    }
    out
}

#[async_trait]
impl Compiler for CheckedCompiler {
    async fn compile(&self, job: CompileJob) -> Result<CompileOutcome, Unavailable> {
        match self.checked(&job).await {
            Ok(findings) => Ok(with_findings(self.inner.compile(job).await?, findings)),
            Err(rejected) => Ok(rejected),
        }
    }

    /// A rejected candidate is answered here, before a compile slot or cores are taken, and so is a
    /// build the inner compiler made before, with the findings a build would get. (A candidate
    /// that is then built is checked again in `compile`: milliseconds of regexes, against a build.)
    async fn cached(&self, job: &CompileJob) -> Option<CompileOutcome> {
        match self.checked(job).await {
            Ok(findings) => Some(with_findings(self.inner.cached(job).await?, findings)),
            Err(rejected) => Some(rejected),
        }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::config::ChecksSection;
    use crate::settings::Backend;
    use crate::types::{EvalMode, Precision, ProblemKey, TaskId};

    /// An inner compiler that made every build before: counts its lookups and builds.
    #[derive(Default)]
    struct BuiltBefore {
        lookups: AtomicUsize,
        builds: AtomicUsize,
    }

    #[async_trait]
    impl Compiler for BuiltBefore {
        async fn compile(&self, _job: CompileJob) -> Result<CompileOutcome, Unavailable> {
            self.builds.fetch_add(1, Ordering::SeqCst);
            Ok(outcome(CompileStatus::Ok))
        }

        async fn cached(&self, _job: &CompileJob) -> Option<CompileOutcome> {
            self.lookups.fetch_add(1, Ordering::SeqCst);
            Some(CompileOutcome {
                cached: true,
                ..outcome(CompileStatus::Ok)
            })
        }
    }

    fn job(code: &str) -> CompileJob {
        CompileJob {
            task: TaskId {
                problem: ProblemKey {
                    level: 1,
                    problem_id: 1,
                },
                sample: 0,
            },
            turn: 1,
            code: code.into(),
            log_path: "/nonexistent/compile.log".into(),
        }
    }

    /// A candidate in plain PyTorch: no kernel, which faithful mode warns of and strict refuses.
    const NO_KERNEL: &str = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, a, b):\n        return a + b\n";

    fn checked(mode: EvalMode, inner: &Arc<BuiltBefore>) -> CheckedCompiler {
        let checks = StaticChecks::new(
            &ChecksSection::default(),
            mode,
            Backend::Cuda,
            Precision::Fp32,
        );
        CheckedCompiler::new(inner.clone(), checks)
    }

    /// Issue 36: a cached build is found before a compile slot or cores are taken. Every run wraps
    /// its compiler in the checks, which did not pass the lookup on: each cached candidate waited
    /// for a slot and its share of the CPU budget first.
    #[tokio::test]
    async fn a_checked_candidate_built_before_is_found_with_its_findings_and_a_rejected_one_at_once()
     {
        let inner = Arc::new(BuiltBefore::default());
        let found = checked(EvalMode::Faithful, &inner)
            .cached(&job(NO_KERNEL))
            .await
            .expect("the build made before");
        assert!(found.cached && found.status == CompileStatus::Ok);
        assert!(
            found
                .findings
                .iter()
                .any(|f| f.severity == Severity::Warning),
            "the static findings come with it: {:?}",
            found.findings
        );
        assert_eq!(inner.lookups.load(Ordering::SeqCst), 1);

        let rejected = checked(EvalMode::Strict, &inner)
            .cached(&job(NO_KERNEL))
            .await
            .expect("a rejection needs no build");
        assert_eq!(rejected.status, CompileStatus::Rejected);
        assert_eq!(rejected.error_name.as_deref(), Some(REJECTED_ERROR_NAME));
        assert_eq!(inner.lookups.load(Ordering::SeqCst), 1, "not looked up");
        assert_eq!(inner.builds.load(Ordering::SeqCst), 0);
    }
}
