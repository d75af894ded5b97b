//! What changed between a candidate's recorded result and its recheck, and what the run's fast_p is
//! with the rechecked results in place of the recorded ones. Pure: turn records in, verdicts out.
//!
//! A candidate is *credited* when its verdict is `correct` (it counts in the correct rate); its
//! *counted* speedup is the one fast_p and the geomean take ([`counted_speedup`]: strict mode leaves
//! out an excessive speedup that re-timing did not confirm). A credited result *no longer stands*
//! when the candidate is no longer correct, its speedup no longer counts, or its counted speedup
//! fell beyond noise: those are the changes that fail a recheck ([`Change::loses_credit`]).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::machine::TaskTurns;
use crate::metrics::extra::{ExtraFastP, beyond_kernelbench};
use crate::metrics::{FAST_P_THRESHOLDS, RunInput, counted_speedup, fast_p_at, run_metrics};
use crate::types::{
    CompileStatus, ExecOutcome, Finding, MethodKind, ProblemKey, Severity, TaskId, TimingStats,
    TurnRecord, Verdict,
};

/// How a candidate's standing changed. A candidate can have several (a lower speedup and a new
/// warning).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Correct before, not correct now.
    NoLongerCredited,
    /// Correct both times; its speedup counted before and does not now (strict mode's unverified
    /// excessive speedup).
    SpeedupNoLongerCounted,
    /// Counted both times, lower now beyond noise.
    SpeedupLower,
    /// Not correct before, correct now.
    NewlyCredited,
    /// Correct both times; its speedup counts now and did not before.
    SpeedupNowCounted,
    /// Counted both times, higher now beyond noise.
    SpeedupHigher,
    /// Not correct either time, with another verdict (`compile_error` then, `rejected` now).
    VerdictChanged,
    /// Integrity findings appeared or went (by category and severity).
    FindingsChanged,
}

impl Change {
    /// A credited result that no longer stands: what makes `recheck` exit with status 1.
    pub fn loses_credit(self) -> bool {
        matches!(
            self,
            Change::NoLongerCredited | Change::SpeedupNoLongerCounted | Change::SpeedupLower
        )
    }

    pub fn label(self) -> &'static str {
        match self {
            Change::NoLongerCredited => "no longer credited",
            Change::SpeedupNoLongerCounted => "speedup no longer counted",
            Change::SpeedupLower => "speedup lower beyond noise",
            Change::NewlyCredited => "newly credited",
            Change::SpeedupNowCounted => "speedup now counted",
            Change::SpeedupHigher => "speedup higher beyond noise",
            Change::VerdictChanged => "verdict changed",
            Change::FindingsChanged => "findings changed",
        }
    }
}

/// What a result shows of a candidate: its verdict, its speedups, its integrity findings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Standing {
    pub verdict: Verdict,
    /// The measured speedup of a correct candidate.
    pub speedup: Option<f64>,
    /// The speedup fast_p and the geomean count (`None` where strict mode left it out).
    pub counted_speedup: Option<f64>,
    /// Static (compile) and runtime findings, in that order.
    pub findings: Vec<Finding>,
    /// Why a candidate that is not correct failed, in a line (`forged_result: ...`).
    pub reason: Option<String>,
    /// The device name that measured it (`cpu`, `NVIDIA H100 80GB HBM3`), where it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// `faithful` or `strict`, where it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

impl Standing {
    /// The standing a finished turn shows; `None` for a turn without a verdict.
    pub fn of(r: &TurnRecord) -> Option<Standing> {
        let verdict = r.verdict?;
        let mut findings = r
            .compile
            .as_ref()
            .map(|c| c.findings.clone())
            .unwrap_or_default();
        if let Some(e) = &r.exec {
            findings.extend(e.findings.iter().cloned());
        }
        let device = r.exec.as_ref().and_then(|e| {
            [&e.env.device_name, &e.device]
                .into_iter()
                .find(|s| !s.is_empty())
                .cloned()
        });
        Some(Standing {
            verdict,
            speedup: r.correct_speedup(),
            counted_speedup: counted_speedup(r),
            findings,
            reason: (verdict != Verdict::Correct).then(|| reason(r)).flatten(),
            device,
            mode: r.exec.as_ref().and_then(|e| e.env.mode.clone()),
        })
    }

