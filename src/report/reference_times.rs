//! Whether runs timed one problem's reference alike: speedups of runs compared at equal budget are
//! comparable only when each problem's reference took about the same time in each. On a shared
//! machine it may not have (something else ran on the device while one run timed it), and nothing in
//! the runs' settings shows it; `krefine compare` warns about each such problem.

use std::collections::BTreeMap;

use serde::Serialize;

use super::LoadedRun;
use crate::types::ProblemKey;

/// A problem's reference time may differ between runs by at most this factor before `compare`
/// warns.
pub const REFERENCE_TIME_SPREAD: f64 = 2.0;

/// One problem whose reference time differs between runs by more than [`REFERENCE_TIME_SPREAD`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReferenceTimeWarning {
    pub problem: ProblemKey,
    /// Each run's reference time of the problem (the median of its results' measured reference
    /// times, ms), by run label; runs without one are left out.
    pub ref_ms: BTreeMap<String, f64>,
    /// The slowest over the fastest.
    pub ratio: f64,
}

impl ReferenceTimeWarning {
    /// The warning as `compare` prints it.
    pub fn message(&self) -> String {
        let times: Vec<String> = self
            .ref_ms
            .iter()
            .map(|(run, ms)| format!("{ms:.4} ms in {run}"))
            .collect();
        format!(
            "problem {}: the reference took {} ({:.1}x apart): its speedups are not comparable \
             between these runs (was the device shared while one of them timed it?)",
            self.problem,
            times.join(", "),
            self.ratio
        )
    }
}

/// A run's reference time of each problem: the median of the reference times its results measured.
fn reference_times(run: &LoadedRun) -> BTreeMap<ProblemKey, f64> {
    let mut by_problem: BTreeMap<ProblemKey, Vec<f64>> = BTreeMap::new();
    for (task, turns) in &run.turns {
        for exec in turns.iter().filter_map(|t| t.exec.as_ref()) {
            if exec.ref_runtime_ms.is_finite() && exec.ref_runtime_ms > 0.0 {
                by_problem
                    .entry(task.problem)
                    .or_default()
                    .push(exec.ref_runtime_ms);
            }
        }
    }
    by_problem
        .into_iter()
        .map(|(p, mut v)| {
            v.sort_by(f64::total_cmp);
            let mid = v.len() / 2;
            let median = if v.len() % 2 == 0 {
                (v[mid - 1] + v[mid]) / 2.0
            } else {
                v[mid]
            };
            (p, median)
        })
        .collect()
}

/// Every problem whose reference time differs between `runs` (labelled `labels`) by more than
/// [`REFERENCE_TIME_SPREAD`], in problem order.
pub fn reference_time_warnings(
    runs: &[&LoadedRun],
    labels: &[String],
) -> Vec<ReferenceTimeWarning> {
    let times: Vec<BTreeMap<ProblemKey, f64>> = runs.iter().map(|r| reference_times(r)).collect();
    let problems: std::collections::BTreeSet<ProblemKey> =
        times.iter().flat_map(|t| t.keys().copied()).collect();
    problems
        .into_iter()
        .filter_map(|p| {
            let ref_ms: BTreeMap<String, f64> = labels
                .iter()
                .zip(&times)
                .filter_map(|(label, t)| t.get(&p).map(|ms| (label.clone(), *ms)))
                .collect();
            let lo = ref_ms.values().copied().fold(f64::INFINITY, f64::min);
            let hi = ref_ms.values().copied().fold(0.0, f64::max);
            let ratio = hi / lo;
            (ref_ms.len() >= 2 && ratio > REFERENCE_TIME_SPREAD).then_some(ReferenceTimeWarning {
                problem: p,
                ref_ms,
                ratio,
            })
        })
        .collect()
}
