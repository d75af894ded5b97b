//! Iterative refinement vs. repeated sampling at equal budget.
//!
//! Equal attempts: turn `n` of refinement against the first `n` samples, over the same problems.
//! Equal tokens: each problem gets the same token budget `B` under both methods; a method uses its
//! attempts in order (turns `1, 2, ...` or samples `0, 1, ...`) while their running token total stays
//! within `B`. Refinement prompts grow with the history, so its attempts get dearer with every turn;
//! this comparison is the one that charges for that.

use serde::Serialize;

use crate::types::{MethodKind, ProblemKey};

use super::{
    Best, Ledger, MetricsError, RunInput, RunMetrics, Summary, attempt_position, summarize,
};

/// Both methods after the same number of attempts per problem.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttemptsRow {
    pub attempts: u32,
    pub refine: Summary,
    pub sampling: Summary,
}

/// Both methods within the same token budget per problem.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokensRow {
    /// Prompt + completion tokens allowed per problem.
    pub budget_tokens: u64,
    pub refine: Summary,
    pub sampling: Summary,
    /// Mean attempts per problem that fit in the budget.
    pub refine_attempts: f64,
    pub sampling_attempts: f64,
}

fn expect_refine(m: MethodKind) -> Result<(), MetricsError> {
    match m {
        MethodKind::Refine | MethodKind::OneShot => Ok(()),
        got => Err(MetricsError::Method {
            expected: "refine",
            got,
        }),
    }
}

fn expect_sampling(m: MethodKind) -> Result<(), MetricsError> {
    match m {
        MethodKind::Sampling => Ok(()),
        got => Err(MetricsError::Method {
            expected: "sampling",
            got,
        }),
    }
}

fn same_problems(a: &[ProblemKey], b: &[ProblemKey]) -> Result<(), MetricsError> {
    // Both lists are sorted and deduplicated (RunMetrics::problems, RunInput::sorted_problems).
    let only_first = a.iter().filter(|p| b.binary_search(p).is_err()).count();
    let only_second = b.iter().filter(|p| a.binary_search(p).is_err()).count();
    if only_first == 0 && only_second == 0 {
        Ok(())
    } else {
        Err(MetricsError::DifferentProblems {
            only_first,
            only_second,
        })
    }
}

/// fast_p and friends of a refinement run at turn `n` next to a sampling run with `n` samples, for
/// `n = 1..=min(turns, k)`.
pub fn equal_attempts(
    refine: &RunMetrics,
    sampling: &RunMetrics,
) -> Result<Vec<AttemptsRow>, MetricsError> {
    expect_refine(refine.method)?;
    expect_sampling(sampling.method)?;
    same_problems(&refine.problems, &sampling.problems)?;
    Ok(refine
        .steps
        .iter()
        .zip(&sampling.steps)
        .map(|(r, s)| AttemptsRow {
            attempts: r.n,
            refine: r.summary.clone(),
            sampling: s.summary.clone(),
        })
        .collect())
}

/// Tokens (prompt + completion) of each attempt `1..=axis` of `problem`.
fn attempt_tokens(run: &RunInput<'_>, ledger: &Ledger, problem: ProblemKey) -> Vec<u64> {
    (1..=run.axis)
        .map(|a| {
            let (sample, turn) = attempt_position(run.method, a);
            ledger
                .per_task_turn
                .get(&crate::types::TaskId { problem, sample })
                .and_then(|turns| turns.get(&turn))
                .map_or(0, |s| s.tokens())
        })
        .collect()
}

/// Mean over the run's problems of the tokens spent by attempts `1..=n`, for each `n = 1..=axis`.
/// A natural grid of budgets for [`equal_tokens`] (e.g. the refinement run's curve).
pub fn cumulative_tokens_per_problem(run: &RunInput<'_>, ledger: &Ledger) -> Vec<f64> {
    let problems = run.sorted_problems();
    let mut sums = vec![0u64; run.axis as usize];
    for &p in &problems {
        let mut running = 0u64;
        for (sum, t) in sums.iter_mut().zip(attempt_tokens(run, ledger, p)) {
            running = running.saturating_add(t);
            *sum = sum.saturating_add(running);
        }
    }
    let count = problems.len().max(1) as f64;
    sums.into_iter().map(|s| s as f64 / count).collect()
}

/// A method's standing per problem within `budget` tokens, and the attempts that fit.
fn within_budget(run: &RunInput<'_>, ledger: &Ledger, budget: u64) -> (Summary, f64) {
    let problems = run.sorted_problems();
    let mut bests = Vec::with_capacity(problems.len());
    let mut used = 0u64;
    for &p in &problems {
        let mut best = Best::default();
        let mut spent = 0u64;
        for (record, tokens) in run
            .attempts(p)
            .into_iter()
            .zip(attempt_tokens(run, ledger, p))
        {
            spent = spent.saturating_add(tokens);
            // Attempts are spent in order, so the first one over budget ends the problem's run.
            if spent > budget {
                break;
            }
            used += 1;
            if let Some(r) = record {
                best.add(r);
            }
        }
        bests.push(best);
    }
    let mean_used = used as f64 / problems.len().max(1) as f64;
    (summarize(&bests), mean_used)
}

/// fast_p and friends of a refinement and a sampling run over the same problems, each problem
/// allowed `budget` tokens, for each of `budgets`. Attempts whose answer carried no `usage` cost
/// nothing here; runs on providers without usage cannot be compared by tokens.
pub fn equal_tokens(
    refine: &RunInput<'_>,
    refine_ledger: &Ledger,
    sampling: &RunInput<'_>,
    sampling_ledger: &Ledger,
    budgets: &[u64],
) -> Result<Vec<TokensRow>, MetricsError> {
    expect_refine(refine.method)?;
    expect_sampling(sampling.method)?;
    same_problems(&refine.sorted_problems(), &sampling.sorted_problems())?;
    Ok(budgets
        .iter()
        .map(|&budget| {
            let (r, r_used) = within_budget(refine, refine_ledger, budget);
            let (s, s_used) = within_budget(sampling, sampling_ledger, budget);
            TokensRow {
                budget_tokens: budget,
                refine: r,
                sampling: s,
                refine_attempts: r_used,
                sampling_attempts: s_used,
            }
        })
        .collect())
}
