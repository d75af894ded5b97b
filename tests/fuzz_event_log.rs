//! Property tests of the event log as every reader takes it (resume, report, replay, watch, the
//! Python package): `read_log` over valid logs and corrupted ones (cut at any byte, a byte changed,
//! a line inserted, lines repeated), then the fold into task states and the metrics over whatever
//! was read. Properties: no panic; an error names the file and a line the file has; a valid log
//! and each of its prefixes read whole; a cut log reads as the prefix of its complete lines; the
//! fold of any prefix never fails. Written against the public API (`krefine::store::read_log`,
//! `krefine::state::RunState::task_turns`, `krefine::metrics::ledger`) so that it outlives refactors of
//! the reader.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

mod fuzz_support;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proptest::prelude::*;

/// The records of a finished simulated quickstart run (4 tasks, 3 turns each), as written. Read once
/// per process: at 10^5 cases a target's own set-up must not cost more than the reader it tests.
fn corpus() -> &'static [String] {
    static LINES: OnceLock<Vec<String>> = OnceLock::new();
    LINES.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/runs/quickstart-sim/events.jsonl");
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    })
}

/// The corpus as JSON values, parsed once.
fn corpus_values() -> &'static [serde_json::Value] {
    static VALUES: OnceLock<Vec<serde_json::Value>> = OnceLock::new();
    VALUES.get_or_init(|| {
        corpus()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    })
}

/// The corpus as one log's bytes, and the end (one past its newline) of each line.
fn corpus_text() -> &'static (Vec<u8>, Vec<usize>) {
    static TEXT: OnceLock<(Vec<u8>, Vec<usize>)> = OnceLock::new();
    TEXT.get_or_init(|| {
        let full = corpus()
            .iter()
            .map(|l| format!("{l}\n"))
            .collect::<String>()
            .into_bytes();
        let ends = (0..full.len())
            .filter(|&i| full[i] == b'\n')
            .map(|i| i + 1)
            .collect();
        (full, ends)
    })
}

/// The corpus as records, parsed once.
fn corpus_records() -> &'static [krefine::types::LogRecord] {
    static RECORDS: OnceLock<Vec<krefine::types::LogRecord>> = OnceLock::new();
    RECORDS.get_or_init(|| {
        corpus()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    })
}

/// One folder per process for the logs the targets write (each target its own file, `name`):
/// creating and removing a folder per case cost more than the read under test.
fn write(name: &str, bytes: &[u8]) -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let dir = DIR.get_or_init(|| tempfile::tempdir().unwrap());
    let path = dir.path().join(format!("{name}.jsonl"));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// How a log is damaged.
#[derive(Debug, Clone)]
enum Damage {
    /// Cut at this fraction of its length.
    Cut(f64),
    /// One byte replaced.
    Byte(f64, u8),
    /// A line of garbage inserted before line `at` (fraction).
    Insert(f64, String),
    /// A line repeated.
    Repeat(f64),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (0.0..1.0f64).prop_map(Damage::Cut),
        (0.0..1.0f64, any::<u8>()).prop_map(|(a, b)| Damage::Byte(a, b)),
        (
            0.0..1.0f64,
            prop_oneof![
                any::<String>(),
                "\\{\"v\": [0-9], \"seq\": [0-9]\\}",
                Just("{}".to_string())
            ]
        )
            .prop_map(|(a, s)| Damage::Insert(a, s)),
        (0.0..1.0f64).prop_map(Damage::Repeat),
    ]
}

fn apply(lines: &[String], d: &Damage) -> Vec<u8> {
    let text = lines.iter().map(|l| format!("{l}\n")).collect::<String>();
    let mut bytes = text.into_bytes();
    let at = |f: f64, n: usize| ((f * n as f64) as usize).min(n.saturating_sub(1));
    match d {
        Damage::Cut(f) => bytes.truncate(at(*f, bytes.len() + 1)),
        Damage::Byte(f, b) => {
            if !bytes.is_empty() {
                let i = at(*f, bytes.len());
                bytes[i] = *b;
            }
        }
        Damage::Insert(f, s) => {
            let mut ls: Vec<String> = lines.to_vec();
            let i = at(*f, ls.len() + 1);
            ls.insert(i, s.replace('\n', " "));
            bytes = ls
                .iter()
                .map(|l| format!("{l}\n"))
                .collect::<String>()
                .into_bytes();
        }
        Damage::Repeat(f) => {
            let mut ls: Vec<String> = lines.to_vec();
            if !ls.is_empty() {
                let i = at(*f, ls.len());
                ls.insert(i, ls[i].clone());
            }
            bytes = ls
                .iter()
                .map(|l| format!("{l}\n"))
                .collect::<String>()
                .into_bytes();
        }
    }
    bytes
}

