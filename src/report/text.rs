//! The text and Markdown reports: one table per run, then pass@k and the ledger totals.
//!
//! Rates (fast_p, correct, compiled, pass@k) are percentages with one decimal, the geomean has three
//! decimals, USD four (a cheap model's turn costs fractions of a cent), times are seconds with one
//! decimal. Numbers that do not exist (no timed correct candidate, no priced answer) print as `-`.

use std::fmt::Write as _;

use crate::metrics::extra::threshold_label;
use crate::metrics::{FAST_P_LABELS, Ledger, Spend};

use crate::types::MethodKind;

use super::{Row, RunReport, integrity_lines, rows};

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn usd(s: &Spend) -> String {
    if s.priced() {
        format!("{:.4}", s.cost_usd)
    } else {
        "-".to_string()
    }
}

fn secs(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn header(r: &RunReport) -> Vec<String> {
    let first = match r.method {
        MethodKind::Sampling => "samples",
        MethodKind::Refine | MethodKind::OneShot => "turn",
    };
    let mut h = vec![first.to_string()];
    h.extend(FAST_P_LABELS.iter().map(|l| format!("fast_{l}")));
    h.extend(
        r.extra
            .thresholds
            .iter()
            .map(|&p| format!("fast_{}", threshold_label(p))),
    );
    h.push("geomean".to_string());
    if r.extra.has_sol() {
        h.push("SOL (n)".to_string());
    }
    h.extend(
        ["correct", "compiled", "tokens", "USD"]
            .iter()
            .map(|s| s.to_string()),
    );
    h
}

fn cells(r: &RunReport, row: &Row<'_>) -> Vec<String> {
    let s = &row.step.summary;
    let extra = r.extra.steps.get(row.step.n as usize - 1);
    let mut c = vec![row.step.n.to_string()];
    c.extend(s.fast_p.0.iter().map(|&x| pct(x)));
    if let Some(e) = extra {
        c.extend(e.fast_p.iter().map(|&x| pct(x)));
    }
    c.push(s.geomean_speedup.map_or("-".into(), |g| format!("{g:.3}")));
    if r.extra.has_sol() {
        c.push(extra.and_then(|e| e.sol_mean).map_or("-".into(), |m| {
            format!("{} ({})", pct(m), extra.map_or(0, |e| e.sol_candidates))
        }));
    }
    c.push(pct(s.correct_rate));
    c.push(pct(s.compiled_rate));
    c.push(row.spend.tokens().to_string());
    c.push(usd(&row.spend));
    c
}

fn title(r: &RunReport) -> String {
    let mut parts = vec![r.method.to_string()];
    if let Some(f) = r.feedback {
        parts.push(format!("feedback {f}"));
    }
    if !r.model.is_empty() {
        parts.push(format!("model {}", r.model));
    }
    parts.push(plural(
        r.metrics.problems.len() as u64,
        "problem",
        "problems",
    ));
    parts.push(if r.complete { "complete" } else { "incomplete" }.to_string());
    parts.join(", ")
}

fn pass_at_k_line(r: &RunReport) -> Option<String> {
    if r.metrics.pass_at_k.is_empty() {
        return None;
    }
    let parts: Vec<String> = r
        .metrics
        .pass_at_k
        .iter()
        .map(|p| format!("pass@{} {}", p.k, pct(p.value)))
        .collect();
    Some(parts.join(", "))
}

/// The ledger totals as (label, value) lines.
fn totals(l: &Ledger, served: Option<u64>) -> Vec<(&'static str, String)> {
    let t = &l.total;
    let mut tokens = format!(
        "{} (prompt {}, completion {}, reasoning {})",
        t.tokens(),
        t.prompt_tokens,
        t.completion_tokens,
        t.reasoning_tokens
    );
    if t.answers_without_usage > 0 {
        let _ = write!(
            tokens,
            "; {} of {} answers without usage",
            t.answers_without_usage, t.answers
        );
    }
    let mut cost = usd(t);
    if t.answers_without_cost > 0 {
        let _ = write!(
            cost,
            " ({} of {} answers without a cost)",
            t.answers_without_cost, t.answers
        );
    }
    let llm = format!(
        "{}; {} ({}, {} failed); {}",
        plural(t.answers, "answer", "answers"),
        plural(l.llm_attempts, "attempt", "attempts"),
        plural(l.llm_retries, "retry", "retries"),
        l.llm_failed_attempts,
        plural(l.llm_failures, "request given up", "requests given up"),
    );
    // Served generations (`krefine eval`) called no model: say so rather than print zeros.
    let (tokens, cost, llm) = match served {
        Some(n) => (
            "none (no model called)".to_string(),
            "none (no model called)".to_string(),
            format!(
                "none ({} served, no model called)",
                plural(n, "generation", "generations")
            ),
        ),
        None => (tokens, cost, llm),
    };
    let mut devices = device_use(&l.device_total);
    if l.gpu_work_ms > 0 {
        let d = &l.device_total;
        // Work, not leases: the timed trials as measured (a lower bound).
        let _ = write!(devices, ", GPU work {} timed", secs(l.gpu_work_ms));
        if d.held_ms > 0 {
            let _ = write!(
                devices,
                " ({} of held)",
                pct(l.gpu_work_ms as f64 / d.held_ms as f64)
            );
        }
    }
    let compile = format!(
        "{} in {} ({} cached)",
        secs(l.compile_ms),
        plural(l.compiles, "build", "builds"),
        l.compiles_cached
    );
    let mut lines = vec![
        ("tokens", tokens),
        ("USD", cost),
        ("LLM", llm),
        ("devices", devices),
    ];
    // With several devices, each one's share (busy: the workers' time on requests, not the lease),
    // and the devices lost.
    if l.devices.len() > 1 {
        for (name, d) in &l.devices {
            let mut line = format!("{name}: {}", device_use(d));
            if d.work_ms > 0 {
                let _ = write!(line, ", GPU work {} timed", secs(d.work_ms));
            }
            lines.push(("device", line));
        }
    }
    for (name, why) in &l.devices_lost {
        lines.push(("lost", format!("{name}: {why}")));
    }
    lines.push(("compile", compile));
    if l.worker_losses > 0 {
        let mut workers = format!(
            "{} lost (node, step or connection died; each request retried elsewhere)",
            l.worker_losses
        );
        if !l.drained_hosts.is_empty() {
            let _ = write!(workers, "; drained: {}", l.drained_hosts.join(", "));
        }
        lines.push(("workers", workers));
    }
    lines.push(("wall", secs(l.wall_ms)));
    lines
}

/// `3 leases, held 1.2 s, busy 1.0 s (83 %), lease wait 0.4 s`.
fn device_use(d: &crate::metrics::ledger::DeviceUse) -> String {
    let mut line = format!(
        "{}, held {}, busy {}",
        plural(d.leases, "lease", "leases"),
        secs(d.held_ms),
        secs(d.busy_ms)
    );
    if d.held_ms > 0 {
        let _ = write!(line, " ({})", pct(d.busy_ms as f64 / d.held_ms as f64));
    }
    let _ = write!(line, ", lease wait {}", secs(d.wait_ms));
    line
}

/// Right-aligned columns, two spaces apart.
fn aligned(table: &[Vec<String>]) -> String {
    let cols = table.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|i| {
            table
                .iter()
                .filter_map(|row| row.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in table {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, &w)| format!("{c:>w$}"))
            .collect();
        out.push_str(&line.join("  "));
        out.push('\n');
    }
    out
}

fn markdown_table(table: &[Vec<String>]) -> String {
    let mut out = String::new();
    for (i, row) in table.iter().enumerate() {
        out.push_str("| ");
        out.push_str(&row.join(" | "));
        out.push_str(" |\n");
        if i == 0 {
            let rule: Vec<&str> = row.iter().map(|_| "---:").collect();
            out.push('|');
            out.push_str(&rule.join("|"));
            out.push_str("|\n");
        }
    }
    out
}

fn render_one(r: &RunReport, md: bool) -> String {
    let mut table = vec![header(r)];
    table.extend(rows(r).iter().map(|row| cells(r, row)));
    let mut out = String::new();
    if md {
        let _ = writeln!(out, "### {}\n", r.run);
        let _ = writeln!(out, "{}\n", title(r));
        if let Some(p) = &r.provenance {
            for (label, value) in super::provenance::lines(p) {
                let _ = writeln!(out, "- {label}: {value}");
            }
            out.push('\n');
        }
        out.push_str(&markdown_table(&table));
        if let Some(line) = pass_at_k_line(r) {
            let _ = writeln!(out, "\n{line}");
        }
        out.push('\n');
        for (label, value) in integrity_lines(&r.metrics.integrity())
            .into_iter()
            .chain(totals(&r.ledger, r.served))
        {
            let _ = writeln!(out, "- {label}: {value}");
        }
    } else {
        let _ = writeln!(out, "{} ({})", r.run, title(r));
        if let Some(p) = &r.provenance {
            for (label, value) in super::provenance::lines(p) {
                let _ = writeln!(out, "{label:<11}{value}");
            }
        }
        out.push_str(&aligned(&table));
        if let Some(line) = pass_at_k_line(r) {
            out.push_str(&line);
            out.push('\n');
        }
        for (label, value) in integrity_lines(&r.metrics.integrity())
            .into_iter()
            .chain(totals(&r.ledger, r.served))
        {
            let _ = writeln!(out, "{label:<9}{value}");
        }
    }
    out
}

pub(super) fn render(runs: &[RunReport], md: bool) -> String {
    let blocks: Vec<String> = runs.iter().map(|r| render_one(r, md)).collect();
    blocks.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Event, LogRecord};

    fn rec(seq: u64, event: Event) -> LogRecord {
        LogRecord {
            v: crate::types::SCHEMA_VERSION,
            seq,
            ts_ms: seq,
            task: None,
            event,
        }
    }

    /// With several devices, each device's leases, busy time and lease waits have a line, and a
    /// lost device says why.
    #[test]
    fn several_devices_each_get_a_line_and_a_lost_one_says_why() {
        let mut records = Vec::new();
        for (device, wait_ms, held_ms, busy_ms) in
            [("cuda:0", 500, 4000, 3000), ("cuda:1", 0, 2000, 1000)]
        {
            let device = device.to_string();
            records.push(rec(
                records.len() as u64,
                Event::LeaseGranted {
                    device: device.clone(),
                    wait_ms,
                    turn: 1,
                },
            ));
            records.push(rec(
                records.len() as u64,
                Event::LeaseReleased {
                    device,
                    held_ms,
                    busy_ms,
                    turn: 1,
                },
            ));
        }
        records.push(rec(
            9,
            Event::DeviceRetired {
                device: "cuda:1".into(),
                error: "no worker starts".into(),
                remaining: 1,
            },
        ));
        let lines = totals(&crate::metrics::ledger(&records), None);
        let of = |label: &str| -> Vec<&str> {
            lines
                .iter()
                .filter(|(l, _)| *l == label)
                .map(|(_, v)| v.as_str())
                .collect()
        };
        assert_eq!(
            of("devices"),
            ["2 leases, held 6.0 s, busy 4.0 s (66.7%), lease wait 0.5 s"]
        );
        assert_eq!(
            of("device"),
            [
                "cuda:0: 1 lease, held 4.0 s, busy 3.0 s (75.0%), lease wait 0.5 s",
                "cuda:1: 1 lease, held 2.0 s, busy 1.0 s (50.0%), lease wait 0.0 s",
            ]
        );
        assert_eq!(of("lost"), ["cuda:1: no worker starts"]);
        // One device: no per-device lines.
        let one = totals(&crate::metrics::ledger(&records[..2]), None);
        assert!(one.iter().all(|(l, _)| *l != "device" && *l != "lost"));
    }
}
