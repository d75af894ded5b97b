//! The prompt's config section: `[prompt]` (templates, style, backend, hardware info).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::settings::Backend;

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