proptest! {
    #![proptest_config(fuzz_support::config())]

    /// Every prefix of a valid log reads whole and folds.
    #[test]
    fn valid_prefixes_read_and_fold(n in 0usize..=103) {
        let lines = corpus();
        let n = n.min(lines.len());
        let path = write("valid_prefixes", lines[..n].iter().map(|l| format!("{l}\n")).collect::<String>().as_bytes());
        let log = krefine::store::read_log(&path).unwrap();
        prop_assert_eq!(log.records.len(), n);
        prop_assert!(log.torn_tail.is_none());
        prop_assert!(krefine::state::RunState::from_records(&log.records).task_turns().is_ok());
        let _ = krefine::metrics::ledger(&log.records);
    }

    /// A damaged log: read, or refused naming the file and one of its lines; never a panic. What
    /// was read folds (or is refused) without a panic too.
    #[test]
    fn damaged_logs_never_panic(n in 1usize..=103, d in damage()) {
        let lines = corpus();
        let n = n.min(lines.len());
        let bytes = apply(&lines[..n], &d);
        let path = write("damaged", &bytes);
        let total_lines = bytes.split(|b| *b == b'\n').count();
        match krefine::store::read_log(&path) {
            Ok(log) => {
                prop_assert!(log.records.len() <= total_lines);
                prop_assert!(log.valid_len <= bytes.len() as u64);
                let _ = krefine::state::RunState::from_records(&log.records).task_turns();
                let _ = krefine::metrics::ledger(&log.records);
            }
            Err(e) => {
                let msg = e.to_string();
                let prefix = format!("{}:", path.display());
                prop_assert!(msg.starts_with(&prefix), "{}", msg);
                let line: usize = msg[prefix.len()..]
                    .split(':')
                    .next()
                    .and_then(|l| l.parse().ok())
                    .unwrap_or(0);
                prop_assert!(line >= 1 && line <= total_lines, "{}", msg);
            }
        }
    }

    /// A log cut anywhere (a crash mid-write) reads as exactly its complete lines.
    #[test]
    fn a_cut_log_reads_as_its_complete_lines(f in 0.0..1.0f64) {
        let (full, ends) = corpus_text();
        let cut = ((f * full.len() as f64) as usize).min(full.len());
        let path = write("cut", &full[..cut]);
        let log = krefine::store::read_log(&path).unwrap();
        // The complete lines of the cut: those whose newline lies before it.
        let complete = ends.partition_point(|&end| end <= cut);
        prop_assert_eq!(log.records.len(), complete);
        prop_assert_eq!(log.valid_len as usize, if complete == 0 { 0 } else { ends[complete - 1] });
    }
}

proptest! {
    #![proptest_config(fuzz_support::config())]

    /// Records in any order and any subset (a log no run writes): the fold refuses or folds, never
    /// panics; the metrics of what folded are shares in [0, 1] and fast_p never grows with p.
    #[test]
    fn reordered_records_fold_and_measure(
        picks in prop::collection::vec(0usize..103, 0..60),
        axis in 1u32..5,
        sampling in any::<bool>(),
    ) {
        use krefine::metrics::{RunInput, run_metrics, run_problems};
        use krefine::types::MethodKind;
        let all = corpus_records();
        let records: Vec<krefine::types::LogRecord> = picks
            .iter()
            .map(|&i| all[i % all.len()].clone())
            .collect();
        let Ok(turns) = krefine::state::RunState::from_records(&records).task_turns() else {
            return Ok(());
        };
        let ids: Vec<_> = turns.keys().copied().collect();
        let problems = run_problems(&ids);
        let m = run_metrics(&RunInput {
            method: if sampling { MethodKind::Sampling } else { MethodKind::Refine },
            axis,
            problems: &problems,
            turns: &turns,
        });
        prop_assert_eq!(m.steps.len(), axis as usize);
        for s in &m.steps {
            let sm = &s.summary;
            prop_assert!((0.0..=1.0).contains(&sm.correct_rate));
            prop_assert!((0.0..=1.0).contains(&sm.compiled_rate));
            prop_assert!(sm.correct_rate <= sm.compiled_rate + 1e-12);
            for w in sm.fast_p.0.windows(2) {
                prop_assert!(w[0] + 1e-12 >= w[1], "{:?}", sm.fast_p);
            }
        }
        for p in &m.pass_at_k {
            prop_assert!((0.0..=1.0).contains(&p.value));
        }
    }
}

