//! Precompiled headers reach the shared build cache (issue 27, defect 7): a sandboxed compile worker
//! builds the header its first candidate missed in its own copy-on-write layer; krefine publishes it
//! into the cache's `pch/`, sealed read-only, and a later run's worker (fresh scratch, same cache)
//! builds a never-seen candidate with it from its first build.
//!
//! Within a run, a header published while the workers run reaches every one of them, the ones that
//! missed it too.
//!
//! Real workers, real builds (C++ extensions and their headers: minutes on a small CPU).

mod worker_support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use krefine::services::Compiler;
use krefine::types::CompileStatus;
use krefine::worker::WorkerPool;
use krefine::worker::sandbox::SandboxLevel;
use worker_support::*;

/// The `ok_cpp.py` fixture with its own constant: a candidate no build cache has seen.
fn never_seen(tag: u32) -> String {
    hostile("ok_cpp.py")
        .replace(
            "z[i] = x[i] + y[i];",
            &format!("z[i] = x[i] + y[i] + 0.0f * {tag};"),
        )
        .replace("krefine_fixture_ok_add", &format!("krefine_pch_{tag}"))
}

/// The complete headers (`<key>/krefine_pch.h.gch`, renamed into place when done) under `pch`.
fn complete_headers(pch: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(pch) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        // `<key>.tmp-*` folders are builds in flight.
        .filter(|p| p.extension().is_none() && p.join("krefine_pch.h.gch").is_file())
        .collect();
    found.sort();
    found
}

/// The headers whose build started (`<key>.lock`) under `pch`.
fn locks(pch: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(pch) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".lock").map(str::to_string)
        })
        .collect()
}

/// A test's folder, the Python and harness its workers run, its build cache and compile logs' folder.
struct Setup {
    tmp: tempfile::TempDir,
    python: PathBuf,
    harness: PathBuf,
    cache: PathBuf,
    logs: PathBuf,
}

impl Setup {
    /// A pool of `compile_workers` sandboxed compile workers on this test's Python, harness and cache,
    /// its scratch under `run`.
    async fn pool(&self, run: &str, compile_workers: usize) -> std::sync::Arc<WorkerPool> {
        let mut settings = cpu_settings(
            self.python.clone(),
            self.harness.clone(),
            &self.tmp.path().join(run),
            &self.cache,
        );
        settings.compile_workers = compile_workers;
        WorkerPool::start(settings)
            .await
            .expect("a pool of compile workers")
    }
}

