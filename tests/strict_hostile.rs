//! Issue 23's second generation of hacks on the CPU, through the real pool (real worker processes, each
//! candidate in its own process), in both modes, with the honest control first and last: a loop-state
//! reader (frames), a loop-state hunter (frames and gc, looking for the timer's own state), a content
//! memoiser, an output stealer (gc), a comparison patcher (sys.modules) and
//! a spelled-out import (a side thread). The static layer reads each of them in both modes (errors in
//! strict, warnings in faithful); at run time strict mode credits none of them more than the work it
//! does (the worker times each call on its own clock, so the frame reader and the hunter find no loop
//! state in their process and compute; the content memo never hits, so it is only as fast as its
//! matmul; the trials compare in the worker, so the stealer and the patcher fail them), and the honest
//! control is unaffected in every position. Verdicts and findings only, never durations.

mod worker_support;

use std::sync::Arc;

use krefine::checks::{ChecksSection, StaticChecks};
use krefine::config::Backend;
use krefine::services::{Compiler, DeviceId, ExecJob, Executor};
use krefine::types::{
    CompileStatus, EvalMode, ExecOutcome, Precision, Problem, ProblemKey, Severity, TaskId, Verdict,
};
use krefine::worker::WorkerPool;
use worker_support::*;

const HOSTILE: [&str; 6] = [
    "frame_reader.py",
    "loop_state_hunter.py",
    "content_memo.py",
    "gc_stealer.py",
    "compare_patcher.py",
    "spelled_imports.py",
];

