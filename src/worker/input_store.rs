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
//! - Bounded before anything is written ([`InputStore::admit`]): the generator reports the entry's
//!   planned bytes first; under the store's admission lock (`.admission.lock`, across processes) the
//!   finished entries, the reservations of entries being made (`.<key>.reserve`, counted while the
//!   entry's lock is held, removed when it is free) and this entry must fit [`effective_cap`]
//!   (the file system's free space less a margin, and `resources.reference_cache_gb` when set);
//!   least recently used entries (the `used` file's mtime, touched at every use) are removed to make
//!   room. An entry that cannot fit is not made (`over_budget`), and the worker makes those inputs.
//!   After each generation the same LRU order trims the store to its limit. An entry being made (its
//!   lock held) is never removed; a reader whose entry vanishes makes its inputs itself.
//! - **In-memory tier** ([`InputStore::in_memory`]): a second store of the same layout in `/dev/shm`,
//!   kept for later runs (`resources.reference_ram_keep`, the default) or the run's own (removed when
//!   it ends, swept if it died), for entries the disk store refuses
//!   (a level-1 problem's six seeds reach 51 GB, more than a GPU machine's disk store holds). Its
//!   admission also keeps a quarter of the machine's memory available ([`memory_cap`]), and the
//!   generator then makes fewer seeds at once (each process holds its seed while the file fills
//!   memory too). Read back at memory speed instead of being drawn inside a candidate's lease.
//!   An entry refused only because other processes use that memory now (a batch's builds and
//!   makers, writes not yet on disk) waits for it like one refused for held entries, for at most
//!   [`MEMORY_WAIT`]; then its inputs are left to the worker.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

pub use super::input_admission::{
    EntryInfo, MIN_FREE_BYTES, RAM_RESERVE_SHARE, RAM_SHARE, RAM_STORE_KEPT, RAM_STORE_PREFIX,
    default_ram_bytes, effective_cap, meminfo, memory_cap, plan_admission, plan_eviction,
    ram_store_dir,
};
use tokio::io::AsyncWriteExt;

/// The harness file that makes entries.
pub const STORE_SCRIPT: &str = "kb_store.py";
/// Inside an entry: written last, so its presence means "complete" (the harness's `MANIFEST`).
pub const MANIFEST: &str = "manifest.json";
/// Inside an entry: touched at every use; its mtime orders eviction.
pub const USED: &str = "used";
/// In the store's folder: held while one admission decides (across processes).
const ADMISSION_LOCK: &str = ".admission.lock";
/// `.<key><RESERVATION>`: the planned bytes of an entry being made.
const RESERVATION: &str = ".reserve";
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
    /// How long the generator took (its own clock).
    #[serde(default)]
    pub seconds: f64,
    /// Bytes of inputs in the entry.
    #[serde(default)]
    pub bytes: u64,
    /// Processes that made seeds in parallel (0: one after another).
    #[serde(default)]
    pub parallel: u32,
    /// Why an entry was rebuilt, refused or could not be stored (the `inputs_prepared` event's
    /// detail).
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
    /// The entry does not fit the store's cap (see [`plan_admission`]): nothing was written, and the
    /// worker makes these inputs as it did before the store existed.
    OverBudget,
    /// Not the generator's answer: the orchestrator's, when every tier refused an entry that fits
    /// one of them once other entries' room comes back ([`InputStore::refused_for_now`]). Its
    /// inputs are made later, still off the lease, rather than inside a candidate's lease now.
    Deferred,
}

