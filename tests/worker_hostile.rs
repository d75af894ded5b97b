//! Real workers (CPU, the test Python with torch) against the hostile candidates in
//! tests/fixtures/hostile/. After every hostile candidate, the correct C++ candidate (ok_cpp.py) must
//! evaluate normally on the same pool: nothing a candidate does may break the next one.
//!
//! The tests share one pool and one build cache (C++ builds take 20-60 s here), so they run on one
//! runtime and one at a time (`run`). The build cache persists across runs in cargo's target temp dir;
//! set KREFINE_TEST_FRESH_CACHE=1 to start from an empty one.

mod worker_support;

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use krefine::services::{Compiler, DeviceId, Executor};
use krefine::types::{CompileOutcome, CompileStatus, EvalMode, ExecOutcome, Verdict};
use krefine::worker::WorkerPool;
use tokio::sync::{Mutex, OnceCell};
use worker_support::*;

static RT: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("test runtime")
});
static SERIAL: Mutex<()> = Mutex::const_new(());
static SHARED: OnceCell<Shared> = OnceCell::const_new();

struct Shared {
    pool: Arc<WorkerPool>,
    work: PathBuf,
    cache: PathBuf,
    python: PathBuf,
    harness: PathBuf,
    logs: PathBuf,
}

fn run<F: Future>(f: F) -> F::Output {
    RT.block_on(async {
        let _one_at_a_time = SERIAL.lock().await;
        f.await
    })
}

async fn shared() -> &'static Shared {
    SHARED
        .get_or_init(|| async {
            let work = persistent_dir("worker-hostile");
            // Fresh logs and scratch every run; the build cache persists.
            for sub in ["workers", "scratch", "logs"] {
                let _ = tokio::fs::remove_dir_all(work.join(sub)).await;
            }
            let cache = if std::env::var_os("KREFINE_TEST_FRESH_CACHE").is_some() {
                let c = work.join("build-cache-fresh");
                let _ = tokio::fs::remove_dir_all(&c).await;
                c
            } else {
                work.join("build-cache")
            };
            let python = test_python().await;
            let harness = deployed_harness(&work).await;
            let t = Instant::now();
            let pool =
                WorkerPool::start(cpu_settings(python.clone(), harness.clone(), &work, &cache))
                    .await
                    .expect("start worker pool");
            eprintln!("pool started in {:.1} s", t.elapsed().as_secs_f64());
            Shared {
                pool,
                logs: work.join("logs"),
                work,
                cache,
                python,
                harness,
            }
        })
        .await
}

async fn compile(pool: &WorkerPool, logs: &std::path::Path, name: &str) -> CompileOutcome {
    let t = Instant::now();
    let out = pool
        .compile(compile_job(
            &hostile(name),
            logs,
            name.trim_end_matches(".py"),
        ))
        .await
        .expect("the compile pool is available");
    eprintln!(
        "compile {name}: {:?} cached={} in {:.2} s",
        out.status,
        out.cached,
        t.elapsed().as_secs_f64()
    );
    out
}

async fn execute(pool: &WorkerPool, name: &str, build_dir: Option<String>) -> ExecOutcome {
    let t = Instant::now();
    let out = pool
        .execute(exec_job(&hostile(name), build_dir), &DeviceId::Cpu)
        .await
        .expect("the evaluation worker is available");
    eprintln!(
        "execute {name}: {} in {:.2} s",
        out.verdict,
        t.elapsed().as_secs_f64()
    );
    out
}

/// Compile and evaluate the correct candidate; it must pass.
async fn ok_cpp_still_works(pool: &WorkerPool, logs: &std::path::Path) {
    let c = compile(pool, logs, "ok_cpp.py").await;
    assert_eq!(c.status, CompileStatus::Ok, "ok_cpp compile: {c:#?}");
    let e = execute(pool, "ok_cpp.py", c.build_dir.clone()).await;
    assert_eq!(
        e.verdict,
        Verdict::Correct,
        "ok_cpp after a hostile one: {e:#?}"
    );
    assert!(e.correctness && e.compiled);
    assert!(e.runtime_ms > 0.0, "{e:#?}");
}

