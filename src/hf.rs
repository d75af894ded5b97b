//! Hugging Face models for KernelBench level 4: where the user's model cache is, what the workers are
//! told about it, and which of a run's models are missing from it.
//!
//! Level-4 problems build whole models with `from_pretrained(model_name)`. Workers start with a
//! scrubbed environment and their own HOME, so the hub client would look in an empty scratch folder:
//! the orchestrator resolves the user's cache here (the way `huggingface_hub` does) and hands it to
//! every worker as `HF_HUB_CACHE`. Workers run offline by default (`HF_HUB_OFFLINE=1`): candidate
//! code has no business on the network, a sandboxed worker has none, and an offline hub client
//! fails at once instead of retrying for half a minute. A model missing from the cache is found
//! before the run starts, with an error naming the model, its problems and the cache folder; since
//! nothing is ever downloaded by a worker, there is no half-downloaded state to clean up.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::types::Problem;

/// `[eval.hf]`: the Hugging Face cache the workers load models from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HfSection {
    /// The hub cache folder (the one holding `models--ORG--NAME/`); default: the user's, found as
    /// `huggingface_hub` finds it (`HF_HUB_CACHE`, `HF_HOME/hub`, `~/.cache/huggingface/hub`).
    #[serde(default)]
    pub cache: Option<PathBuf>,
    /// Workers never touch the network (`HF_HUB_OFFLINE=1`); models must be in the cache.
    #[serde(default = "default_offline")]
    pub offline: bool,
}

fn default_offline() -> bool {
    true
}

impl Default for HfSection {
    fn default() -> Self {
        HfSection {
            cache: None,
            offline: default_offline(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error(
        "Hugging Face model(s) not in the cache {}, and workers run offline (eval.hf.offline = true): {models}. Download them first (e.g. `HF_HUB_CACHE={} hf download {first}`), or set eval.hf.cache to the cache that holds them",
        cache.display(), cache.display()
    )]
    NotCached {
        cache: PathBuf,
        /// `gpt2 (level 4 problems 7, 16, 19); ...`
        models: String,
        first: String,
    },
    #[error(
        "level {level} loads Hugging Face models ({models}), but no cache folder was found (no HF_HUB_CACHE, HF_HOME or HOME): set eval.hf.cache"
    )]
    NoCache { level: u32, models: String },
}

/// The user's hub cache as `huggingface_hub` resolves it, from the given environment.
pub fn user_cache(env: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let set = |name: &str| env(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(p) = set("HF_HUB_CACHE") {
        return Some(p);
    }
    // transformers' legacy variable, still honoured by the hub client.
    if let Some(p) = set("TRANSFORMERS_CACHE") {
        return Some(p);
    }
    if let Some(home) = set("HF_HOME") {
        return Some(home.join("hub"));
    }
    if let Some(xdg) = set("XDG_CACHE_HOME") {
        return Some(xdg.join("huggingface").join("hub"));
    }
    set("HOME").map(|h| h.join(".cache").join("huggingface").join("hub"))
}

impl HfSection {
    /// The cache the workers get: `cache` as configured (already resolved by the caller), else the
    /// user's.
    pub fn cache_dir(&self, configured: Option<PathBuf>) -> Option<PathBuf> {
        configured.or_else(|| user_cache(|n| std::env::var_os(n)))
    }

    /// Variables every worker gets, on top of its scrubbed environment. Never a token: offline needs
    /// none, and the worker environment drops anything named like a secret anyway.
    pub fn worker_env(&self, cache: Option<&Path>) -> Vec<(String, OsString)> {
        let mut env = Vec::new();
        if let Some(c) = cache {
            env.push(("HF_HUB_CACHE".to_string(), c.as_os_str().to_os_string()));
        }
        if self.offline {
            env.push(("HF_HUB_OFFLINE".to_string(), "1".into()));
            env.push(("TRANSFORMERS_OFFLINE".to_string(), "1".into()));
        } else if let Some(endpoint) = std::env::var_os("HF_ENDPOINT") {
            env.push(("HF_ENDPOINT".to_string(), endpoint));
        }
        env.push(("HF_HUB_DISABLE_TELEMETRY".to_string(), "1".into()));
        // Progress bars would fill the worker logs with carriage returns.
        env.push(("HF_HUB_DISABLE_PROGRESS_BARS".to_string(), "1".into()));
        env
    }

    /// Before a run: with workers offline, every model the problems load must be in `cache`.
    pub fn check_models(&self, cache: Option<&Path>, problems: &[Problem]) -> Result<(), HfError> {
        if !self.offline {
            return Ok(());
        }
        let wanted = models_of(problems);
        if wanted.is_empty() {
            return Ok(());
        }
        let Some(cache) = cache else {
            return Err(HfError::NoCache {
                level: problems.first().map(|p| p.key.level).unwrap_or(0),
                models: wanted.keys().cloned().collect::<Vec<_>>().join(", "),
            });
        };
        let missing: Vec<(&String, &Vec<String>)> = wanted
            .iter()
            .filter(|(model, _)| !is_cached(cache, model))
            .collect();
        let Some((first, _)) = missing.first() else {
            return Ok(());
        };
        Err(HfError::NotCached {
            cache: cache.to_path_buf(),
            first: first.to_string(),
            models: missing
                .iter()
                .map(|(m, ps)| format!("{m} ({})", ps.join(", ")))
                .collect::<Vec<_>>()
                .join("; "),
        })
    }
}

/// Model names the problems load, each with the problems (`level 4 problem 7`) that load it.
pub fn models_of(problems: &[Problem]) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in problems {
        for m in model_names(&p.code) {
            out.entry(m).or_default().push(format!(
                "level {} problem {}",
                p.key.level, p.key.problem_id
            ));
        }
    }
    out
}