    pub fn credited(&self) -> bool {
        self.verdict == Verdict::Correct
    }
}

/// Each category's strongest finding (whether it is an error, and the first finding of that
/// severity): what two results' findings are compared by.
fn strongest(findings: &[Finding]) -> BTreeMap<&str, (bool, &Finding)> {
    let mut out: BTreeMap<&str, (bool, &Finding)> = BTreeMap::new();
    for f in findings {
        let error = f.severity == Severity::Error;
        match out.get(f.category.as_str()) {
            Some((seen, _)) if *seen || !error => {}
            _ => {
                out.insert(&f.category, (error, f));
            }
        }
    }
    out
}

/// Why a turn that is not correct failed, in one line: the runtime's own name for the problem
/// (`forged_result`, `Output mismatch`), else the compiler's, else the first finding that is an error.
fn reason(r: &TurnRecord) -> Option<String> {
    let line = |s: &str| {
        let first = s
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        let cut: String = first.chars().take(160).collect();
        if cut.len() < first.len() {
            format!("{cut}...")
        } else {
            cut
        }
    };
    let error_finding = || {
        let c = r.compile.iter().flat_map(|c| &c.findings);
        let e = r.exec.iter().flat_map(|e| &e.findings);
        c.chain(e)
            .find(|f| f.severity == Severity::Error)
            .map(|f| format!("{}: {}", f.category, line(&f.message)))
    };
    if let Some(e) = &r.exec {
        let text = |k: &str| e.metadata.get(k).and_then(|v| v.as_str());
        let named = text("correctness_issue_name");
        let issue = text("correctness_issue");
        let detail = ["runtime_error", "error", "cuda_error", "compilation_error"]
            .iter()
            .find_map(|k| text(k));
        return match (named, issue, detail) {
            (Some(n), Some(i), _) if n != i => Some(format!("{n}: {}", line(i))),
            (Some(n), _, _) => Some(n.to_string()),
            (None, Some(i), _) => Some(line(i)),
            (None, None, Some(d)) => Some(line(d)),
            (None, None, None) => error_finding().or_else(|| Some(line(&e.feedback))),
        }
        .filter(|s| !s.is_empty());
    }
    let c = r.compile.as_ref()?;
    if c.status == CompileStatus::Rejected {
        return error_finding().or_else(|| Some("rejected by a static check".into()));
    }
    let text = c.error.as_deref().map(line).unwrap_or_default();
    Some(match &c.error_name {
        Some(n) if text.is_empty() => n.clone(),
        Some(n) => format!("{n}: {text}"),
        None if text.is_empty() => return None,
        None => text,
    })
}

/// One candidate of the run and what its recheck showed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rechecked {
    /// `level/id`.
    pub problem: ProblemKey,
    /// The problem's file name (`19_ReLU.py`), where the run recorded it.
    pub name: Option<String>,
    pub sample: u32,
    pub turn: u32,
    /// The sample of the recheck run that evaluated it (turn 1); `None` when it was not rechecked.
    pub recheck_sample: Option<u32>,
    pub old: Standing,
    /// `None`: not rechecked (its code is missing, or the recheck gave it no verdict; `notes` says).
    pub new: Option<Standing>,
    pub changes: Vec<Change>,
    /// Findings of a category the recorded result had not, or had only as a warning and the
    /// recheck has as an error (one per category).
    pub new_findings: Vec<Finding>,
    /// Findings of a category the recheck has not, or has only as a warning where the recorded
    /// result had an error (one per category).
    pub gone_findings: Vec<Finding>,
    /// Half-width of the band within which two counted speedups are the same (a fraction:
    /// `0.05` = ±5 %), where both counted.
    pub noise_band: Option<f64>,
    pub notes: Vec<String>,
}

