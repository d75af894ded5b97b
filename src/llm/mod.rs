//! LLM providers behind the [`crate::services::Llm`] trait: scripted (tests, quickstart),
//! OpenAI-compatible, and replay of a recorded run; the ledger and budget around all of them; and
//! code extraction.
//!
//! - [`openai`]: the OpenAI-compatible provider (retries, attempt events, pricing), built from
//!   [`http`] (one attempt), [`wire`] (tolerant response shapes), [`gate`] (in-flight and per-minute
//!   limits), [`retry`] (backoff, `Retry-After`) and [`secret`] (the API key).
//! - [`metered`] and [`ledger`]: token and USD totals of a run, and its budget stop.
//! - [`scripted`], [`replay`]: offline providers.
//! - [`extract`]: the candidate code in an answer.
//! - [`config`]: the `[model]` and `[budget]` sections.
//!
//! [`build`] assembles the configured provider from [`LlmParts`]: the room's own sections, the
//! launcher's `[resources]` limits and the config file's place. `config` hands those parts out
//! (`LoadedConfig::llm_parts`); this room never imports `config`, which sits above it.

pub mod config;
pub mod extract;
pub mod gate;
pub mod http;
pub mod ledger;
pub mod metered;
pub mod openai;
pub mod replay;
pub mod retry;
pub mod scripted;
pub mod secret;
pub mod wire;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::launcher::config::ResourcesSection;
use crate::services::Llm;
use crate::settings::resolve_config_path;
use config::{BudgetSection, ModelSection, Provider};

pub use ledger::{Ledger, LedgerTotals};

/// What the provider is built from: the loaded config's `[model]`, `[budget]` and `[resources]`
/// sections, and the config file, against whose folder relative paths in `[model]` (scripted
/// answers, a replayed run) are resolved.
#[derive(Debug, Clone, Copy)]
pub struct LlmParts<'a> {
    pub model: &'a ModelSection,
    pub budget: &'a BudgetSection,
    pub resources: &'a ResourcesSection,
    pub config_file: &'a Path,
}

impl LlmParts<'_> {
    /// A path from the config, resolved the way every path in it is.
    fn resolve(&self, p: &Path) -> PathBuf {
        resolve_config_path(self.config_file, p)
    }
}

/// The configured provider, wrapped in the run's ledger and budget. `replay_override` (a run
/// directory or its `events.jsonl`) replaces the configured provider with a replay of that run.
pub fn build(
    cfg: &LlmParts<'_>,
    replay_override: Option<&Path>,
    cancel: CancellationToken,
) -> anyhow::Result<Arc<dyn Llm>> {
    Ok(build_with_ledger(cfg, replay_override, cancel)?.0)
}

/// [`build`], also handing out the ledger whose [`Ledger::totals`] a progress display shows.
pub fn build_with_ledger(
    cfg: &LlmParts<'_>,
    replay_override: Option<&Path>,
    cancel: CancellationToken,
) -> anyhow::Result<(Arc<dyn Llm>, Arc<Ledger>)> {
    let m = cfg.model;
    let inner: Arc<dyn Llm> = match (replay_override, m.provider) {
        (Some(run), _) => Arc::new(replay::ReplayLlm::load(run)?),
        (None, Provider::Replay) => {
            let run = m.replay_run.as_deref().context(
                "model.provider = \"replay\" needs model.replay_run (a run directory) or --replay-llm",
            )?;
            Arc::new(replay::ReplayLlm::load(&cfg.resolve(run))?)
        }
        (None, Provider::Scripted) => {
            let answers = m
                .answers
                .as_deref()
                .context("model.provider = \"scripted\" needs model.answers")?;
            Arc::new(
                scripted::ScriptedLlm::load(&cfg.resolve(answers))?
                    .with_price(m.prices.get(&m.name).cloned()),
            )
        }
        (None, Provider::Openai) => {
            if cfg.budget.usd.is_some() && !m.prices.contains_key(&m.name) {
                anyhow::bail!(
                    "budget.usd is set but model.prices has no price for model.name {:?}, so spending \
                     cannot be counted: add [model.prices.{:?}] with prompt and completion USD per \
                     million tokens",
                    m.name,
                    m.name
                );
            }
            Arc::new(
                openai::OpenAiLlm::builder(m)
                    .resources(cfg.resources)
                    .cancel(cancel)
                    .build()?,
            )
        }
    };
    let ledger = Arc::new(Ledger::new(cfg.budget));
    Ok((
        Arc::new(metered::Metered::new(inner, ledger.clone())),
        ledger,
    ))
}

/// One line for `krefine doctor`: provider, model, endpoint and whether the key variable is set
/// (never its value).
pub fn describe_endpoint(cfg: &LlmParts<'_>) -> String {
    let m = cfg.model;
    let resolved = |p: Option<&Path>| match p {
        Some(p) => cfg.resolve(p).display().to_string(),
        None => "(not configured)".into(),
    };
    match m.provider {
        Provider::Scripted => format!("scripted: answers from {}", resolved(m.answers.as_deref())),
        Provider::Replay => format!(
            "replay: answers recorded in {}",
            resolved(m.replay_run.as_deref())
        ),
        Provider::Openai => {
            let key = match &m.api_key_env {
                Some(var) if std::env::var_os(var).is_some_and(|v| !v.is_empty()) => {
                    format!("API key from ${var} (set)")
                }
                Some(var) => format!("API key from ${var} (NOT SET)"),
                None => "no API key (model.api_key_env not given)".into(),
            };
            format!(
                "openai: model {:?} at {}; {key}{}",
                m.name,
                m.base_url.as_deref().unwrap_or(http::DEFAULT_BASE_URL),
                if m.stream { "; streaming" } else { "" }
            )
        }
    }
}
