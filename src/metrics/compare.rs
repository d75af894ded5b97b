//! Several runs at matched budgets, with bootstrap confidence intervals over problems.
//!
//! Each problem gets the same budget under every run, along one of four axes ([`BudgetAxis`]): LLM
//! calls (refinement turn N against sampling k = N), tokens, USD or device seconds. A run spends its
//! attempts of a problem in order (turns `1, 2, ...`, or samples `0, 1, ...`) while their running cost
//! stays within the budget; the problem's best candidate among them counts. Only problems every run
//! has are compared; how many each run loses is reported.
//!
//! Budgets: `1..=longest run` for LLM calls; for the cost axes, every run's mean (over the shared
//! problems) cumulative cost after `n` attempts, for every `n`, merged and sorted — so each run's own
//! curve points are rows, and the other runs are read at the same budgets.
//!
//! Intervals: percentile bootstrap ([`super::bootstrap`]) resampling the shared problems with
//! replacement; the same resamples serve every run, so the difference to the first run
//! (`vs_first`) is a paired interval.

use serde::Serialize;
use serde::ser::SerializeMap;

use super::attempts::{Attempt, AttemptCost, RunAttempts};
use super::bootstrap::{Interval, percentile_interval, resample_indices};
use super::{Best, FAST_P_LABELS, Summary, summarize};
use crate::types::ProblemKey;

/// What a budget counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetAxis {
    /// Attempts (LLM calls) per problem.
    LlmCalls,
    /// Prompt + completion tokens per problem.
    Tokens,
    /// USD per problem.
    Usd,
    /// Device-lease seconds per problem.
    GpuS,
}

impl BudgetAxis {
    pub const ALL: [BudgetAxis; 4] = [
        BudgetAxis::LlmCalls,
        BudgetAxis::Tokens,
        BudgetAxis::Usd,
        BudgetAxis::GpuS,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BudgetAxis::LlmCalls => "llm_calls",
            BudgetAxis::Tokens => "tokens",
            BudgetAxis::Usd => "usd",
            BudgetAxis::GpuS => "gpu_s",
        }
    }

    fn cost(self, c: &AttemptCost) -> f64 {
        match self {
            BudgetAxis::LlmCalls => 1.0,
            BudgetAxis::Tokens => c.tokens as f64,
            BudgetAxis::Usd => c.usd,
            BudgetAxis::GpuS => c.gpu_s,
        }
    }
}

/// Bootstrap settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CompareSettings {
    /// Resamples (0 = no intervals).
    pub resamples: u32,
    pub seed: u64,
    /// Coverage of the intervals, e.g. 0.95.
    pub level: f64,
}

impl Default for CompareSettings {
    fn default() -> Self {
        CompareSettings {
            resamples: 1000,
            seed: 0,
            level: 0.95,
        }
    }
}

/// One value per fast_p threshold; serialises as a map keyed by [`FAST_P_LABELS`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerThreshold<T>(pub [T; 6]);

impl<T: Serialize> Serialize for PerThreshold<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(6))?;
        for (label, value) in FAST_P_LABELS.iter().zip(&self.0) {
            map.serialize_entry(label, value)?;
        }
        map.end()
    }
}

/// Bootstrap intervals of a run's numbers at one budget.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SummaryCi {
    pub fast_p: PerThreshold<Option<Interval>>,
    pub correct_rate: Option<Interval>,
    pub geomean_speedup: Option<Interval>,
}

/// A run minus the first run at the same budget, with paired intervals.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Delta {
    pub fast_p: PerThreshold<f64>,
    pub fast_p_ci: PerThreshold<Option<Interval>>,
    pub correct_rate: f64,
    pub correct_rate_ci: Option<Interval>,
}

/// One run at one budget.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunAtBudget {
    pub run: String,
    #[serde(flatten)]
    pub summary: Summary,
    /// Mean attempts per problem that fit in the budget.
    pub attempts: f64,
    /// Every attempt of every problem fit: a larger budget buys this run nothing more.
    pub exhausted: bool,
    pub ci: Option<SummaryCi>,
    /// This run minus the first run (absent for the first run).
    pub vs_first: Option<Delta>,
    /// fast_p at the thresholds asked beyond KernelBench's (`compare --fast-p`), keyed by threshold;
    /// no intervals.
    #[serde(skip_serializing_if = "ThresholdValues::is_empty")]
    pub fast_p_extra: ThresholdValues,
}

/// (threshold, fast_p) pairs in the order asked; serialises as a map keyed by
/// [`super::extra::threshold_label`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ThresholdValues(pub Vec<(f64, f64)>);

