//! The scripted provider: answers read from a JSONL file, one per (problem, sample, turn).
//!
//! Deterministic and offline; used by tests and the quickstart. A missing answer is an empty message,
//! which the turn handles like any answer without code. Usage is estimated (4 characters a token);
//! with a price ([`ScriptedLlm::with_price`], from `model.prices[model.name]`) answers cost what a
//! priced model would charge for that usage, so USD budgets and comparisons can be tried offline.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use serde::Deserialize;

use super::config::Price;
use crate::services::{EventSink, Llm, LlmError};

use super::ledger::cost_usd;
use crate::types::{LlmAnswer, LlmRequest, ProblemKey, Usage};

#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("cannot read scripted answers {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptLine {
    problem: String,
    #[serde(default)]
    sample: u32,
    turn: u32,
    content: String,
}

pub struct ScriptedLlm {
    path: PathBuf,
    answers: HashMap<(ProblemKey, u32, u32), String>,
    /// Price of the estimated usage; `None`: answers cost 0.
    price: Option<Price>,
}

impl ScriptedLlm {
    pub fn load(path: &Path) -> Result<Self, ScriptError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self, ScriptError> {
        let mut answers = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let err = |message: String| ScriptError::Line {
                path: path.to_path_buf(),
                line: i + 1,
                message,
            };
            if raw.trim().is_empty() {
                continue;
            }
            let l: ScriptLine = serde_json::from_str(raw).map_err(|e| {
                err(format!(
                    "expected {{\"problem\": \"<level>/<id>\", \"sample\": s, \"turn\": n, \"content\": \"...\"}}: {e}"
                ))
            })?;
            let key: ProblemKey = l
                .problem
                .parse()
                .map_err(|m| err(format!("field `problem`: {m}")))?;
            if l.turn == 0 {
                return Err(err("field `turn`: turns count from 1".into()));
            }
            if answers.insert((key, l.sample, l.turn), l.content).is_some() {
                return Err(err(format!(
                    "duplicate answer for problem {key}, sample {}, turn {}",
                    l.sample, l.turn
                )));
            }
        }
        Ok(ScriptedLlm {
            path: path.to_path_buf(),
            answers,
            price: None,
        })
    }
}

impl ScriptedLlm {
    /// Charge answers at `price` (USD per million tokens of the estimated usage).
    pub fn with_price(mut self, price: Option<Price>) -> Self {
        self.price = price;
        self
    }
}

/// Rough token count (4 characters a token) so scripted runs have non-zero usage to report.
fn approx_tokens(s: &str) -> u64 {
    (s.len() as u64).div_ceil(4)
}

#[async_trait]
impl Llm for ScriptedLlm {
    fn describe(&self) -> String {
        format!("scripted answers from {}", self.path.display())
    }

    async fn complete(&self, req: LlmRequest, _sink: &EventSink) -> Result<LlmAnswer, LlmError> {
        let content = self
            .answers
            .get(&(req.task.problem, req.task.sample, req.turn))
            .cloned()
            .unwrap_or_default();
        let prompt_tokens = req.messages.iter().map(|m| approx_tokens(&m.content)).sum();
        let usage = Usage {
            prompt_tokens,
            completion_tokens: approx_tokens(&content),
            reasoning_tokens: 0,
        };
        Ok(LlmAnswer {
            usage: Some(usage),
            content,
            cost_usd: Some(self.price.as_ref().map_or(0.0, |p| cost_usd(p, &usage))),
            model: "scripted".into(),
            finish_reason: Some("stop".into()),
            latency_ms: 0,
            attempts: 1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::TaskId;

    #[tokio::test]
    async fn answers_by_key_and_missing_is_empty() {
        let text = r#"{"problem": "1/2", "sample": 0, "turn": 1, "content": "hello"}
{"problem": "1/2", "sample": 1, "turn": 1, "content": "other"}
"#;
        let llm = ScriptedLlm::parse(text, Path::new("a.jsonl")).unwrap();
        let task = TaskId {
            problem: "1/2".parse().unwrap(),
            sample: 1,
        };
        let req = LlmRequest {
            task,
            turn: 1,
            messages: vec![],
        };
        let a = llm
            .complete(req.clone(), &EventSink::discard())
            .await
            .unwrap();
        assert_eq!(a.content, "other");
        let a = llm
            .complete(LlmRequest { turn: 2, ..req }, &EventSink::discard())
            .await
            .unwrap();
        assert_eq!(a.content, "");
    }

    #[tokio::test]
    async fn a_price_charges_the_estimated_usage() {
        let text = r#"{"problem": "1/2", "turn": 1, "content": "12345678"}"#;
        let llm = ScriptedLlm::parse(text, Path::new("a.jsonl"))
            .unwrap()
            .with_price(Some(Price {
                prompt: 1_000_000.0,
                completion: 2_000_000.0,
            }));
        let req = LlmRequest {
            task: "1/2/0".parse().unwrap(),
            turn: 1,
            messages: vec![crate::types::ChatMessage {
                role: crate::types::Role::User,
                content: "abcd".into(),
            }],
        };
        let a = llm.complete(req, &EventSink::discard()).await.unwrap();
        // 1 prompt token at $1 each, 2 completion tokens at $2 each.
        assert_eq!(a.cost_usd, Some(5.0));
    }

    #[test]
    fn bad_lines_are_located() {
        let e = ScriptedLlm::parse(
            "\n{\"problem\": \"x\", \"turn\": 1, \"content\": \"\"}\n",
            Path::new("a.jsonl"),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.starts_with("a.jsonl:2: field `problem`"), "{e}");
        let dup = "{\"problem\": \"1/1\", \"turn\": 1, \"content\": \"\"}\n{\"problem\": \"1/1\", \"turn\": 1, \"content\": \"\"}";
        let e = ScriptedLlm::parse(dup, Path::new("a.jsonl"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("a.jsonl:2: duplicate"), "{e}");
        let e = ScriptedLlm::parse("{not json", Path::new("a.jsonl"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.starts_with("a.jsonl:1: expected"), "{e}");
    }
}
