//! The inputs room: the stores of CPU-made reference inputs this pool writes and reads (the disk store
//! and its in-memory tier), and the CPU stage of reference preparation (planning and making a
//! problem's inputs off the device lease, see `crate::refprep`).
//!
//! [`InputTiers`] are opened before the workers start (the generator's scratch folder, the in-memory
//! tier's folder); once the workers said which torch they run, they become [`InputStores`], which
//! know what an entry is made of and answer every question the pool has about inputs.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::WorkerError;
use super::config::InputsMode;
use super::input_store::{
    GenerateAnswer, GenerateStatus, InputStore, PlannedEntry, RAM_STORE_PREFIX, entry_key,
    ram_store_dir,
};
use super::outcome::elapsed_ms;
use super::settings::WorkerSettings;
use super::spawn_spec::{SpawnSpec, worker_env};
use crate::scratch::Scratch;
use crate::services::{InputsPlan, Unavailable};
use crate::types::{
    INPUTS_DEFERRED, INPUTS_TIER_DISK, INPUTS_TIER_MEMORY, InputsOutcome, Problem, ProblemKey,
};

/// The store's tiers, opened before the workers start.
pub(super) struct InputTiers {
    disk: Option<InputStore>,
    ram: Option<InputStore>,
    ram_scratch: Option<Scratch>,
}

impl InputTiers {
    /// Open the tiers `settings` ask for: the disk store when it is on (`eval.inputs =
    /// "kernelbench"`, a size above 0, a local launcher: remote workers would not see it), and its
    /// in-memory tier in `/dev/shm`. `generator`: how the store's generator runs (its environment
    /// and scratch), asked for only when the store is on.
    pub(super) async fn open(
        settings: &WorkerSettings,
        reference_deadline: Duration,
        generator: impl FnOnce() -> SpawnSpec,
    ) -> Result<InputTiers, WorkerError> {
        let disk = match &settings.reference_cache {
            Some(root)
                if !settings.launcher.is_remote()
                    && settings.reference_cache_bytes > 0
                    && settings.inputs == InputsMode::Kernelbench =>
            {
                // The generator runs the problem's (trusted) code on the CPU with every GPU hidden,
                // outside the sandbox: it is the only writer of the store.
                let gen_spec = generator();
                tokio::fs::create_dir_all(&gen_spec.scratch)
                    .await
                    .map_err(|e| WorkerError::io("create scratch", &gen_spec.scratch, e))?;
                Some(InputStore::new(
                    root.clone(),
                    settings.reference_cache_bytes,
                    settings.python.clone(),
                    settings.harness_dir.clone(),
                    worker_env(&gen_spec),
                    reference_deadline,
                ))
            }
            _ => None,
        };
        // The in-memory tier: this run's own folder in /dev/shm (a dead run's is swept), or the
        // machine's kept one, shared by runs and left in place.
        let shm = std::path::Path::new("/dev/shm");
        let ram_root = match &disk {
            Some(_) if settings.reference_ram_keep && settings.reference_ram_bytes > 0 => {
                let dir = ram_store_dir(true);
                match std::fs::create_dir_all(dir.join("inputs")) {
                    Ok(()) => Some(dir.join("inputs")),
                    Err(e) => {
                        tracing::warn!("no in-memory input store in {}: {e}", dir.display());
                        None
                    }
                }
            }
            _ => None,
        };
        let ram_scratch = match &disk {
            Some(_) if ram_root.is_some() => None,
            Some(_) if settings.reference_ram_bytes > 0 && shm.is_dir() => {
                match Scratch::claim(shm, RAM_STORE_PREFIX) {
                    Ok(s) => Some(s),
                    Err(e) => {
                        tracing::warn!("no in-memory input store in {}: {e}", shm.display());
                        None
                    }
                }
            }
            _ => None,
        };
        let ram_root = ram_root.or_else(|| ram_scratch.as_ref().map(|s| s.path().join("inputs")));
        let ram = match (&disk, ram_root) {
            (Some(disk), Some(root)) => Some(
                InputStore::new(
                    root,
                    settings.reference_ram_bytes,
                    settings.python.clone(),
                    settings.harness_dir.clone(),
                    disk.env().to_vec(),
                    reference_deadline,
                )
                .in_memory(),
            ),
            _ => None,
        };
        Ok(InputTiers {
            disk,
            ram,
            ram_scratch,
        })
    }

