//! Issue 10 end to end through the real pool (CPU workers, the test Python with torch): a refinement
//! whose turns patch the timer, then are honest, then memoise, all extensions named `fast_matmul`.
//! Each turn is judged by its own code in its own process, and the runtime findings reach
//! `ExecOutcome` through the worker protocol. Verdicts and findings only, never durations.

mod worker_support;

use std::sync::Arc;

use krefine::services::{Compiler, DeviceId, ExecJob, Executor};
use krefine::types::{
    CompileStatus, EvalMode, ExecOutcome, Problem, ProblemKey, Severity, TaskId, Verdict,
};
use krefine::worker::WorkerPool;
use worker_support::*;

fn integrity(name: &str) -> String {
    let path = repo_root().join("tests/fixtures/integrity").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn matmul() -> Arc<Problem> {
    Arc::new(Problem {
        key: ProblemKey {
            level: 1,
            problem_id: 901,
        },
        name: "901_matmul.py".into(),
        code: integrity("problem_matmul.py"),
    })
}

async fn turn(pool: &WorkerPool, logs: &std::path::Path, name: &str, n: u32) -> ExecOutcome {
    let code = integrity(name);
    let compiled = pool
        .compile(compile_job(&code, logs, name))
        .await
        .expect("pool available");
    assert_eq!(compiled.status, CompileStatus::Ok, "{name}: {compiled:#?}");
    let job = ExecJob {
        task: TaskId {
            problem: matmul().key,
            sample: 0,
        },
        turn: n,
        problem: matmul(),
        code,
        build_dir: compiled.build_dir,
    };
    pool.execute(job, &DeviceId::Cpu)
        .await
        .expect("pool available")
}

fn has(o: &ExecOutcome, category: &str, severity: Severity) -> bool {
    o.findings
        .iter()
        .any(|f| f.category == category && f.severity == severity)
}

#[test]
fn timer_patch_then_honest_then_memoise_in_both_modes() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let tmp = tempfile::tempdir().expect("tempdir");
        let python = test_python().await;
        let harness = deployed_harness(tmp.path()).await;
        let logs = tmp.path().join("logs");
        for mode in [EvalMode::Faithful, EvalMode::Strict] {
            let work = tmp.path().join(mode.as_str());
            let mut settings =
                cpu_settings(python.clone(), harness.clone(), &work, &work.join("cache"));
            settings.mode = mode;
            settings.timeouts.execute_s = 300.0;
            settings.timeouts.reference_s = 300.0;
            let pool = WorkerPool::start(settings).await.expect("pool");
            let alone = turn(&pool, &logs, "honest.py", 0).await;
            let patched = turn(&pool, &logs, "timer_patch.py", 1).await;
            let honest = turn(&pool, &logs, "honest.py", 2).await;
            let memoised = turn(&pool, &logs, "memoise.py", 3).await;
            pool.shutdown().await;

            for o in [&alone, &honest] {
                assert_eq!(o.verdict, Verdict::Correct, "{mode:?}: {o:#?}");
                assert!(o.findings.is_empty(), "{mode:?}: {:?}", o.findings);
                assert!(
                    o.speedup_check.is_some(),
                    "{mode:?}: a speedup was measured"
                );
                assert_eq!(o.env.isolation.as_deref(), Some("process"));
            }
            assert_eq!(honest.env.settings, alone.env.settings);
            match mode {
                EvalMode::Faithful => {
                    assert_eq!(patched.verdict, Verdict::Correct, "{patched:#?}");
                    assert!(
                        has(&patched, "timing_patch", Severity::Warning),
                        "{patched:#?}"
                    );
                }
                EvalMode::Strict => {
                    assert_eq!(patched.verdict, Verdict::Incorrect, "{patched:#?}");
                    assert!(
                        has(&patched, "timing_patch", Severity::Error),
                        "{patched:#?}"
                    );
                    assert_eq!(patched.speedup, None);
                }
            }
            // KernelBench's loop cannot see the memo (faithful: correct); strict timing can.
            let expected = match mode {
                EvalMode::Faithful => Verdict::Correct,
                EvalMode::Strict => Verdict::Incorrect,
            };
            assert_eq!(memoised.verdict, expected, "{mode:?}: {memoised:#?}");
        }
    });
}
