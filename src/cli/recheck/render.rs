//! A recheck's result as one document ([`Document`]: `--format json`) and as text.

use std::fmt::Write;

use serde::Serialize;

use super::compare::{Change, Counts, Headline, Rechecked, Standing};
use super::select::Which;
use crate::metrics::extra::threshold_label;
use crate::types::{Finding, MethodKind, Severity};

/// Exit status when a credited result no longer stands.
pub const EXIT_CREDIT_LOST: u8 = 1;
/// Exit status when some candidate could not be rechecked (and none lost its credit).
pub const EXIT_NOT_RECHECKED: u8 = 2;

/// The settings a run was evaluated with, then or now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Setting {
    /// `0.1.0 (85fd048)`; `None` where the run recorded no provenance.
    pub krefine: Option<String>,
    /// `eval.mode`.
    pub mode: Option<String>,
    /// Devices that measured the candidates (`cpu`, `NVIDIA H100 80GB HBM3`).
    pub devices: Vec<String>,
}

/// The fast_p of the run before and after.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FastPChange {
    /// `turns`, `samples` or `one_shot`: the axis of the run's curve (fast_p is over all of it).
    pub axis: &'static str,
    pub before: Headline,
    pub after: Headline,
}

/// Everything a recheck found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Document {
    /// The run rechecked.
    pub run: String,
    /// The recheck's own run directory; `None` when nothing was evaluated.
    pub recheck_run: Option<String>,
    pub candidates: Which,
    /// `--set` assignments, as given.
    pub sets: Vec<String>,
    /// The smallest half-width of the speedup noise band (`--speedup-tolerance`).
    pub speedup_tolerance: f64,
    pub then: Setting,
    pub now: Setting,
    /// Run-level notes (problems that changed since the run, a torn log, other hardware, ...).
    pub notes: Vec<String>,
    /// Every candidate taken, changed or not, in (problem, sample, turn) order.
    pub results: Vec<Rechecked>,
    pub summary: Counts,
    pub fast_p: FastPChange,
    /// 0: no credited result changed for the worse; 1: some credited result no longer stands;
    /// 2: some candidate could not be rechecked.
    pub exit_status: u8,
}

impl Document {
    /// The exit status the counts give.
    pub fn status_of(summary: &Counts) -> u8 {
        if summary.credit_lost > 0 {
            EXIT_CREDIT_LOST
        } else if summary.not_rechecked > 0 {
            EXIT_NOT_RECHECKED
        } else {
            0
        }
    }
}

pub fn axis_of(method: MethodKind) -> &'static str {
    match method {
        MethodKind::Refine => "turns",
        MethodKind::Sampling => "samples",
        MethodKind::OneShot => "one_shot",
    }
}

fn speedup(s: Option<f64>) -> String {
    match s {
        Some(s) => format!("x{s:.3}"),
        None => "-".into(),
    }
}

/// `correct x1.234`, `correct x9.000 (not counted)`, `rejected`.
fn standing(s: &Standing) -> String {
    let mut out = s.verdict.to_string();
    if s.speedup.is_some() {
        out.push(' ');
        out.push_str(&speedup(s.speedup));
        if s.counted_speedup.is_none() {
            out.push_str(" (not counted)");
        }
    }
    out
}

fn finding(f: &Finding) -> String {
    let severity = match f.severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    };
    let at = f.line.map(|l| format!(", line {l}")).unwrap_or_default();
    let message = f.message.lines().next().unwrap_or("");
    format!("{} ({severity}{at}): {message}", f.category)
}

fn who(r: &Rechecked) -> String {
    let name = r
        .name
        .as_deref()
        .map(|n| format!(" ({n})"))
        .unwrap_or_default();
    format!(
        "level {} problem {}{name}, sample {} turn {}",
        r.problem.level, r.problem.problem_id, r.sample, r.turn
    )
}

fn setting(s: &Setting) -> String {
    let krefine = s.krefine.as_deref().unwrap_or("unknown");
    let mode = s.mode.as_deref().unwrap_or("-");
    let devices = if s.devices.is_empty() {
        "-".to_string()
    } else {
        s.devices.join(", ")
    };
    format!("krefine {krefine}, eval.mode {mode}, on {devices}")
}