impl ThresholdValues {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for ThresholdValues {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (p, v) in &self.0 {
            map.serialize_entry(&super::extra::threshold_label(*p), v)?;
        }
        map.end()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BudgetRow {
    /// Budget per problem, in the axis's unit.
    pub budget: f64,
    pub runs: Vec<RunAtBudget>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AxisComparison {
    pub axis: BudgetAxis,
    /// Why this axis cannot be compared (a run recorded no tokens, no prices, no device time).
    pub unavailable: Option<String>,
    pub rows: Vec<BudgetRow>,
}

/// The whole comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub runs: Vec<String>,
    /// Problems every run has (the denominator of every number).
    pub shared_problems: Vec<ProblemKey>,
    /// Problems of each run left out because another run lacks them.
    pub dropped: Vec<usize>,
    pub settings: CompareSettings,
    pub axes: Vec<AxisComparison>,
}

/// One run's input: its name and attempts.
#[derive(Debug, Clone, Copy)]
pub struct CompareRun<'a> {
    pub name: &'a str,
    pub attempts: &'a RunAttempts,
    /// Its answers were generations served as they were (`krefine eval`), not LLM calls: the LLM
    /// axes cannot compare it.
    pub served: bool,
}

/// A cost at most `budget`, up to rounding (budgets are means of sums).
fn within(spent: f64, budget: f64) -> bool {
    spent <= budget * (1.0 + 1e-9) + 1e-12
}

fn merge(into: &mut Best, a: &Attempt) {
    let o = a.outcome;
    into.correct |= o.correct;
    into.compiled |= o.compiled;
    if let Some(s) = o.speedup {
        into.speedup = Some(into.speedup.map_or(s, |b| b.max(s)));
    }
}

/// Each problem's best within `budget`, the attempts used, and whether every attempt fit.
fn bests_within(problems: &[&[Attempt]], axis: BudgetAxis, budget: f64) -> (Vec<Best>, f64, bool) {
    let mut used = 0usize;
    let mut all_fit = true;
    let bests = problems
        .iter()
        .map(|attempts| {
            let mut best = Best::default();
            let mut spent = 0.0;
            let mut n = 0;
            for a in attempts.iter() {
                spent += axis.cost(&a.cost);
                if !within(spent, budget) {
                    break;
                }
                n += 1;
                merge(&mut best, a);
            }
            used += n;
            all_fit &= n == attempts.len();
            best
        })
        .collect();
    let mean = used as f64 / problems.len().max(1) as f64;
    (bests, mean, all_fit)
}

/// Every run's mean cumulative cost after `n` attempts, merged, sorted, deduplicated.
fn budget_grid(runs: &[Vec<&[Attempt]>], axis: BudgetAxis) -> Vec<f64> {
    if axis == BudgetAxis::LlmCalls {
        let longest = runs
            .iter()
            .flat_map(|r| r.iter().map(|a| a.len()))
            .max()
            .unwrap_or(0);
        return (1..=longest).map(|n| n as f64).collect();
    }
    let mut grid = Vec::new();
    for problems in runs {
        let longest = problems.iter().map(|a| a.len()).max().unwrap_or(0);
        let count = problems.len().max(1) as f64;
        let mut sums = vec![0.0; longest];
        for attempts in problems {
            let mut running = 0.0;
            for (i, sum) in sums.iter_mut().enumerate() {
                if let Some(a) = attempts.get(i) {
                    running += axis.cost(&a.cost);
                }
                *sum += running;
            }
        }
        grid.extend(sums.into_iter().map(|s| s / count));
    }
    grid.retain(|b| b.is_finite() && *b > 0.0);
    grid.sort_by(f64::total_cmp);
    grid.dedup_by(|b, a| (*b - *a).abs() <= 1e-9 * a.abs().max(1.0));
    grid
}

/// Why `axis` cannot compare these runs, if it cannot.
fn unavailable(
    names: &[&str],
    served: &[bool],
    runs: &[Vec<&[Attempt]>],
    axis: BudgetAxis,
) -> Option<String> {
    if axis != BudgetAxis::GpuS {
        let serving: Vec<&str> = names
            .iter()
            .zip(served)
            .filter(|(_, s)| **s)
            .map(|(n, _)| *n)
            .collect();
        if !serving.is_empty() {
            return Some(format!(
                "{} served existing generations (no LLM calls)",
                serving.join(", ")
            ));
        }
    }
    let what = match axis {
        BudgetAxis::LlmCalls => return None,
        BudgetAxis::Tokens => "no token usage (its provider sent none)",
        BudgetAxis::Usd => "no priced LLM answers",
        BudgetAxis::GpuS => "no device lease time",
    };
    let lacking: Vec<&str> = names
        .iter()
        .zip(runs)
        .filter(|(_, problems)| {
            !problems
                .iter()
                .flat_map(|a| a.iter())
                .any(|a| axis.cost(&a.cost) > 0.0)
        })
        .map(|(n, _)| *n)
        .collect();
    (!lacking.is_empty()).then(|| format!("{} recorded {what}", lacking.join(", ")))
}

fn gather(bests: &[Best], idx: &[usize]) -> Summary {
    let sample: Vec<Best> = idx.iter().map(|&i| bests[i]).collect();
    summarize(&sample)
}

fn share(count: usize, total: usize) -> f64 {
    if total == 0 {
        0.0
    } else {
        count as f64 / total as f64
    }
}

fn interval(values: impl Iterator<Item = f64>, level: f64) -> Option<Interval> {
    percentile_interval(values.collect(), level)
}

/// Compare `runs` at matched budgets along every axis.
pub fn compare(runs: &[CompareRun<'_>], settings: CompareSettings) -> Comparison {
    compare_at(runs, settings, &[])
}

/// [`compare`], with fast_p also at `thresholds` (those beyond KernelBench's set) in every row.
pub fn compare_at(
    runs: &[CompareRun<'_>],
    settings: CompareSettings,
    thresholds: &[f64],
) -> Comparison {
    let thresholds = super::extra::beyond_kernelbench(thresholds);
    let names: Vec<&str> = runs.iter().map(|r| r.name).collect();
    let served: Vec<bool> = runs.iter().map(|r| r.served).collect();
    let mut shared: Vec<ProblemKey> = runs
        .first()
        .map(|r| r.attempts.keys().copied().collect())
        .unwrap_or_default();
    shared.retain(|p| runs.iter().all(|r| r.attempts.contains_key(p)));
    let dropped = runs
        .iter()
        .map(|r| r.attempts.len() - shared.len())
        .collect();
    let per_run: Vec<Vec<&[Attempt]>> = runs
        .iter()
        .map(|r| {
            shared
                .iter()
                .map(|p| r.attempts.get(p).map_or(&[][..], |a| a.as_slice()))
                .collect()
        })
        .collect();
    let resamples = resample_indices(shared.len(), settings.resamples, settings.seed);
    let axes = BudgetAxis::ALL
        .iter()
        .map(|&axis| {
            if let Some(why) = unavailable(&names, &served, &per_run, axis) {
                return AxisComparison {
                    axis,
                    unavailable: Some(why),
                    rows: Vec::new(),
                };
            }
            let rows = budget_grid(&per_run, axis)
                .into_iter()
                .map(|budget| {
                    let at = Budget {
                        axis,
                        budget,
                        thresholds: &thresholds,
                    };
                    row(&names, &per_run, at, &resamples, settings)
                })
                .collect();
            AxisComparison {
                axis,
                unavailable: None,
                rows,
            }
        })
        .collect();
    Comparison {
        runs: names.iter().map(|n| n.to_string()).collect(),
        shared_problems: shared,
        dropped,
        settings,
        axes,
    }
}

/// Where a row is read: the axis, the budget on it, and the extra fast_p thresholds.
struct Budget<'a> {
    axis: BudgetAxis,
    budget: f64,
    thresholds: &'a [f64],
}

fn row(
    names: &[&str],
    per_run: &[Vec<&[Attempt]>],
    at: Budget<'_>,
    resamples: &[Vec<usize>],
    settings: CompareSettings,
) -> BudgetRow {
    let Budget {
        axis,
        budget,
        thresholds,
    } = at;
    let fitted: Vec<(Vec<Best>, f64, bool)> = per_run
        .iter()
        .map(|problems| bests_within(problems, axis, budget))
        .collect();
    // Every run's summary on every resample (the same resamples for all runs: paired deltas).
    let boot: Vec<Vec<Summary>> = fitted
        .iter()
        .map(|(bests, _, _)| resamples.iter().map(|idx| gather(bests, idx)).collect())
        .collect();
    let level = settings.level;
    let runs = fitted
        .iter()
        .enumerate()
        .map(|(i, (bests, attempts, exhausted))| {
            let summary = summarize(bests);
            let samples = &boot[i];
            let ci = (!samples.is_empty()).then(|| SummaryCi {
                fast_p: PerThreshold(std::array::from_fn(|t| {
                    interval(samples.iter().map(|s| s.fast_p.0[t]), level)
                })),
                correct_rate: interval(samples.iter().map(|s| s.correct_rate), level),
                geomean_speedup: interval(samples.iter().filter_map(|s| s.geomean_speedup), level),
            });
            let vs_first = (i > 0).then(|| {
                let first = summarize(&fitted[0].0);
                let base = &boot[0];
                Delta {
                    fast_p: PerThreshold(std::array::from_fn(|t| {
                        summary.fast_p.0[t] - first.fast_p.0[t]
                    })),
                    fast_p_ci: PerThreshold(std::array::from_fn(|t| {
                        interval(
                            samples
                                .iter()
                                .zip(base)
                                .map(|(s, b)| s.fast_p.0[t] - b.fast_p.0[t]),
                            level,
                        )
                    })),
                    correct_rate: summary.correct_rate - first.correct_rate,
                    correct_rate_ci: interval(
                        samples
                            .iter()
                            .zip(base)
                            .map(|(s, b)| s.correct_rate - b.correct_rate),
                        level,
                    ),
                }
            });
            let fast_p_extra = ThresholdValues(
                thresholds
                    .iter()
                    .map(|&p| {
                        let fast = bests
                            .iter()
                            .filter(|b| b.speedup.is_some_and(|s| s > p))
                            .count();
                        (p, share(fast, bests.len()))
                    })
                    .collect(),
            );
            RunAtBudget {
                run: names[i].to_string(),
                summary,
                attempts: *attempts,
                exhausted: *exhausted,
                ci,
                vs_first,
                fast_p_extra,
            }
        })
        .collect();
    BudgetRow { budget, runs }
}
