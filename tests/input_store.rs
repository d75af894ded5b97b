//! The reference-input store with the real harness generator: a miss makes the entry, a hit makes
//! nothing, a corrupt entry is rebuilt, two runs asking for one entry at once make it once, and the
//! store stays within its size by removing the least recently used entries.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

mod worker_support;

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use krefine::worker::input_store::{GenerateStatus, InputStore, MANIFEST, USED, entry_key};
use worker_support::*;

async fn store(work: &Path, limit: u64) -> InputStore {
    let python = test_python().await;
    let harness = deployed_harness(work).await;
    let env: Vec<(String, OsString)> = std::env::vars_os()
        .filter(|(k, _)| k == "PATH")
        .map(|(k, v)| (k.to_string_lossy().into_owned(), v))
        .chain([("CUDA_VISIBLE_DEVICES".into(), OsString::new())])
        .collect();
    InputStore::new(
        work.join("reference-cache"),
        limit,
        python,
        harness,
        env,
        Duration::from_secs(120),
    )
}

/// The workers' torch version (as the pool passes it: an entry made for it is recognised without
/// importing torch).
async fn torch_version() -> String {
    let out = tokio::process::Command::new(test_python().await)
        .args(["-c", "import torch; print(torch.__version__)"])
        .output()
        .await
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn problem(n: u32) -> String {
    hostile("problem_add.py").replace("N = 64", &format!("N = {n}"))
}

#[tokio::test]
async fn miss_hit_corrupt_and_two_runs_at_once() {
    let work = tempfile::tempdir().unwrap();
    let s = store(work.path(), u64::MAX).await;
    let torch = torch_version().await;
    let code = problem(64);
    let key = entry_key(&code, 42, 5, true, &torch);
    assert!(s.usable(&key).is_none(), "nothing is stored yet");

    // Two runs at once: the entry's lock lets one make it; the other then finds it whole.
    let (a, b) = tokio::join!(
        s.ensure(&key, &code, 42, 5, true, &torch),
        s.ensure(&key, &code, 42, 5, true, &torch)
    );
    let mut got = [a.unwrap().status, b.unwrap().status];
    got.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(got, [GenerateStatus::Generated, GenerateStatus::Hit]);
    let entry = s.usable(&key).expect("a complete entry");
    assert!(entry.join(USED).is_file());
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(entry.join(MANIFEST)).unwrap()).unwrap();
    let seeds = manifest["seeds"].as_object().unwrap();
    assert_eq!(
        seeds.len(),
        6,
        "five trials and the timing seed: {manifest}"
    );

    // A hit makes nothing.
    let hit = s.ensure(&key, &code, 42, 5, true, &torch).await.unwrap();
    assert_eq!(hit.status, GenerateStatus::Hit);
    assert_eq!(hit.bytes, 6 * 2 * 64 * 64 * 4);

    // One flipped byte: detected by its checksum and rebuilt.
    let file = entry.join(seeds.values().next().unwrap()["file"].as_str().unwrap());
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[7] ^= 0x40;
    std::fs::write(&file, bytes).unwrap();
    let rebuilt = s.ensure(&key, &code, 42, 5, true, &torch).await.unwrap();
    assert_eq!(rebuilt.status, GenerateStatus::Rebuilt, "{rebuilt:?}");
    assert!(rebuilt.detail.contains("checksum"), "{rebuilt:?}");
    assert_eq!(
        s.ensure(&key, &code, 42, 5, true, &torch)
            .await
            .unwrap()
            .status,
        GenerateStatus::Hit
    );

    // The problem's own failure is an answer, not the machinery's error; nothing is stored.
    let broken = "raise RuntimeError('broken reference')\n";
    let bkey = entry_key(broken, 42, 5, true, &torch);
    let answer = s.ensure(&bkey, broken, 42, 5, true, &torch).await.unwrap();
    assert_eq!(answer.status, GenerateStatus::Error);
    assert!(answer.detail.contains("broken reference"), "{answer:?}");
    assert!(s.usable(&bkey).is_none());
}