/// The store: where it is, how large it may grow, and how to start the harness that fills it.
#[derive(Debug, Clone)]
pub struct InputStore {
    /// The store's folder: one sub-folder per entry, their locks and reservations beside them.
    root: PathBuf,
    /// `resources.reference_cache_gb` in bytes (`u64::MAX` when unset: [`effective_cap`] then
    /// bounds the store by the file system's free space alone); for the in-memory tier
    /// `resources.reference_ram_gb`.
    limit: u64,
    /// The workers' Python (the generator imports torch as they do, so entries match their torch).
    python: PathBuf,
    /// The deployed harness, where `kb_store.py` is.
    harness_dir: PathBuf,
    /// The generator's whole environment (a worker's allowlist, no GPU visible).
    env: Vec<(String, OsString)>,
    /// `eval.timeouts.reference_s`: a generation that takes longer is killed.
    timeout: Duration,
    /// The in-memory tier: admission also keeps memory available, and the generator is told.
    memory: bool,
    /// Entries this process holds ([`InputStore::hold`]: a candidate of the problem waits for or
    /// holds a lease), with how many holds each: never removed to make room.
    held: Arc<Mutex<HashMap<String, usize>>>,
    /// This process's last refusal of each entry (see [`InputStore::refused_for_now`]).
    refusals: Arc<Mutex<HashMap<String, Refusal>>>,
}

/// A refused admission: the entry's planned bytes, and whether other entries' room comes back.
#[derive(Debug, Clone, Copy)]
struct Refusal {
    /// The entry's planned bytes: a retry asks whether that much would be admitted now.
    planned: u64,
    /// Other entries (held or being made) took the room: it comes back, so the entry is deferred.
    room_later: bool,
    /// In-memory tier: refused since then only for memory other processes use now (builds, input
    /// makers, writes not yet on disk): deferred for at most [`MEMORY_WAIT`] from then.
    memory_since: Option<Instant>,
}

/// How long an entry refused only for memory in use now (not for this tier's own entries) waits for
/// it to come back before its inputs are left to the worker: another user's job may hold it for
/// hours, a batch's builds for a minute or two.
pub const MEMORY_WAIT: Duration = Duration::from_secs(120);

/// An admission decision (see [`InputStore::admit`]).
struct Plan {
    /// The entries to remove; `None`: refused.
    victims: Option<Vec<String>>,
    /// Refused only for room held or reserved by other entries.
    room_later: bool,
    /// In-memory tier, refused for neither: it would fit were the memory other processes use now
    /// available again.
    memory_later: bool,
    /// Bytes other entries being made have reserved (counted against the cap).
    reserved: u64,
    /// The cap this decision was made under ([`effective_cap`], [`memory_cap`]).
    cap: u64,
    /// Why it was refused.
    why: String,
}

/// Keeps an entry from being evicted while it lives (see [`InputStore::hold`]).
#[derive(Debug)]
pub struct InputsHold {
    /// The store's hold counts (shared by its clones), decremented on drop.
    held: Arc<Mutex<HashMap<String, usize>>>,
    /// The entry held.
    key: String,
}