impl Rechecked {
    pub fn task(&self) -> TaskId {
        TaskId {
            problem: self.problem,
            sample: self.sample,
        }
    }

    pub fn loses_credit(&self) -> bool {
        self.changes.iter().any(|c| c.loses_credit())
    }
}

/// Compare a recorded standing with its recheck: the changes, the findings that came and went,
/// and the noise band used. `tolerance` is the smallest band (a fraction).
pub fn compare(
    old: &Standing,
    old_exec: Option<&ExecOutcome>,
    new: &Standing,
    new_exec: Option<&ExecOutcome>,
    tolerance: f64,
) -> (Vec<Change>, Vec<Finding>, Vec<Finding>, Option<f64>) {
    let mut changes = Vec::new();
    let mut band = None;
    match (old.credited(), new.credited()) {
        (true, false) => changes.push(Change::NoLongerCredited),
        (false, true) => changes.push(Change::NewlyCredited),
        (false, false) if old.verdict != new.verdict => changes.push(Change::VerdictChanged),
        (false, false) => {}
        (true, true) => match (old.counted_speedup, new.counted_speedup) {
            (Some(_), None) => changes.push(Change::SpeedupNoLongerCounted),
            (None, Some(_)) => changes.push(Change::SpeedupNowCounted),
            (None, None) => {}
            (Some(a), Some(b)) => {
                let half = noise_band(old_exec, new_exec, tolerance);
                band = Some(half.exp_m1());
                if a > 0.0 && b > 0.0 {
                    let shift = (b / a).ln();
                    if shift < -half {
                        changes.push(Change::SpeedupLower);
                    } else if shift > half {
                        changes.push(Change::SpeedupHigher);
                    }
                }
            }
        },
    }
    let (before, after) = (strongest(&old.findings), strongest(&new.findings));
    // A category that appears, or turns from a warning into an error, is new; one that goes, or
    // turns from an error into a warning, is gone.
    let stronger = |a: &BTreeMap<&str, (bool, &Finding)>, b: &BTreeMap<&str, (bool, &Finding)>| {
        a.iter()
            .filter(|(cat, (error, _))| b.get(*cat).is_none_or(|(other, _)| *error && !other))
            .map(|(_, (_, f))| (*f).clone())
            .collect::<Vec<Finding>>()
    };
    let new_findings = stronger(&after, &before);
    let gone_findings = stronger(&before, &after);
    if !new_findings.is_empty() || !gone_findings.is_empty() {
        changes.push(Change::FindingsChanged);
    }
    (changes, new_findings, gone_findings, band)
}

/// Half-width, in natural log, of the band within which two speedups are the same: the larger of
/// `ln(1 + tolerance)` and two standard errors of the log of their ratio, each speedup's from the
/// spread of its own timed trials (candidate and reference: `std / mean / sqrt(trials)`).
pub fn noise_band(old: Option<&ExecOutcome>, new: Option<&ExecOutcome>, tolerance: f64) -> f64 {
    let rel = |s: Option<&TimingStats>| match s {
        Some(s) if s.mean > 0.0 && s.num_trials > 0 && s.std.is_finite() => {
            let r = s.std / s.mean / f64::from(s.num_trials).sqrt();
            r * r
        }
        _ => 0.0,
    };
    let var = |e: Option<&ExecOutcome>| {
        e.map_or(0.0, |e| {
            rel(e.runtime_stats.as_ref()) + rel(e.ref_runtime_stats.as_ref())
        })
    };
    let se = (var(old) + var(new)).sqrt();
    tolerance.ln_1p().max(2.0 * se)
}

/// The counts of a recheck.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Counts {
    /// Candidates the recheck took (with `--candidates correct`, the correct ones).
    pub selected: usize,
    /// Those that got a verdict from the recheck.
    pub rechecked: usize,
    /// Rechecked with no change at all.
    pub unchanged: usize,
    pub no_longer_credited: usize,
    pub newly_credited: usize,
    pub speedup_no_longer_counted: usize,
    pub speedup_now_counted: usize,
    pub speedup_lower: usize,
    pub speedup_higher: usize,
    pub verdict_changed: usize,
    pub findings_changed: usize,
    /// Candidates whose credited result no longer stands (any of the three changes that lose it).
    pub credit_lost: usize,
    /// Selected but not rechecked: code missing, or no verdict from the recheck.
    pub not_rechecked: usize,
}

