//! The content-addressed build cache (`build_cache/<blake3(source, torch, arch list)[..16]>`): build
//! keys, the per-build-dir lock, and the markers a cached build answers from without touching Python:
//! the success marker, and the failure marker of a build that failed in the candidate's own code (its
//! error and compiler output, replayed to the next request of the same source, toolchain and flags, so
//! no failing build is paid twice).
//!
//! [`Builds`] is the build room: the cache's folder, what its keys are made of, and the locks of the
//! build dirs in use; the compile and execute jobs ask it for a build dir, its lock and its markers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::sync::{Mutex, OwnedMutexGuard};

use super::build_store::{
    PCH_DIR, STALE_PUBLISH, make_files_read_only, publish_pchs, publish_pchs_as_built,
    sweep_publish_leftovers,
};
use super::config::BuildMode;
use super::outcome::elapsed_ms;
use super::slot::Slot;
use crate::services::{CompileJob, Unavailable};
use crate::types::{CompileOutcome, CompileStatus};

pub(super) use super::build_store::SUCCESS_MARKER;
/// A copy of the compile log kept with the build, handed to later jobs that hit the cache.
pub(super) const CACHED_LOG: &str = "krefine-compile.log";
/// Written into a build dir after a build that failed in the candidate's own code: the failure a
/// later request of the same key gets without building (see [`FailureMarker`]).
pub(crate) const FAILURE_MARKER: &str = "krefine-failed.json";
/// The failed build's compile log, kept next to its marker.
const FAILED_LOG: &str = "krefine-failed.log";

/// Words of a compile error that say the machine, not the candidate, failed it: such a failure is
/// not cached (the next request builds again).
const TRANSIENT_FAILURES: &[&str] = &[
    "No space left on device",
    "Cannot allocate memory",
    "MemoryError",
    "Resource temporarily unavailable",
    "Too many open files",
    "Killed",
    "Interrupted system call",
    "Stale file handle",
    "Input/output error",
];

/// Whether a failed build may be cached and replayed: its error and compiler output name nothing of
/// the machine's own (a full disk, a killed compiler, ...).
pub(super) fn failure_is_cacheable(error: Option<&str>, feedback: &str, log: &str) -> bool {
    let said = [error.unwrap_or(""), feedback, log];
    !TRANSIENT_FAILURES
        .iter()
        .any(|w| said.iter().any(|text| text.contains(w)))
}

/// Exclusive use of one build dir: the in-process lock, then the cross-process file lock that every
/// krefine process sharing the build cache takes (`<build dir>.lock`, next to the dir so that the
/// build itself never touches it). A concurrent run therefore never sees a half-written build.
pub(super) struct BuildGuard {
    pub(super) dir: PathBuf,
    pub(super) _local: OwnedMutexGuard<()>,
    pub(super) _file: crate::lock::FileLock,
}

impl Drop for BuildGuard {
    fn drop(&mut self) {
        // Before the locks (fields) are released: see release_build_dir.
        super::build_store::release_build_dir(&self.dir);
    }
}

/// The success marker's content.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct BuildMarker {
    pub(super) key: String,
    pub(super) torch: String,
    pub(super) arch_list: Option<String>,
    pub(super) feedback: String,
    pub(super) duration_s: f64,
    /// How the build was made (`fast`, `plain`, `fallback:<why>`), reported again on a cache hit.
    #[serde(default)]
    pub(super) build_path: Option<String>,
}

/// The failure marker's content. A failure is replayed only to a worker running the same harness
/// (`harness`): the build code is the harness's, so another version may build what this one could
/// not.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct FailureMarker {
    pub(super) key: String,
    pub(super) torch: String,
    pub(super) arch_list: Option<String>,
    pub(super) harness: String,
    pub(super) error_name: Option<String>,
    pub(super) error: Option<String>,
    pub(super) feedback: String,
    pub(super) duration_s: f64,
    #[serde(default)]
    pub(super) build_path: Option<String>,
}

/// What a failed build said, to be cached with it.
pub(super) struct FailedBuild<'a> {
    pub(super) error_name: Option<&'a str>,
    pub(super) error: Option<&'a str>,
    pub(super) feedback: &'a str,
    pub(super) duration_s: f64,
    pub(super) build_path: Option<&'a str>,
}

