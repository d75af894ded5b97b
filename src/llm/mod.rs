//! LLM providers behind the [`crate::services::Llm`] trait: scripted (tests, quickstart),
//! OpenAI-compatible, and replay of a recorded run; plus code extraction.

pub mod extract;
pub mod scripted;

use std::path::Path;
use std::sync::Arc;

use crate::config::{LoadedConfig, Provider};
use crate::services::Llm;

/// The configured provider (interim: scripted only, until the provider layer lands).
pub fn build(
    cfg: &LoadedConfig,
    _replay_override: Option<&Path>,
    _cancel: tokio_util::sync::CancellationToken,
) -> anyhow::Result<Arc<dyn Llm>> {
    match cfg.config.model.provider {
        Provider::Scripted => {
            let p = cfg.config.model.answers.as_deref().unwrap_or(Path::new(""));
            Ok(Arc::new(scripted::ScriptedLlm::load(&cfg.resolve(p))?))
        }
        other => anyhow::bail!("provider {other:?} is not available in this build"),
    }
}
