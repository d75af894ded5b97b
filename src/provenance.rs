//! What a score depends on that the event log cannot show, recorded when a run starts: the exact
//! problems (a KernelBench checkout's git commit and a content hash), the baseline file's hash, the
//! machine (GPU names and UUIDs, driver, CPU), how results are judged and timed (mode, precision,
//! timing method, tolerance) and the krefine build. Written once to the run
//! directory's `provenance.json`; reports combine it with the frozen config and the measured
//! results' env (see `report::provenance`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::gpu::{DeviceInfo, Discovery};
use crate::services::DeviceId;
use crate::types::{Problem, Tolerance};

/// File name inside a run directory.
pub const FILE: &str = "provenance.json";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunProvenance {
    pub krefine: Build,
    pub dataset: DatasetRevision,
    /// `None`: reference times are measured live.
    pub baseline: Option<FileHash>,
    pub host: Host,
    /// The Hugging Face cache the workers were given (level 4), and whether they ran offline.
    #[serde(default)]
    pub hf_cache: Option<PathBuf>,
    #[serde(default)]
    pub hf_offline: Option<bool>,
    /// How the run judges and times results (absent in runs recorded before it was).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation: Option<Evaluation>,
}

/// How a run judges and times its results, as its config set them (every result's `env` says what
/// was in effect where it was measured).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// `faithful` or `strict`.
    pub mode: String,
    /// `fp32`, `fp16` or `bf16`.
    pub precision: String,
    /// `eval.timing_method` (`cuda_event`, ...; the CPU device times with `perf_counter`).
    pub timing_method: String,
    /// The correctness tolerance in effect at the run's precision.
    pub tolerance: Tolerance,
    /// How the reference runs: `eager`, or `compile` (`torch.compile`).
    pub reference: String,
    /// Where inputs are made: `kernelbench` (on the CPU) or `device`.
    pub inputs: String,
    pub correct_trials: u32,
    pub timing_trials: u32,
    pub warmup: u32,
    pub seed: u64,
    /// Verdicts and timings are scripted, not measured (`eval.executor = "simulated"`).
    pub simulated: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Build {
    pub version: String,
    /// The git commit krefine was built from, `unknown` outside a checkout.
    pub commit: String,
}

