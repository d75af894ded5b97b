//! Settings shared by several rooms: enums more than one room reads from its own config section, and
//! the rule for paths written in the config file. A leaf: it imports nothing of the crate, so any room
//! may use it without reaching up to `config`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Resolve a path written in the config file at `config_file` relative to that file's folder.
pub fn resolve_config_path(config_file: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        return p.to_path_buf();
    }
    let base = config_file.parent().unwrap_or_else(|| Path::new("."));
    // Configs in the repo's configs/ folder name repo-relative paths; prefer the path as given
    // when it exists from the working directory, else relative to the config's folder.
    if p.exists() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// Inline CUDA through `load_inline`.
    #[default]
    Cuda,
    Triton,
    /// CuTe: the CUTLASS Python DSL (`cutlass.cute`), or `cute::`/`cutlass::` C++ through
    /// `load_inline`.
    Cute,
    /// TileLang (`@T.prim_func`); KernelBench runs it in fp16 (see [`Backend::forced_precision`]).
    Tilelang,
    /// ThunderKittens tiles in inline CUDA (headers under `THUNDERKITTENS_ROOT`); bf16, H100.
    Thunderkittens,
    /// C++ extensions for the CPU device.
    Cpu,
}

impl Backend {
    /// The config word (`prompt.backend`).
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Cuda => "cuda",
            Backend::Triton => "triton",
            Backend::Cute => "cute",
            Backend::Tilelang => "tilelang",
            Backend::Thunderkittens => "thunderkittens",
            Backend::Cpu => "cpu",
        }
    }

    /// Whether its kernels run on a CUDA GPU (every backend but `cpu`).
    pub fn needs_gpu(self) -> bool {
        self != Backend::Cpu
    }

    /// The precision KernelBench forces for this backend (`generate_and_eval_single_sample.py`,
    /// `eval_from_generations.py`): fp16 for TileLang (its `eval.py` takes fp16 or bf16 only),
    /// bf16 for ThunderKittens; `None` for the others. The names are `eval.precision` words.
    pub fn forced_precision(self) -> Option<(&'static str, &'static [&'static str])> {
        match self {
            Backend::Tilelang => Some(("fp16", &["fp16", "bf16"])),
            Backend::Thunderkittens => Some(("bf16", &["bf16"])),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum HistoryPolicy {
    /// The paper's: the initial prompt plus the latest generation and its feedback.
    #[default]
    Last,
    /// The whole conversation as chat messages, each feedback a user turn.
    Full,
}

/// `auto` (every GPU cudarc finds, else the CPU), `cpu`, or a list of GPU indices.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceSelection {
    #[default]
    Auto,
    Cpu,
    Gpus(Vec<u32>),
}

impl Serialize for DeviceSelection {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            DeviceSelection::Auto => s.serialize_str("auto"),
            DeviceSelection::Cpu => s.serialize_str("cpu"),
            DeviceSelection::Gpus(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for DeviceSelection {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Word(String),
            One(u32),
            List(Vec<u32>),
        }
        let expected = "expected \"auto\", \"cpu\", a GPU index or a list of GPU indices";
        match Raw::deserialize(d).map_err(|_| serde::de::Error::custom(expected))? {
            Raw::Word(w) => match w.as_str() {
                "auto" => Ok(DeviceSelection::Auto),
                "cpu" => Ok(DeviceSelection::Cpu),
                other => {
                    // `--set resources.devices=0,1` arrives as a string.
                    let parsed: Result<Vec<u32>, _> =
                        other.split(',').map(|p| p.trim().parse::<u32>()).collect();
                    match parsed {
                        Ok(v) if !v.is_empty() => Ok(DeviceSelection::Gpus(v)),
                        _ => Err(serde::de::Error::custom(format!(
                            "{expected}, got {other:?}"
                        ))),
                    }
                }
            },
            Raw::One(i) => Ok(DeviceSelection::Gpus(vec![i])),
            Raw::List(v) if !v.is_empty() => Ok(DeviceSelection::Gpus(v)),
            Raw::List(_) => Err(serde::de::Error::custom(format!("{expected}, got []"))),
        }
    }
}