#[tokio::test]
async fn the_store_keeps_to_its_size_least_recently_used_first() {
    let work = tempfile::tempdir().unwrap();
    let s = store(work.path(), u64::MAX).await;
    let torch = torch_version().await;
    let codes: Vec<String> = [32, 32, 32]
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{}\n# variant {i}\n", problem(*n)))
        .collect();
    let keys: Vec<String> = codes
        .iter()
        .map(|c| entry_key(c, 42, 5, true, &torch))
        .collect();
    for i in 0..2 {
        let a = s
            .ensure(&keys[i], &codes[i], 42, 5, true, &torch)
            .await
            .unwrap();
        assert_eq!(a.status, GenerateStatus::Generated);
        // Distinct use times (file mtimes) without reading a clock in the assertion.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Another run's store over the same folder, room for two and a half entries (all three are the
    // same size: 6 seeds x 2 x 32 x 32 floats and their manifest).
    let one = s.scan()[0].bytes;
    let limit = one * 5 / 2;
    let s = store(work.path(), limit).await;
    // Entry 0 is used again, so entry 1 is now the least recently used.
    assert!(s.usable(&keys[0]).is_some());
    tokio::time::sleep(Duration::from_millis(20)).await;
    s.ensure(&keys[2], &codes[2], 42, 5, true, &torch)
        .await
        .unwrap();
    assert!(
        s.usable(&keys[1]).is_none(),
        "the least recently used entry was removed"
    );
    assert!(s.usable(&keys[0]).is_some());
    assert!(s.usable(&keys[2]).is_some());
    let total: u64 = s.scan().iter().map(|e| e.bytes).sum();
    assert!(total <= limit, "{total} > {limit}");
}

/// An entry larger than the store's cap is not made (nothing written, nothing evicted), and says so
/// with a status that is not an error.
#[tokio::test]
async fn an_entry_larger_than_the_cap_is_not_stored() {
    let work = tempfile::tempdir().unwrap();
    let torch = torch_version().await;
    let small = format!("{}\n# small\n", problem(8));
    let big = problem(64);
    let s = store(work.path(), u64::MAX).await;
    let skey = entry_key(&small, 42, 5, true, &torch);
    s.ensure(&skey, &small, 42, 5, true, &torch).await.unwrap();
    let one = s.scan()[0].bytes;
    // Room for the small entry and a little more, far less than the big one (64x the floats).
    let s = store(work.path(), one * 3).await;
    let key = entry_key(&big, 42, 5, true, &torch);
    let answer = s.ensure(&key, &big, 42, 5, true, &torch).await.unwrap();
    assert_eq!(answer.status, GenerateStatus::OverBudget, "{answer:?}");
    assert!(answer.detail.contains("do not fit"), "{answer:?}");
    assert!(s.usable(&key).is_none());
    assert!(s.usable(&skey).is_some(), "nothing was evicted for it");
    assert!(
        !std::fs::read_dir(s.root())
            .unwrap()
            .filter_map(Result::ok)
            .any(|e| e.file_name().to_string_lossy().contains("reserve")),
        "no reservation is left behind"
    );
}

/// Two entries made at once see each other's reservation: together they never exceed the cap, so
/// the second does not fit while the first is being made (slowly: its get_inputs() sleeps).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_entries_made_at_once_never_exceed_the_cap_together() {
    let work = tempfile::tempdir().unwrap();
    let torch = torch_version().await;
    let slow = problem(64).replace(
        "def get_inputs():\n",
        "def get_inputs():\n    import time\n    time.sleep(0.5)\n",
    );
    assert_ne!(slow, problem(64));
    let codes = [slow, format!("{}\n# another\n", problem(64))];
    let keys: Vec<String> = codes
        .iter()
        .map(|c| entry_key(c, 42, 5, true, &torch))
        .collect();
    // One entry's bytes, measured on a scratch store.
    let scratch = tempfile::tempdir().unwrap();
    let probe = store(scratch.path(), u64::MAX).await;
    probe
        .ensure(&keys[1], &codes[1], 42, 5, true, &torch)
        .await
        .unwrap();
    let one = probe.scan()[0].bytes;
    let limit = one * 3 / 2;
    // Two stores over one folder, as two runs would have.
    let (s1, s2) = (
        store(work.path(), limit).await,
        store(work.path(), limit).await,
    );
    let root = s1.root().to_path_buf();
    let first = tokio::spawn({
        let (key, code, torch) = (keys[0].clone(), codes[0].clone(), torch.clone());
        async move { s1.ensure(&key, &code, 42, 5, true, &torch).await }
    });
    // The second starts once the first is admitted and making its seeds (six sleeps long).
    let marker = root.join(format!(".{}.reserve", keys[0]));
    let mut admitted = false;
    for _ in 0..600 {
        if marker.is_file() {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(admitted, "the first entry was never admitted");
    let second = s2
        .ensure(&keys[1], &codes[1], 42, 5, true, &torch)
        .await
        .unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status, GenerateStatus::Generated, "{first:?}");
    assert_eq!(second.status, GenerateStatus::OverBudget, "{second:?}");
    assert!(second.detail.contains("being made by others"), "{second:?}");
    let total: u64 = s2.scan().iter().map(|e| e.bytes).sum();
    assert!(total <= limit, "{total} > {limit}");
    assert!(!marker.exists(), "the reservation goes with the made entry");
}

/// The plans of several problems' entries from one planner process, before anything is made: their
/// sizes, and a maker's processes (one, its own, unless the inputs are large enough to make in
/// parallel, and never more than the cap). Nothing is written.
#[tokio::test]
async fn entries_are_planned_before_any_is_made() {
    let work = tempfile::tempdir().unwrap();
    let s = store(work.path(), u64::MAX).await;
    let small = problem(64);
    // 1 GiB a seed (2**28 fp32 values in each of two inputs: sized on the meta device, never made).
    let large = problem(64).replace("torch.rand(N, N)", "torch.rand(1 << 27)");
    let named = small.replace(
        "a = torch.rand(N, N)",
        "a = torch.rand(N, N, device=\"cpu\")",
    );
    let plans = s
        .plan_entries(&[&small, &large, &named], 6, Some(6))
        .await
        .expect("plans");
    assert_eq!(plans[0].bytes, Some(6 * 2 * 64 * 64 * 4));
    assert_eq!(
        plans[0].processes, 1,
        "small inputs are made by the generator alone"
    );
    assert_eq!(plans[1].bytes, Some(6 * 2 * (1 << 27) * 4));
    // Made in parallel (the machine's cores and memory decide how many), within the cap.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    assert!(
        (2..=cores.min(6)).contains(&plans[1].processes),
        "{plans:?}"
    );
    // A get_inputs() that names its device does not run on the meta device: unknown, made alone.
    assert_eq!((plans[2].bytes, plans[2].processes), (None, 1));
    let capped = s.plan_entries(&[&large], 6, Some(1)).await.expect("plans");
    assert_eq!(capped[0].processes, 1, "the cap holds");
    assert!(s.scan().is_empty(), "nothing is made by a plan");
}