/// The build room: the content-addressed build cache one pool builds into.
pub(super) struct Builds {
    /// The cache's folder (`eval.build_cache`), shared with other runs.
    root: PathBuf,
    /// How `load_inline` extensions are built (`eval.build`): a plain build is its own artifact, so
    /// the mode is part of the key.
    mode: BuildMode,
    /// torch version of the workers (part of the build key).
    torch: String,
    /// The first compile worker's toolchain (machine, libc, compilers; part of the build key).
    toolchain: Option<String>,
    /// The arch list builds use (settings, or derived from the GPUs; part of the build key).
    arch_list: Option<String>,
    /// The in-process half of each build dir's lock (see [`Builds::lock`]); an entry nobody holds or
    /// waits for is dropped at the next lock.
    locks: StdMutex<HashMap<PathBuf, Arc<Mutex<()>>>>,
    /// Which sandboxed compile worker builds the run's shared precompiled headers
    /// ([`Builds::pch_background_for`]).
    pch_builder: StdMutex<PchBuilder>,
    /// Whether a task publishes the header builder's headers as they are completed
    /// ([`Builds::watch_pchs_of`]).
    pch_watch: Arc<std::sync::atomic::AtomicBool>,
}

/// Who builds a run's shared precompiled headers in the background (sandboxed workers only).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
enum PchBuilder {
    /// No worker yet: the next request may start them.
    #[default]
    Open,
    /// One request in flight may (its worker named); the others do not until it answers.
    Trying(String),
    /// This worker started them: only it builds headers from now on.
    Chosen(String),
}

