//! What the pool's workers run in: probing the namespaces sandbox, and each worker's file system view.

use std::path::PathBuf;

use super::WorkerError;
use super::sandbox::{self, Overlay, SandboxLevel, SandboxMode, SandboxSpec};
use super::settings::WorkerSettings;

/// Where a worker's copy-on-write layer of the build cache lives: `<scratch_root>/<name>.cow/`.
pub(super) const COW_SUFFIX: &str = "cow";

/// Decide what the workers run in: probe the namespaces sandbox unless it is off.
pub(super) async fn resolve_sandbox(
    settings: &WorkerSettings,
) -> Result<SandboxLevel, WorkerError> {
    if settings.sandbox == SandboxMode::Off {
        return Ok(SandboxLevel::Off);
    }
    // The namespaces are entered between fork and exec of the local child, which for a remote
    // worker is `srun`/`ssh`, not the worker: remote workers run without them, and say so.
    let launcher = settings.launcher.kind().as_str();
    if settings.launcher.is_remote() {
        return match settings.sandbox {
            SandboxMode::Required => Err(WorkerError::Settings(format!(
                "eval.sandbox = \"required\" (the default in strict mode), but workers started by \
                 the {launcher} launcher run without krefine's namespaces sandbox (only the \
                 per-candidate confinement inside the harness applies); set eval.sandbox = \"auto\" \
                 or \"off\" to run them anyway"
            ))),
            _ => {
                tracing::warn!(
                    "workers started by the {launcher} launcher run WITHOUT the namespaces sandbox"
                );
                Ok(SandboxLevel::Unavailable(format!(
                    "the {launcher} launcher starts workers without the namespaces sandbox"
                )))
            }
        };
    }
    let python = settings.python.clone();
    // With the build cache as an overlay, as the workers will have it (overlayfs refuses some file
    // systems, e.g. NFS as the upper layer).
    let cow = settings.scratch_root.join(format!(".probe.{COW_SUFFIX}"));
    let overlay = Overlay {
        target: settings.build_cache.clone(),
        upper: cow.join("upper"),
        work: cow.join("work"),
    };
    for d in [&overlay.upper, &overlay.work] {
        tokio::fs::create_dir_all(d)
            .await
            .map_err(|e| WorkerError::io("create sandbox probe folder", d, e))?;
    }
    let probed = tokio::task::spawn_blocking(move || sandbox::probe(&python, Some(overlay)))
        .await
        .map_err(|e| WorkerError::Settings(format!("sandbox probe panicked: {e}")))?;
    let _ = tokio::fs::remove_dir_all(&cow).await;
    match (probed, settings.sandbox) {
        (Ok(_), _) => Ok(SandboxLevel::Namespaces),
        (Err(e), SandboxMode::Required) => Err(WorkerError::Settings(format!(
            "eval.sandbox = \"required\" (the default in strict mode), but this machine cannot \
             start a sandboxed worker: {e}"
        ))),
        (Err(e), _) => {
            tracing::warn!(
                "eval.sandbox = \"auto\": workers run WITHOUT a sandbox (candidate code has the \
                 user's rights): {e}"
            );
            Ok(SandboxLevel::Unavailable(e.to_string()))
        }
    }
}

/// Folders a worker must still read where they lie under a hidden one (the home): the Python
/// install, the harness, and the CUDA toolkit and library folders the environment names.
pub(super) fn visible_dirs(settings: &WorkerSettings) -> Vec<PathBuf> {
    let mut dirs = sandbox::python_dirs(&settings.python);
    dirs.push(settings.harness_dir.clone());
    // The store of CPU-made inputs, read (never written) by the evaluation workers.
    if let Some(store) = &settings.reference_cache {
        dirs.push(store.clone());
        // Its in-memory tier in /dev/shm, this process's or the kept one (see `WorkerPool::new`).
        if settings.reference_ram_bytes > 0 {
            dirs.push(super::input_store::ram_store_dir(
                settings.reference_ram_keep,
            ));
        }
    }
    // The Hugging Face cache level-4 models load from (often under the hidden home).
    for (name, value) in &settings.extra_env {
        if name == "HF_HUB_CACHE" || name == "HF_HOME" {
            dirs.push(PathBuf::from(value));
        }
    }
    for var in ["CUDA_HOME", "CUDA_PATH", "THUNDERKITTENS_ROOT"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.push(PathBuf::from(v));
        }
    }
    for var in ["PATH", "LD_LIBRARY_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            dirs.extend(std::env::split_paths(&v));
        }
    }
    dirs.retain(|d| d.is_absolute());
    dirs.sort();
    dirs.dedup();
    dirs
}

/// The file system view of worker `name`: everything read-only, its scratch writable, the other
/// workers' scratch folders, the home and `/tmp` hidden, and the build cache copy-on-write (its
/// writes stay in `<scratch_root>/<name>.cow`; compile results are published by [`publish_build`]).
pub(super) fn worker_sandbox(
    settings: &WorkerSettings,
    name: &str,
    visible: &[PathBuf],
) -> SandboxSpec {
    let scratch = settings.scratch_root.join(name);
    let cow = settings.scratch_root.join(format!("{name}.{COW_SUFFIX}"));
    let mut hidden = SandboxSpec::default_hidden();
    hidden.push(settings.scratch_root.clone());
    SandboxSpec {
        writable: vec![scratch.clone(), cow.clone()],
        visible: visible.to_vec(),
        hidden,
        overlays: vec![Overlay {
            target: settings.build_cache.clone(),
            upper: cow.join("upper"),
            work: cow.join("work"),
        }],
        cwd: scratch,
    }
}
