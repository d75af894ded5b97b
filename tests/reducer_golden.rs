//! The run's one reducer against the numbers every consumer of the log showed before it was the one:
//! the committed fixture log, whole and cut mid-run (and torn), is read and folded, and what the
//! report (text and JSON), the Python package's tables, the ledger, GPU-seconds per turn, the fast_p
//! curve, the terminal UI's and progress line's view and the resume budget say of it is written out
//! and compared with `tests/fixtures/golden/quickstart-sim.txt`. That file was written by the code
//! before the reducer was shared (each consumer folding the log its own way); `KREFINE_BLESS=1`
//! rewrites it.
//!
//! A second test asserts that the report, the Python package's numbers and the view are the one
//! fold's: each equals what `RunState` answers for the same records.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use krefine::config::BudgetSection;
use krefine::llm::Ledger as BudgetLedger;
use krefine::metrics::ledger;
use krefine::report::{Format, candidate_rows, load_run, render, turn_rows};
use krefine::store::read_log;
use krefine::types::Event;
use krefine::view::RunView;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/runs/quickstart-sim/events.jsonl")
}

fn golden() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/golden/quickstart-sim.txt")
}

/// The fixture's logs: whole, cut after some lines (a run in progress), and with a torn last line.
fn logs() -> Vec<(String, Vec<u8>)> {
    let text = std::fs::read(fixture()).unwrap();
    let ends: Vec<usize> = text
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| i + 1)
        .collect();
    let mut out = vec![("whole".to_string(), text.clone())];
    for n in [1, 7, 30, 61, 90] {
        out.push((format!("first {n} lines"), text[..ends[n - 1]].to_vec()));
    }
    let cut = ends[ends.len() - 2] + 20;
    out.push(("torn last line".to_string(), text[..cut].to_vec()));
    out
}

/// Everything each consumer says of one log, as text.
fn numbers(dir: &Path) -> String {
    let mut s = String::new();
    let events = dir.join("events.jsonl");
    let log = read_log(&events).unwrap();
    writeln!(s, "records: {}", log.records.len()).unwrap();
    writeln!(s, "torn: {}", log.torn_tail.is_some()).unwrap();

    // The report, and the Python package's tables (the same rows `krefine.Run` returns).
    match load_run(dir) {
        Ok(run) => {
            let report = std::slice::from_ref(&run.report);
            writeln!(s, "report json: {}", render(report, Format::Json)).unwrap();
            writeln!(s, "report text:\n{}", render(report, Format::Text)).unwrap();
            writeln!(s, "report csv:\n{}", render(report, Format::Csv)).unwrap();
            writeln!(s, "complete: {}", run.report.complete).unwrap();
            writeln!(
                s,
                "turn rows: {}",
                serde_json::to_string(&turn_rows(&run)).unwrap()
            )
            .unwrap();
            // The candidates' code is the log's own text; its length stands for it here.
            let mut rows = serde_json::to_value(candidate_rows(&run)).unwrap();
            for row in rows.as_array_mut().unwrap() {
                let code = row["code"].as_str().map(str::len);
                row["code"] = serde_json::json!(code);
            }
            writeln!(s, "candidate rows: {rows}").unwrap();
            writeln!(s, "device ms: {:?}", run.device_ms).unwrap();
            writeln!(s, "attempts: {:?}", run.attempts).unwrap();
            for (task, turns) in &run.turns {
                let verdicts: Vec<String> = turns
                    .iter()
                    .map(|t| format!("{}:{:?}", t.turn, t.verdict))
                    .collect();
                writeln!(s, "turns {task}: {}", verdicts.join(" ")).unwrap();
            }
        }
        Err(e) => writeln!(s, "report: error {e}").unwrap(),
    }

    // The ledger.
    writeln!(s, "ledger: {:?}", ledger(&log.records)).unwrap();

    // The view the terminal UI and the progress line draw.
    let v = RunView::from_records(&log.records);
    writeln!(s, "view finished turns: {}", v.finished_turns()).unwrap();
    writeln!(s, "view planned turns: {}", v.planned_turns()).unwrap();
    writeln!(s, "view verdicts: {:?}", v.verdict_tally()).unwrap();
    let stages: Vec<String> = v
        .stage_counts()
        .into_iter()
        .map(|(stage, n)| format!("{}={n}", stage.as_str()))
        .collect();
    writeln!(s, "view stages: {}", stages.join(" ")).unwrap();
    let sp = &v.spend;
    writeln!(
        s,
        "view spend: answers {} prompt {} completion {} reasoning {} usd {} no usage {} no cost {}",
        sp.answers,
        sp.prompt_tokens,
        sp.completion_tokens,
        sp.reasoning_tokens,
        sp.cost_usd,
        sp.answers_without_usage,
        sp.answers_without_cost
    )
    .unwrap();
    for (name, d) in &v.devices {
        writeln!(
            s,
            "view device {name}: holder {:?} leases {} held {} busy {} prepare {}",
            d.holder, d.leases, d.held_ms, d.busy_ms, d.prepare_ms
        )
        .unwrap();
    }
    for (id, t) in &v.tasks {
        writeln!(
            s,
            "view task {id}: {} turn {} best {:?} error {:?}",
            t.stage.as_str(),
            t.turn,
            t.best_speedup(),
            t.error
        )
        .unwrap();
    }
    writeln!(s, "view curve: {:?}", v.curve).unwrap();
    writeln!(s, "view ended: {:?}", v.ended.as_deref()).unwrap();
    writeln!(s, "view device queue: {}", v.device_queue()).unwrap();
    writeln!(s, "view elapsed: {}", v.elapsed_ms(u64::MAX / 2)).unwrap();

    // The resume budget: what the log spent, as the budget counts it.
    let budget = BudgetLedger::new(&BudgetSection::default());
    for rec in &log.records {
        if let Event::LlmAnswered { answer, .. } = &rec.event {
            budget.record(answer);
        }
    }
    let t = budget.totals();
    writeln!(
        s,
        "budget: answers {} tokens {} usd {} no usage {} no cost {}",
        t.answers,
        t.tokens(),
        t.cost_usd,
        t.answers_without_usage,
        t.answers_without_cost
    )
    .unwrap();
    s
}