impl Builds {
    pub(super) fn new(
        root: PathBuf,
        mode: BuildMode,
        torch: String,
        toolchain: Option<String>,
        arch_list: Option<String>,
    ) -> Builds {
        Builds {
            root,
            mode,
            torch,
            toolchain,
            arch_list,
            locks: StdMutex::new(HashMap::new()),
            pch_builder: StdMutex::new(PchBuilder::Open),
            pch_watch: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    /// Whether compile worker `worker` may build, in the background, the shared precompiled headers
    /// its candidate's build missed. A sandboxed worker builds them in its own copy-on-write layer of
    /// the cache (published after its next build and at shutdown), where no other worker's flock sees
    /// them: left to every worker, each built the same headers (40-60 CPU-s each; 96 of them in a
    /// 64-candidate batch on 64 workers, more compiler work than the candidates' own builds). So one
    /// request at a time may start them until a worker did ([`Builds::pch_answer`]), a request whose
    /// candidate builds an extension (`extension`: its source names `load_inline` or
    /// `cpp_extension`; a PyTorch-only one would miss no header, and while it held the turn every
    /// other build of a first wave went out without one); that worker builds the run's headers and no
    /// other does. Unsandboxed workers share the cache's `pch/` and its per-header flock: each may
    /// ask, one builds.
    pub(super) fn pch_background_for(
        &self,
        worker: &str,
        sandboxed: bool,
        extension: bool,
    ) -> bool {
        if !sandboxed {
            return true;
        }
        let mut builder = self.pch_builder();
        match &*builder {
            PchBuilder::Open if extension => {
                *builder = PchBuilder::Trying(worker.to_string());
                true
            }
            PchBuilder::Open => false,
            PchBuilder::Trying(w) | PchBuilder::Chosen(w) => w == worker,
        }
    }

    /// What the worker allowed to start headers did (`started`: it started at least one; false also
    /// for a request that failed): it becomes the run's header builder, or the next request may try.
    pub(super) fn pch_answer(&self, worker: &str, started: bool) {
        let mut builder = self.pch_builder();
        if let PchBuilder::Trying(w) = &*builder
            && w == worker
        {
            *builder = if started {
                PchBuilder::Chosen(w.clone())
            } else {
                PchBuilder::Open
            };
        }
    }

    fn pch_builder(&self) -> std::sync::MutexGuard<'_, PchBuilder> {
        match self.pch_builder.lock() {
            Ok(b) => b,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The torch version the workers run.
    pub(super) fn torch(&self) -> &str {
        &self.torch
    }

    /// The `TORCH_CUDA_ARCH_LIST` builds use.
    pub(super) fn arch_list(&self) -> Option<&str> {
        self.arch_list.as_deref()
    }

    /// The cache's folder.
    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    /// Content-addressed build directory of a candidate source.
    pub(super) fn dir_for(&self, source: &str) -> PathBuf {
        self.root.join(self.key(source))
    }

    fn key(&self, source: &str) -> String {
        let mut h = blake3::Hasher::new();
        let mut parts = vec![
            source,
            self.torch.as_str(),
            self.arch_list.as_deref().unwrap_or(""),
        ];
        // The toolchain builds were made with (machine, libc, compilers): a cache shared by nodes
        // or runs on other machines never hands a build to a worker it was not made for.
        if let Some(t) = &self.toolchain {
            parts.push(t.as_str());
        }
        // A plain build is its own artifact; fast builds keep the keys builds had before `eval.build`.
        if self.mode == BuildMode::Plain {
            parts.push("plain");
        }
        for part in parts {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.finalize().to_hex()[..16].to_string()
    }

    /// Lock a build dir for exclusive use (compile, or the load step of an evaluation, which also
    /// writes into it and clears torch's lock files there), in this process and across processes.
    pub(super) async fn lock(&self, dir: &Path) -> Result<BuildGuard, Unavailable> {
        let lock = {
            let mut locks = match self.locks.lock() {
                Ok(l) => l,
                Err(poisoned) => poisoned.into_inner(),
            };
            // Drop locks nobody holds or waits for, so the map stays as small as the work in flight.
            locks.retain(|_, m| Arc::strong_count(m) > 1);
            locks.entry(dir.to_path_buf()).or_default().clone()
        };
        let local = lock.lock_owned().await;
        let mut path = dir.as_os_str().to_os_string();
        path.push(".lock");
        let path = PathBuf::from(path);
        if let Some(parent) = path.parent() {
            tokio::fs::create_dir_all(parent).await.map_err(|e| {
                Unavailable(format!(
                    "cannot create build cache {}: {e}",
                    parent.display()
                ))
            })?;
        }
        let file = crate::lock::lock_exclusive(&path)
            .await
            .map_err(|e| Unavailable(format!("cannot lock {}: {e}", path.display())))?;
        Ok(BuildGuard {
            dir: dir.to_path_buf(),
            _local: local,
            _file: file,
        })
    }

    /// The outcome a build dir answers with without building: its success marker's, or the
    /// failure this harness cached there; `None`: it must be built.
    pub(super) async fn cached(
        &self,
        build_dir: &Path,
        job: &CompileJob,
        started: Instant,
    ) -> Option<CompileOutcome> {
        if let Ok(text) = tokio::fs::read_to_string(build_dir.join(SUCCESS_MARKER)).await
            && let Ok(marker) = serde_json::from_str::<BuildMarker>(&text)
        {
            let log_path = replay_log(
                build_dir,
                job,
                CACHED_LOG,
                "identical build",
                marker.duration_s,
            )
            .await;
            return Some(CompileOutcome {
                ran_on: None,
                worker_losses: Vec::new(),
                status: CompileStatus::Ok,
                cached: true,
                error_name: None,
                error: None,
                feedback: marker.feedback,
                log_path,
                build_dir: Some(build_dir.to_string_lossy().into_owned()),
                duration_ms: elapsed_ms(started),
                findings: Vec::new(),
                build_path: marker.build_path,
                cpu: None,
            });
        }
        let marker = failure_marker(build_dir).await?;
        let log_path = replay_log(
            build_dir,
            job,
            FAILED_LOG,
            "identical failed build",
            marker.duration_s,
        )
        .await;
        Some(CompileOutcome {
            ran_on: None,
            worker_losses: Vec::new(),
            status: CompileStatus::Error,
            cached: true,
            error_name: marker.error_name,
            error: marker.error,
            feedback: marker.feedback,
            log_path,
            build_dir: Some(build_dir.to_string_lossy().into_owned()),
            duration_ms: elapsed_ms(started),
            findings: Vec::new(),
            build_path: marker.build_path,
            cpu: None,
        })
    }

    /// Keep a build that failed in the candidate's own code: its compile log and a marker with its
    /// error and feedback, so the next request of the same key replays it instead of building. Not
    /// fatal when it cannot be written (the next request builds again).
    pub(super) async fn record_failure(
        &self,
        build_dir: &Path,
        job: &CompileJob,
        failed: FailedBuild<'_>,
    ) {
        let log = tokio::fs::read_to_string(&job.log_path)
            .await
            .unwrap_or_default();
        if !failure_is_cacheable(failed.error, failed.feedback, &log) {
            return;
        }
        let marker = FailureMarker {
            key: build_dir
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
            torch: self.torch.clone(),
            arch_list: self.arch_list.clone(),
            harness: crate::worker::harness_digest().to_string(),
            error_name: failed.error_name.map(str::to_string),
            error: failed.error.map(str::to_string),
            feedback: failed.feedback.to_string(),
            duration_s: failed.duration_s,
            build_path: failed.build_path.map(str::to_string),
        };
        let written = async {
            tokio::fs::create_dir_all(build_dir).await?;
            write_atomic(&build_dir.join(FAILED_LOG), log.as_bytes()).await?;
            let bytes = serde_json::to_vec_pretty(&marker).map_err(std::io::Error::other)?;
            write_atomic(&build_dir.join(FAILURE_MARKER), &bytes).await
        };
        if let Err(e) = written.await {
            tracing::warn!(
                "cannot keep the failed build in {}: {e}",
                build_dir.display()
            );
        }
    }

    /// Before building again where a failure is cached (another harness made it): remove its
    /// marker, so a build that dies midway leaves no stale failure behind.
    pub(super) async fn forget_failure(build_dir: &Path) {
        let _ = tokio::fs::remove_file(build_dir.join(FAILURE_MARKER)).await;
    }

    pub(super) async fn record_success(
        &self,
        build_dir: &Path,
        job: &CompileJob,
        feedback: &str,
        duration_s: f64,
        build_path: Option<String>,
    ) {
        if let Err(e) = tokio::fs::copy(&job.log_path, build_dir.join(CACHED_LOG)).await {
            tracing::warn!(
                "cannot keep compile log {} with the build: {e}",
                job.log_path.display()
            );
        }
        let marker = BuildMarker {
            key: build_dir
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default(),
            torch: self.torch.clone(),
            arch_list: self.arch_list.clone(),
            feedback: feedback.to_string(),
            duration_s,
            build_path,
        };
        let result = match serde_json::to_vec_pretty(&marker) {
            Ok(bytes) => write_atomic(&build_dir.join(SUCCESS_MARKER), &bytes).await,
            Err(e) => Err(std::io::Error::other(e)),
        };
        if let Err(e) = result {
            // Not fatal: the build is fine, the next identical candidate just compiles again.
            tracing::warn!("cannot write build marker in {}: {e}", build_dir.display());
        }
        // Written once, read-only afterwards.
        let dir = build_dir.to_path_buf();
        let sealed = tokio::task::spawn_blocking(move || make_files_read_only(&dir)).await;
        if let Ok(Err(e)) = sealed {
            tracing::warn!("cannot make build {} read-only: {e}", build_dir.display());
        }
    }

    /// After a compile that started shared headers on sandboxed worker `slot`: publish each into the
    /// shared cache as soon as it is complete (one such task at a time), not only after that worker's
    /// next build.
    pub(super) fn watch_pchs_of(&self, slot: &Slot) {
        use std::sync::atomic::Ordering;
        let Some(overlay) = slot.spec.sandbox.as_ref().and_then(|s| s.overlays.first()) else {
            return;
        };
        if self.pch_watch.swap(true, Ordering::SeqCst) {
            return;
        }
        let (upper, cache, worker) = (
            overlay.upper.clone(),
            self.root.clone(),
            slot.spec.name.clone(),
        );
        let watching = self.pch_watch.clone();
        tokio::spawn(async move {
            publish_pchs_as_built(upper, cache, worker).await;
            watching.store(false, Ordering::SeqCst);
        });
    }

    /// Publish the precompiled headers a sandboxed compile worker has finished (in the background,
    /// after a build that missed them) into the shared cache, for every later worker and run. Without
    /// the sandbox the worker writes the shared `pch/` itself. A failure only costs speed: logged.
    pub(super) async fn publish_pchs_of(&self, slot: &Slot) {
        let Some(overlay) = slot.spec.sandbox.as_ref().and_then(|s| s.overlays.first()) else {
            return;
        };
        let (upper, cache) = (overlay.upper.clone(), self.root.clone());
        match tokio::task::spawn_blocking(move || publish_pchs(&upper, &cache)).await {
            Ok(Ok(keys)) if !keys.is_empty() => tracing::info!(
                "published the precompiled header(s) {} of worker {} into the build cache",
                keys.join(", "),
                slot.spec.name
            ),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(
                "could not publish worker {}'s precompiled headers: {e}",
                slot.spec.name
            ),
            Err(e) => tracing::warn!("publishing precompiled headers failed: {e}"),
        }
    }
}

/// The failure cached in `build_dir`, if this harness made it.
async fn failure_marker(build_dir: &Path) -> Option<FailureMarker> {
    let text = tokio::fs::read_to_string(build_dir.join(FAILURE_MARKER))
        .await
        .ok()?;
    let marker: FailureMarker = serde_json::from_str(&text).ok()?;
    (marker.harness == crate::worker::harness_digest()).then_some(marker)
}

/// Remove what a krefine killed while publishing into the build cache left there (a build's or a
/// precompiled header's temporary folder, [`sweep_publish_leftovers`]).
pub(super) async fn sweep_build_cache(cache: &Path) {
    let cache = cache.to_path_buf();
    let swept = tokio::task::spawn_blocking(move || {
        let mut removed = sweep_publish_leftovers(&cache, STALE_PUBLISH);
        removed.extend(sweep_publish_leftovers(&cache.join(PCH_DIR), STALE_PUBLISH));
        removed
    })
    .await
    .unwrap_or_default();
    if !swept.is_empty() {
        tracing::info!(
            "removed {} folder(s) left in the build cache by a publisher that is gone",
            swept.len()
        );
    }
}

/// Write the job's compile log for a cached outcome: where it came from, then the original log kept
/// in `build_dir/kept`. The log's path, or None when it could not be written.
async fn replay_log(
    build_dir: &Path,
    job: &CompileJob,
    kept: &str,
    what: &str,
    duration_s: f64,
) -> Option<String> {
    let mut log = format!(
        "krefine: {what} found in {} (compiled earlier in {duration_s:.1} s); nothing was compiled.\n",
        build_dir.display(),
    );
    if let Ok(original) = tokio::fs::read_to_string(build_dir.join(kept)).await {
        log.push_str("----- original compile log -----\n");
        log.push_str(&original);
    }
    match write_file(&job.log_path, log.as_bytes()).await {
        Ok(()) => Some(job.log_path.to_string_lossy().into_owned()),
        Err(e) => {
            tracing::warn!("cannot write compile log {}: {e}", job.log_path.display());
            None
        }
    }
}

pub(super) async fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir).await?;
    }
    tokio::fs::write(path, bytes).await
}

pub(super) async fn append_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir).await?;
    }
    let mut f = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .await?;
    f.write_all(bytes).await?;
    f.flush().await
}

