//! Progress display for `--no-tui` runs: one indicatif bar over all turns of all tasks, with the
//! stages tasks are in and the running tally of outcomes.

use std::collections::HashMap;
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::broadcast;

use crate::types::{Event, LogRecord, TaskId, Verdict};

/// Counts shown next to the bar.
#[derive(Default)]
struct Tally {
    stage: HashMap<TaskId, &'static str>,
    correct: u64,
    failed: u64,
    tokens: u64,
}

impl Tally {
    fn message(&self) -> String {
        let count = |s: &str| self.stage.values().filter(|v| **v == s).count();
        format!(
            "llm {} · compile {} · execute {} | correct {} · failed {} | {} tokens",
            count("generate"),
            count("compile"),
            count("execute"),
            self.correct,
            self.failed,
            self.tokens
        )
    }
}

/// Follow the event bus until it closes, drawing progress on stderr. `done_turns` is how many turns
/// a resumed run had already finished.
pub async fn follow(
    mut rx: broadcast::Receiver<Arc<LogRecord>>,
    total_turns: u64,
    done_turns: u64,
    initial: Vec<(TaskId, &'static str)>,
) {
    let bar = ProgressBar::with_draw_target(Some(total_turns), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} turns  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_position(done_turns);
    let mut t = Tally::default();
    for (task, s) in initial {
        t.stage.insert(task, s);
    }
    bar.set_message(t.message());
    loop {
        let rec = match rx.recv().await {
            Ok(r) => r,
            Err(broadcast::error::RecvError::Lagged(_)) => continue,
            Err(broadcast::error::RecvError::Closed) => break,
        };
        let Some(task) = rec.task else {
            if let Event::RunEnded { .. } = rec.event {
                break;
            }
            continue;
        };
        let mut turn_ended = None;
        match &rec.event {
            Event::LlmAnswered { answer, code, .. } => {
                if let Some(u) = answer.usage {
                    t.tokens += u.total();
                }
                if code.is_some() {
                    t.stage.insert(task, "compile");
                } else {
                    turn_ended = Some(false);
                }
            }
            Event::LlmFailed { .. } => turn_ended = Some(false),
            Event::Compiled { outcome, .. } => {
                if outcome.status == crate::types::CompileStatus::Ok {
                    t.stage.insert(task, "execute");
                } else {
                    turn_ended = Some(false);
                }
            }
            Event::Executed { outcome, .. } => {
                // A G+E+P profile may still follow, but the candidate's outcome is known now.
                turn_ended = Some(outcome.verdict == Verdict::Correct);
            }
            _ => {}
        }
        if let Some(ok) = turn_ended {
            if ok {
                t.correct += 1;
            } else {
                t.failed += 1;
            }
            bar.inc(1);
            t.stage.insert(task, "generate");
        }
        bar.set_message(t.message());
    }
    bar.finish_and_clear();
}
