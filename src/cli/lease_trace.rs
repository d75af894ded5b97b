//! The lease trace read back (`eval.lease_trace`, README "Where a lease goes"): the harness's one line
//! per job in a run's worker logs (`krefine harness: lease trace at=... <kind> <build> <status>
//! total=... | <phases> | <steps>`), summed per pass for `krefine bench throughput`. A diagnosis, not a
//! figure: candidates' prints go to the same logs, so a line can be forged by a candidate.

use std::collections::BTreeMap;
use std::path::Path;

/// What marks a trace line in a worker log.
const MARKER: &str = "krefine harness: lease trace ";
/// The rows of the table, in this order (others the harness may add come after, by name).
const ORDER: [&str; 20] = [
    "total",
    "take",
    "warm_spares",
    "between",
    "before_timing",
    "ask_trial",
    "ask_verify",
    "ask_timing_inputs",
    "fresh_probe",
    "escape_probe",
    "precision_probe",
    "retire",
    "process",
    "load_s",
    "reference_s",
    "correctness_s",
    "timing_s",
    "ref_timing_s",
    "isolation_s",
    "spawn_wait_s",
];

/// The traced jobs of one run by kind (`evaluate`, and the reference's own timing and re-timings in a
/// process: `reference`, `retime`), and their seconds summed by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct TraceSum {
    pub jobs: BTreeMap<String, u32>,
    pub seconds: BTreeMap<String, f64>,
}

impl TraceSum {
    fn total_jobs(&self) -> u32 {
        self.jobs.values().sum()
    }

    /// One trace line's figures. A `tail` line (what the worker did for an evaluation after its
    /// job: the reference's timing, memory given back, spares, the response) is no job of its own:
    /// its figures are `tail_*`, its total `tail_total`.
    fn add(&mut self, kind: &str, figures: Vec<(String, f64)>) {
        let tail = kind == TAIL;
        if !tail {
            *self.jobs.entry(kind.to_string()).or_insert(0) += 1;
        }
        for (name, seconds) in figures {
            let name = if tail && name == "total" {
                "tail_total".to_string()
            } else {
                name
            };
            *self.seconds.entry(name).or_insert(0.0) += seconds;
        }
    }
}

/// The kind of the line that follows an evaluation's trace line (kb_eval.py `_trace_tail`).
const TAIL: &str = "tail";

/// A trace line's job kind and `name=seconds` figures, or None for any other line (and for a trace
/// line that does not read whole: no kind, a name that is not lower-case words, a figure that is not
/// a finite, non-negative number).
pub(super) fn parse_line(line: &str) -> Option<(String, Vec<(String, f64)>)> {
    let rest = &line[line.find(MARKER)? + MARKER.len()..];
    let mut kind = None;
    let mut figures = Vec::new();
    for token in rest.split_whitespace() {
        let Some((name, value)) = token.split_once('=') else {
            // The kind first, then the build folder, the status, the `|` separators.
            kind = kind.or(Some(token));
            continue;
        };
        if name == "at" {
            continue;
        }
        let named = !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
        let seconds: f64 = value.parse().ok()?;
        if !named || !seconds.is_finite() || seconds < 0.0 {
            return None;
        }
        figures.push((name.to_string(), seconds));
    }
    let kind = kind.filter(|k| k.bytes().all(|b| b.is_ascii_lowercase()))?;
    figures
        .iter()
        .any(|(n, _)| n == "total")
        .then(|| (kind.to_string(), figures))
}

/// The trace lines of the GPU and CPU workers' logs in `dir` (`<run>/logs/workers`), summed; an
/// unreadable log counts as none.
pub(super) fn sum_logs(dir: &Path) -> TraceSum {
    let mut sum = TraceSum::default();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return sum;
    };
    let mut logs: Vec<_> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| {
                (n.starts_with("gpu-") || n.starts_with("cpu-"))
                    && (n.ends_with(".log") || n.ends_with(".log.1"))
            })
        })
        .collect();
    logs.sort();
    for log in logs {
        let Ok(bytes) = std::fs::read(&log) else {
            continue;
        };
        for line in String::from_utf8_lossy(&bytes).lines() {
            if let Some((kind, figures)) = parse_line(line) {
                sum.add(&kind, figures);
            }
        }
    }
    sum
}