/// Calls that fetch from the hub (or its cache): a problem without any builds its model locally
/// (`from_config`, a config class), whatever names it mentions.
const HUB_CALLS: &[&str] = &[
    "from_pretrained(",
    "hf_hub_download(",
    "snapshot_download(",
    "pipeline(",
];

/// The models a problem loads from the hub, in order, without duplicates: its `model_name =
/// "ORG/NAME"` assignments (how every KernelBench level-4 problem names its model) when it calls the
/// hub at all, and the quoted first argument of any `from_pretrained("...")`. A problem that never
/// calls the hub loads nothing, even if it names a model.
pub fn model_names(code: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let mut add = |name: &str| {
        if !name.is_empty() && !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    };
    let calls_hub = HUB_CALLS.iter().any(|c| code.contains(c));
    for line in code.lines() {
        if calls_hub
            && let Some(rest) = line.trim_start().strip_prefix("model_name")
            && let Some(value) = rest.trim_start().strip_prefix('=')
            && let Some(name) = quoted(value)
        {
            add(name);
        }
        let mut rest = line;
        while let Some(at) = rest.find("from_pretrained(") {
            rest = &rest[at + "from_pretrained(".len()..];
            if let Some(name) = quoted(rest) {
                add(name);
            }
        }
    }
    names
}

/// The string literal at the start of `value` (after blanks), if it starts with one.
fn quoted(value: &str) -> Option<&str> {
    let value = value.trim_start();
    let quote = match value.chars().next() {
        Some(q @ ('"' | '\'')) => q,
        _ => return None,
    };
    let end = value[1..].find(quote)?;
    Some(&value[1..1 + end])
}

