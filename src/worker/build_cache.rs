//! The content-addressed build cache (`build_cache/<blake3(source, torch, arch list)[..16]>`): build
//! keys, the per-build-dir lock, and the success marker a cached build answers from without touching
//! Python.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::sync::OwnedMutexGuard;

use super::build_store::make_files_read_only;
use super::config::BuildMode;
use super::outcome::elapsed_ms;
use super::pool::WorkerPool;
use crate::services::{CompileJob, Unavailable};
use crate::types::{CompileOutcome, CompileStatus};

/// Written into a build dir after a good compile; its presence means "this build is usable".
pub(super) const SUCCESS_MARKER: &str = "krefine-ok.json";
/// A copy of the compile log kept with the build, handed to later jobs that hit the cache.
pub(super) const CACHED_LOG: &str = "krefine-compile.log";

/// Exclusive use of one build dir: the in-process lock, then the cross-process file lock that every
/// krefine process sharing the build cache takes (`<build dir>.lock`, next to the dir so that the
/// build itself never touches it). A concurrent run therefore never sees a half-written build.
pub(super) struct BuildGuard {
    pub(super) _local: OwnedMutexGuard<()>,
    pub(super) _file: std::fs::File,
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

impl WorkerPool {
    /// Content-addressed build directory of a candidate source.
    pub fn build_dir_for(&self, source: &str) -> PathBuf {
        self.settings.build_cache.join(self.build_key(source))
    }

    pub(super) fn build_key(&self, source: &str) -> String {
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
        if self.settings.build == BuildMode::Plain {
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
    pub(super) async fn lock_build(&self, dir: &Path) -> Result<BuildGuard, Unavailable> {
        let lock = {
            let mut locks = match self.build_locks.lock() {
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
            _local: local,
            _file: file,
        })
    }

    pub(super) async fn cached_compile(
        &self,
        build_dir: &Path,
        job: &CompileJob,
        started: Instant,
    ) -> Option<CompileOutcome> {
        let text = tokio::fs::read_to_string(build_dir.join(SUCCESS_MARKER))
            .await
            .ok()?;
        let marker: BuildMarker = serde_json::from_str(&text).ok()?;
        // The job's log says where the build came from, then repeats the original compiler log.
        let mut log = format!(
            "krefine: identical build found in {} (compiled earlier in {:.1} s); nothing was compiled.\n",
            build_dir.display(),
            marker.duration_s
        );
        if let Ok(original) = tokio::fs::read_to_string(build_dir.join(CACHED_LOG)).await {
            log.push_str("----- original compile log -----\n");
            log.push_str(&original);
        }
        let log_path = match write_file(&job.log_path, log.as_bytes()).await {
            Ok(()) => Some(job.log_path.to_string_lossy().into_owned()),
            Err(e) => {
                tracing::warn!("cannot write compile log {}: {e}", job.log_path.display());
                None
            }
        };
        Some(CompileOutcome {
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
        })
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
