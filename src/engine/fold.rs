//! Folding a whole log into per-task turn records, for metrics and reports.

use std::collections::BTreeMap;

use crate::machine::{MachineError, TaskRunner, TaskSpec};
use crate::types::{Event, FeedbackMode, LogRecord, TaskId};

/// Turn records of every task of a run, by task.
pub type TaskTurns = BTreeMap<TaskId, Vec<crate::types::TurnRecord>>;

/// Fold a whole log into per-task turn records (for metrics and reports); also returns the run's
/// first `RunStarted` event, which fixes its plan.
pub fn fold_records(records: &[LogRecord]) -> Result<(Option<Event>, TaskTurns), MachineError> {
    let mut started: Option<Event> = None;
    let mut by_task: BTreeMap<TaskId, Vec<&Event>> = BTreeMap::new();
    for r in records {
        if let Event::RunStarted { .. } = r.event {
            // The first RunStarted fixes the plan; resumes repeat it.
            if started.is_none() {
                started = Some(r.event.clone());
            }
        }
        if let Some(t) = r.task
            && r.event.drives_machine()
        {
            by_task.entry(t).or_default().push(&r.event);
        }
    }
    let (turns, feedback, task_ids) = match &started {
        Some(Event::RunStarted {
            turns,
            feedback,
            task_ids,
            ..
        }) => (
            *turns,
            feedback.unwrap_or(FeedbackMode::GE),
            task_ids.clone(),
        ),
        _ => (
            u32::MAX,
            FeedbackMode::GE,
            by_task.keys().copied().collect(),
        ),
    };
    let mut out = BTreeMap::new();
    for id in task_ids {
        let evs = by_task.remove(&id).unwrap_or_default();
        let spec = TaskSpec {
            id,
            max_turns: turns,
            feedback,
        };
        let (runner, _) = TaskRunner::fold(spec, evs)?;
        out.insert(id, runner.turns().to_vec());
    }
    Ok((started, out))
}