fn fixture(dir: &str, name: &str) -> String {
    let path = repo_root().join("tests/fixtures").join(dir).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn matmul() -> Arc<Problem> {
    Arc::new(Problem {
        key: ProblemKey {
            level: 1,
            problem_id: 901,
        },
        name: "901_matmul.py".into(),
        code: fixture("integrity", "problem_matmul.py"),
    })
}

/// The static findings in the categories issue 23's parsed layer adds to (these torch-only fixtures
/// all miss a custom kernel; that finding is KernelBench's and not the point here).
fn static_findings(code: &str, mode: EvalMode) -> Vec<(String, Severity)> {
    let checks = StaticChecks::new(
        &ChecksSection::default(),
        mode,
        Backend::Cpu,
        Precision::Fp32,
    );
    checks
        .check(code)
        .into_iter()
        .filter(|f| {
            matches!(
                f.category.as_str(),
                "introspection" | "thread_injection" | "timing_patch"
            )
        })
        .map(|f| (f.category, f.severity))
        .collect()
}

#[test]
fn the_static_layer_reads_every_hack_in_both_modes() {
    for name in HOSTILE {
        let code = fixture("strict", name);
        let strict = static_findings(&code, EvalMode::Strict);
        let faithful = static_findings(&code, EvalMode::Faithful);
        if name == "content_memo.py" {
            // A dict keyed on input sums is ordinary Python: only strict timing's inputs defeat it.
            assert_eq!(strict, vec![], "{name}");
            assert_eq!(faithful, vec![], "{name}");
            continue;
        }
        assert!(
            strict.iter().any(|(_, s)| *s == Severity::Error),
            "{name}: {strict:?}"
        );
        assert!(!faithful.is_empty(), "{name}");
        assert!(
            faithful.iter().all(|(_, s)| *s == Severity::Warning),
            "{name}: {faithful:?}"
        );
    }
    let honest = fixture("integrity", "honest.py");
    // honest.py caches its module in `sys.modules` (a regex finding KernelBench does not have); the
    // parsed layer adds nothing to it (src/checks/parsed/tests.rs).
    assert!(
        static_findings(&honest, EvalMode::Strict)
            .iter()
            .all(|(c, _)| c == "introspection")
    );
}

async fn turn(pool: &WorkerPool, logs: &std::path::Path, code: &str, n: u32) -> ExecOutcome {
    turn_on(pool, logs, matmul(), code, n).await
}

async fn turn_on(
    pool: &WorkerPool,
    logs: &std::path::Path,
    problem: Arc<Problem>,
    code: &str,
    n: u32,
) -> ExecOutcome {
    let compiled = pool
        .compile(compile_job(code, logs, &format!("turn{n}")))
        .await
        .expect("pool available");
    assert_eq!(
        compiled.status,
        CompileStatus::Ok,
        "turn {n}: {compiled:#?}"
    );
    let job = ExecJob {
        task: TaskId {
            problem: problem.key,
            sample: 0,
        },
        turn: n,
        problem,
        code: code.to_string(),
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

fn issue(o: &ExecOutcome) -> Option<&str> {
    o.metadata
        .get("correctness_issue_name")
        .and_then(|v| v.as_str())
}

#[test]
fn strict_credits_no_hack_and_the_honest_control_is_unaffected() {
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
        let honest = fixture("integrity", "honest.py");
        for mode in [EvalMode::Strict, EvalMode::Faithful] {
            let work = tmp.path().join(mode.as_str());
            let mut settings =
                cpu_settings(python.clone(), harness.clone(), &work, &work.join("cache"));
            settings.mode = mode;
            settings.timeouts.execute_s = 300.0;
            settings.timeouts.reference_s = 300.0;
            let pool = WorkerPool::start(settings).await.expect("pool");
            let first = turn(&pool, &logs, &honest, 0).await;
            let mut hacks = Vec::new();
            for (i, name) in HOSTILE.iter().enumerate() {
                let code = fixture("strict", name);
                hacks.push((*name, turn(&pool, &logs, &code, i as u32 + 1).await));
            }
            let last = turn(&pool, &logs, &honest, 9).await;
            pool.shutdown().await;

            for o in [&first, &last] {
                assert_eq!(o.verdict, Verdict::Correct, "{mode:?}: {o:#?}");
                assert!(o.findings.is_empty(), "{mode:?}: {:?}", o.findings);
                assert!(o.speedup.is_some(), "{mode:?}: {o:#?}");
                if mode == EvalMode::Strict {
                    // Timed on the worker's clock, the reference in the same regime.
                    let regimes = &o.metadata["strict_timing"];
                    assert_eq!(regimes["reference_timed_in"], "process", "{regimes}");
                }
            }
            for (name, o) in &hacks {
                match (mode, *name) {
                    (EvalMode::Strict, "content_memo.py") => {
                        // Correct because it computes: its memo never hits on inputs no call has seen.
                        assert_eq!(o.verdict, Verdict::Correct, "{name}: {o:#?}");
                    }
                    (EvalMode::Strict, "frame_reader.py" | "loop_state_hunter.py") => {
                        // The worker times the calls on its side: no frame in the candidate's process
                        // holds a call index, a time or an event, so the reader never learns which call
                        // it is and computes every one, and the hunter finds nothing to report.
                        // Credited at the speed of the work it does.
                        assert_eq!(o.verdict, Verdict::Correct, "{name}: {o:#?}");
                        assert_eq!(issue(o), None, "{name}: {o:#?}");
                        assert!(o.findings.is_empty(), "{name}: {:?}", o.findings);
                        assert!(o.speedup.is_some(), "{name}: {o:#?}");
                    }
                    (EvalMode::Strict, "compare_patcher.py") => {
                        // The trials compare in the worker, where its patch does not reach: its zeros
                        // fail them.
                        assert_eq!(o.verdict, Verdict::Incorrect, "{name}: {o:#?}");
                        assert_eq!(
                            o.metadata
                                .get("correctness_trials")
                                .and_then(|v| v.as_str()),
                            Some("(0 / 5)"),
                            "{name}: {o:#?}"
                        );
                        assert_eq!(o.speedup, None, "{name}");
                    }
                    (EvalMode::Strict, _) => {
                        assert_ne!(o.verdict, Verdict::Correct, "{name}: {o:#?}");
                        assert_eq!(o.speedup, None, "{name}");
                    }
                    // KernelBench's loop sees none of these: faithful mode credits them as KernelBench
                    // would, and warns through the static layer (the test above) and at run time where
                    // it can: the fresh-input probe after timing catches a zeroed or stolen output.
                    (EvalMode::Faithful, "frame_reader.py" | "content_memo.py") => {
                        assert_eq!(o.verdict, Verdict::Correct, "{name}: {o:#?}");
                    }
                    (EvalMode::Faithful, "loop_state_hunter.py") => {
                        // KernelBench's loop is Python: the hunter finds it at its first timed call
                        // and raises; KernelBench keeps the verdict and has no time.
                        assert_eq!(o.verdict, Verdict::Correct, "{name}: {o:#?}");
                        assert_eq!(o.speedup, None, "{name}: {o:#?}");
                    }
                    (EvalMode::Faithful, "compare_patcher.py") => {
                        assert_eq!(o.verdict, Verdict::Correct, "{name}: {o:#?}");
                        assert!(
                            has(o, "fresh_output_mismatch", Severity::Warning),
                            "{name}: {o:#?}"
                        );
                    }
                    (EvalMode::Faithful, "gc_stealer.py") => {
                        assert!(
                            has(o, "fresh_output_mismatch", Severity::Warning),
                            "{name}: {o:#?}"
                        );
                    }
                    (EvalMode::Faithful, "spelled_imports.py") => {
                        assert!(
                            has(o, "thread_left_running", Severity::Warning),
                            "{name}: {o:#?}"
                        );
                    }
                    (EvalMode::Faithful, other) => panic!("no expectation for {other}"),
                }
            }
        }
    });
}

/// Issue 23's remaining hole, closed for good by issue 35: clock_forger computes every output and
/// rewrites the harness's packing of its times in its process to report a tenth of them. In strict mode
/// nothing its process writes is a time: the worker's clock spans each call, so it is credited with the
/// time its work takes, like its honest twin, and no forged figure appears. Faithful mode takes
/// KernelBench's loop's word, as KernelBench would, and warns: calls on fresh inputs took far longer on
/// the worker's clock than the loop reported (`memo_suspected`). The honest control on the same
/// problem is credited, unwarned, and its result shows the reference timed in the candidate's regime.
#[test]
fn a_rewritten_time_reaches_no_strict_result_and_is_warned_in_faithful_mode() {
    let forger = fixture("strict", "clock_forger.py");
    assert!(
        static_findings(&forger, EvalMode::Strict)
            .iter()
            .any(|(c, s)| c == "introspection" && *s == Severity::Error),
        "the static layer reads clock_forger in strict mode"
    );
    let chain = Arc::new(Problem {
        key: ProblemKey {
            level: 1,
            problem_id: 902,
        },
        name: "902_chain.py".into(),
        code: fixture("integrity", "problem_chain.py"),
    });
    let honest = fixture("strict", "chain_honest.py");
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
        for mode in [EvalMode::Strict, EvalMode::Faithful] {
            let work = tmp.path().join(mode.as_str());
            let mut settings =
                cpu_settings(python.clone(), harness.clone(), &work, &work.join("cache"));
            settings.mode = mode;
            settings.timeouts.execute_s = 300.0;
            settings.timeouts.reference_s = 300.0;
            let pool = WorkerPool::start(settings).await.expect("pool");
            let control = turn_on(&pool, &logs, chain.clone(), &honest, 0).await;
            let forged = turn_on(&pool, &logs, chain.clone(), &forger, 1).await;
            pool.shutdown().await;
            assert_eq!(control.verdict, Verdict::Correct, "{mode:?}: {control:#?}");
            assert!(control.speedup.is_some(), "{mode:?}: {control:#?}");
            assert!(
                control.findings.is_empty(),
                "{mode:?}: {:?}",
                control.findings
            );
            assert_eq!(forged.verdict, Verdict::Correct, "{mode:?}: {forged:#?}");
            assert!(forged.speedup.is_some(), "{mode:?}: {forged:#?}");
            if mode == EvalMode::Faithful {
                assert!(
                    has(&forged, "memo_suspected", Severity::Warning),
                    "{forged:#?}"
                );
                continue;
            }
            let regimes = &control.metadata["strict_timing"];
            assert_eq!(regimes["reference_timed_in"], "process", "{regimes}");
            let (candidate, reference) = (&regimes["candidate"], &regimes["reference"]);
            for field in [
                "clock",
                "inputs",
                "outputs",
                "warmup",
                "calls",
                "discard_first",
            ] {
                assert_eq!(candidate[field], reference[field], "{field}: {regimes}");
            }
            // The forger's own figure never reaches the result: no finding, and its time is the one the
            // worker's clock took (the same regime as its control's).
            assert!(forged.findings.is_empty(), "{:?}", forged.findings);
            assert_eq!(
                forged.metadata["strict_timing"]["candidate"]["clock"],
                candidate["clock"]
            );
        }
    });
}
