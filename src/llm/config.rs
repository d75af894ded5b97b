//! The LLM's config sections: `[model]` (provider, endpoint, retries, prices) and `[budget]`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// Answers from a JSONL file (`model.answers`); deterministic, offline.
    #[default]
    Scripted,
    /// Any OpenAI-compatible chat-completions endpoint.
    Openai,
    /// Answers recorded in an earlier run (`model.replay_run`, or `krefine run --replay-llm`).
    Replay,
}

/// USD per million tokens.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Price {
    #[serde(default)]
    pub prompt: f64,
    #[serde(default)]
    pub completion: f64,
}

/// `[model]`: which provider, which model, and how requests are made and retried (each key is in the
/// README's "Configuration reference").
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    #[serde(default)]
    pub provider: Provider,
    #[serde(default)]
    pub name: String,
    /// Scripted provider: JSONL with `problem`, `sample`, `turn`, `content`.
    #[serde(default)]
    pub answers: Option<PathBuf>,
    /// Replay provider: the run directory whose answers are served.
    #[serde(default)]
    pub replay_run: Option<PathBuf>,
    #[serde(default)]
    pub base_url: Option<String>,
    /// Name of the environment variable holding the API key (the key itself is never stored).
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default = "default_request_timeout")]
    pub request_timeout_s: f64,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub extra_headers: BTreeMap<String, String>,
    /// Price table: model name → USD per million tokens.
    #[serde(default)]
    pub prices: BTreeMap<String, Price>,
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    #[serde(default = "default_backoff_base")]
    pub backoff_base_s: f64,
    #[serde(default = "default_backoff_max")]
    pub backoff_max_s: f64,
}

fn default_request_timeout() -> f64 {
    600.0
}
fn default_max_retries() -> u32 {
    6
}
fn default_backoff_base() -> f64 {
    1.0
}
fn default_backoff_max() -> f64 {
    60.0
}

impl Default for ModelSection {
    fn default() -> Self {
        ModelSection {
            provider: Provider::default(),
            name: String::new(),
            answers: None,
            replay_run: None,
            base_url: None,
            api_key_env: None,
            temperature: None,
            top_p: None,
            max_tokens: None,
            seed: None,
            request_timeout_s: default_request_timeout(),
            stream: false,
            extra_headers: BTreeMap::new(),
            prices: BTreeMap::new(),
            max_retries: default_max_retries(),
            backoff_base_s: default_backoff_base(),
            backoff_max_s: default_backoff_max(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BudgetSection {
    /// Stop new LLM requests once this much has been spent (USD).
    #[serde(default)]
    pub usd: Option<f64>,
    /// Stop new LLM requests once this many tokens (prompt + completion) have been used.
    #[serde(default)]
    pub tokens: Option<u64>,
}
