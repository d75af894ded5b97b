//! The reference-input store on disk: a problem's seeded inputs, made once on the CPU by a process of
//! their own (no device lease held, see `crate::refprep`), read back by every later evaluation of the
//! problem (this run, a resume, another method, `krefine eval` of new kernels).
//!
//! - An entry is a folder `<root>/<key>` named by [`entry_key`]: blake3 of the problem's code, the
//!   seed, the number of correctness trials, whether timing inputs are made, and the torch version
//!   (shapes and dtypes follow from the code; the harness records them per seed and the loader
//!   checks them). What is stored is `get_inputs()`'s raw CPU output before any cast or move, so one
//!   entry serves every precision, mode and device.
//! - Made by `kb_store.py generate` (the harness), under the entry's file lock `<root>/<key>.lock`,
//!   the build store's rule (see `crate::lock`): two runs never make one entry at once; the second
//!   waits and finds it made. The harness writes a temporary folder and renames it into place, the
//!   manifest last, so a reader sees a whole entry or none.
//! - Every seed's file has a CRC-32; the GPU worker checks it as it reads, and a bad entry is never
//!   used: that worker makes the inputs itself, and the next generation rebuilds the entry.
//! - Bounded: after each generation, entries are removed oldest last use first (the `used` file's
//!   mtime, touched at every use) until the store fits `resources.reference_cache_gb`. An entry being
//!   made (its lock held) is never removed; a reader whose entry vanishes makes its inputs itself.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

/// The harness file that makes entries.
pub const STORE_SCRIPT: &str = "kb_store.py";
/// Inside an entry: written last, so its presence means "complete" (the harness's `MANIFEST`).
pub const MANIFEST: &str = "manifest.json";
/// Inside an entry: touched at every use; its mtime orders eviction.
pub const USED: &str = "used";
/// Bumped when the entry layout changes (part of every key).
const FORMAT: &str = "kb_store/1";

/// The entry of a problem's inputs: blake3 over length-prefixed parts, 16 hex digits.
pub fn entry_key(code: &str, seed: u64, trials: u32, timing: bool, torch: &str) -> String {
    let mut h = blake3::Hasher::new();
    let seed = seed.to_string();
    let trials = trials.to_string();
    for part in [
        FORMAT,
        code,
        &seed,
        &trials,
        if timing { "t" } else { "-" },
        torch,
    ] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().to_hex()[..16].to_string()
}

/// What `kb_store.py generate` answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerateAnswer {
    pub status: GenerateStatus,
    #[serde(default)]
    pub seconds: f64,
    /// Bytes of inputs in the entry.
    #[serde(default)]
    pub bytes: u64,
    /// Processes that made seeds in parallel (0: one after another).
    #[serde(default)]
    pub parallel: u32,
    #[serde(default)]
    pub detail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GenerateStatus {
    /// The entry was there and whole: nothing was made.
    Hit,
    Generated,
    /// A broken entry (missing seed, bad checksum) was replaced.
    Rebuilt,
    /// `get_inputs()` makes something the store does not keep; the worker makes these inputs.
    Unstorable,
    /// The problem's own code failed; the worker's preparation reports it as the reference's error.
    Error,
}

/// One entry found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryInfo {
    pub key: String,
    pub bytes: u64,
    pub last_used: SystemTime,
}

/// The entries to remove, oldest use first, until the rest fit `limit` bytes. `keep` (the entry just
/// made or used) is never chosen, even when it alone is over the limit.
pub fn plan_eviction(entries: &[EntryInfo], limit: u64, keep: &str) -> Vec<String> {
    let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
    let mut order: Vec<&EntryInfo> = entries.iter().filter(|e| e.key != keep).collect();
    order.sort_by(|a, b| a.last_used.cmp(&b.last_used).then(a.key.cmp(&b.key)));
    let mut victims = Vec::new();
    for e in order {
        if total <= limit {
            break;
        }
        total -= e.bytes;
        victims.push(e.key.clone());
    }
    victims
}

/// The store: where it is, how large it may grow, and how to start the harness that fills it.
#[derive(Debug, Clone)]
pub struct InputStore {
    root: PathBuf,
    /// `resources.reference_cache_gb` in bytes.
    limit: u64,
    python: PathBuf,
    harness_dir: PathBuf,
    /// The generator's whole environment (a worker's allowlist, no GPU visible).
    env: Vec<(String, OsString)>,
    /// `eval.timeouts.reference_s`: a generation that takes longer is killed.
    timeout: Duration,
}