/// Compile a pure-Python hostile candidate (it must compile) and evaluate it.
async fn compile_and_execute(s: &Shared, name: &str) -> ExecOutcome {
    let c = compile(&s.pool, &s.logs, name).await;
    assert_eq!(c.status, CompileStatus::Ok, "{name} compile: {c:#?}");
    execute(&s.pool, name, c.build_dir).await
}

#[test]
fn ok_cpp_is_correct_and_fully_reported() {
    run(async {
        let s = shared().await;
        let c = compile(&s.pool, &s.logs, "ok_cpp.py").await;
        assert_eq!(c.status, CompileStatus::Ok, "{c:#?}");
        let e = execute(&s.pool, "ok_cpp.py", c.build_dir.clone()).await;
        assert_eq!(e.verdict, Verdict::Correct, "{e:#?}");
        assert_eq!(
            e.metadata
                .get("correctness_trials")
                .and_then(|v| v.as_str()),
            Some("(5 / 5)")
        );
        assert_eq!(e.device, "cpu");
        assert_eq!(e.env.precision.as_deref(), Some("fp32"));
        assert_eq!(e.env.mode.as_deref(), Some("faithful"));
        assert_eq!(e.env.timing_method.as_deref(), Some("cpu_perf_counter"));
        assert!(e.env.torch.is_some());
        let stats = e.runtime_stats.expect("timed");
        assert_eq!(stats.num_trials, 5);
        assert!(e.ref_runtime_ms > 0.0 && e.speedup.is_some(), "{e:#?}");
        assert!(e.ref_source.is_some());
        assert!(e.phases.contains_key("load_s") && e.phases.contains_key("timing_s"));
        assert!(e.wall_ms > 0);
    });
}

#[test]
fn a_cached_compile_is_found_not_built() {
    run(async {
        let s = shared().await;
        let first = compile(&s.pool, &s.logs, "ok_cpp.py").await;
        assert_eq!(first.status, CompileStatus::Ok, "{first:#?}");
        let again = compile(&s.pool, &s.logs, "ok_cpp.py").await;
        assert_eq!(again.status, CompileStatus::Ok);
        // Cached: found, not built (no Python import; the log says so).
        assert!(
            again.cached,
            "second compile of the same source must be cached"
        );
        assert_eq!(again.build_dir, first.build_dir);
        let log = std::fs::read_to_string(again.log_path.expect("log path")).expect("log");
        assert!(log.contains("identical build found"), "{log}");
    });
}

#[test]
fn what_a_candidate_leaves_in_dev_shm_is_gone_before_the_next_one() {
    run(async {
        let s = shared().await;
        // The worker's own /dev/shm (an empty tmpfs) exists only in the namespaces sandbox, which
        // this machine allows (tests/worker_sandbox.rs asserts it too).
        assert_eq!(
            s.pool.sandbox_level().as_str(),
            "namespaces",
            "the sandbox must be on here"
        );
        let w = compile_and_execute(s, "shm_writer.py").await;
        assert_eq!(w.verdict, Verdict::Correct, "{w:#?}");
        // The reader answers wrongly if it finds the writer's notes (a file, and one in a folder).
        let r = compile_and_execute(s, "shm_reader.py").await;
        assert_eq!(
            r.verdict,
            Verdict::Correct,
            "the next candidate found what the one before it left in /dev/shm: {r:#?}"
        );
    });
}

#[test]
fn infinite_loop_times_out_and_worker_is_replaced() {
    run(async {
        let s = shared().await;
        let t = Instant::now();
        let e = compile_and_execute(s, "infinite_loop.py").await;
        assert_eq!(e.verdict, Verdict::Timeout, "{e:#?}");
        assert!(!e.compiled && !e.correctness);
        assert_eq!(
            e.feedback, "evaluation exceeded 10 s; the worker was killed",
            "{e:#?}"
        );
        assert_eq!(
            e.metadata.get("error").and_then(|v| v.as_str()),
            Some("Evaluation timed out")
        );
        assert!(t.elapsed() < Duration::from_secs(40));
        ok_cpp_still_works(&s.pool, &s.logs).await;
    });
}

#[test]
fn exit3_is_a_crash_with_its_exit_code() {
    run(async {
        let s = shared().await;
        let e = compile_and_execute(s, "exit3.py").await;
        assert_eq!(e.verdict, Verdict::Crashed, "{e:#?}");
        assert!(
            e.feedback
                .starts_with("worker exited with exit code 3 while evaluating"),
            "{}",
            e.feedback
        );
        assert_eq!(
            e.metadata.get("exit_code").and_then(|v| v.as_i64()),
            Some(3)
        );
        ok_cpp_still_works(&s.pool, &s.logs).await;
    });
}