/// Write-then-rename, so a reader never sees a half-written marker (a crash mid-write leaves none).
pub(super) async fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(format!(".tmp-{}", std::process::id()));
    tokio::fs::write(&tmp, bytes).await?;
    tokio::fs::rename(&tmp, path).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builds() -> Builds {
        Builds::new(
            PathBuf::from("/cache"),
            BuildMode::Fast,
            "2.11.0".into(),
            None,
            None,
        )
    }

    #[test]
    fn one_sandboxed_worker_builds_a_runs_precompiled_headers() {
        let b = builds();
        assert!(
            !b.pch_background_for("compile-1", true, false),
            "a PyTorch-only candidate takes no turn"
        );
        assert!(
            b.pch_background_for("compile-3", true, true),
            "the first to ask"
        );
        assert!(
            !b.pch_background_for("compile-0", true, true),
            "while compile-3's build is out"
        );
        // compile-3's candidate missed no header (its flags cannot have one): the next may try.
        b.pch_answer("compile-0", true);
        assert!(
            !b.pch_background_for("compile-0", true, true),
            "an answer not asked for changes nothing"
        );
        b.pch_answer("compile-3", false);
        assert!(b.pch_background_for("compile-0", true, true));
        assert!(!b.pch_background_for("compile-3", true, true));
        // compile-0 started headers: it builds the run's, and no other worker does.
        b.pch_answer("compile-0", true);
        assert!(!b.pch_background_for("compile-3", true, true));
        assert!(!b.pch_background_for("compile-7", true, true));
        assert!(
            b.pch_background_for("compile-0", true, true),
            "and again, for its next builds"
        );
        b.pch_answer("compile-0", false);
        assert!(
            b.pch_background_for("compile-0", true, true),
            "chosen for the run"
        );
        assert!(!b.pch_background_for("compile-7", true, true));
        // Unsandboxed workers share the cache's headers and their flock: each may ask.
        assert!(b.pch_background_for("compile-7", false, true));
    }
}