fn all_numbers() -> String {
    let mut out = String::new();
    for (name, bytes) in logs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("events.jsonl"), bytes).unwrap();
        writeln!(out, "== {name}").unwrap();
        out.push_str(&numbers(dir.path()));
    }
    out
}

#[test]
fn every_consumer_shows_the_numbers_it_showed_before() {
    let got = all_numbers();
    if std::env::var_os("KREFINE_BLESS").is_some() {
        std::fs::create_dir_all(golden().parent().unwrap()).unwrap();
        std::fs::write(golden(), &got).unwrap();
    }
    let want = std::fs::read_to_string(golden()).unwrap();
    if got != want {
        let first = got
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        panic!(
            "numbers differ from {} at line {}:\n got: {}\nwant: {}",
            golden().display(),
            first + 1,
            got.lines().nth(first).unwrap_or(""),
            want.lines().nth(first).unwrap_or("")
        );
    }
}

#[test]
fn report_python_and_view_numbers_are_the_one_folds() {
    use krefine::state::RunState;
    for (name, bytes) in logs() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("events.jsonl"), bytes).unwrap();
        let log = read_log(&dir.path().join("events.jsonl")).unwrap();
        let state = RunState::from_records(&log.records);
        let run = load_run(dir.path()).unwrap();
        let view = RunView::from_records(&log.records);

        // The report (and the Python package, whose tables are the loaded run's rows).
        assert_eq!(run.report.ledger, state.ledger(), "{name}: ledger");
        assert_eq!(run.turns, state.task_turns().unwrap(), "{name}: turns");
        assert_eq!(&run.device_ms, state.device_ms(), "{name}: GPU ms");
        assert_eq!(run.report.complete, state.complete, "{name}: complete");
        let rows = turn_rows(&run);
        let curve: Vec<_> = rows.iter().map(|r| r.summary.fast_p).collect();
        let gpu_ms: u64 = state.device_ms().values().sum();
        let row_gpu_s: f64 = rows.iter().map(|r| r.gpu_s).sum();
        assert!((row_gpu_s - gpu_ms as f64 / 1000.0).abs() < 1e-9, "{name}");
        let candidates = candidate_rows(&run);
        assert_eq!(
            candidates.len(),
            state
                .tasks
                .values()
                .map(|t| t.finished_turns())
                .sum::<usize>(),
            "{name}: candidates"
        );

        // The view the terminal UI and the progress line draw.
        assert_eq!(view.state().ledger(), state.ledger(), "{name}: view ledger");
        assert_eq!(view.spend, state.ledger().total, "{name}: view spend");
        for (device, d) in &view.devices {
            assert_eq!(Some(&d.usage), state.ledger().devices.get(device), "{name}");
        }
        let view_curve: Vec<_> = view.curve.iter().map(|p| p.fast_p).collect();
        assert_eq!(view_curve, curve, "{name}: curve");

        // The resume budget.
        let budget = BudgetLedger::new(&BudgetSection::default());
        for rec in &log.records {
            if let Event::LlmAnswered { answer, .. } = &rec.event {
                budget.record(answer);
            }
        }
        assert_eq!(budget.totals(), state.budget_spend, "{name}: budget");
    }
}
