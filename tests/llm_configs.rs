//! The provider configs in configs/providers/ load, and the LLM factory builds (or refuses) them.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;

use krefine::config::{self, LoadedConfig, Provider};
use krefine::llm;
use krefine::types::{Event, LlmAnswer, LogRecord, SCHEMA_VERSION};

const UNSET: &str = "KREFINE_TEST_SURELY_UNSET_VAR_5b1e";

fn providers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/providers")
}

fn load(name: &str, sets: &[&str]) -> LoadedConfig {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    config::load(&providers_dir().join(name), &sets).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn every_provider_config_loads() {
    let mut names: Vec<String> = std::fs::read_dir(providers_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".toml"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["deepseek.toml", "ollama.toml", "openai.toml", "vllm.toml"]
    );
    for name in &names {
        let loaded = load(name, &[]);
        let c = &loaded.config;
        assert_eq!(c.model.provider, Provider::Openai, "{name}");
        assert!(loaded.resolve(&c.dataset.path).is_dir(), "{name}: dataset");
        assert!(!c.model.name.is_empty(), "{name}");
        // Written `../quickstart/problems`, loaded as the absolute path it names (the run
        // directory's copy of the config stands on its own).
        assert!(
            c.dataset.path.is_absolute(),
            "{name}: {}",
            c.dataset.path.display()
        );
        assert!(
            c.dataset
                .path
                .ends_with("configs/providers/../quickstart/problems"),
            "{name}: {}",
            c.dataset.path.display()
        );
        assert_eq!((c.dataset.level, c.dataset.problems.as_str()), (1, "all"));
        assert_eq!(c.method.turns, 3, "{name}");
        assert_eq!(c.method.feedback.to_string(), "G+E+P", "{name}");
        // Every config prices its model, so the USD totals are known (0 for local servers).
        assert!(c.model.prices.contains_key(&c.model.name), "{name}");
    }
    let local = |name: &str| load(name, &[]).config.model;
    assert_eq!(
        local("vllm.toml").base_url.as_deref(),
        Some("http://127.0.0.1:8000/v1")
    );
    assert_eq!(
        local("ollama.toml").base_url.as_deref(),
        Some("http://127.0.0.1:11434/v1")
    );
    assert_eq!(local("vllm.toml").api_key_env, None);
    assert_eq!(
        local("openai.toml").api_key_env.as_deref(),
        Some("OPENAI_API_KEY")
    );
    assert_eq!(
        local("deepseek.toml").api_key_env.as_deref(),
        Some("DEEPSEEK_API_KEY")
    );
}

#[test]
fn local_servers_build_without_a_key() {
    for name in ["vllm.toml", "ollama.toml"] {
        let cfg = load(name, &[]);
        let llm = llm::build(&cfg.llm_parts(), None, CancellationToken::new())
            .unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert!(llm.describe().contains("127.0.0.1"), "{}", llm.describe());
        let d = llm::describe_endpoint(&cfg.llm_parts());
        assert!(d.contains("no API key"), "{d}");
    }
}

#[test]
fn a_missing_key_variable_is_named() {
    for name in ["openai.toml", "deepseek.toml"] {
        let set = format!("model.api_key_env={UNSET}");
        let cfg = load(name, &[&set]);
        let e = llm::build(&cfg.llm_parts(), None, CancellationToken::new())
            .err()
            .unwrap_or_else(|| panic!("{name} built without its key"));
        let e = format!("{e:#}");
        assert!(
            e.contains(&format!("{UNSET} (model.api_key_env) is not set")),
            "{e}"
        );
        let d = llm::describe_endpoint(&cfg.llm_parts());
        assert!(d.contains(&format!("${UNSET} (NOT SET)")), "{d}");
    }
    let d = llm::describe_endpoint(
        &load("openai.toml", &[&format!("model.api_key_env={UNSET}")]).llm_parts(),
    );
    assert_eq!(
        d,
        format!(
            "openai: model \"gpt-5-mini\" at https://api.openai.com/v1; API key from ${UNSET} (NOT SET)"
        )
    );
}

#[test]
fn usd_budget_needs_a_price_for_the_model() {
    let cfg = load("vllm.toml", &["model.name=unpriced", "budget.usd=1.0"]);
    let e = format!(
        "{:#}",
        llm::build(&cfg.llm_parts(), None, CancellationToken::new())
            .err()
            .unwrap()
    );
    assert!(
        e.contains("model.prices has no price for model.name \"unpriced\""),
        "{e}"
    );
}

fn recorded_run(dir: &Path) {
    let record = LogRecord {
        v: SCHEMA_VERSION,
        seq: 0,
        ts_ms: 0,
        task: Some("1/1/0".parse().unwrap()),
        event: Event::LlmAnswered {
            turn: 1,
            answer: LlmAnswer {
                content: "recorded".into(),
                usage: None,
                cost_usd: None,
                model: "m".into(),
                finish_reason: None,
                latency_ms: 5,
                attempts: 1,
            },
            code: None,
            code_file: None,
        },
    };
    let line = serde_json::to_string(&record).unwrap();
    std::fs::write(dir.join("events.jsonl"), format!("{line}\n")).unwrap();
}

#[tokio::test]
async fn replay_override_wins_over_the_configured_provider() {
    let run = tempfile::tempdir().unwrap();
    recorded_run(run.path());
    // The configured provider could not even be built (its key is missing): the override wins.
    let cfg = load("openai.toml", &[&format!("model.api_key_env={UNSET}")]);
    let (llm, ledger) =
        llm::build_with_ledger(&cfg.llm_parts(), Some(run.path()), CancellationToken::new())
            .unwrap();
    assert!(llm.describe().starts_with("replay"), "{}", llm.describe());
    let req = krefine::types::LlmRequest {
        task: "1/1/0".parse().unwrap(),
        turn: 1,
        messages: vec![],
    };
    let a = llm
        .complete(req, &krefine::services::EventSink::discard())
        .await
        .unwrap();
    assert_eq!(a.content, "recorded");
    assert_eq!(ledger.totals().answers, 1);
}

#[test]
fn replay_provider_from_config() {
    let run = tempfile::tempdir().unwrap();
    recorded_run(run.path());
    let set = format!("model.replay_run={}", run.path().display());
    let cfg = load("vllm.toml", &["model.provider=replay", &set]);
    let llm = llm::build(&cfg.llm_parts(), None, CancellationToken::new()).unwrap();
    assert!(
        llm.describe().contains("events.jsonl"),
        "{}",
        llm.describe()
    );
    assert!(llm::describe_endpoint(&cfg.llm_parts()).starts_with("replay: answers recorded in"));
    let cfg = load("vllm.toml", &["model.provider=replay"]);
    let e = format!(
        "{:#}",
        llm::build(&cfg.llm_parts(), None, CancellationToken::new())
            .err()
            .unwrap()
    );
    assert!(e.contains("model.replay_run"), "{e}");
}
