//! A log's events grouped by task, in log order: what a task's machine is folded from. The engine's
//! resume folds each group with [`super::TaskRunner::fold_keeping`]; the run's reducer
//! ([`crate::state::RunState`]) feeds the same events one record at a time, so both see a task's
//! events in the same order and fold them through the same machine.

use std::collections::BTreeMap;

use crate::types::{Event, LogRecord, TaskId, TurnRecord};

/// Turn records of every task of a run, by task.
pub type TaskTurns = BTreeMap<TaskId, Vec<TurnRecord>>;

/// The events that drive each task's machine (see [`Event::drives_machine`]), by task, in log order.
pub fn events_by_task(records: &[LogRecord]) -> BTreeMap<TaskId, Vec<&Event>> {
    let mut by_task: BTreeMap<TaskId, Vec<&Event>> = BTreeMap::new();
    for r in records {
        if let Some(t) = r.task
            && r.event.drives_machine()
        {
            by_task.entry(t).or_default().push(&r.event);
        }
    }
    by_task
}