    /// The stores, for entries made under `settings` by workers running torch `torch`.
    pub(super) fn for_entries(self, settings: &WorkerSettings, torch: &str) -> InputStores {
        InputStores {
            disk: self.disk,
            ram: self.ram,
            _ram_scratch: self.ram_scratch,
            seed: settings.seed,
            correct_trials: settings.correct_trials,
            timed: settings.timing_trials > 0,
            torch: torch.to_string(),
        }
    }
}

/// The input stores of one pool, and what their entries are made of.
pub(super) struct InputStores {
    /// The on-disk store of CPU-made inputs, when it is on (see [`InputTiers::open`]).
    disk: Option<InputStore>,
    /// The store's in-memory tier (`/dev/shm`), for entries the disk store refuses.
    ram: Option<InputStore>,
    /// The in-memory tier's folder when it is this run's own: removed when the pool is dropped.
    _ram_scratch: Option<Scratch>,
    /// The run's seed: part of every entry's key (the inputs are drawn from it).
    seed: u64,
    /// Correctness trials: one set of inputs each, part of the key.
    correct_trials: u32,
    /// Timing is on: one more set of inputs, part of the key.
    timed: bool,
    /// The workers' torch version: part of the key (another torch may draw other inputs).
    torch: String,
}

impl InputStores {
    /// The store key of `problem`'s inputs.
    fn key(&self, problem: &Problem) -> String {
        entry_key(
            &problem.code,
            self.seed,
            self.correct_trials,
            self.timed,
            &self.torch,
        )
    }

    /// Both tiers that are on, the disk store first.
    fn tiers(&self) -> impl Iterator<Item = &InputStore> {
        [&self.disk, &self.ram].into_iter().flatten()
    }

    /// The store entry of `problem`'s inputs when it is whole (made by this run or any other), on
    /// disk or in the in-memory tier.
    pub(super) fn stored(&self, problem: &Problem) -> Option<String> {
        let key = self.key(problem);
        let dir = self.tiers().find_map(|store| store.usable(&key))?;
        Some(dir.to_string_lossy().into_owned())
    }