/// The niceness of a process as the processes that ran `get_inputs` wrote it down, one per line.
fn nices_in(path: &Path) -> Vec<i64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

/// Input makers and the planner run below the timings' priority and ahead of builds (niceness 10 against
/// the compile workers' 15, `worker_process::compile_workers_run_nicer_than_evaluation_workers`): a
/// problem's inputs hold back all its candidates, a build one (issue 36's cold batch waited 59 s for
/// its first inputs while 16 builds ran at the makers' niceness).
#[tokio::test]
async fn inputs_are_planned_and_made_ahead_of_builds_below_timings() {
    let work = tempfile::tempdir().unwrap();
    let s = store(work.path(), u64::MAX).await;
    let torch = torch_version().await;
    let seen = work.path().join("nice");
    let code = problem(64).replace(
        "    a = torch.rand(N, N)\n",
        &format!(
            "    import os\n    open({:?}, 'a').write(str(os.nice(0)) + '\\n')\n    a = torch.rand(N, N)\n",
            seen.display().to_string()
        ),
    );
    let own = {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 1..];
        after
            .split_whitespace()
            .nth(19 - 3)
            .unwrap()
            .parse::<i64>()
            .unwrap()
    };
    let want = own.max(10);

    let plans = s.plan_entries(&[&code], 6, Some(6)).await.expect("plans");
    assert_eq!(plans.len(), 1);
    let planned = nices_in(&seen);
    assert!(!planned.is_empty(), "the planner ran get_inputs");
    assert!(
        planned.iter().all(|n| *n == want),
        "{planned:?}, want {want}"
    );

    std::fs::remove_file(&seen).unwrap();
    let key = entry_key(&code, 42, 5, true, &torch);
    let made = s.ensure(&key, &code, 42, 5, true, &torch).await.unwrap();
    assert_eq!(made.status, GenerateStatus::Generated, "{made:?}");
    let drawn = nices_in(&seen);
    assert!(
        drawn.len() >= 6,
        "five trials and the timing seed at least (the generator sizes them first): {drawn:?}"
    );
    assert!(drawn.iter().all(|n| *n == want), "{drawn:?}, want {want}");
}