#[test]
fn segfault_is_a_crash_with_sigsegv() {
    run(async {
        let s = shared().await;
        let e = compile_and_execute(s, "segfault.py").await;
        assert_eq!(e.verdict, Verdict::Crashed, "{e:#?}");
        assert!(
            e.feedback
                .starts_with("worker exited with signal 11 (SIGSEGV) while evaluating"),
            "{}",
            e.feedback
        );
        assert_eq!(e.metadata.get("signal").and_then(|v| v.as_i64()), Some(11));
        ok_cpp_still_works(&s.pool, &s.logs).await;
    });
}

#[test]
fn huge_allocation_is_out_of_memory_or_runtime_error() {
    run(async {
        let s = shared().await;
        let e = compile_and_execute(s, "huge_alloc.py").await;
        assert!(
            matches!(e.verdict, Verdict::OutOfMemory | Verdict::RuntimeError),
            "{e:#?}"
        );
        ok_cpp_still_works(&s.pool, &s.logs).await;
    });
}

#[test]
fn compile_error_feedback_has_the_compiler_error_line() {
    run(async {
        let s = shared().await;
        let c = compile(&s.pool, &s.logs, "compile_error.py").await;
        assert_eq!(c.status, CompileStatus::Error, "{c:#?}");
        // Built, or (on a later run of the suite, whose build cache persists) replayed from the
        // cache with the same output: a failure in the candidate's own code is cached (issue 36).
        assert!(c.error_name.is_some(), "{c:#?}");
        // g++: "error: expected ',' or ';' before 'return'" and "'undeclared_name' was not declared".
        assert!(
            c.feedback.contains("error:") && c.feedback.contains("undeclared_name"),
            "feedback lacks the compiler's error lines:\n{}",
            c.feedback
        );
        let log = std::fs::read_to_string(c.log_path.as_deref().expect("log")).expect("log");
        assert!(
            log.contains("undeclared_name"),
            "full log must keep the diagnostics"
        );
        ok_cpp_still_works(&s.pool, &s.logs).await;
    });
}

#[test]
fn syntax_error_and_missing_modelnew_are_kernelbench_syntax_errors() {
    run(async {
        let s = shared().await;
        for name in ["syntax_error.py", "no_modelnew.py"] {
            let c = compile(&s.pool, &s.logs, name).await;
            assert_eq!(c.status, CompileStatus::Error, "{name}: {c:#?}");
            assert_eq!(c.error_name.as_deref(), Some("SyntaxError"), "{name}");
            assert_eq!(
                c.error.as_deref(),
                Some("Syntax error in custom generated code or ModelNew not found"),
                "{name}"
            );
            assert!(!c.feedback.is_empty(), "{name}: no feedback");
        }
        ok_cpp_still_works(&s.pool, &s.logs).await;
    });
}

#[test]
fn shape_mismatch_is_incorrect_with_kernelbench_message() {
    run(async {
        let s = shared().await;
        let e = compile_and_execute(s, "shape_mismatch.py").await;
        assert_eq!(e.verdict, Verdict::Incorrect, "{e:#?}");
        assert!(e.compiled && !e.correctness);
        assert_eq!(
            e.metadata.get("correctness_issue").and_then(|v| v.as_str()),
            Some("Output shape mismatch: Expected torch.Size([64, 64]), got torch.Size([32, 64])"),
            "{e:#?}"
        );
        assert!(e.feedback.contains("shape"), "{}", e.feedback);
        ok_cpp_still_works(&s.pool, &s.logs).await;
    });
}

#[test]
fn value_mismatch_is_incorrect_with_differences() {
    run(async {
        let s = shared().await;
        let e = compile_and_execute(s, "value_mismatch.py").await;
        assert_eq!(e.verdict, Verdict::Incorrect, "{e:#?}");
        assert_eq!(
            e.metadata.get("correctness_issue").and_then(|v| v.as_str()),
            Some("Output mismatch")
        );
        assert_eq!(
            e.metadata
                .get("correctness_trials")
                .and_then(|v| v.as_str()),
            Some("(0 / 5)")
        );
        let max = e.metadata.get("max_difference").and_then(|v| v.as_array());
        assert_eq!(
            max.map(|a| a.len()),
            Some(5),
            "one max_difference per failing trial: {e:#?}"
        );
        assert_eq!(max.and_then(|a| a[0].as_str()), Some("1.000000"), "{e:#?}");
        ok_cpp_still_works(&s.pool, &s.logs).await;
    });
}