async fn setup() -> Setup {
    // The pool's warnings (a header it could not publish) in the test's output.
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let tmp = tempfile::tempdir().expect("a temporary folder");
    let python = test_python().await;
    let harness = deployed_harness(tmp.path()).await;
    let (cache, logs) = (tmp.path().join("build-cache"), tmp.path().join("logs"));
    std::fs::create_dir_all(&logs).expect("the logs' folder");
    Setup {
        tmp,
        python,
        harness,
        cache,
        logs,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_precompiled_header_serves_the_next_runs_first_build() {
    let setup = setup().await;
    let (tmp, cache, logs) = (&setup.tmp, &setup.cache, &setup.logs);
    let tag = std::process::id() * 2;

    // The first run: its build misses the header; its worker builds it in the background.
    let first = setup.pool("run1", 1).await;
    assert_eq!(
        first.sandbox_level(),
        &SandboxLevel::Namespaces,
        "this machine allows user namespaces; the compile workers' copy-on-write layer is the case"
    );
    let job = compile_job(&never_seen(tag), logs, "first");
    let built = first.compile(job.clone()).await.unwrap();
    assert_eq!(built.status, CompileStatus::Ok, "{}", built.feedback);
    let log = std::fs::read_to_string(&job.log_path).unwrap();
    assert!(log.contains("no precompiled header"), "{log}");
    // The worker's own layer gets the header; the cache does not until krefine publishes it.
    let upper_pch = tmp.path().join("run1/scratch/compile-0.cow/upper/pch");
    // Every header it started (a build takes `<key>.lock` first; a split build wants two) complete,
    // and nothing new started for a few seconds.
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut settled = 0;
    while settled < 10 {
        let started = locks(&upper_pch);
        let done = complete_headers(&upper_pch).len();
        settled = if !started.is_empty() && done == started.len() {
            settled + 1
        } else {
            0
        };
        assert!(
            Instant::now() < deadline,
            "the worker's precompiled headers did not complete in {}: {started:?}",
            upper_pch.display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    first.shutdown().await;
    let published = complete_headers(&cache.join("pch"));
    assert!(
        !published.is_empty(),
        "nothing published into the shared cache"
    );
    for dir in &published {
        assert!(dir.join("krefine-published.json").is_file());
        for f in std::fs::read_dir(dir).unwrap().flatten() {
            let mode = f.metadata().unwrap().permissions().mode();
            assert_eq!(
                mode & 0o222,
                0,
                "{} is sealed read-only",
                f.path().display()
            );
        }
    }

    // The next run: fresh workers and scratch, the same cache, a candidate never built before.
    let second = setup.pool("run2", 1).await;
    let job = compile_job(&never_seen(tag + 1), logs, "second");
    let built = second.compile(job.clone()).await.unwrap();
    second.shutdown().await;
    assert_eq!(built.status, CompileStatus::Ok, "{}", built.feedback);
    assert_eq!(built.build_path.as_deref(), Some("fast"));
    let log = std::fs::read_to_string(&job.log_path).unwrap();
    assert!(
        log.contains("from the shared build cache") && !log.contains("no precompiled header"),
        "{log}"
    );
}

/// Within one run: two sandboxed compile workers both miss the header at their first build; the one
/// that builds it has it published into the cache as soon as it is complete (no shutdown, no further
/// build), and then both workers' next builds use it. Before, the other worker never saw it (its view
/// of the cache, an overlay, kept its first lookup's miss) and it reached the cache only after the
/// builder's next build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_published_mid_run_serves_every_worker() {
    let setup = setup().await;
    let (tmp, cache, logs) = (&setup.tmp, &setup.cache, &setup.logs);
    let tag = std::process::id() * 2 + 1_000_000;
    let pool = setup.pool("run", 2).await;
    assert_eq!(pool.sandbox_level(), &SandboxLevel::Namespaces);

    // Two builds at once take both workers; both miss the header.
    let (a, b) = (
        compile_job(&never_seen(tag), logs, "a"),
        compile_job(&never_seen(tag + 1), logs, "b"),
    );
    let (built_a, built_b) = tokio::join!(pool.compile(a.clone()), pool.compile(b.clone()));
    for (job, built) in [(&a, built_a), (&b, built_b)] {
        let built = built.unwrap();
        assert_eq!(built.status, CompileStatus::Ok, "{}", built.feedback);
        let log = std::fs::read_to_string(&job.log_path).unwrap();
        assert!(log.contains("no precompiled header"), "{log}");
    }

    // Every header a worker started is published into the cache while the pool is idle.
    let uppers = [0, 1].map(|n| {
        tmp.path()
            .join(format!("run/scratch/compile-{n}.cow/upper/pch"))
    });
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let mut started: Vec<String> = uppers.iter().flat_map(|u| locks(u)).collect();
        started.sort();
        started.dedup();
        let published: Vec<String> = complete_headers(&cache.join("pch"))
            .iter()
            .filter_map(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
            .collect();
        if !started.is_empty() && started.iter().all(|k| published.contains(k)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "headers started {started:?}, published {published:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Both workers' next builds (two at once again) use the header.
    let (c, d) = (
        compile_job(&never_seen(tag + 2), logs, "c"),
        compile_job(&never_seen(tag + 3), logs, "d"),
    );
    let (built_c, built_d) = tokio::join!(pool.compile(c.clone()), pool.compile(d.clone()));
    pool.shutdown().await;
    for (job, built) in [(&c, built_c), (&d, built_d)] {
        let built = built.unwrap();
        assert_eq!(built.status, CompileStatus::Ok, "{}", built.feedback);
        let log = std::fs::read_to_string(&job.log_path).unwrap();
        assert!(!log.contains("no precompiled header"), "{log}");
    }
}

/// A run's headers made before its first build (issue 36): `warm_headers` has one sandboxed compile
/// worker build the headers of torch's default flags and publishes them into the shared cache when
/// they are complete, so the run's first build of a never-seen candidate with default flags uses them
/// (before, the first builds of a cold cache each compiled torch's headers themselves). A second
/// warm-up finds them made and builds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warmed_headers_serve_a_runs_first_build() {
    let setup = setup().await;
    let (tmp, cache, logs) = (&setup.tmp, &setup.cache, &setup.logs);
    let pool = setup.pool("run", 1).await;
    pool.warm_headers(Duration::from_secs(900)).await;
    let published = complete_headers(&cache.join("pch"));
    // `main.cpp`'s header; a second, the CUDA split's host unit's, where torch builds CUDA.
    assert!(
        !published.is_empty(),
        "the warmed headers are in the shared cache: {published:?}"
    );
    for dir in &published {
        assert!(dir.join("krefine-published.json").is_file());
    }
    let upper_pch = tmp.path().join("run/scratch/compile-0.cow/upper/pch");
    let started = locks(&upper_pch).len();

    pool.warm_headers(Duration::from_secs(900)).await;
    assert_eq!(
        locks(&upper_pch).len(),
        started,
        "a second warm-up started another header build"
    );
    let job = compile_job(&never_seen(std::process::id() * 2 + 7), logs, "warmed");
    let built = pool.compile(job.clone()).await.unwrap();
    pool.shutdown().await;
    assert_eq!(built.status, CompileStatus::Ok, "{}", built.feedback);
    // A C++ extension builds the fast way only with a header (else "nothing to speed up": plain).
    assert_eq!(built.build_path.as_deref(), Some("fast"));
    let log = std::fs::read_to_string(&job.log_path).unwrap();
    assert!(!log.contains("no precompiled header"), "{log}");
}