/// The records of the corpus with every LLM answer's usage and cost, and every lease's times,
/// replaced by the given numbers (a provider or a damaged log can carry any).
fn with_numbers(tokens: &[u64], usd: &[f64], ms: &[u64]) -> Vec<krefine::types::LogRecord> {
    let mut i = 0usize;
    corpus_values()
        .iter()
        .map(|v| {
            let mut v = v.clone();
            let mut pick = |xs: &[u64]| {
                i += 1;
                xs[i % xs.len()]
            };
            if let Some(a) = v.pointer_mut("/event/answer")
                && a.is_object()
            {
                a["usage"] = serde_json::json!({
                    "prompt_tokens": pick(tokens),
                    "completion_tokens": pick(tokens),
                    "reasoning_tokens": pick(tokens),
                });
                let k = pick(&[0, 1, 2, 3]) as usize;
                a["cost_usd"] = serde_json::json!(usd[k % usd.len()]);
            }
            for key in ["wait_ms", "held_ms", "busy_ms", "duration_ms", "ts_ms"] {
                if let Some(e) = v.pointer_mut("/event")
                    && e.get(key).is_some_and(serde_json::Value::is_u64)
                {
                    e[key] = serde_json::json!(pick(ms));
                }
            }
            serde_json::from_value(v).unwrap()
        })
        .collect()
}

proptest! {
    #![proptest_config(fuzz_support::config())]

    /// Any token counts, costs and lease times (u64::MAX included): the ledger, the attempts'
    /// costs and the metrics are computed without a panic (sums saturate).
    #[test]
    fn extreme_numbers_are_summed_without_overflow(
        tokens in prop::collection::vec(prop_oneof![any::<u64>(), Just(u64::MAX), 0u64..1000], 1..6),
        usd in prop::collection::vec(prop_oneof![any::<f64>().prop_filter("finite", |x| x.is_finite()), Just(f64::MAX), 0.0..1.0f64], 1..4),
        ms in prop::collection::vec(prop_oneof![any::<u64>(), Just(u64::MAX), 0u64..100_000], 1..6),
    ) {
        use krefine::metrics::{RunInput, ledger, run_attempts, run_problems};
        use krefine::types::MethodKind;
        let records = with_numbers(&tokens, &usd, &ms);
        let l = ledger(&records);
        let _ = l.total.tokens();
        let state = krefine::state::RunState::from_records(&records);
        let device = state.device_ms().clone();
        let turns = state.task_turns().unwrap();
        let ids: Vec<_> = turns.keys().copied().collect();
        let problems = run_problems(&ids);
        let input = RunInput { method: MethodKind::Refine, axis: 3, problems: &problems, turns: &turns };
        let _ = run_attempts(&input, &l, &device);
    }
}

/// Regression (found by `extreme_numbers_are_summed_without_overflow`): a provider that reports
/// u64::MAX tokens, and leases of u64::MAX ms, overflowed the ledger's sums (a panic in debug
/// builds, wrapped numbers in release).
#[test]
fn u64_max_usage_and_lease_times_saturate() {
    let records = with_numbers(&[u64::MAX], &[1.0], &[u64::MAX]);
    let l = krefine::metrics::ledger(&records);
    assert_eq!(l.total.tokens(), u64::MAX);
    assert_eq!(l.device_total.held_ms, u64::MAX);
}