#[test]
fn print_flood_is_correct_and_protocol_intact() {
    run(async {
        let s = shared().await;
        let e = compile_and_execute(s, "print_flood.py").await;
        assert_eq!(e.verdict, Verdict::Correct, "{e:#?}");
        // The flood went to the worker log, not the protocol stream.
        let log = std::fs::read(s.work.join("workers/cpu-0.log")).expect("worker log");
        let floods = log.windows(6).filter(|w| w == b"flood ").take(1000).count();
        assert!(
            floods >= 1000,
            "the printed flood should be in the worker log"
        );
        ok_cpp_still_works(&s.pool, &s.logs).await;
    });
}

#[test]
fn inplace_input_faithful_passes_strict_fails() {
    run(async {
        let s = shared().await;
        let faithful = compile_and_execute(s, "inplace_input.py").await;
        assert_eq!(
            faithful.verdict,
            Verdict::Correct,
            "faithful mode accepts what KernelBench accepts: {faithful:#?}"
        );
        ok_cpp_still_works(&s.pool, &s.logs).await;

        let work = s.work.join("strict");
        let mut settings = cpu_settings(s.python.clone(), s.harness.clone(), &work, &s.cache);
        settings.mode = EvalMode::Strict;
        let strict = WorkerPool::start(settings).await.expect("strict pool");
        let c = compile(&strict, &s.logs, "inplace_input.py").await;
        assert!(c.cached, "same source, same toolchain: the build is shared");
        let e = execute(&strict, "inplace_input.py", c.build_dir).await;
        assert_eq!(e.verdict, Verdict::Incorrect, "{e:#?}");
        assert_eq!(e.env.mode.as_deref(), Some("strict"));
        assert!(
            e.feedback.to_lowercase().contains("input"),
            "strict feedback should say the inputs were modified: {}",
            e.feedback
        );
        ok_cpp_still_works(&strict, &s.logs).await;
        strict.shutdown().await;
    });
}

#[test]
fn reuse_of_freed_memory_is_incorrect() {
    run(async {
        let s = shared().await;
        let e = compile_and_execute(s, "reuse_freed.py").await;
        assert_eq!(e.verdict, Verdict::Incorrect, "{e:#?}");
        ok_cpp_still_works(&s.pool, &s.logs).await;
    });
}

#[test]
fn profile_on_cpu_gives_a_table() {
    run(async {
        let s = shared().await;
        let c = compile(&s.pool, &s.logs, "ok_cpp.py").await;
        let t = Instant::now();
        let p = s
            .pool
            .profile(exec_job(&hostile("ok_cpp.py"), c.build_dir), &DeviceId::Cpu)
            .await
            .unwrap();
        eprintln!(
            "profile ok_cpp: ok={} in {:.2} s",
            p.ok,
            t.elapsed().as_secs_f64()
        );
        assert!(p.ok, "{p:#?}");
        assert!(!p.table.is_empty(), "{p:#?}");
    });
}

#[test]
fn concurrent_compiles_of_one_source_build_once() {
    run(async {
        let s = shared().await;
        // In the compile worker's own scratch: the only place outside the build a sandboxed
        // candidate may write (one compile worker, so both jobs would import there).
        let counter = s
            .work
            .join("scratch/compile-0")
            .join(format!("imports-{}.txt", std::process::id()));
        let _ = std::fs::remove_file(&counter);
        // Unique per run (so it is never cached from an earlier run); every import appends a line.
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let code = format!(
            "# nonce {nonce}\nimport torch.nn as nn\n\
             with open({counter:?}, 'a') as f:\n    f.write('import\\n')\n\n\
             class ModelNew(nn.Module):\n    def forward(self, a, b):\n        return a + b\n",
            counter = counter.to_string_lossy()
        );
        let (a, b) = tokio::join!(
            async {
                s.pool
                    .compile(compile_job(&code, &s.logs, "concurrent-a"))
                    .await
                    .unwrap()
            },
            async {
                s.pool
                    .compile(compile_job(&code, &s.logs, "concurrent-b"))
                    .await
                    .unwrap()
            },
        );
        assert_eq!(a.status, CompileStatus::Ok, "{a:#?}");
        assert_eq!(b.status, CompileStatus::Ok, "{b:#?}");
        assert_eq!(
            [a.cached, b.cached].iter().filter(|c| **c).count(),
            1,
            "exactly one of the two must be served from the cache"
        );
        let imports = std::fs::read_to_string(&counter).expect("counter file");
        assert_eq!(
            imports.lines().count(),
            1,
            "the source was imported more than once"
        );
        assert_eq!(a.build_dir, b.build_dir);
    });
}

