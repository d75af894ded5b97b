//! How to start one worker ([`SpawnSpec`], [`Remote`]) and the scrubbed environment it gets.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::protocol::WorkerRole;
use super::sandbox::SandboxSpec;
use crate::launcher::{Launcher, Placement};

/// The harness's lease trace (README, "Where a lease goes"): set, each GPU or CPU worker writes one
/// line per job to its log (`eval.lease_trace`, or the variable in krefine's own environment).
pub const LEASE_TRACE_ENV: &str = "KREFINE_LEASE_TRACE";

/// Environment variables passed through from the orchestrator when set. Everything else is dropped.
const PASS_THROUGH: [&str; 15] = [
    "PATH",
    // The build switches the harness documents (README "Builds"): a user's own nvcc wrapper, and
    // turning off the overlapped nvcc, the split C++ build or the split CUDA build.
    "PYTORCH_NVCC",
    "KREFINE_NVCC_OVERLAP",
    "KREFINE_SPLIT_CPP",
    "KREFINE_SPLIT_CUDA",
    LEASE_TRACE_ENV,
    // The order in which the driver numbers devices must match the orchestrator's, or a worker's
    // CUDA_VISIBLE_DEVICES index names another GPU.
    "CUDA_DEVICE_ORDER",
    "LANG",
    "LC_ALL",
    "CUDA_HOME",
    "CUDA_PATH",
    "LD_LIBRARY_PATH",
    "CC",
    "CXX",
    // Where ThunderKittens' headers are (`prompt.backend = "thunderkittens"`: candidates build with
    // them, as KernelBench's do).
    "THUNDERKITTENS_ROOT",
];
/// Names that never reach a worker, whatever an allowlist says.
const SECRET_MARKERS: [&str; 5] = ["KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL"];

/// How to start one worker.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    /// `compile-0`, `gpu-1`, `cpu-0`: names the log file and scratch folder.
    pub name: String,
    pub role: WorkerRole,
    pub python: PathBuf,
    pub harness_dir: PathBuf,
    /// The worker's own folder (HOME, TMPDIR, working directory); emptied at every spawn.
    pub scratch: PathBuf,
    /// stderr (and everything candidates print) goes here, appended across respawns.
    pub log_path: PathBuf,
    /// `Some("3")` for the worker of GPU 3, `Some("")` to hide every GPU.
    pub cuda_visible_devices: Option<String>,
    /// `TORCH_CUDA_ARCH_LIST`; `None` passes the orchestrator's own value through, if any.
    pub arch_list: Option<String>,
    pub load_timeout: Duration,
    /// Variables set on purpose by the orchestrator (the Hugging Face cache and offline mode);
    /// still subject to the secret filter.
    pub extra_env: Vec<(String, OsString)>,
    /// The namespaces sandbox to start the worker in (`None`: unconfined). See [`super::sandbox`].
    pub sandbox: Option<SandboxSpec>,
    /// Start the worker through a launcher (`srun`, `ssh`) instead of as a child process of its
    /// own (`None`). See [`crate::launcher`].
    pub remote: Option<Remote>,
}

/// A worker started through a remote launcher, at a placement.
#[derive(Debug, Clone)]
pub struct Remote {
    pub launcher: Arc<Launcher>,
    pub placement: Placement,
}

/// The complete environment of a worker: an allowlist, never anything that looks like a secret.
pub fn worker_env(spec: &SpawnSpec) -> Vec<(String, OsString)> {
    worker_env_from(spec, |name| std::env::var_os(name))
}

