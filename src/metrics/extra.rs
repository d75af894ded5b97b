//! What `report` and `compare` show beyond KernelBench's fixed fast_p set: fast_p at thresholds the
//! user picks (`--fast-p`, else the run's `report.fast_p`, Fast@1.2 by default) and the mean
//! fraction of speed of light of the candidates whose roofline is known, per step of the curve.
//!
//! Both follow the curve's rules ([`super::run_metrics`]): step `n` covers attempts `1..=n` of each
//! problem; fast_p takes each problem's best correct speedup so far (strict `>`, unverified
//! strict-mode speedups left out, every problem in the denominator).
//!
//! A candidate's fraction of speed of light (SOL) is what its Nsight Compute profile recorded
//! (`profile.ncu.sol_fraction`, from `eval.profiler = "ncu"` or `"both"`): each kernel of one forward
//! sits under the memory roof or the compute roof (its arithmetic intensity against the GPU's ridge
//! point), its fraction is achieved bytes/s or FLOP/s over that roof's peak, and the candidate's is the
//! duration-weighted mean over the kernels whose roofline is known. The step's `sol_mean` is the plain
//! mean over the correct candidates up to that step that carry one; `sol_candidates` counts them.

use serde::Serialize;
use serde::ser::SerializeMap;

use crate::types::{TurnRecord, Verdict};

use super::{Best, FAST_P_THRESHOLDS, RunInput};

/// The extra numbers of a run, one entry per step (empty when they were not asked for).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExtraMetrics {
    /// Thresholds beyond KernelBench's set, in the order asked, without duplicates.
    pub thresholds: Vec<f64>,
    pub steps: Vec<ExtraStep>,
}

/// The extra numbers at one step.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExtraStep {
    /// fast_p at each of [`ExtraMetrics::thresholds`], as shares in `0..=1`.
    pub fast_p: Vec<f64>,
    /// Mean fraction of speed of light (in `0..`; 1 is the roof) of the correct candidates so far
    /// that have one; `None` when none has.
    pub sol_mean: Option<f64>,
    /// How many candidates `sol_mean` is over.
    pub sol_candidates: usize,
}

impl ExtraMetrics {
    /// Whether any step has a fraction of speed of light (text tables show the column only then).
    pub fn has_sol(&self) -> bool {
        self.steps.iter().any(|s| s.sol_candidates > 0)
    }
}

/// A threshold's name in columns and keys: `1.2`, `3`, `0.25` (as `{p}` prints it).
pub fn threshold_label(p: f64) -> String {
    format!("{p}")
}

/// The fast_p values of a step as a map keyed by [`threshold_label`].
pub struct ExtraFastP<'a>(pub &'a [f64], pub &'a [f64]);

impl Serialize for ExtraFastP<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (p, v) in self.0.iter().zip(self.1) {
            map.serialize_entry(&threshold_label(*p), v)?;
        }
        map.end()
    }
}

/// Thresholds as asked, less those in KernelBench's set (already shown) and repeats.
pub fn beyond_kernelbench(thresholds: &[f64]) -> Vec<f64> {
    let mut out: Vec<f64> = Vec::new();
    for &p in thresholds {
        if !FAST_P_THRESHOLDS.contains(&p) && !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// A finished correct candidate's fraction of speed of light, where its profile recorded one.
pub fn candidate_sol(r: &TurnRecord) -> Option<f64> {
    if r.verdict != Some(Verdict::Correct) {
        return None;
    }
    let ncu = r.profile.as_ref()?.ncu.as_ref()?;
    ncu.get("sol_fraction")?
        .as_f64()
        .filter(|f| f.is_finite() && *f >= 0.0)
}

/// fast_p at `thresholds` (those beyond KernelBench's set) and the mean SOL, per step of the curve.
pub fn extra_metrics(run: &RunInput<'_>, thresholds: &[f64]) -> ExtraMetrics {
    let thresholds = beyond_kernelbench(thresholds);
    let problems = run.sorted_problems();
    let attempts: Vec<Vec<Option<&TurnRecord>>> =
        problems.iter().map(|&p| run.attempts(p)).collect();
    let mut bests = vec![Best::default(); problems.len()];
    let (mut sol_sum, mut sol_candidates) = (0.0, 0usize);
    let mut steps = Vec::with_capacity(run.axis as usize);
    for n in 1..=run.axis {
        let idx = (n - 1) as usize;
        for (best, list) in bests.iter_mut().zip(&attempts) {
            if let Some(r) = list.get(idx).copied().flatten() {
                best.add(r);
                if let Some(f) = candidate_sol(r) {
                    sol_sum += f;
                    sol_candidates += 1;
                }
            }
        }
        let total = problems.len();
        let fast_p = thresholds
            .iter()
            .map(|p| {
                let count = bests
                    .iter()
                    .filter(|b| b.speedup.is_some_and(|s| s > *p))
                    .count();
                if total == 0 {
                    0.0
                } else {
                    count as f64 / total as f64
                }
            })
            .collect();
        steps.push(ExtraStep {
            fast_p,
            sol_mean: (sol_candidates > 0).then(|| sol_sum / sol_candidates as f64),
            sol_candidates,
        });
    }
    ExtraMetrics { thresholds, steps }
}