impl Counts {
    pub fn of(results: &[Rechecked]) -> Counts {
        let mut c = Counts {
            selected: results.len(),
            ..Counts::default()
        };
        for r in results {
            if r.new.is_none() {
                c.not_rechecked += 1;
                continue;
            }
            c.rechecked += 1;
            if r.changes.is_empty() {
                c.unchanged += 1;
            }
            if r.loses_credit() {
                c.credit_lost += 1;
            }
            for change in &r.changes {
                *match change {
                    Change::NoLongerCredited => &mut c.no_longer_credited,
                    Change::NewlyCredited => &mut c.newly_credited,
                    Change::SpeedupNoLongerCounted => &mut c.speedup_no_longer_counted,
                    Change::SpeedupNowCounted => &mut c.speedup_now_counted,
                    Change::SpeedupLower => &mut c.speedup_lower,
                    Change::SpeedupHigher => &mut c.speedup_higher,
                    Change::VerdictChanged => &mut c.verdict_changed,
                    Change::FindingsChanged => &mut c.findings_changed,
                } += 1;
            }
        }
        c
    }
}

/// The run's headline numbers: fast_p over all its candidates (KernelBench's thresholds and the
/// run's `report.fast_p`), the geomean of the best counted speedups, correct and timed problems.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Headline {
    #[serde(serialize_with = "fast_p_map")]
    pub fast_p: (Vec<f64>, Vec<f64>),
    pub geomean_speedup: Option<f64>,
    pub correct: usize,
    pub timed: usize,
    pub problems: usize,
}

fn fast_p_map<S: serde::Serializer>(v: &(Vec<f64>, Vec<f64>), s: S) -> Result<S::Ok, S::Error> {
    ExtraFastP(&v.0, &v.1).serialize(s)
}

/// The shape of a run that fast_p is computed over.
#[derive(Debug, Clone, Copy)]
pub struct Shape<'a> {
    pub method: MethodKind,
    pub axis: u32,
    pub problems: &'a [ProblemKey],
    /// The run's `report.fast_p` (thresholds beyond KernelBench's are added to its six).
    pub extra: &'a [f64],
}

/// [`Headline`] of `turns` in the run's shape.
pub fn headline(shape: &Shape<'_>, turns: &TaskTurns) -> Headline {
    let input = RunInput {
        method: shape.method,
        axis: shape.axis,
        problems: shape.problems,
        turns,
    };
    let mut thresholds = FAST_P_THRESHOLDS.to_vec();
    thresholds.extend(beyond_kernelbench(shape.extra));
    let values = fast_p_at(&input, &thresholds);
    let metrics = run_metrics(&input);
    let last = metrics
        .last()
        .map(|s| s.summary.clone())
        .unwrap_or_default();
    Headline {
        fast_p: (thresholds, values),
        geomean_speedup: last.geomean_speedup,
        correct: last.correct,
        timed: last.timed,
        problems: metrics.problems.len(),
    }
}

/// The run's turns with each rechecked candidate's result in place of the recorded one (`new`:
/// the recheck's turn record of (task, turn)).
pub fn replaced<'a>(
    turns: &TaskTurns,
    new: impl IntoIterator<Item = (TaskId, u32, &'a TurnRecord)>,
) -> TaskTurns {
    let mut out = turns.clone();
    for (task, turn, record) in new {
        let Some(r) = out
            .get_mut(&task)
            .and_then(|list| list.iter_mut().find(|r| r.turn == turn))
        else {
            continue;
        };
        r.verdict = record.verdict;
        r.compile = record.compile.clone();
        r.exec = record.exec.clone();
        r.profile = record.profile.clone();
    }
    out
}

#[cfg(test)]
mod tests;
