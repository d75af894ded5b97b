//! A krefine killed while publishing a build or a precompiled header into the shared build cache
//! leaves its temporary folder (`<key>.publish-<pid>[-<n>]`, half a gigabyte for a header). The next
//! pool to open the cache removes those whose publisher is gone, and keeps a live publisher's.
//!
//! Real files, a real pool (real worker processes) opening the cache.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

mod worker_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use krefine::worker::WorkerPool;
use worker_support::*;

/// A publish folder with a sealed file in it, last changed an hour ago.
fn leftover(dir: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::create_dir_all(&path).unwrap();
    let file = path.join("krefine_pch.h.gch");
    std::fs::write(&file, b"half a header").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o444)).unwrap();
    std::fs::File::open(&path)
        .unwrap()
        .set_modified(SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_the_cache_sweeps_what_a_killed_publisher_left() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let pch = cache.join("pch");
    // A pid no process has any more: a child that ended and was reaped.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    child.wait().unwrap();
    let gone = child.id();
    let me = std::process::id();
    let stale_pch = leftover(&pch, &format!("0a1b2c.publish-{gone}-0"));
    let stale_build = leftover(&cache, &format!("77ff00aa11bb22cc.publish-{gone}"));
    let live = leftover(&pch, &format!("0a1b2c.publish-{me}-1"));
    let header = leftover(&pch, "0a1b2c");

    let python = test_python().await;
    let harness = deployed_harness(tmp.path()).await;
    let settings = cpu_settings(python, harness, &tmp.path().join("work"), &cache);
    let pool = WorkerPool::start(settings).await.expect("pool starts");
    pool.shutdown().await;

    assert!(!stale_pch.exists(), "{} is left", stale_pch.display());
    assert!(!stale_build.exists(), "{} is left", stale_build.display());
    assert!(live.exists(), "a live publisher's folder was removed");
    assert!(header.exists(), "a published header was removed");
}
