//! The reference-input store with the real harness generator: a miss makes the entry, a hit makes
//! nothing, a corrupt entry is rebuilt, two runs asking for one entry at once make it once, and the
//! store stays within its size by removing the least recently used entries.

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