/// True when `cache` holds a snapshot of `model` with its `config.json` (the hub cache layout:
/// `models--ORG--NAME/snapshots/REVISION/config.json`), or `model` is a local model folder.
pub fn is_cached(cache: &Path, model: &str) -> bool {
    let local = Path::new(model);
    if local.is_absolute() {
        return local.join("config.json").is_file();
    }
    let folder = cache
        .join(format!("models--{}", model.replace('/', "--")))
        .join("snapshots");
    let Ok(entries) = std::fs::read_dir(&folder) else {
        return false;
    };
    entries
        .filter_map(|e| e.ok())
        .any(|e| e.path().join("config.json").is_file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ProblemKey;

    fn problem(id: u32, code: &str) -> Problem {
        Problem {
            key: ProblemKey {
                level: 4,
                problem_id: id,
            },
            name: format!("{id}_m.py"),
            code: code.to_string(),
        }
    }

    #[test]
    fn model_names_are_read_from_the_assignment() {
        let code = "import torch\nmodel_name = \"EleutherAI/gpt-neo-2.7B\"\nconfig = AutoConfig.from_pretrained(model_name)\n    self.model_name = model_name\nmodel_name='gpt2'\nmodel_name = \"gpt2\"\n";
        assert_eq!(model_names(code), ["EleutherAI/gpt-neo-2.7B", "gpt2"]);
        assert!(model_names("x = 1\nmodel_name = other\n").is_empty());
    }

    /// Issue 27 (2): a problem that names a model but builds it from a config (never calling the
    /// hub) needs nothing from the cache.
    #[test]
    fn a_model_built_from_a_config_needs_no_cache() {
        let code = "from transformers import AutoModelForCausalLM, GPT2Config
model_name = \"org/never-downloaded\"
config = GPT2Config(n_layer=2)
class Model:
    def __init__(self):
        self.model = AutoModelForCausalLM.from_config(config)
";
        assert!(model_names(code).is_empty());
        let hf = HfSection::default();
        assert!(hf.check_models(None, &[problem(3, code)]).is_ok());
        // Loading it from the hub does need it, by variable or by literal.
        let loads = code.replace("from_config(config)", "from_pretrained(model_name)");
        assert_eq!(model_names(&loads), ["org/never-downloaded"]);
        let literal = "m = AutoModel.from_pretrained( 'gpt2', config=c)\n";
        assert_eq!(model_names(literal), ["gpt2"]);
    }

    #[test]
    fn user_cache_follows_the_hub_client_order() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |n: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == n)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        assert_eq!(
            user_cache(env(&[
                ("HOME", "/h"),
                ("HF_HOME", "/hf"),
                ("HF_HUB_CACHE", "/c")
            ])),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            user_cache(env(&[("HOME", "/h"), ("HF_HOME", "/hf")])),
            Some(PathBuf::from("/hf/hub"))
        );
        assert_eq!(
            user_cache(env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")])),
            Some(PathBuf::from("/x/huggingface/hub"))
        );
        assert_eq!(
            user_cache(env(&[("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/huggingface/hub"))
        );
        assert_eq!(user_cache(env(&[("HF_HOME", "")])), None);
    }

    #[test]
    fn worker_env_is_offline_with_the_cache_and_no_token() {
        let hf = HfSection::default();
        let env = hf.worker_env(Some(Path::new("/m/hub")));
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("HF_HUB_CACHE"), Some("/m/hub".into()));
        assert_eq!(get("HF_HUB_OFFLINE"), Some("1".into()));
        assert_eq!(get("TRANSFORMERS_OFFLINE"), Some("1".into()));
        assert!(env.iter().all(|(k, _)| !k.contains("TOKEN")));
        let online = HfSection {
            offline: false,
            ..HfSection::default()
        };
        assert!(
            online
                .worker_env(None)
                .iter()
                .all(|(k, _)| k != "HF_HUB_OFFLINE")
        );
    }

    #[test]
    fn missing_models_name_the_model_the_problems_and_the_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path();
        let snap = cache.join("models--gpt2/snapshots/abc");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::write(snap.join("config.json"), "{}").unwrap();
        // A folder without a snapshot's config.json (an interrupted download) is not a cached model.
        std::fs::create_dir_all(cache.join("models--facebook--opt-1.3b/snapshots/x")).unwrap();
        let problems = [
            problem(
                7,
                "model_name = \"gpt2\"\nm = AutoModel.from_pretrained(model_name)\n",
            ),
            problem(
                2,
                "model_name = \"facebook/opt-1.3b\"\nm = AutoModel.from_pretrained(model_name)\n",
            ),
            problem(
                4,
                "model_name = \"facebook/opt-1.3b\"\nm = AutoModel.from_pretrained(model_name)\n",
            ),
        ];
        let hf = HfSection::default();
        assert!(hf.check_models(Some(cache), &problems[..1]).is_ok());
        let err = hf
            .check_models(Some(cache), &problems)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("facebook/opt-1.3b (level 4 problem 2, level 4 problem 4)"),
            "{err}"
        );
        assert!(err.contains(&cache.display().to_string()), "{err}");
        assert!(!err.contains("gpt2 ("), "{err}");
        assert!(err.contains("hf download facebook/opt-1.3b"), "{err}");
        let err = hf.check_models(None, &problems).unwrap_err().to_string();
        assert!(err.contains("eval.hf.cache"), "{err}");
        // Online workers fetch what they need; nothing to check.
        let online = HfSection {
            offline: false,
            ..HfSection::default()
        };
        assert!(online.check_models(Some(cache), &problems).is_ok());
        // Problems without models need no cache at all.
        assert!(
            hf.check_models(None, &[problem(1, "import torch\n")])
                .is_ok()
        );
    }
}