/// The passes' sums side by side (seconds over all traced jobs), or nothing when no pass was traced.
pub(super) fn render(passes: &[(&str, &TraceSum)]) -> String {
    if passes.iter().all(|(_, s)| s.total_jobs() == 0) {
        return String::new();
    }
    let mut names: Vec<&str> = ORDER
        .iter()
        .copied()
        .filter(|n| passes.iter().any(|(_, s)| s.seconds.contains_key(*n)))
        .collect();
    for (_, s) in passes {
        for name in s.seconds.keys() {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
    }
    let mut text = format!(
        "\nwhere the leases went (the workers' lease trace, s summed):\n{:<32}",
        ""
    );
    for (pass, _) in passes {
        text.push_str(&format!("{pass:>14}"));
    }
    text.push_str(&format!("\n{:<32}", "jobs traced"));
    for (_, s) in passes {
        text.push_str(&format!("{:>14}", s.total_jobs()));
    }
    let mut kinds: Vec<&String> = passes.iter().flat_map(|(_, s)| s.jobs.keys()).collect();
    kinds.sort();
    kinds.dedup();
    for kind in kinds {
        text.push_str(&format!("\n{:<32}", format!("  {kind} jobs")));
        for (_, s) in passes {
            text.push_str(&format!("{:>14}", s.jobs.get(kind).copied().unwrap_or(0)));
        }
    }
    for name in names {
        text.push_str(&format!("\n{name:<32}"));
        for (_, s) in passes {
            match s.seconds.get(name) {
                Some(v) => text.push_str(&format!("{v:>14.1}")),
                None => text.push_str(&format!("{:>14}", "-")),
            }
        }
    }
    text.push_str(
        "\nThe worker's steps overlap (`process`: waiting for the candidate's process, inside any \
         step); phases (`*_s`) as in eval_results.json. README, \"Where a lease goes\".\n",
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LINE: &str = "krefine harness: lease trace at=1795879981.856 evaluate c9644d6afd2fc832 \
        correct total=2.471 | correctness_s=0.314 isolation_s=0.346 load_s=0.068 | ask_trial=0.009 \
        precision_probe=0.039 process=1.754 take=0.615";

    #[test]
    fn a_trace_line_reads_as_its_figures_and_other_lines_as_none() {
        let (kind, figures) = parse_line(LINE).unwrap();
        assert_eq!(kind, "evaluate");
        assert_eq!(figures.len(), 8);
        assert_eq!(figures[0], ("total".to_string(), 2.471));
        assert!(figures.contains(&("precision_probe".to_string(), 0.039)));
        assert_eq!(
            parse_line("krefine harness: building the shared precompiled header"),
            None
        );
        assert_eq!(parse_line("Traceback (most recent call last):"), None);
        assert_eq!(parse_line(&LINE.replace("take=0.615", "take=nan")), None);
        assert_eq!(parse_line(&LINE.replace("take=0.615", "take=-1")), None);
        assert_eq!(parse_line(&LINE.replace("take=0.615", "Take=1")), None);
        assert_eq!(parse_line(&LINE.replace("total=2.471", "")), None);
        let reference = LINE.replace(" evaluate ", " reference ");
        assert_eq!(parse_line(&reference).unwrap().0, "reference");
    }

    #[test]
    fn the_logs_of_a_run_sum_by_name_and_render_side_by_side() {
        let dir = tempfile::tempdir().unwrap();
        let line = |total: f64| LINE.replace("total=2.471", &format!("total={total}"));
        let tail = "krefine harness: lease trace at=1795879982.000 tail c9644d6afd2fc832 - \
            total=0.250 | tail_release=0.125 tail_response=0.125";
        let gpu = format!(
            "===== krefine: starting worker gpu-0 =====\n{}\n{tail}\nnoise\n{}\n{tail}\n",
            line(1.0),
            line(2.0)
        );
        std::fs::write(dir.path().join("gpu-0.log"), gpu).unwrap();
        std::fs::write(
            dir.path().join("gpu-1.log"),
            line(4.0).replace(" evaluate ", " reference "),
        )
        .unwrap();
        // A compile worker's log is not read (it evaluates nothing).
        std::fs::write(dir.path().join("compile-0.log"), line(100.0)).unwrap();
        let sum = sum_logs(dir.path());
        assert_eq!(sum.total_jobs(), 3);
        assert_eq!((sum.jobs["evaluate"], sum.jobs["reference"]), (2, 1));
        assert_eq!(
            sum.seconds["total"], 7.0,
            "an evaluation's tail is no job of its own"
        );
        assert_eq!(sum.seconds["tail_total"], 0.5);
        assert_eq!(sum.seconds["tail_release"], 0.25);
        assert!((sum.seconds["take"] - 3.0 * 0.615).abs() < 1e-9);
        let empty = TraceSum::default();
        let text = render(&[("cold", &sum), ("warm", &empty)]);
        assert!(text.contains("jobs traced"), "{text}");
        let evaluate = text
            .lines()
            .find(|l| l.trim_start().starts_with("evaluate jobs"))
            .unwrap();
        assert!(evaluate.contains('2'), "{evaluate}");
        let total = text.lines().find(|l| l.starts_with("total")).unwrap();
        assert!(
            total.contains("7.0") && total.trim_end().ends_with('-'),
            "{total}"
        );
        assert_eq!(render(&[("cold", &empty)]), "");
        assert_eq!(sum_logs(&dir.path().join("missing")), TraceSum::default());
    }

    proptest! {
        #[test]
        fn any_line_reads_as_none_or_as_named_finite_figures(line in ".{0,200}") {
            for candidate in [line.clone(), format!("{MARKER}{line} total=1")] {
                if let Some((kind, figures)) = parse_line(&candidate) {
                    prop_assert!(!kind.is_empty());
                    for (name, seconds) in figures {
                        prop_assert!(!name.is_empty() && name != "at");
                        prop_assert!(seconds.is_finite() && seconds >= 0.0);
                    }
                }
            }
        }
    }
}
