//! The comparison `krefine compare` prints, as data: several loaded runs at matched budgets, after the
//! checks that make a comparison meaningful (distinct run names, shared problems, a coverage level in
//! (0, 1)). The command and the Python package both call [`compare_runs`].

use crate::metrics::compare::{CompareRun, CompareSettings, Comparison, compare};

use super::LoadedRun;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CompareError {
    #[error("coverage level {0}: expected a number between 0 and 1, like 0.95")]
    Level(f64),
    #[error("two of the runs are both named {0:?}; compare runs with distinct names")]
    DuplicateName(String),
    #[error("the runs share no problem, so there is nothing to compare")]
    NoSharedProblems,
}

/// Compare `runs` (the first is the one differences are taken against) at matched budgets along
/// every axis.
pub fn compare_runs(
    runs: &[&LoadedRun],
    settings: CompareSettings,
) -> Result<Comparison, CompareError> {
    if !(settings.level > 0.0 && settings.level < 1.0) {
        return Err(CompareError::Level(settings.level));
    }
    let mut names: Vec<&str> = Vec::new();
    for r in runs {
        if names.contains(&r.report.run.as_str()) {
            return Err(CompareError::DuplicateName(r.report.run.clone()));
        }
        names.push(&r.report.run);
    }
    let inputs: Vec<CompareRun<'_>> = runs
        .iter()
        .map(|r| CompareRun {
            name: &r.report.run,
            attempts: &r.attempts,
        })
        .collect();
    let c = compare(&inputs, settings);
    if c.shared_problems.is_empty() {
        return Err(CompareError::NoSharedProblems);
    }
    Ok(c)
}
