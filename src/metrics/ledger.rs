//! What a run spent, as reports show it: the reducer's ledger ([`crate::state::RunState::ledger`])
//! of a whole log, and its spending per step of the curve.

use crate::state::RunState;
use crate::types::{LogRecord, MethodKind};

pub use crate::spend::Spend;
pub use crate::state::ledger::{DeviceUse, Ledger, measured_work_ms};

use super::attempt_position;

/// Fold a run's log (in log order) into its [`Ledger`], through the run's one reducer.
pub fn ledger(records: &[LogRecord]) -> Ledger {
    RunState::from_records(records).ledger()
}

/// LLM spending of each step `1..=axis` of the curve: turn `n` of the sample-0 tasks (refine,
/// one-shot), or sample `n - 1` (sampling), over all problems.
pub fn step_spend(method: MethodKind, axis: u32, ledger: &Ledger) -> Vec<Spend> {
    (1..=axis)
        .map(|n| {
            let (sample, turn) = attempt_position(method, n);
            let mut spend = Spend::default();
            for (task, turns) in &ledger.per_task_turn {
                if task.sample == sample
                    && let Some(s) = turns.get(&turn)
                {
                    spend.add(s);
                }
            }
            spend
        })
        .collect()
}