fn share(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// The document as text: what changed per candidate, notes, the counts, fast_p before and after,
/// and what the exit status says.
pub fn text(d: &Document) -> String {
    let mut o = String::new();
    header(&mut o, d);
    let changed: Vec<&Rechecked> = d.results.iter().filter(|r| !r.changes.is_empty()).collect();
    if !changed.is_empty() {
        let _ = writeln!(o, "\nchanged:");
        for r in changed {
            candidate(&mut o, r);
        }
    }
    let notes: Vec<String> = d
        .notes
        .iter()
        .cloned()
        .chain(
            d.results
                .iter()
                .flat_map(|r| r.notes.iter().map(move |n| format!("{}: {n}", who(r)))),
        )
        .collect();
    if !notes.is_empty() {
        let _ = writeln!(o, "\nnotes:");
        for n in notes {
            let _ = writeln!(o, "  {n}");
        }
    }
    summary(&mut o, &d.summary);
    fast_p(&mut o, &d.fast_p);
    let c = &d.summary;
    let _ = write!(
        o,
        "\n{}",
        match d.exit_status {
            EXIT_CREDIT_LOST => format!(
                "{} credited result(s) no longer stand (exit status 1)",
                c.credit_lost
            ),
            EXIT_NOT_RECHECKED => format!(
                "{} candidate(s) could not be rechecked (exit status 2; see notes)",
                c.not_rechecked
            ),
            _ => "every credited result stands (exit status 0)".to_string(),
        }
    );
    o
}

/// The run, the settings then and now, what was taken and where the recheck went.
fn header(o: &mut String, d: &Document) {
    let _ = writeln!(o, "recheck of {}", d.run);
    let _ = writeln!(o, "  then: {}", setting(&d.then));
    let sets: Vec<String> = d.sets.iter().map(|s| format!("--set {s}")).collect();
    let sets = if sets.is_empty() {
        String::new()
    } else {
        format!(" ({})", sets.join(" "))
    };
    let _ = writeln!(o, "  now:  {}{sets}", setting(&d.now));
    let which = match d.candidates {
        Which::Correct => "the correct ones",
        Which::All => "all with a verdict",
    };
    let _ = writeln!(o, "  candidates: {which} ({} taken)", d.summary.selected);
    if let Some(dir) = &d.recheck_run {
        let _ = writeln!(o, "  recheck run: {dir}");
    }
}

/// One changed candidate: old and new standing, what changed, why it fails now, findings.
fn candidate(o: &mut String, r: &Rechecked) {
    let Some(new) = &r.new else { return };
    let labels: Vec<&str> = r.changes.iter().map(|c| c.label()).collect();
    let _ = writeln!(
        o,
        "  {}: {} -> {}: {}",
        who(r),
        standing(&r.old),
        standing(new),
        labels.join(", ")
    );
    let moved = [Change::SpeedupLower, Change::SpeedupHigher];
    if let Some(band) = r.noise_band
        && r.changes.iter().any(|c| moved.contains(c))
    {
        let _ = writeln!(o, "      noise band: ±{:.1}%", band * 100.0);
    }
    // The reason, unless a new finding already says it.
    if let Some(reason) = new
        .reason
        .as_deref()
        .filter(|_| new.verdict != r.old.verdict)
        && !r
            .new_findings
            .iter()
            .any(|f| reason.starts_with(&format!("{}: ", f.category)))
    {
        let _ = writeln!(o, "      why: {reason}");
    }
    let had = |s: &Standing, f: &Finding| s.findings.iter().any(|g| g.category == f.category);
    for f in &r.new_findings {
        let was = if had(&r.old, f) {
            ", a warning before"
        } else {
            ""
        };
        let _ = writeln!(o, "      new finding{was}: {}", finding(f));
    }
    for f in &r.gone_findings {
        let now = if had(new, f) { " (a warning now)" } else { "" };
        let _ = writeln!(o, "      finding gone{now}: {}", finding(f));
    }
}

fn summary(o: &mut String, c: &Counts) {
    let not = if c.not_rechecked > 0 {
        format!(", {} not rechecked", c.not_rechecked)
    } else {
        String::new()
    };
    let _ = writeln!(
        o,
        "\nsummary: {} rechecked, {} unchanged, {} no longer credited, {} newly credited, {} speedup changed beyond noise ({} lower), {} speedup no longer counted, {} with findings changed{not}",
        c.rechecked,
        c.unchanged,
        c.no_longer_credited,
        c.newly_credited,
        c.speedup_lower + c.speedup_higher,
        c.speedup_lower,
        c.speedup_no_longer_counted,
        c.findings_changed,
    );
}

/// fast_p at each threshold, the geomean and the correct problems, before and after.
fn fast_p(o: &mut String, f: &FastPChange) {
    let (b, a) = (&f.before, &f.after);
    let axis = match f.axis {
        "one_shot" => "candidates",
        axis => axis,
    };
    let _ = writeln!(
        o,
        "\nfast_p of the run ({} problem(s), all its {axis}):",
        b.problems
    );
    let row = |o: &mut String, label: &str, before: String, after: String| {
        let _ = writeln!(o, "  {label:<10} {before:>8} {after:>8}");
    };
    row(o, "", "before".into(), "after".into());
    for ((p, before), after) in b.fast_p.0.iter().zip(&b.fast_p.1).zip(&a.fast_p.1) {
        let label = format!("fast_{}", threshold_label(*p));
        row(o, &label, share(*before), share(*after));
    }
    let geo = |g: Option<f64>| g.map_or("-".into(), |g| format!("{g:.3}"));
    row(o, "geomean", geo(b.geomean_speedup), geo(a.geomean_speedup));
    row(o, "correct", b.correct.to_string(), a.correct.to_string());
}