impl Build {
    pub fn current() -> Build {
        Build {
            version: env!("CARGO_PKG_VERSION").to_string(),
            commit: env!("KREFINE_GIT_COMMIT").to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetRevision {
    pub path: PathBuf,
    /// `kernelbench_checkout` (a folder with `KernelBench/level{L}/`), `folder` or `jsonl`.
    pub kind: String,
    /// The commit of the git checkout the dataset lies in (`git rev-parse HEAD`), with `-dirty` when
    /// tracked files under the dataset path differ from it; `None` outside a checkout.
    pub git_commit: Option<String>,
    /// `blake3:<hex>` of the JSONL file, or of the selected problems (file names and code, in id order)
    /// for a folder, so two runs on the same problems can be matched whatever their layout.
    pub content_hash: String,
    pub level: u32,
    pub problems: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileHash {
    pub path: PathBuf,
    /// `blake3:<hex>` of the file's bytes.
    pub hash: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Host {
    /// The devices the run evaluates on.
    pub devices: Vec<Device>,
    /// NVIDIA kernel driver version (`580.159.04`), when there is one.
    pub driver: Option<String>,
    /// The CUDA driver API version (`13.0`).
    pub cuda_driver_api: Option<String>,
    pub cpu: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Device {
    /// `cuda:0` or `cpu`.
    pub id: String,
    pub name: String,
    /// `GPU-xxxxxxxx-...`, the identifier that tells two GPUs of one model apart.
    pub uuid: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProvenanceError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not valid provenance: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// The inputs a run was started with.
pub struct Inputs<'a> {
    pub dataset_path: &'a Path,
    pub level: u32,
    /// `dataset.problems` as written (`1-3`, `all`).
    pub selection: &'a str,
    /// The problems it selected: what the content hash is over.
    pub problems: &'a [Problem],
    /// The KernelBench baseline file reference times come from, if any: its hash is recorded.
    pub baseline: Option<&'a Path>,
    pub devices: &'a [DeviceInfo],
    /// What device discovery found: the CUDA driver's version.
    pub discovery: &'a Discovery,
    /// The Hugging Face cache the workers were given (level 4), and whether they ran offline.
    pub hf_cache: Option<PathBuf>,
    pub hf_offline: Option<bool>,
    pub evaluation: Option<Evaluation>,
}

/// Collect everything (reads the dataset and baseline files, asks git, reads /proc).
pub fn collect(i: &Inputs<'_>) -> Result<RunProvenance, ProvenanceError> {
    let gpu_ids = nvidia_gpus();
    let devices = i
        .devices
        .iter()
        .map(|d| Device {
            id: match &d.id {
                DeviceId::Cpu => "cpu".to_string(),
                DeviceId::Gpu(n) => format!("cuda:{n}"),
            },
            name: d.name.clone(),
            uuid: match d.id {
                DeviceId::Gpu(n) => gpu_ids.get(n as usize).map(|g| g.uuid.clone()),
                DeviceId::Cpu => None,
            },
        })
        .collect();
    Ok(RunProvenance {
        krefine: Build::current(),
        dataset: dataset_revision(i.dataset_path, i.level, i.selection, i.problems)?,
        baseline: i.baseline.map(hash_file).transpose()?,
        host: Host {
            devices,
            driver: nvidia_driver(),
            cuda_driver_api: i.discovery.driver_version.clone(),
            cpu: cpu_model(),
        },
        hf_cache: i.hf_cache.clone(),
        hf_offline: i.hf_offline,
        evaluation: i.evaluation.clone(),
    })
}

pub fn dataset_revision(
    path: &Path,
    level: u32,
    selection: &str,
    problems: &[Problem],
) -> Result<DatasetRevision, ProvenanceError> {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let git_commit = git_commit(path);
    let (kind, content_hash) = if path.is_file() {
        ("jsonl", hash_file(path)?.hash)
    } else {
        let mut h = blake3::Hasher::new();
        for p in problems {
            // Length-prefixed, so no two different lists hash alike.
            for part in [p.name.as_bytes(), p.code.as_bytes()] {
                h.update(&(part.len() as u64).to_le_bytes());
                h.update(part);
            }
        }
        let kind = if path.join("KernelBench").is_dir() {
            "kernelbench_checkout"
        } else {
            "folder"
        };
        (kind, format!("blake3:{}", h.finalize().to_hex()))
    };
    Ok(DatasetRevision {
        path: abs,
        kind: kind.to_string(),
        git_commit,
        content_hash,
        level,
        problems: selection.to_string(),
    })
}

pub fn hash_file(path: &Path) -> Result<FileHash, ProvenanceError> {
    let bytes = std::fs::read(path).map_err(|source| ProvenanceError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(FileHash {
        path: std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
        hash: format!("blake3:{}", blake3::hash(&bytes).to_hex()),
    })
}

/// The commit of the git checkout holding `path` (a folder, or the folder of a file), `-dirty`
/// appended when tracked files under it differ; `None` outside a checkout or without git.
fn git_commit(path: &Path) -> Option<String> {
    let dir = if path.is_dir() { path } else { path.parent()? };
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"]).filter(|c| !c.is_empty())?;
    let dirty = git(&["status", "--porcelain", "--untracked-files=no", "--", "."])
        .is_some_and(|s| !s.is_empty());
    Some(if dirty {
        format!("{commit}-dirty")
    } else {
        commit
    })
}

struct NvidiaGpu {
    uuid: String,
}

/// GPUs as the NVIDIA kernel driver lists them (`/proc/driver/nvidia/gpus/<bus>/information`), in
/// bus order, which is CUDA's default device order (`CUDA_DEVICE_ORDER=PCI_BUS_ID` makes it exact).
fn nvidia_gpus() -> Vec<NvidiaGpu> {
    let Ok(dir) = std::fs::read_dir("/proc/driver/nvidia/gpus") else {
        return Vec::new();
    };
    let mut buses: Vec<PathBuf> = dir.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    buses.sort();
    buses
        .iter()
        .filter_map(|b| std::fs::read_to_string(b.join("information")).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("GPU UUID:"))
                .map(|u| NvidiaGpu {
                    uuid: u.trim().to_string(),
                })
        })
        .collect()
}

/// `580.159.04` from `/proc/driver/nvidia/version`.
fn nvidia_driver() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    parse_driver_version(&text)
}

fn parse_driver_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|w| w.split('.').count() >= 2 && w.split('.').all(|p| p.parse::<u32>().is_ok()))
        .map(str::to_string)
}

fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// Write `provenance.json` into `dir`.
pub fn write(dir: &Path, p: &RunProvenance) -> Result<(), ProvenanceError> {
    let path = dir.join(FILE);
    let mut text = serde_json::to_string_pretty(p).map_err(|source| ProvenanceError::Parse {
        path: path.clone(),
        source,
    })?;
    text.push('\n');
    std::fs::write(&path, text).map_err(|source| ProvenanceError::Write { path, source })
}

/// Read `provenance.json` from `dir`; `Ok(None)` when the run has none (written before it existed).
pub fn read(dir: &Path) -> Result<Option<RunProvenance>, ProvenanceError> {
    let path = dir.join(FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ProvenanceError::Read { path, source }),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| ProvenanceError::Parse { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ProblemKey;

    fn problem(id: u32, name: &str, code: &str) -> Problem {
        Problem {
            key: ProblemKey {
                level: 1,
                problem_id: id,
            },
            name: name.to_string(),
            code: code.to_string(),
        }
    }

    #[test]
    fn driver_version_from_the_kernel_module_line() {
        let text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22)  Thu\nGCC version:  gcc version 13.3.0\n";
        assert_eq!(parse_driver_version(text).as_deref(), Some("580.159.04"));
        assert_eq!(parse_driver_version("GCC version: 13\n"), None);
    }

    #[test]
    fn folder_hash_depends_on_names_and_code_only() {
        let tmp = tempfile::tempdir().unwrap();
        let a = [problem(1, "1_A.py", "x"), problem(2, "2_B.py", "y")];
        let r1 = dataset_revision(tmp.path(), 1, "all", &a).unwrap();
        let r2 = dataset_revision(tmp.path(), 1, "1-2", &a).unwrap();
        assert_eq!(r1.content_hash, r2.content_hash);
        assert!(r1.content_hash.starts_with("blake3:"));
        let b = [problem(1, "1_A.py", "xy"), problem(2, "2_B.py", "")];
        assert_ne!(
            r1.content_hash,
            dataset_revision(tmp.path(), 1, "all", &b)
                .unwrap()
                .content_hash
        );
    }

    #[test]
    fn jsonl_hash_is_the_file_hash_and_round_trips() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("p.jsonl");
        std::fs::write(&file, "{}\n").unwrap();
        let r = dataset_revision(&file, 4, "all", &[]).unwrap();
        assert_eq!(r.kind, "jsonl");
        assert_eq!(
            r.content_hash,
            format!("blake3:{}", blake3::hash(b"{}\n").to_hex())
        );
        let p = RunProvenance {
            krefine: Build::current(),
            dataset: r,
            baseline: Some(hash_file(&file).unwrap()),
            host: Host {
                devices: vec![],
                driver: None,
                cuda_driver_api: None,
                cpu: None,
            },
            hf_cache: None,
            hf_offline: Some(true),
            evaluation: Some(Evaluation {
                mode: "faithful".into(),
                precision: "fp32".into(),
                timing_method: "cuda_event".into(),
                tolerance: Tolerance {
                    name: "kernelbench".into(),
                    atol: 1e-4,
                    rtol: 1e-4,
                },
                reference: "eager".into(),
                inputs: "kernelbench".into(),
                correct_trials: 5,
                timing_trials: 100,
                warmup: 3,
                seed: 42,
                simulated: false,
            }),
        };
        write(tmp.path(), &p).unwrap();
        assert_eq!(read(tmp.path()).unwrap(), Some(p));
        assert_eq!(read(&tmp.path().join("none")).unwrap(), None);
    }
}