impl Drop for InputsHold {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
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
            memory: false,
            held: Arc::default(),
            refusals: Arc::default(),
        }
    }

    /// Hold the entry `key` while the guard lives: admission and trimming never remove it to make
    /// room (another problem's entry is refused instead). A candidate holds its problem's entry from
    /// before it queues for a lease until its evaluation ends, since a problem too large for the
    /// device's cache reads its inputs again for every candidate; an entry evicted under it would be
    /// drawn again inside the lease.
    pub fn hold(&self, key: &str) -> InputsHold {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        *held.entry(key.to_string()).or_default() += 1;
        InputsHold {
            held: self.held.clone(),
            key: key.to_string(),
        }
    }

    fn held_keys(&self) -> Vec<String> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.keys().cloned().collect()
    }

    /// This store is the in-memory tier (its root in `/dev/shm`): see the module doc.
    pub fn in_memory(mut self) -> InputStore {
        self.memory = true;
        self
    }

    pub fn is_in_memory(&self) -> bool {
        self.memory
    }

    /// The generator's environment.
    pub fn env(&self) -> &[(String, OsString)] {
        &self.env
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
        self.ensure_with(None, key, code, seed, trials, timing, torch)
            .await
    }

    /// [`InputStore::ensure`] with at most `processes` processes drawing the inputs (the CPU
    /// budget's grant, `crate::cpu_budget`); `None`: as many as the generator sees fit.
    #[allow(clippy::too_many_arguments)]
    pub async fn ensure_with(
        &self,
        processes: Option<u32>,
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
            // Ask before making anything: the generator reports the entry's planned bytes first.
            "admit": true,
            "processes": processes,
            // Each seed's file then fills memory too: the generator makes fewer at once.
            "in_memory": self.memory,
        });
        let answer = self.run_generator(key, &request.to_string()).await;
        let _ = tokio::fs::remove_dir_all(&tmp).await;
        // Made (or not): the entry now counts as itself, no longer as a reservation.
        let _ = tokio::fs::remove_file(self.reservation(key)).await;
        if matches!(&answer, Ok(a) if matches!(a.status,
            GenerateStatus::Hit | GenerateStatus::Generated | GenerateStatus::Rebuilt))
        {
            touch(&entry.join(USED));
        }
        drop(lock);
        let answer = answer?;
        self.evict(key).await;
        Ok(answer)
    }

    /// Start `kb_store.py <verb>` (`generate`, `plan`): in the store's folder, with the generator's
    /// environment (no GPU visible), below the timings' priority, tied to this process.
    async fn spawn_script(&self, verb: &str) -> Result<tokio::process::Child, String> {
        tokio::fs::create_dir_all(&self.root)
            .await
            .map_err(|e| format!("cannot create {}: {e}", self.root.display()))?;
        let mut cmd = tokio::process::Command::new(&self.python);
        cmd.arg(self.harness_dir.join(STORE_SCRIPT))
            .arg(verb)
            .current_dir(&self.root)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // A generator outlives no krefine, even a killed one (see `die_with_parent`).
        let krefine = std::process::id() as libc::pid_t;
        // It draws inputs beside the evaluation workers' timings and the builds: below the first,
        // ahead of the second (see `INPUTS_NICE` and `BUILD_NICE`).
        // SAFETY: only async-signal-safe `getpriority`, `setpriority`, `prctl` and `getppid` between
        // fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                super::session::lower_priority_to(super::session::INPUTS_NICE);
                super::session::die_with_parent(krefine)
            });
        }
        super::session::spawn_tied(cmd)
            .await
            .map_err(|e| format!("cannot start {}: {e}", self.python.display()))
    }

    /// Run `kb_store.py generate`: the request goes in on stdin; a generator that has to make the
    /// entry first reports its planned bytes (`{"planned": n}`) and waits for [`Self::admit`]'s answer
    /// on the same stdin; its last JSON line is the answer.
    async fn run_generator(&self, key: &str, request: &str) -> Result<GenerateAnswer, String> {
        let mut child = self.spawn_script("generate").await?;
        let stderr = collect_stderr(&mut child);
        let dialogue = self.dialogue(&mut child, key, request);
        let (status, last) = tokio::time::timeout(self.timeout, dialogue)
            .await
            .map_err(|_| {
                format!(
                    "making the inputs took longer than {} s (eval.timeouts.reference_s)",
                    self.timeout.as_secs()
                )
            })??;
        match last.as_deref().map(serde_json::from_str::<GenerateAnswer>) {
            Some(Ok(a)) => Ok(a),
            _ => Err(format!(
                "the input generator ended ({status}) without an answer: {}",
                stderr_tail(stderr).await
            )),
        }
    }

    /// The generator's side of the conversation: send `request`, answer its admission question (the
    /// `{"planned": n}` line) with [`Self::admit`]'s decision, keep the last other JSON line (its
    /// answer), and wait for it to exit.
    async fn dialogue(
        &self,
        child: &mut tokio::process::Child,
        key: &str,
        request: &str,
    ) -> Result<(std::process::ExitStatus, Option<String>), String> {
        use tokio::io::{AsyncBufReadExt, BufReader};

        let mut stdin = child.stdin.take();
        if let Some(stdin) = stdin.as_mut() {
            send_line(stdin, request)
                .await
                .map_err(|e| format!("cannot send the generation request: {e}"))?;
        }
        let mut last = None;
        if let Some(stdout) = child.stdout.take() {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if !line.trim_start().starts_with('{') {
                    continue;
                }
                let Ok(PlannedLine { planned }) = serde_json::from_str::<PlannedLine>(&line) else {
                    last = Some(line);
                    continue;
                };
                let reply = self.admit_blocking(key, planned).await;
                let reply = serde_json::json!({
                    "admit": reply.is_ok(),
                    "detail": reply.err().unwrap_or_default(),
                });
                if let Some(stdin) = stdin.as_mut() {
                    let _ = send_line(stdin, &reply.to_string()).await;
                }
            }
        }
        drop(stdin);
        let status = child
            .wait()
            .await
            .map_err(|e| format!("the input generator failed: {e}"))?;
        Ok((status, last))
    }

    /// The plans of several problems' entries (`kb_store.py plan`, one process sizing them all on
    /// the meta device, nothing made): per code, in order, the entry's bytes for `seeds` seeds and
    /// the processes its generator would use, at most `processes`.
    pub async fn plan_entries(
        &self,
        codes: &[&str],
        seeds: u32,
        processes: Option<u32>,
    ) -> Result<Vec<PlannedEntry>, String> {
        let mut child = self.spawn_script("plan").await?;
        let stderr = collect_stderr(&mut child);
        let request = serde_json::json!({"codes": codes, "seeds": seeds, "processes": processes});
        let talk = async {
            if let Some(mut stdin) = child.stdin.take() {
                send_line(&mut stdin, &request.to_string())
                    .await
                    .map_err(|e| format!("cannot send the plan request: {e}"))?;
            }
            let mut out = String::new();
            if let Some(mut stdout) = child.stdout.take() {
                use tokio::io::AsyncReadExt;
                let _ = stdout.read_to_string(&mut out).await;
            }
            let status = child
                .wait()
                .await
                .map_err(|e| format!("the input planner failed: {e}"))?;
            Ok::<_, String>((status, out))
        };
        let (status, out) = tokio::time::timeout(self.timeout, talk)
            .await
            .map_err(|_| "planning the inputs took too long".to_string())??;
        let answer = out.lines().rev().find(|l| l.trim_start().starts_with('{'));
        match answer.map(serde_json::from_str::<PlanAnswer>) {
            Some(Ok(a)) if a.plans.len() == codes.len() => Ok(a.plans),
            _ => Err(format!(
                "the input planner ended ({status}) without a plan: {}",
                stderr_tail(stderr).await
            )),
        }
    }

    /// The reservation file of an entry being made: its planned bytes, counted against the cap by
    /// every process's admission while the entry's lock is held (a stale one, its lock free, is
    /// removed by the next admission).
    fn reservation(&self, key: &str) -> PathBuf {
        self.root.join(format!(".{key}{RESERVATION}"))
    }

    async fn admit_blocking(&self, key: &str, planned: Option<u64>) -> Result<(), String> {
        let store = self.clone();
        let key = key.to_string();
        tokio::task::spawn_blocking(move || store.admit(&key, planned))
            .await
            .unwrap_or_else(|e| Err(format!("admission failed: {e}")))
    }

    /// Admission of the entry `key` (its lock held by the caller) of `planned` bytes, under the
    /// store's admission lock (one admission at a time across processes): the finished entries, the
    /// others being made and this one must fit [`effective_cap`]; least recently used entries are
    /// removed to make room. Admitted: its reservation is written. Refused (`Err`, why): nothing
    /// is removed or written, and the worker makes the inputs itself.
    pub fn admit(&self, key: &str, planned: Option<u64>) -> Result<(), String> {
        let Some(planned) = planned else {
            return Err(
                "the entry's size is unknown before making it (get_inputs() does not \
                        run on the meta device)"
                    .into(),
            );
        };
        let _lock = self.admission_lock()?;
        let plan = self.plan(key, planned);
        let victims = match plan.victims {
            Some(victims) => victims,
            None => {
                self.refused(key, planned, plan.room_later, plan.memory_later);
                return Err(plan.why);
            }
        };
        // Every victim is tried (no short circuit): one in use since the plan just stays.
        let failed = victims.iter().filter(|v| !self.remove_unlocked(v)).count();
        if failed > 0 {
            let left: u64 = self.scan().iter().map(|e| e.bytes).sum();
            if left.saturating_add(plan.reserved).saturating_add(planned) > plan.cap {
                self.refused(key, planned, true, false);
                return Err(plan.why);
            }
        }
        std::fs::write(self.reservation(key), planned.to_string())
            .map_err(|e| format!("cannot write the reservation of {key}: {e}"))?;
        self.refusals().remove(key);
        Ok(())
    }

    /// Would an entry of `planned` bytes be admitted now? The same decision as [`Self::admit`],
    /// under the same lock, with nothing removed or reserved: a deferred entry is retried only once
    /// this says yes, so a retry that would be refused again starts no generator.
    pub fn would_admit(&self, key: &str, planned: u64) -> bool {
        let Ok(_lock) = self.admission_lock() else {
            return false;
        };
        self.plan(key, planned).victims.is_some()
    }

    /// The planned bytes of `key`'s last refusal here when it was refused for want of room that
    /// other entries (held by queued candidates, or being made) will give back, or (in-memory tier,
    /// for less than [`MEMORY_WAIT`]) memory other processes use now: it fits this store alone,
    /// so waiting for room beats drawing the inputs inside a lease.
    pub fn refused_for_now(&self, key: &str) -> Option<u64> {
        self.refusals().get(key).and_then(|r| {
            let memory = r.memory_since.is_some_and(|t| t.elapsed() < MEMORY_WAIT);
            (r.room_later || memory).then_some(r.planned)
        })
    }

    fn refusals(&self) -> std::sync::MutexGuard<'_, HashMap<String, Refusal>> {
        self.refusals.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a refusal; one for memory in use keeps the time of the first such refusal in a row
    /// (the wait is bounded from there).
    fn refused(&self, key: &str, planned: u64, room_later: bool, memory_later: bool) {
        let mut refusals = self.refusals();
        let memory_since = memory_later.then(|| {
            refusals
                .get(key)
                .and_then(|r| r.memory_since)
                .unwrap_or_else(Instant::now)
        });
        refusals.insert(
            key.to_string(),
            Refusal {
                planned,
                room_later,
                memory_since,
            },
        );
    }

    /// The store's admission lock (one admission at a time, across processes), held while the
    /// returned file lives.
    fn admission_lock(&self) -> Result<std::fs::File, String> {
        std::fs::create_dir_all(&self.root)
            .map_err(|e| format!("cannot create {}: {e}", self.root.display()))?;
        let lock_path = self.root.join(ADMISSION_LOCK);
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| format!("cannot open {}: {e}", lock_path.display()))?;
        lock.lock()
            .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
        Ok(lock)
    }

    /// Admission's decision for `key` of `planned` bytes (the admission lock held by the caller).
    fn plan(&self, key: &str, planned: u64) -> Plan {
        let (reserved, mut busy) = self.reservations(key);
        busy.extend(self.held_keys());
        let entries = self.scan();
        let stored: u64 = entries.iter().map(|e| e.bytes).sum();
        let (free, fs_total) = fs_space(&self.root).unwrap_or((u64::MAX, 0));
        let disk_cap = effective_cap(self.limit, stored, free, fs_total);
        let mut cap = disk_cap;
        // The cap were no other process using memory (the tier's entries still in /dev/shm).
        let mut cap_memory_free = disk_cap;
        if self.memory
            && let Some((total, available)) = meminfo()
        {
            cap = memory_cap(disk_cap, stored, available, total);
            cap_memory_free = memory_cap(disk_cap, stored, total.saturating_sub(stored), total);
        }
        let victims = plan_admission(&entries, reserved, planned, cap, key, &busy);
        // Refused, but it would fit were the held and reserved entries gone: room comes later.
        let room_later =
            victims.is_none() && plan_admission(&entries, 0, planned, cap, key, &[]).is_some();
        // Refused for more than that, but it would fit once the memory other processes use now
        // comes back too.
        let memory_later = victims.is_none()
            && !room_later
            && plan_admission(&entries, 0, planned, cap_memory_free, key, &[]).is_some();
        let (tier, limit_key) = if self.memory {
            ("the in-memory store", "resources.reference_ram_gb")
        } else {
            ("the store", "resources.reference_cache_gb")
        };
        let limit = match self.limit {
            u64::MAX => "unset".to_string(),
            n => format!("{n} bytes"),
        };
        let why = format!(
            "{planned} bytes do not fit {tier}: cap {cap} bytes ({limit_key} {limit}, free space \
             {free} bytes), {reserved} bytes being made by others{}",
            if room_later {
                ", the rest held by queued candidates"
            } else if memory_later {
                ", the rest in use by other processes now"
            } else {
                ""
            }
        );
        Plan {
            victims,
            room_later,
            memory_later,
            reserved,
            cap,
            why,
        }
    }

    /// The bytes reserved by other entries being made (their lock held), and their keys; stale
    /// reservations (lock free: the maker is gone) are removed.
    fn reservations(&self, key: &str) -> (u64, Vec<String>) {
        let mut total = 0u64;
        let mut busy = Vec::new();
        let Ok(dir) = std::fs::read_dir(&self.root) else {
            return (0, busy);
        };
        for e in dir.filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(other) = name
                .strip_prefix('.')
                .and_then(|n| n.strip_suffix(RESERVATION))
            else {
                continue;
            };
            if other == key {
                continue;
            }
            if self.lock_is_free(other) {
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            let bytes = std::fs::read_to_string(e.path())
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(0);
            total = total.saturating_add(bytes);
            busy.push(other.to_string());
        }
        (total, busy)
    }

    fn lock_is_free(&self, key: &str) -> bool {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.root.join(format!("{key}.lock")))
            .is_ok_and(|f| f.try_lock().is_ok())
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
        if self.held_keys().iter().any(|k| k == key) {
            return false;
        }
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

