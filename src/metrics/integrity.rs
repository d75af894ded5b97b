//! Integrity of a run's results, from the log: static-check and runtime findings per category, and
//! the excessive-speedup guard's flags, re-verifications and exclusions.
//!
//! The one rule that changes a metric: in strict mode, a result whose speedup the guard flagged as
//! excessive counts in fast_p and the geomean only once re-timing confirmed it
//! (`speedup_check.verified == Some(true)`). Such a result is still correct (it counts in the
//! correct rate) but untimed. Faithful mode counts it as KernelBench does and only reports the flag.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::types::{EvalMode, ExecOutcome, Finding, Severity, TurnRecord, Verdict};

/// Candidates with at least one finding of a category, by severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct FindingCounts {
    /// Candidates with a warning of this category (recorded; the verdict is unchanged).
    pub warnings: usize,
    /// Candidates with an error of this category: rejected before compiling (static) or failed
    /// (runtime).
    pub errors: usize,
}

/// The excessive-speedup guard over a set of results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct SpeedupCounts {
    /// Results whose speedup was above the guard's bound.
    pub flagged: usize,
    /// Flagged results that re-timing with fresh inputs in a fresh process confirmed.
    pub verified: usize,
    /// Flagged results not confirmed (re-timing disagreed, or was not done).
    pub unverified: usize,
    /// Unverified strict-mode results left out of fast_p and the geomean.
    pub excluded: usize,
}

/// Findings and speedup flags of a set of candidates (one step of the curve, or a whole run).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Integrity {
    /// Static checks on the sources, by category.
    #[serde(rename = "static")]
    pub static_checks: BTreeMap<String, FindingCounts>,
    /// Runtime checks during evaluation, by category.
    #[serde(rename = "runtime")]
    pub runtime_checks: BTreeMap<String, FindingCounts>,
    /// Candidates rejected by static checks before compiling (verdict `rejected`).
    pub rejected: usize,
    pub speedups: SpeedupCounts,
}

impl Integrity {
    /// True when no candidate had a finding or a flagged speedup.
    pub fn is_empty(&self) -> bool {
        *self == Integrity::default()
    }

    /// Count one finished candidate.
    pub fn add(&mut self, r: &TurnRecord) {
        if r.verdict.is_none() {
            return;
        }
        if let Some(c) = &r.compile {
            count_findings(&mut self.static_checks, &c.findings);
        }
        if r.verdict == Some(Verdict::Rejected) {
            self.rejected += 1;
        }
        let Some(e) = &r.exec else { return };
        count_findings(&mut self.runtime_checks, &e.findings);
        if let Some(check) = e.speedup_check.as_ref().filter(|c| c.flagged) {
            self.speedups.flagged += 1;
            if check.verified == Some(true) {
                self.speedups.verified += 1;
            } else {
                self.speedups.unverified += 1;
                if r.verdict == Some(Verdict::Correct) && speedup_excluded(e) {
                    self.speedups.excluded += 1;
                }
            }
        }
    }

    /// Add another set's counts (steps into a run total).
    pub fn merge(&mut self, other: &Integrity) {
        for (mine, theirs) in [
            (&mut self.static_checks, &other.static_checks),
            (&mut self.runtime_checks, &other.runtime_checks),
        ] {
            for (category, n) in theirs {
                let m = mine.entry(category.clone()).or_default();
                m.warnings += n.warnings;
                m.errors += n.errors;
            }
        }
        self.rejected += other.rejected;
        self.speedups.flagged += other.speedups.flagged;
        self.speedups.verified += other.speedups.verified;
        self.speedups.unverified += other.speedups.unverified;
        self.speedups.excluded += other.speedups.excluded;
    }
}

/// Each category counts a candidate once per severity, however many lines it flagged.
fn count_findings(into: &mut BTreeMap<String, FindingCounts>, findings: &[Finding]) {
    let mut seen: BTreeMap<&str, (bool, bool)> = BTreeMap::new();
    for f in findings {
        let s = seen.entry(f.category.as_str()).or_default();
        match f.severity {
            Severity::Warning => s.0 = true,
            Severity::Error => s.1 = true,
        }
    }
    for (category, (warning, error)) in seen {
        let c = into.entry(category.to_string()).or_default();
        c.warnings += usize::from(warning);
        c.errors += usize::from(error);
    }
}

/// True for a strict-mode result whose excessive speedup was not confirmed by re-timing: its
/// speedup does not count. The mode is the one the result was measured in (`env.mode`).
pub fn speedup_excluded(e: &ExecOutcome) -> bool {
    let strict = e.env.mode.as_deref() == Some(EvalMode::Strict.as_str());
    strict
        && e.speedup_check
            .as_ref()
            .is_some_and(|c| c.flagged && c.verified != Some(true))
}

/// The speedup a turn contributes to fast_p and the geomean: its correct speedup, unless
/// [`speedup_excluded`].
pub fn counted_speedup(r: &TurnRecord) -> Option<f64> {
    match &r.exec {
        Some(e) if speedup_excluded(e) => None,
        _ => r.correct_speedup(),
    }
}