    /// Hold `problem`'s entry in both tiers (see `InputStore::hold`); `None` without a store.
    pub(super) fn hold(&self, problem: &Problem) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        let key = self.key(problem);
        let holds: Vec<_> = self.tiers().map(|store| store.hold(&key)).collect();
        (!holds.is_empty()).then(|| Box::new(holds) as Box<dyn std::any::Any + Send + Sync>)
    }

    async fn ensure_in(
        &self,
        store: &InputStore,
        processes: Option<u32>,
        key: &str,
        problem: &Problem,
    ) -> Result<GenerateAnswer, String> {
        store
            .ensure_with(
                processes,
                key,
                &problem.code,
                self.seed,
                self.correct_trials,
                self.timed,
                &self.torch,
            )
            .await
    }

    /// The plans of `problems`' inputs (see [`Executor::plan_inputs`]): one planner process for all
    /// of them; empty without a store or when planning fails (logged).
    ///
    /// [`Executor::plan_inputs`]: crate::services::Executor::plan_inputs
    pub(super) async fn plan(
        &self,
        problems: &[Arc<Problem>],
        processes: Option<u32>,
    ) -> HashMap<ProblemKey, InputsPlan> {
        let Some(store) = &self.disk else {
            return HashMap::new();
        };
        let seeds = self.correct_trials + u32::from(self.timed);
        let started = Instant::now();
        let folder = store.root().join(PLANS_DIR);
        let mut planned: HashMap<ProblemKey, PlannedEntry> = HashMap::new();
        let mut missing: Vec<&Arc<Problem>> = Vec::new();
        for problem in problems {
            match read_plan(&folder, &self.key(problem), processes).await {
                Some(entry) => {
                    planned.insert(problem.key, entry);
                }
                None => missing.push(problem),
            }
        }
        if !missing.is_empty() {
            let codes: Vec<&str> = missing.iter().map(|p| p.code.as_str()).collect();
            match store.plan_entries(&codes, seeds, processes).await {
                Ok(plans) => {
                    for (problem, entry) in missing.iter().zip(plans) {
                        write_plan(&folder, &self.key(problem), processes, entry).await;
                        planned.insert(problem.key, entry);
                    }
                }
                Err(e) => {
                    tracing::warn!(
                        "could not plan the problems' inputs (made in arrival order): {e}"
                    );
                    return HashMap::new();
                }
            }
        }
        tracing::info!(
            "inputs of {} problem(s) planned in {} ms ({} plan(s) kept from earlier runs)",
            problems.len(),
            started.elapsed().as_millis(),
            problems.len() - missing.len()
        );
        planned
            .into_iter()
            .map(|(key, e)| {
                let plan = InputsPlan {
                    bytes: e.bytes,
                    processes: e.processes.max(1),
                };
                (key, plan)
            })
            .collect()
    }

    /// The CPU stage of `problem` (see `crate::refprep`): its inputs made into the store by a
    /// process of their own, while no device lease is held. `None` without a store.
    pub(super) async fn make(
        &self,
        problem: &Problem,
        processes: Option<u32>,
    ) -> Result<Option<InputsOutcome>, Unavailable> {
        let Some(store) = &self.disk else {
            return Ok(None);
        };
        let started = Instant::now();
        let key = self.key(problem);
        let tiers: Vec<&InputStore> = self.tiers().collect();
        // Deferred before (and not made since): no generator is started (it would import torch only
        // to be refused again) until one tier would take the entry now.
        let known = tiers.iter().find_map(|t| t.refused_for_now(&key));
        if let Some(planned) = known
            && self.stored(problem).is_none()
            && !admits_now(&tiers, &key, planned).await
        {
            let tier = waits_in(&tiers, &key);
            return Ok(Some(deferred(planned, elapsed_ms(started), tier)));
        }
        // An entry kept in the in-memory tier only is read there at once: asking the disk store
        // first started a generator (torch imported, the entry planned) only to be refused, about
        // 2 s in front of each such problem's first lease.
        let ram_only = self
            .ram
            .as_ref()
            .filter(|ram| store.usable(&key).is_none() && ram.usable(&key).is_some());
        let (mut answer, mut tier) = match ram_only {
            Some(ram) => (
                self.ensure_in(ram, processes, &key, problem)
                    .await
                    .map(|mut a| {
                        a.detail = "in memory".into();
                        a
                    }),
                INPUTS_TIER_MEMORY,
            ),
            None => (
                self.ensure_in(store, processes, &key, problem).await,
                INPUTS_TIER_DISK,
            ),
        };
        // Too large for the disk store: the in-memory tier, still off the lease (the worker would
        // otherwise draw these inputs inside a candidate's lease).
        if let (Ok(disk), Some(ram)) = (&answer, &self.ram)
            && ram_only.is_none()
            && disk.status == GenerateStatus::OverBudget
        {
            let refused = disk.detail.clone();
            tier = INPUTS_TIER_MEMORY;
            answer = self
                .ensure_in(ram, processes, &key, problem)
                .await
                .map(|mut a| {
                    a.detail = match a.status {
                        GenerateStatus::OverBudget => format!("{refused}; {}", a.detail),
                        _ => format!("in memory ({refused})"),
                    };
                    a
                });
        }
        // Refused by every tier, but one of them has room once queued candidates are done with
        // their entries (or, for up to `MEMORY_WAIT`, once memory other processes use now comes
        // back): made later (see `crate::refprep`), not inside a lease now. The tier it waits for
        // is named when only one would take it (the CPU stage then runs the candidates holding
        // room there first).
        let mut waits_for = None;
        if let Ok(a) = &mut answer
            && a.status == GenerateStatus::OverBudget
            && tiers.iter().any(|t| t.refused_for_now(&key).is_some())
        {
            a.status = GenerateStatus::Deferred;
            waits_for = waits_in(&tiers, &key);
        }
        let duration_ms = elapsed_ms(started);
        Ok(Some(match answer {
            Ok(a) => {
                let tier = match a.status {
                    GenerateStatus::Hit | GenerateStatus::Generated | GenerateStatus::Rebuilt => {
                        Some(tier)
                    }
                    GenerateStatus::Deferred => waits_for,
                    _ => None,
                };
                InputsOutcome {
                    status: serde_json::to_value(a.status)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default(),
                    bytes: a.bytes,
                    duration_ms,
                    parallel: a.parallel,
                    detail: (!a.detail.is_empty()).then_some(a.detail),
                    tier: tier.map(str::to_string),
                }
            }
            Err(e) => InputsOutcome {
                status: "failed".into(),
                bytes: 0,
                duration_ms,
                parallel: 0,
                detail: Some(e),
                tier: None,
            },
        }))
    }
}