impl InputStore {
    pub fn new(
        root: PathBuf,
        limit: u64,
        python: PathBuf,
        harness_dir: PathBuf,
        env: Vec<(String, OsString)>,
        timeout: Duration,
    ) -> InputStore {
        InputStore {
            root,
            limit,
            python,
            harness_dir,
            env,
            timeout,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn entry(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    /// The entry's folder when it is complete (its manifest is there), marking it used.
    pub fn usable(&self, key: &str) -> Option<PathBuf> {
        let dir = self.entry(key);
        if !dir.join(MANIFEST).is_file() {
            return None;
        }
        touch(&dir.join(USED));
        Some(dir)
    }

    /// Make sure the entry `key` holds the problem's inputs (made now, in a process of its own,
    /// unless a whole entry is there), then bound the store. Holds no device: the caller must not
    /// hold a lease either. Errors are the machinery's (no Python, a full disk, a timeout).
    pub async fn ensure(
        &self,
        key: &str,
        code: &str,
        seed: u64,
        trials: u32,
        timing: bool,
        torch: &str,
    ) -> Result<GenerateAnswer, String> {
        tokio::fs::create_dir_all(&self.root)
            .await
            .map_err(|e| format!("cannot create {}: {e}", self.root.display()))?;
        let lock_path = self.root.join(format!("{key}.lock"));
        let lock = crate::lock::lock_exclusive(&lock_path)
            .await
            .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
        let entry = self.entry(key);
        let tmp = self.root.join(format!(".{key}.tmp-{}", std::process::id()));
        let request = serde_json::json!({
            "code": code,
            "seed": seed,
            "trials": trials,
            "timing": timing,
            // The workers' torch: an entry made for it is recognised without importing torch.
            "torch": torch,
            "entry": entry,
            "tmp": tmp,
        });
        let answer = self.run_generator(&request.to_string()).await;
        let _ = tokio::fs::remove_dir_all(&tmp).await;
        if matches!(&answer, Ok(a) if a.status != GenerateStatus::Unstorable
            && a.status != GenerateStatus::Error)
        {
            touch(&entry.join(USED));
        }
        drop(lock);
        let answer = answer?;
        self.evict(key).await;
        Ok(answer)
    }

    async fn run_generator(&self, request: &str) -> Result<GenerateAnswer, String> {
        let mut child = tokio::process::Command::new(&self.python)
            .arg(self.harness_dir.join(STORE_SCRIPT))
            .arg("generate")
            .current_dir(&self.root)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.python.display()))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(request.as_bytes())
                .await
                .map_err(|e| format!("cannot send the generation request: {e}"))?;
        }
        let out = tokio::time::timeout(self.timeout, child.wait_with_output())
            .await
            .map_err(|_| {
                format!(
                    "making the inputs took longer than {} s (eval.timeouts.reference_s)",
                    self.timeout.as_secs()
                )
            })?
            .map_err(|e| format!("the input generator failed: {e}"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout
            .lines()
            .rev()
            .find(|l| l.trim_start().starts_with('{'));
        match line.map(serde_json::from_str::<GenerateAnswer>) {
            Some(Ok(a)) => Ok(a),
            _ => {
                let stderr = String::from_utf8_lossy(&out.stderr);
                let tail: Vec<&str> = stderr.lines().rev().take(10).collect();
                Err(format!(
                    "the input generator ended ({}) without an answer: {}",
                    out.status,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ))
            }
        }
    }

    /// The complete entries on disk.
    pub fn scan(&self) -> Vec<EntryInfo> {
        let Ok(dir) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        dir.filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| {
                let key = e.file_name().to_string_lossy().into_owned();
                if key.starts_with('.') || !e.path().join(MANIFEST).is_file() {
                    return None;
                }
                let last_used = std::fs::metadata(e.path().join(USED))
                    .or_else(|_| std::fs::metadata(e.path().join(MANIFEST)))
                    .and_then(|m| m.modified())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                Some(EntryInfo {
                    bytes: folder_bytes(&e.path()),
                    key,
                    last_used,
                })
            })
            .collect()
    }

    /// Remove entries, oldest use first, until the store fits its limit; returns the removed keys.
    /// An entry whose lock another process holds (being made or rebuilt) is skipped.
    pub async fn evict(&self, keep: &str) -> Vec<String> {
        let store = self.clone();
        let keep = keep.to_string();
        tokio::task::spawn_blocking(move || {
            let victims = plan_eviction(&store.scan(), store.limit, &keep);
            victims
                .into_iter()
                .filter(|key| store.remove_unlocked(key))
                .collect()
        })
        .await
        .unwrap_or_default()
    }

    fn remove_unlocked(&self, key: &str) -> bool {
        let lock_path = self.root.join(format!("{key}.lock"));
        let Ok(file) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
        else {
            return false;
        };
        if file.try_lock().is_err() {
            return false;
        }
        std::fs::remove_dir_all(self.entry(key)).is_ok()
    }
}

fn touch(path: &Path) {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path);
    if let Ok(f) = file {
        let _ = f.set_modified(SystemTime::now());
    }
}

fn folder_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(key: &str, bytes: u64, secs: u64) -> EntryInfo {
        EntryInfo {
            key: key.into(),
            bytes,
            last_used: SystemTime::UNIX_EPOCH + Duration::from_secs(secs),
        }
    }

    #[test]
    fn eviction_removes_the_least_recently_used_until_the_rest_fit() {
        let entries = [
            at("a", 40, 3),
            at("b", 30, 1),
            at("c", 20, 2),
            at("d", 10, 4),
        ];
        assert_eq!(plan_eviction(&entries, 100, "d"), Vec::<String>::new());
        assert_eq!(plan_eviction(&entries, 70, "d"), vec!["b"]);
        assert_eq!(plan_eviction(&entries, 60, "d"), vec!["b", "c"]);
        assert_eq!(plan_eviction(&entries, 45, "d"), vec!["b", "c", "a"]);
        // The kept entry stays even when it alone is over the limit.
        assert_eq!(plan_eviction(&entries, 5, "a"), vec!["b", "c", "d"]);
    }

    #[test]
    fn keys_change_with_every_part() {
        let base = entry_key("code", 42, 5, true, "2.9.0");
        assert_eq!(base.len(), 16);
        assert_eq!(base, entry_key("code", 42, 5, true, "2.9.0"));
        for other in [
            entry_key("code2", 42, 5, true, "2.9.0"),
            entry_key("code", 43, 5, true, "2.9.0"),
            entry_key("code", 42, 4, true, "2.9.0"),
            entry_key("code", 42, 5, false, "2.9.0"),
            entry_key("code", 42, 5, true, "2.9.1"),
        ] {
            assert_ne!(base, other);
        }
    }
}
