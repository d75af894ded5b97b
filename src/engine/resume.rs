//! Resume: the engine's task machines folded from the run's log by the run's one reducer
//! ([`RunState::resuming`]), so that a resumed task goes on from exactly the command its logged
//! events leave it at, and a completed turn is never redone.

use std::collections::BTreeSet;
use std::path::Path;

use super::EngineError;
use crate::machine::{Retention, TaskRunner, TaskSpec};
use crate::state::RunState;
use crate::types::{Command, LogRecord, TaskId};

/// Each planned task's machine, folded from `records` keeping `retention` of its finished turns,
/// with the command it still has to perform, in the plan's order. A log that drives a task the
/// plan does not have was written by another experiment (resumed with another config than its
/// own, `config`); a log whose events do not fit a task's machine is corrupt: both are errors.
pub(super) fn fold(
    specs: &[TaskSpec],
    retention: Retention,
    records: &[LogRecord],
    config: &Path,
) -> Result<Vec<(TaskRunner, Command)>, EngineError> {
    if records.is_empty() {
        // A new run: nothing to fold, and no state of a whole run to build and drop first.
        return Ok(specs
            .iter()
            .map(|&spec| TaskRunner::start_keeping(spec, retention))
            .collect());
    }
    let mut state = RunState::resuming(specs, retention);
    for r in records {
        state.apply(r);
    }
    let planned: BTreeSet<TaskId> = specs.iter().map(|s| s.id).collect();
    if let Some(stray) = state
        .tasks
        .values()
        .find(|t| t.moved() && !planned.contains(&t.id))
    {
        return Err(EngineError::Resume(format!(
            "the log has events for task {}, which this config does not plan; resume with the run's own config ({})",
            stray.id,
            config.display()
        )));
    }
    let mut folded = state.into_runners();
    let mut runners = Vec::with_capacity(specs.len());
    for &spec in specs {
        let runner = folded
            .remove(&spec.id)
            .unwrap_or_else(|| Ok(TaskRunner::start_keeping(spec, retention)))?;
        runners.push(runner);
    }
    Ok(runners)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::HistoryPolicy;
    use crate::types::{Event, FeedbackMode};

    /// The committed log of a simulated run: 4 tasks, 3 turns each, G+E+P.
    fn fixture() -> Vec<LogRecord> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/runs/quickstart-sim/events.jsonl");
        crate::store::read_log(&path).unwrap().records
    }

    fn specs() -> Vec<TaskSpec> {
        (1..=4)
            .map(|problem| TaskSpec {
                id: format!("1/{problem}/0").parse().unwrap(),
                max_turns: 3,
                feedback: FeedbackMode::GEP,
            })
            .collect()
    }

    /// A killed run resumed after any record is where each task's own events leave its machine:
    /// the same stage and turn, the same kept turns and prompt feedback, the same next command.
    #[test]
    fn every_task_goes_on_from_where_its_own_events_leave_it() {
        let records = fixture();
        let config = Path::new("config.toml");
        for policy in [HistoryPolicy::Last, HistoryPolicy::Full] {
            let retention = Retention::Prompts(policy);
            for n in 0..=records.len() {
                let prefix = &records[..n];
                let got = fold(&specs(), retention, prefix, config).unwrap();
                assert_eq!(got.len(), 4);
                for (spec, (runner, pending)) in specs().into_iter().zip(got) {
                    let events = prefix
                        .iter()
                        .filter(|r| r.task == Some(spec.id) && r.event.drives_machine())
                        .map(|r| &r.event);
                    let (want, want_pending) =
                        TaskRunner::fold_keeping(spec, retention, events).unwrap();
                    let at = format!("{policy:?}, {n} records, task {}", spec.id);
                    assert_eq!(runner.spec(), want.spec(), "{at}");
                    assert_eq!(runner.stage(), want.stage(), "{at}");
                    assert_eq!(runner.turns(), want.turns(), "{at}");
                    assert_eq!(runner.kept_feedback(), want.kept_feedback(), "{at}");
                    assert_eq!(pending, want_pending, "{at}");
                }
            }
        }
        // The whole log: every task finished its three turns.
        let whole = fold(&specs(), Retention::Everything, &records, config).unwrap();
        assert!(
            whole
                .iter()
                .all(|(r, c)| r.is_done() && *c == Command::Finish)
        );
    }

    #[test]
    fn a_log_that_drives_a_task_the_plan_lacks_is_another_experiments() {
        let records = fixture();
        let fewer = &specs()[..3];
        let left_out: TaskId = "1/4/0".parse().unwrap();
        let e = fold(
            fewer,
            Retention::Everything,
            &records,
            Path::new("run/config.toml"),
        )
        .err()
        .unwrap()
        .to_string();
        assert_eq!(
            e,
            "resume: the log has events for task 1/4/0, which this config does not plan; resume \
             with the run's own config (run/config.toml)"
        );
        // A task the log only names (its request sent, no answer logged) drives nothing: the
        // plan goes on without it.
        let named_only: Vec<LogRecord> = records
            .iter()
            .filter(|r| r.task != Some(left_out) || !r.event.drives_machine())
            .cloned()
            .collect();
        let runners = fold(fewer, Retention::Everything, &named_only, Path::new("c")).unwrap();
        assert_eq!(runners.len(), 3);
    }

    #[test]
    fn an_event_that_does_not_fit_its_task_is_a_corrupt_log() {
        let mut records = fixture();
        // The first answer, logged a second time at the end.
        let again = records
            .iter()
            .find(|r| matches!(r.event, Event::LlmAnswered { .. }))
            .cloned()
            .unwrap();
        let task = again.task.unwrap();
        records.push(LogRecord {
            seq: records.len() as u64,
            ..again
        });
        let e = fold(&specs(), Retention::Everything, &records, Path::new("c"))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.starts_with(&format!(
                "resume: task {task}: event `llm_answered` does not fit"
            )),
            "{e}"
        );
    }
}