/// One entry's plan, as `kb_store.py plan` answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedEntry {
    /// The entry's bytes (every seed); `None`: unknown until made.
    pub bytes: Option<u64>,
    /// Processes its generator would use (1: its own).
    pub processes: u32,
}

#[derive(Deserialize)]
struct PlanAnswer {
    plans: Vec<PlannedEntry>,
}

/// Read a child's stderr to its end in the background (for the error of a child that gave no answer).
fn collect_stderr(child: &mut tokio::process::Child) -> Option<tokio::task::JoinHandle<Vec<u8>>> {
    use tokio::io::AsyncReadExt;

    child.stderr.take().map(|mut err| {
        tokio::spawn(async move {
            let mut buf = Vec::new();
            let _ = err.read_to_end(&mut buf).await;
            buf
        })
    })
}

/// The last ten lines of a collected stderr.
async fn stderr_tail(task: Option<tokio::task::JoinHandle<Vec<u8>>>) -> String {
    let bytes = match task {
        Some(t) => t.await.unwrap_or_default(),
        None => Vec::new(),
    };
    let text = String::from_utf8_lossy(&bytes);
    let tail: Vec<&str> = text.lines().rev().take(10).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

async fn send_line(stdin: &mut tokio::process::ChildStdin, line: &str) -> std::io::Result<()> {
    stdin.write_all(format!("{line}\n").as_bytes()).await?;
    stdin.flush().await
}

/// The generator's first line when it must make the entry: its planned bytes (null: unknown).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlannedLine {
    planned: Option<u64>,
}