fn worker_env_from(
    spec: &SpawnSpec,
    ours: impl Fn(&str) -> Option<OsString>,
) -> Vec<(String, OsString)> {
    let mut env: Vec<(String, OsString)> = Vec::new();
    for name in PASS_THROUGH {
        if let Some(v) = ours(name) {
            env.push((name.to_string(), v));
        }
    }
    let scratch = spec.scratch.as_os_str().to_os_string();
    env.push(("HOME".into(), scratch.clone()));
    env.push(("TMPDIR".into(), scratch));
    env.push((
        "TORCH_EXTENSIONS_DIR".into(),
        spec.scratch.join("torch_extensions").into_os_string(),
    ));
    if let Some(cvd) = &spec.cuda_visible_devices {
        env.push(("CUDA_VISIBLE_DEVICES".into(), cvd.into()));
    }
    match &spec.arch_list {
        Some(a) => env.push(("TORCH_CUDA_ARCH_LIST".into(), a.into())),
        None => {
            if let Some(v) = std::env::var_os("TORCH_CUDA_ARCH_LIST") {
                env.push(("TORCH_CUDA_ARCH_LIST".into(), v));
            }
        }
    }
    env.extend(spec.extra_env.iter().cloned());
    env.retain(|(k, _)| {
        let upper = k.to_ascii_uppercase();
        !SECRET_MARKERS.iter().any(|m| upper.contains(m))
    });
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SpawnSpec {
        SpawnSpec {
            name: "gpu-0".into(),
            role: WorkerRole::Gpu,
            python: "/usr/bin/python3".into(),
            harness_dir: "/h".into(),
            scratch: "/s/gpu-0".into(),
            log_path: "/l/gpu-0.log".into(),
            cuda_visible_devices: Some("0".into()),
            arch_list: Some("9.0".into()),
            load_timeout: Duration::from_secs(1),
            extra_env: vec![
                ("HF_HUB_OFFLINE".into(), "1".into()),
                ("HF_TOKEN".into(), "hf_secret".into()),
            ],
            sandbox: None,
            remote: None,
        }
    }

    #[test]
    fn env_is_an_allowlist_with_our_values() {
        let env = worker_env(&spec());
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("HOME"), Some("/s/gpu-0".into()));
        assert_eq!(get("TMPDIR"), Some("/s/gpu-0".into()));
        assert_eq!(get("CUDA_VISIBLE_DEVICES"), Some("0".into()));
        assert_eq!(get("TORCH_CUDA_ARCH_LIST"), Some("9.0".into()));
        assert_eq!(get("HF_HUB_OFFLINE"), Some("1".into()));
        assert_eq!(get("HF_TOKEN"), None);
        for (k, _) in &env {
            let allowed = PASS_THROUGH.contains(&k.as_str())
                || [
                    "HOME",
                    "TMPDIR",
                    "TORCH_EXTENSIONS_DIR",
                    "CUDA_VISIBLE_DEVICES",
                    "TORCH_CUDA_ARCH_LIST",
                    "HF_HUB_OFFLINE",
                ]
                .contains(&k.as_str());
            assert!(allowed, "unexpected variable {k}");
        }
    }

    #[test]
    fn the_build_switches_reach_the_worker_and_nothing_else_does() {
        let ours = |name: &str| -> Option<OsString> {
            match name {
                "KREFINE_SPLIT_CPP" | "KREFINE_SPLIT_CUDA" | "KREFINE_NVCC_OVERLAP" => {
                    Some("0".into())
                }
                "KREFINE_LEASE_TRACE" => Some("1".into()),
                "PYTORCH_NVCC" => Some("ccache nvcc".into()),
                "OPENAI_API_KEY" => Some("sk-secret".into()),
                _ => None,
            }
        };
        let env = worker_env_from(&spec(), ours);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("KREFINE_SPLIT_CPP"), Some("0".into()));
        assert_eq!(get("KREFINE_NVCC_OVERLAP"), Some("0".into()));
        assert_eq!(get("KREFINE_SPLIT_CUDA"), Some("0".into()));
        assert_eq!(get("KREFINE_LEASE_TRACE"), Some("1".into()));
        assert_eq!(get("PYTORCH_NVCC"), Some("ccache nvcc".into()));
        assert_eq!(get("OPENAI_API_KEY"), None);
    }
}
