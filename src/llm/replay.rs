//! The replay provider: serves the answers recorded in an earlier run's event log.
//!
//! Re-running a run's candidates (another GPU, another evaluation mode) without asking a model
//! again. Answers keep their recorded usage, so token metrics stay comparable; their cost is 0,
//! since replaying spends nothing. The log is read by the store's one reader
//! ([`crate::store::read_log`]), with its rule for a torn last line, and folded by the run's one
//! reducer ([`RunState`]): each turn's answer is the one the recorded run went on with. A log whose
//! events do not fit a task's machine (a corrupt or foreign one, which reports refuse) serves that
//! task's answers up to the event that does not fit, with a warning.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use async_trait::async_trait;

use crate::services::{EventSink, Llm, LlmError};
use crate::state::RunState;
use crate::store::{self, ReadLog, StoreError};
use crate::types::{LlmAnswer, LlmRequest, TaskId};

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
        let mut run = RunState::from_records(&log.records);
        // A last line that lacks only its newline still holds an answer worth serving.
        if let Some(last) = &log.unterminated {
            run.apply(last);
        }
        for t in run.tasks.values() {
            if let Some(e) = &t.error {
                tracing::warn!(
                    "{}: task {}: {e}; its answers after that event are not served",
                    path.display(),
                    t.id
                );
            }
        }
        // Each turn holds the answer the run went on with.
        let answers = run
            .tasks
            .values()
            .flat_map(|t| {
                t.turns()
                    .iter()
                    .filter_map(move |r| Some(((t.id, r.turn), r.answer.clone()?)))
            })
            .collect();
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
    use crate::types::{Event, LogRecord, SCHEMA_VERSION, Usage};

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

    /// A recorded run cut after any record, or mid-record: every answer its log holds is served,
    /// as recorded, and nothing else.
    #[tokio::test]
    async fn a_recorded_run_cut_anywhere_serves_the_answers_it_holds() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/runs/quickstart-sim/events.jsonl");
        let text = std::fs::read_to_string(&path).unwrap();
        let ends: Vec<usize> = text.match_indices('\n').map(|(i, _)| i + 1).collect();
        let sink = EventSink::discard();
        let mut served_whole = 0;
        for (n, &end) in ends.iter().enumerate() {
            // Cut after line n + 1; in the middle of the line after it (a torn tail); and just
            // before that line's newline (a last line that still reads as a record).
            let next = ends.get(n + 1).copied().unwrap_or(end + 1);
            for cut in [end, (end + next) / 2, next - 1] {
                let log = &text[..cut];
                let llm = ReplayLlm::parse(log, &path).unwrap();
                let mut recorded = 0;
                for line in log.lines() {
                    let Ok(rec) = serde_json::from_str::<LogRecord>(line) else {
                        continue;
                    };
                    let (Some(task), Event::LlmAnswered { turn, answer, .. }) =
                        (rec.task, rec.event)
                    else {
                        continue;
                    };
                    recorded += 1;
                    let got = llm.complete(req(&task.to_string(), turn), &sink).await;
                    let got = got.unwrap();
                    assert_eq!(
                        (got.content, got.usage, &got.model),
                        (answer.content, answer.usage, &answer.model)
                    );
                    assert_eq!(
                        (got.cost_usd, got.latency_ms, got.attempts),
                        (Some(0.0), 0, 1)
                    );
                }
                assert_eq!(llm.len(), recorded, "{n} lines, cut at {cut}");
                if cut == text.len() {
                    served_whole = recorded;
                }
            }
        }
        assert_eq!(served_whole, 12);
    }

    #[test]
    fn loads_from_run_dir_or_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(EVENTS_FILE), answered(0, "2/5/0", 1, "x")).unwrap();
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