/// The disk store's folder of plans already made (`<key>.json`, see [`read_plan`]).
pub const PLANS_DIR: &str = ".plans";

/// A plan kept from an earlier run, as written by [`write_plan`].
#[derive(Debug, Serialize, Deserialize)]
struct KeptPlan {
    /// The processes cap the plan was made under (the CPU budget's share for input makers).
    cap: Option<u32>,
    #[serde(flatten)]
    entry: PlannedEntry,
}

/// The plan of entry `key` made by an earlier run under the same processes cap, if any. An entry's
/// bytes follow from its key (the problem's code, seeds, trials and torch): planning them again
/// started a process that imported torch (about 4 s before a warm batch's first lease). The
/// processes its maker runs also depend on the memory available when it was planned: a kept plan
/// may claim a little more or less than a fresh one would (the maker itself still decides within
/// the grant).
async fn read_plan(folder: &Path, key: &str, cap: Option<u32>) -> Option<PlannedEntry> {
    let bytes = tokio::fs::read(folder.join(format!("{key}.json")))
        .await
        .ok()?;
    let kept: KeptPlan = serde_json::from_slice(&bytes).ok()?;
    (kept.cap == cap).then_some(kept.entry)
}

/// Keep entry `key`'s plan for later runs (best effort: a plan not kept is made again).
async fn write_plan(folder: &Path, key: &str, cap: Option<u32>, entry: PlannedEntry) {
    let Ok(text) = serde_json::to_vec(&KeptPlan { cap, entry }) else {
        return;
    };
    let tmp = folder.join(format!(".{key}.{}", std::process::id()));
    let write = async {
        tokio::fs::create_dir_all(folder).await?;
        tokio::fs::write(&tmp, text).await?;
        tokio::fs::rename(&tmp, folder.join(format!("{key}.json"))).await
    };
    if let Err(e) = write.await {
        let _ = tokio::fs::remove_file(&tmp).await;
        tracing::debug!("could not keep the plan of {key}: {e}");
    }
}

/// The CPU stage's outcome for an entry no tier takes yet (see [`GenerateStatus::Deferred`]).
fn deferred(planned: u64, duration_ms: u64, tier: Option<&str>) -> InputsOutcome {
    InputsOutcome {
        status: INPUTS_DEFERRED.into(),
        bytes: 0,
        duration_ms,
        parallel: 0,
        detail: Some(format!(
            "{planned} bytes wait for room that queued candidates' entries (or, for a while, \
             other processes' memory) give back"
        )),
        tier: tier.map(str::to_string),
    }
}

/// The only tier of `tiers` that will have room for `key`'s refused entry later, when only one
/// will (`None`: both, or neither).
fn waits_in(tiers: &[&InputStore], key: &str) -> Option<&'static str> {
    let later: Vec<&&InputStore> = tiers
        .iter()
        .filter(|t| t.refused_for_now(key).is_some())
        .collect();
    match later.as_slice() {
        [only] if only.is_in_memory() => Some(INPUTS_TIER_MEMORY),
        [_] => Some(INPUTS_TIER_DISK),
        _ => None,
    }
}

/// Would any of `tiers` admit `key`'s entry of `planned` bytes now? Each asks under its admission
/// lock (a file lock, and a scan of its folder): off the runtime's threads.
async fn admits_now(tiers: &[&InputStore], key: &str, planned: u64) -> bool {
    for tier in tiers {
        let (tier, key) = ((*tier).clone(), key.to_string());
        let yes = tokio::task::spawn_blocking(move || tier.would_admit(&key, planned))
            .await
            .unwrap_or(false);
        if yes {
            return true;
        }
    }
    false
}
