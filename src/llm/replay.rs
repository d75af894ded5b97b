//! The replay provider: serves the answers recorded in an earlier run's event log.
//!
//! Re-running a run's candidates (another GPU, another evaluation mode) without asking a model
//! again. Answers keep their recorded usage, so token metrics stay comparable; their cost is 0,
//! since replaying spends nothing. The log is read by the store's one reader
//! ([`crate::store::read_log`]), with its rule for a torn last line.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use async_trait::async_trait;

use crate::services::{EventSink, Llm, LlmError};
use crate::store::{self, ReadLog, StoreError};
use crate::types::{Event, LlmAnswer, LlmRequest, TaskId};

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cannot read the recorded run {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A line of the log that is not a record (the store's reader says which and why).
    #[error(transparent)]
    Log(StoreError),
}

impl From<StoreError> for ReplayError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Io { path, source } => ReplayError::Read { path, source },
            other => ReplayError::Log(other),
        }
    }
}

pub struct ReplayLlm {
    path: PathBuf,
    answers: HashMap<(TaskId, u32), LlmAnswer>,
}

impl ReplayLlm {
    /// Loads `<run>/events.jsonl`; `run` may also be the log file itself.
    pub fn load(run: &Path) -> Result<Self, ReplayError> {
        let path = store::events_path(run);
        Ok(Self::from_log(store::read_log(&path)?, &path))
    }

    /// The answers of the log text `text`, read by the store's reader (an unreadable last line is
    /// dropped, one that lacks only its newline is kept; a bad line anywhere else is an error).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ReplayError> {
        Ok(Self::from_log(
            store::read_from(text.as_bytes(), path)?,
            path,
        ))
    }

    fn from_log(log: ReadLog, path: &Path) -> Self {
        if let Some(w) = &log.torn_tail {
            tracing::warn!("{w}");
        }
        let mut answers = HashMap::new();
        // A last line that lacks only its newline still holds an answer worth serving.
        for record in log.records.into_iter().chain(log.unterminated) {
            if let (Some(task), Event::LlmAnswered { turn, answer, .. }) =
                (record.task, record.event)
            {
                // The first answer is the one the run went on with.
                answers.entry((task, turn)).or_insert(answer);
            }
        }
        ReplayLlm {
            path: path.to_path_buf(),
            answers,
        }
    }

    pub fn len(&self) -> usize {
        self.answers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }
}

#[async_trait]
impl Llm for ReplayLlm {
    fn describe(&self) -> String {
        format!("replay of the answers recorded in {}", self.path.display())
    }

    async fn complete(&self, req: LlmRequest, _sink: &EventSink) -> Result<LlmAnswer, LlmError> {
        let recorded = self.answers.get(&(req.task, req.turn)).ok_or_else(|| {
            LlmError::Failed(format!(
                "no recorded answer for task {} turn {} in {}",
                req.task,
                req.turn,
                self.path.display()
            ))
        })?;
        Ok(LlmAnswer {
            cost_usd: Some(0.0),
            latency_ms: 0,
            attempts: 1,
            ..recorded.clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::EVENTS_FILE;
    use crate::types::{LogRecord, SCHEMA_VERSION, Usage};

    fn task(s: &str) -> TaskId {
        s.parse().unwrap()
    }

    fn answered(seq: u64, t: &str, turn: u32, content: &str) -> String {
        let record = LogRecord {
            v: SCHEMA_VERSION,
            seq,
            ts_ms: 0,
            task: Some(task(t)),
            event: Event::LlmAnswered {
                turn,
                answer: LlmAnswer {
                    content: content.into(),
                    usage: Some(Usage {
                        prompt_tokens: 10,
                        completion_tokens: 20,
                        reasoning_tokens: 0,
                    }),
                    cost_usd: Some(0.5),
                    model: "m".into(),
                    finish_reason: Some("stop".into()),
                    latency_ms: 1234,
                    attempts: 3,
                },
                code: None,
                code_file: None,
            },
        };
        serde_json::to_string(&record).unwrap()
    }

    fn req(t: &str, turn: u32) -> LlmRequest {
        LlmRequest {
            task: task(t),
            turn,
            messages: vec![],
        }
    }

    #[tokio::test]
    async fn serves_recorded_answers_by_task_and_turn() {
        let other = r#"{"v":1,"seq":2,"ts_ms":0,"task":"1/3/0","event":{"type":"llm_failed","turn":2,"error":"x"}}"#;
        let text = [
            answered(0, "1/3/0", 1, "first"),
            String::new(),
            other.to_string(),
            answered(3, "1/3/1", 1, "sample one"),
            answered(4, "1/3/0", 1, "duplicate"),
        ]
        .join("\n");
        let llm = ReplayLlm::parse(&text, Path::new("run/events.jsonl")).unwrap();
        assert_eq!(llm.len(), 2);
        let sink = EventSink::discard();
        let a = llm.complete(req("1/3/0", 1), &sink).await.unwrap();
        assert_eq!(a.content, "first");
        assert_eq!(a.usage.map(|u| u.total()), Some(30));
        assert_eq!((a.cost_usd, a.latency_ms, a.attempts), (Some(0.0), 0, 1));
        let a = llm.complete(req("1/3/1", 1), &sink).await.unwrap();
        assert_eq!(a.content, "sample one");
        let e = llm.complete(req("1/3/0", 2), &sink).await.unwrap_err();
        assert!(matches!(e, LlmError::Failed(_)));
        assert_eq!(
            e.to_string(),
            "no recorded answer for task 1/3/0 turn 2 in run/events.jsonl"
        );
    }

    #[test]
    fn torn_last_line_is_skipped_other_bad_lines_are_located() {
        let good = answered(0, "1/1/0", 1, "a");
        let torn = format!("{good}\n{}", &good[..good.len() / 2]);
        let llm = ReplayLlm::parse(&torn, Path::new("e.jsonl")).unwrap();
        assert_eq!(llm.len(), 1);
        let bad = format!("{good}\n{{\"v\":1}}\n{good}\n");
        let e = ReplayLlm::parse(&bad, Path::new("e.jsonl"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.starts_with("e.jsonl:2: not an event record"), "{e}");
    }

    #[test]
    fn loads_from_run_dir_or_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(EVENTS_FILE), answered(0, "2/5/0", 3, "x")).unwrap();
        assert_eq!(ReplayLlm::load(dir.path()).unwrap().len(), 1);
        assert_eq!(
            ReplayLlm::load(&dir.path().join(EVENTS_FILE))
                .unwrap()
                .len(),
            1
        );
        let e = ReplayLlm::load(&dir.path().join("missing"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.starts_with("cannot read the recorded run"), "{e}");
    }
}