#[test]
fn dropping_a_pool_leaves_no_processes() {
    run(async {
        let s = shared().await;
        let work = s.work.join("orphans");
        let _ = std::fs::create_dir_all(&work);
        // A candidate that leaves grandchildren behind: one in the worker's process group, one in
        // a process group of its own (as ninja starts every compiler).
        let code = format!(
            "# orphan test {}\nimport subprocess\nimport torch.nn as nn\n\
             _child = subprocess.Popen(['sleep', '300'])\n\
             _own_group = subprocess.Popen(['sleep', '300'], process_group=0)\n\
             import os\n\
             with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'grandchild.pid'), 'a') as f:\n    f.write(f'{{_child.pid}}\\n{{_own_group.pid}}\\n')\n\n\
             class ModelNew(nn.Module):\n    def forward(self, a, b):\n        return a + b\n",
            std::process::id(),
        );
        let cache = work.join("build-cache");
        let _ = std::fs::remove_dir_all(&cache);
        let mut settings = cpu_settings(s.python.clone(), s.harness.clone(), &work, &cache);
        // The unsandboxed kill path (process group and session scan): a sandboxed candidate could
        // not write the pid file, and the pids it sees are its PID namespace's. Sandboxed, the
        // namespace's PID 1 takes every process in it along when it is killed.
        settings.sandbox = krefine::worker::sandbox::SandboxMode::Off;
        // A fresh candidate process on a loaded 2-core machine can take longer than the shared 10 s.
        settings.timeouts.execute_s = 60.0;
        let pool = WorkerPool::start(settings).await.expect("pool");
        let c = pool
            .compile(compile_job(&code, &s.logs, "orphan"))
            .await
            .unwrap();
        assert_eq!(c.status, CompileStatus::Ok, "{c:#?}");
        // Candidates may write only their own build and scratch folders: the pid file is in the build.
        let pidfile = std::path::PathBuf::from(c.build_dir.clone().expect("build dir"))
            .join("grandchild.pid");
        let e = pool
            .execute(exec_job(&code, c.build_dir), &DeviceId::Cpu)
            .await
            .unwrap();
        assert_eq!(e.verdict, Verdict::Correct, "{e:#?}");
        let mut pids = pool.worker_pids().await;
        assert_eq!(pids.len(), 2, "one compile and one cpu worker");
        let grandchildren: Vec<u32> = std::fs::read_to_string(&pidfile)
            .expect("pid file")
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        assert_eq!(
            grandchildren.len(),
            4,
            "compile and evaluate each imported it, leaving two each"
        );
        // The compile worker imported it first: nothing a compile started outlives it (the worker
        // kills what its compile child left, so that it cannot write into a later candidate's log).
        // The evaluation's may be gone already: the worker kills a candidate process's strays before
        // anything is timed (issue 35); the drop must end whatever is left.
        let (compile_kids, _) = grandchildren.split_at(2);
        let outlived = wait_gone(compile_kids, Duration::from_secs(10)).await;
        assert!(
            outlived.is_empty(),
            "a compile's grandchildren outlived it: {outlived:?}"
        );
        assert!(
            pids.iter().all(|p| pid_alive(*p)),
            "the workers should run before the drop"
        );
        pids.extend(&grandchildren);
        drop(pool);
        let survivors = wait_gone(&pids, Duration::from_secs(10)).await;
        assert!(
            survivors.is_empty(),
            "processes survived the pool: {survivors:?}"
        );
    });
}