/// (free bytes for an unprivileged writer, total bytes) of the file system holding `path`.
fn fs_space(path: &Path) -> Option<(u64, u64)> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    let unit = st.fragment_size() as u64;
    Some((
        (st.blocks_available() as u64).saturating_mul(unit),
        (st.blocks() as u64).saturating_mul(unit),
    ))
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

    /// A store of 10,000 bytes in `dir` (no generator is started by these tests).
    fn store_of_10k(dir: &Path) -> InputStore {
        InputStore::new(
            dir.to_path_buf(),
            10_000,
            "python3".into(),
            dir.to_path_buf(),
            Vec::new(),
            Duration::from_secs(1),
        )
    }

    #[test]
    fn a_held_entry_is_never_evicted_to_make_room() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_of_10k(dir.path());
        let now = SystemTime::now();
        for (key, age) in [("old", 100), ("new", 50)] {
            let e = dir.path().join(key);
            std::fs::create_dir_all(&e).unwrap();
            std::fs::write(e.join(MANIFEST), "{}").unwrap();
            std::fs::write(e.join("seed-1.bin"), vec![0u8; 4000]).unwrap();
            let used = std::fs::File::create(e.join(USED)).unwrap();
            used.set_modified(now - Duration::from_secs(age)).unwrap();
        }
        let exists = |key: &str| dir.path().join(key).join(MANIFEST).is_file();
        // The least recently used entry is held: the other one makes room instead.
        let hold = store.hold("old");
        store.admit("x", Some(4000)).unwrap();
        assert!(exists("old") && !exists("new"));
        // x is made (and held by its candidate): nothing can go, so y is refused.
        let e = dir.path().join("x");
        std::fs::create_dir_all(&e).unwrap();
        std::fs::write(e.join(MANIFEST), "{}").unwrap();
        std::fs::write(e.join("seed-1.bin"), vec![0u8; 4000]).unwrap();
        std::fs::File::create(e.join(USED)).unwrap();
        let _x = store.hold("x");
        let e = store.admit("y", Some(4000)).unwrap_err();
        assert!(e.contains("do not fit the store"), "{e}");
        assert!(e.contains("held by queued candidates"), "{e}");
        assert!(exists("old"));
        // Refused for room the held entries give back: y waits for it (no generator meanwhile).
        assert_eq!(store.refused_for_now("y"), Some(4000));
        assert!(!store.would_admit("y", 4000));
        // Larger than the store alone: nothing to wait for.
        assert!(store.admit("huge", Some(20_000)).is_err());
        assert_eq!(store.refused_for_now("huge"), None);
        // Released: it is evicted like any other; asking removes nothing, admitting does.
        drop(hold);
        assert!(store.would_admit("y", 4000));
        assert!(exists("old"));
        store.admit("y", Some(4000)).unwrap();
        assert!(!exists("old"));
        assert_eq!(store.refused_for_now("y"), None);
    }

    #[test]
    fn an_entry_waits_for_memory_in_use_for_a_bounded_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_of_10k(dir.path());
        // Refused for memory other processes use: deferred, and a second refusal in a row keeps
        // the first one's time.
        store.refused("big", 5000, false, true);
        assert_eq!(store.refused_for_now("big"), Some(5000));
        let first = store.refusals()["big"].memory_since;
        store.refused("big", 5000, false, true);
        assert_eq!(store.refusals()["big"].memory_since, first);
        // Waited longer than MEMORY_WAIT: no longer deferred (the worker makes its inputs).
        let long_ago = Instant::now().checked_sub(MEMORY_WAIT + Duration::from_secs(1));
        if let Some(long_ago) = long_ago {
            store.refusals().get_mut("big").unwrap().memory_since = Some(long_ago);
            assert_eq!(store.refused_for_now("big"), None);
            store.refused("big", 5000, false, true);
            assert_eq!(
                store.refused_for_now("big"),
                None,
                "the wait is not restarted"
            );
        }
        // Refused for neither: not deferred at all.
        store.refused("huge", 50_000, false, false);
        assert_eq!(store.refused_for_now("huge"), None);
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
