//! The prompt's config section: `[prompt]` (templates, style, backend, hardware info).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::settings::Backend;
use crate::types::Precision;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum PromptStyle {
    ZeroShot,
    #[default]
    OneShot,
    FewShot,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PromptSection {
    /// A folder of templates overriding the built-in ones (same file names).
    #[serde(default)]
    pub templates: Option<PathBuf>,
    #[serde(default)]
    pub style: PromptStyle,
    /// Kernel language asked for; default: `cuda` on a GPU, `cpu` on the CPU device.
    #[serde(default)]
    pub backend: Option<Backend>,
    /// Add the GPU's specifications to the prompt.
    #[serde(default)]
    pub hardware_info: bool,
}

/// The precision KernelBench forces for `prompt.backend` (fp16 for `tilelang`, bf16 for
/// `thunderkittens`): taken when `eval.precision` is not set (`given` false), an error message
/// when it is set to one the backend's kernels cannot run in.
pub fn backend_precision(
    backend: Option<Backend>,
    precision: &mut Precision,
    given: bool,
) -> Result<(), String> {
    let Some((forced, allowed)) = backend.and_then(Backend::forced_precision) else {
        return Ok(());
    };
    let current = precision.as_str();
    if !given {
        *precision = if forced == "fp16" {
            Precision::Fp16
        } else {
            Precision::Bf16
        };
    } else if !allowed.contains(&current) {
        return Err(format!(
            "prompt.backend = \"{}\" runs in {} (KernelBench forces {forced}), got \"{current}\"",
            backend.map_or("", Backend::as_str),
            allowed.join(" or "),
        ));
    }
    Ok(())
}

/// Why `prompt.backend` cannot run on the CPU device, for the GPU-only DSL backends (`cute`,
/// `tilelang`, `thunderkittens`). `cuda` and `triton` keep their earlier behaviour there.
pub fn backend_device(backend: Option<Backend>, cpu_device: bool) -> Option<String> {
    let b = backend?;
    let dsl = matches!(
        b,
        Backend::Cute | Backend::Tilelang | Backend::Thunderkittens
    );
    (dsl && cpu_device).then(|| {
        format!(
            "\"{}\" kernels run on a CUDA GPU, but resources.devices = \"cpu\"",
            b.as_str()
        )
    })
}
