//! The comparison `krefine compare` prints, as data: several loaded runs at matched budgets, after the
//! checks that make a comparison meaningful (shared problems, a coverage level in (0, 1)). Runs are
//! labelled by name, or by directory where names repeat ([`run_labels`]). The command and the Python
//! package both call [`compare_runs`].

use crate::metrics::compare::{CompareRun, CompareSettings, Comparison, compare_at};

use super::LoadedRun;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CompareError {
    #[error("coverage level {0}: expected a number between 0 and 1, like 0.95")]
    Level(f64),
    #[error("the runs share no problem, so there is nothing to compare")]
    NoSharedProblems,
}

/// Compare `runs` (the first is the one differences are taken against) at matched budgets along
/// every axis.
pub fn compare_runs(
    runs: &[&LoadedRun],
    settings: CompareSettings,
) -> Result<Comparison, CompareError> {
    compare_runs_at(runs, settings, &[])
}

/// [`compare_runs`], with fast_p also at `thresholds` (those beyond KernelBench's set) in every row.
pub fn compare_runs_at(
    runs: &[&LoadedRun],
    settings: CompareSettings,
    thresholds: &[f64],
) -> Result<Comparison, CompareError> {
    if !(settings.level > 0.0 && settings.level < 1.0) {
        return Err(CompareError::Level(settings.level));
    }
    let labels = run_labels(runs);
    let inputs: Vec<CompareRun<'_>> = runs
        .iter()
        .zip(&labels)
        .map(|(r, label)| CompareRun {
            name: label,
            attempts: &r.attempts,
            served: r.report.served.is_some(),
        })
        .collect();
    let c = compare_at(&inputs, settings, thresholds);
    if c.shared_problems.is_empty() {
        return Err(CompareError::NoSharedProblems);
    }
    Ok(c)
}

/// One label per run, distinct: the run's name where no other run has it; otherwise (runs made from
/// one config share its name) the shortest tail of the run's directory path that no other of those
/// runs has, and, for the same directory given twice, that tail numbered (`dir#2`).
pub fn run_labels(runs: &[&LoadedRun]) -> Vec<String> {
    let name = |r: &LoadedRun| r.report.run.clone();
    let repeated = |i: usize| {
        runs.iter()
            .enumerate()
            .any(|(j, o)| j != i && o.report.run == runs[i].report.run)
    };
    let parts = |r: &LoadedRun| -> Vec<String> {
        r.dir
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .filter(|c| c != ".")
            .collect()
    };
    let tail = |p: &[String], n: usize| p[p.len().saturating_sub(n)..].join("/");
    let mut labels: Vec<String> = Vec::with_capacity(runs.len());
    for (i, r) in runs.iter().enumerate() {
        if !repeated(i) {
            labels.push(name(r));
            continue;
        }
        let mine = parts(r);
        let others: Vec<Vec<String>> = runs
            .iter()
            .enumerate()
            .filter(|(j, o)| *j != i && o.report.run == r.report.run && o.dir != r.dir)
            .map(|(_, o)| parts(o))
            .collect();
        if others.is_empty() {
            labels.push(name(r));
            continue;
        }
        let n = (1..=mine.len().max(1))
            .find(|&n| others.iter().all(|o| tail(o, n) != tail(&mine, n)))
            .unwrap_or(mine.len());
        let label = tail(&mine, n);
        labels.push(if label.is_empty() { name(r) } else { label });
    }
    // Whatever still repeats (one directory given twice, or a directory named like another run)
    // gets numbered by occurrence.
    let mut out = Vec::with_capacity(labels.len());
    for (i, l) in labels.iter().enumerate() {
        let before = labels[..i].iter().filter(|o| *o == l).count();
        let mut label = if before == 0 {
            l.clone()
        } else {
            format!("{l}#{}", before + 1)
        };
        while out.contains(&label) {
            label.push('\'');
        }
        out.push(label);
    }
    out
}
