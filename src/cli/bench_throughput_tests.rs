//! `bench_throughput`'s tests: a pass's figures and floors from hand-made event logs.

use super::*;
use crate::types::{Event, LogRecord};
use serde_json::json;

fn rec(ts_ms: u64, event: serde_json::Value) -> LogRecord {
    serde_json::from_value(json!({"v": 1, "seq": 0, "ts_ms": ts_ms, "event": event})).unwrap()
}

/// `log` folded as the log of a run holds it: numbered in order.
fn fold(log: &[LogRecord]) -> RunState {
    let numbered: Vec<LogRecord> = (0..)
        .zip(log)
        .map(|(seq, r)| LogRecord { seq, ..r.clone() })
        .collect();
    RunState::from_records(&numbered)
}

fn executed(ts: u64, ref_source: &str) -> LogRecord {
    rec(
        ts,
        json!({
            "type": "executed", "turn": 1,
            "outcome": {
                "verdict": "correct", "compiled": true, "correctness": true, "metadata": {},
                "runtime_ms": 2.0, "ref_runtime_ms": 4.0,
                "runtime_stats": {"mean": 2.0, "median": 2.0, "std": 0.0, "min": 2.0, "max": 2.0, "num_trials": 100},
                "ref_runtime_stats": {"mean": 4.0, "median": 4.0, "std": 0.0, "min": 4.0, "max": 4.0, "num_trials": 100},
                "ref_source": ref_source, "feedback": "", "env": {}, "device": "cuda:0", "wall_ms": 0,
                "phases": {"reference_s": 1.5, "ref_timing_s": 0.5, "load_s": 0.25, "correctness_s": 1.0,
                           "timing_s": 0.75, "isolation_s": 0.125, "spawn_wait_s": 0.125}
            }
        }),
    )
}

#[test]
fn the_arithmetic_of_a_pass() {
    let log = vec![
        rec(
            1_000,
            json!({"type": "inputs_prepared", "problem": "1/8",
            "outcome": {"status": "generated", "bytes": 8, "duration_ms": 40_000}}),
        ),
        rec(
            2_000,
            json!({"type": "compiled", "turn": 1, "outcome": {"status": "ok", "cached": false,
            "feedback": "", "duration_ms": 80_000}}),
        ),
        rec(
            2_500,
            json!({"type": "compiled", "turn": 1, "outcome": {"status": "ok", "cached": true,
            "feedback": "", "duration_ms": 5}}),
        ),
        rec(
            3_000,
            json!({"type": "reference_prepared", "problem": "1/8",
            "device": "cuda:0", "held_ms": 3_000, "outcome": {"status": "ready", "done": true,
            "duration_ms": 2_500}}),
        ),
        rec(
            4_000,
            json!({"type": "lease_granted", "device": "cuda:0", "wait_ms": 2_000, "turn": 1}),
        ),
        executed(11_000, "measured"),
        rec(
            11_000,
            json!({"type": "lease_released", "device": "cuda:0", "held_ms": 7_000, "busy_ms": 6_000, "turn": 1}),
        ),
        rec(
            12_000,
            json!({"type": "lease_granted", "device": "cuda:0", "wait_ms": 500, "turn": 1}),
        ),
        executed(19_000, "cached"),
        rec(
            19_000,
            json!({"type": "lease_released", "device": "cuda:0", "held_ms": 7_000, "busy_ms": 6_000, "turn": 1}),
        ),
    ];
    let t = throughput(&fold(&log), 36.0);
    assert_eq!(t.candidates, 2);
    assert_eq!(t.devices, 1);
    // 2 candidates in 36 s on one device: 2 / 0.01 h.
    assert_eq!(t.per_gpu_hour, 200.0);
    assert_eq!(t.first_result_s, Some(10.0));
    assert_eq!(t.build_s, 80.0, "cache hits are not builds");
    assert_eq!(t.cpu_prep_s, 40.0);
    assert_eq!(t.gpu_prep_s, 3.0 + 2.0 * 2.0);
    assert_eq!((t.load_s, t.check_s, t.timing_s), (0.5, 2.0, 1.5));
    assert_eq!(t.isolation_s, 0.5);
    assert_eq!(t.lease_wait_s, 2.5);
    assert_eq!(t.lease_held_s, 3.0 + 14.0);
    // Candidates 2 x (2 ms x 100); the reference once (measured), 4 ms x 100.
    assert_eq!(t.gpu_work_s, 0.4 + 0.4);
    // Worker-measured: 2 x 6 s of leases, 2.5 s of the reference step.
    assert_eq!(t.gpu_busy_s, 12.0 + 2.5);
    let table = render(&[("cold", &t)]);
    assert!(table.contains("candidates per GPU-hour"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("lease held / wall x devices") && l.ends_with("47 %")),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("GPU busy: work / wall x devices") && l.ends_with("2 %")),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("GPU busy: worker / wall x devices") && l.ends_with("40 %")),
        "{table}"
    );
}

/// The committed fixture run (11 candidates on the CPU device), as the benchmark read it before
/// it read the log through the reducer.
#[test]
fn the_figures_of_a_recorded_run() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/runs/quickstart-sim/events.jsonl");
    let records = crate::store::read_log(&path).unwrap().records;
    let t = throughput(&RunState::from_records(&records), 10.0);
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    assert_eq!((t.candidates, t.devices), (11, 1));
    assert!(close(t.per_gpu_hour, 3960.0));
    assert_eq!(t.first_result_s, Some(0.24));
    assert!(close(t.build_s, 0.55));
    assert_eq!(
        (
            t.cpu_prep_s,
            t.gpu_prep_s,
            t.load_s,
            t.check_s,
            t.timing_s,
            t.isolation_s
        ),
        (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    );
    assert!(close(t.lease_wait_s, 2.648));
    assert!(close(t.lease_held_s, 0.675));
    assert!(close(t.gpu_busy_s, 0.641));
    assert_eq!(t.gpu_work_s, 0.0);
    let cpu = &t.per_device["cpu"];
    assert_eq!(t.per_device.len(), 1);
    assert_eq!(cpu.candidates, 11);
    assert!(close(cpu.lease_wait_s, 2.648) && close(cpu.lease_held_s, 0.675));
    assert!(close(cpu.busy_s, 0.641) && cpu.gpu_work_s == 0.0);
}

#[test]
fn a_pass_is_measured_against_its_cpu_and_gpu_floors() {
    let compiled = |ts, cached: bool, cpu_ms: Option<u64>, duration_ms: u64| {
        let mut o = json!({"status": "ok", "cached": cached, "feedback": "",
            "duration_ms": duration_ms, "build_path": "fast"});
        if let Some(c) = cpu_ms {
            o["cpu"] = json!({"cpu_ms": c, "wall_ms": duration_ms});
        }
        rec(ts, json!({"type": "compiled", "turn": 1, "outcome": o}))
    };
    let lease = |ts, device: &str, held_ms: u64| {
        rec(
            ts,
            json!({"type": "lease_released", "device": device, "held_ms": held_ms, "busy_ms": 0, "turn": 1}),
        )
    };
    let log = vec![
        rec(
            1_000,
            json!({"type": "inputs_prepared", "problem": "1/8",
            "outcome": {"status": "generated", "bytes": 8, "duration_ms": 10_000, "parallel": 6}}),
        ),
        rec(
            1_200,
            json!({"type": "inputs_prepared", "problem": "1/9",
            "outcome": {"status": "hit", "bytes": 8, "duration_ms": 0, "parallel": 0}}),
        ),
        compiled(2_000, false, Some(20_000), 10_000),
        compiled(3_000, false, Some(10_000), 5_000),
        compiled(3_500, false, Some(14_000), 7_000),
        compiled(3_600, true, None, 1),
        // A build without its measure counts its wall time at one core.
        compiled(4_000, false, None, 4_000),
        // A candidate in plain PyTorch: its import is checked, no extension is built. Its CPU counts
        // towards the floor, not towards the median build (which it would pull down to 12.0).
        rec(
            4_100,
            json!({"type": "compiled", "turn": 1, "outcome": {"status": "ok", "cached": false,
                "feedback": "", "duration_ms": 1_000, "cpu": {"cpu_ms": 1_000, "wall_ms": 1_000}}}),
        ),
        rec(
            4_500,
            json!({"type": "lease_granted", "device": "cuda:0", "wait_ms": 0, "turn": 1}),
        ),
        lease(5_000, "cuda:0", 30_000),
        rec(
            5_500,
            json!({"type": "lease_granted", "device": "cuda:1", "wait_ms": 0, "turn": 1}),
        ),
        lease(6_000, "cuda:1", 40_000),
        executed(7_000, "measured"),
        executed(8_000, "measured"),
    ];
    let t = throughput(&fold(&log), 100.0);
    let f = floors(&log, &t, 4);
    assert_eq!(f.build_cpu_s, 49.0);
    assert_eq!(
        f.median_build_cpu_s, 14.0,
        "the median of the measured builds that compiled an extension"
    );
    assert_eq!(f.extension_builds, 3);
    assert_eq!(f.inputs_cpu_s, 60.0);
    assert_eq!(f.cpu_floor_s, 27.25, "(49 + 60) / 4 cores");
    assert_eq!(f.gpu_floor_s, 40.0, "the busiest device");
    assert_eq!((f.inputs_made, f.inputs_found), (1, 1));
    let text = render_floors(&[("cold", &t, &f)]);
    let row = |label: &str| {
        text.lines()
            .find(|l| l.starts_with(label))
            .map(|l| l[34..].trim().to_string())
            .unwrap_or_default()
    };
    // 2 candidates in 100 s on 2 devices: 36 per GPU-hour; in 27.25 s: 132.
    assert_eq!(row("candidates per GPU-hour"), "36");
    assert_eq!(row("per GPU-hour at the CPU floor"), "132");
    assert_eq!(row("wall / CPU floor"), "3.67x");
    assert_eq!(row("extension builds"), "3");
    assert_eq!(row("median extension build CPU (s)"), "14.0");
    assert_eq!(row("wall / GPU floor"), "2.50x");
    assert_eq!(row("problems' inputs made / found"), "1 / 1");
    // Inputs a cold pass found stored were not made in it: the table says so.
    assert!(
        text.contains("NOT COLD: the cold pass found 1 problem(s)' inputs"),
        "{text}"
    );
    assert!(!render_floors(&[("warm", &t, &f)]).contains("NOT COLD"));
    // No work: no floor to divide by.
    let none = floors(&[], &throughput(&RunState::from_records(&[]), 0.0), 16);
    assert_eq!((none.cpu_floor_s, none.gpu_floor_s), (0.0, 0.0));
    assert!(
        render_floors(&[(
            "cold",
            &throughput(&RunState::from_records(&[]), 0.0),
            &none
        )])
        .contains(" -\n")
    );
}

#[test]
fn the_cores_are_the_budget_set_else_the_machines() {
    assert_eq!(cores_of(&["resources.cpu_budget=12".into()]), 12);
    assert_eq!(
        cores_of(&[
            "resources.cpu_budget=12".into(),
            "resources.cpu_budget = 3".into()
        ]),
        3
    );
    assert_eq!(
        cores_of(&["resources.compile_workers=16".into()]),
        crate::cpu_budget::available_cores()
    );
}

#[test]
fn an_empty_log_divides_by_nothing() {
    let t = throughput(&RunState::new(), 0.0);
    assert_eq!((t.candidates, t.devices, t.per_gpu_hour), (0, 1, 0.0));
    assert_eq!(t.first_result_s, None);
    assert!(render(&[("cold", &t)]).contains(" -\n"));
}

/// Two devices: each one's candidates, leases, busy time, measured work and waits.
#[test]
fn each_device_has_its_share() {
    let lease = |ts, device: &str, wait_ms: u64, held_ms: u64, busy_ms: u64| {
        [
            rec(
                ts,
                json!({"type": "lease_granted", "device": device, "wait_ms": wait_ms, "turn": 1}),
            ),
            rec(
                ts + 1,
                json!({"type": "lease_released", "device": device, "held_ms": held_ms,
                               "busy_ms": busy_ms, "turn": 1}),
            ),
        ]
    };
    let mut log = Vec::new();
    log.extend(lease(1_000, "cuda:0", 0, 4_000, 3_000));
    log.push(executed(2_000, "measured"));
    log.extend(lease(3_000, "cuda:1", 2_000, 6_000, 5_000));
    let mut on_1 = executed(4_000, "baseline");
    if let Event::Executed { outcome, .. } = &mut on_1.event {
        outcome.device = "cuda:1".into();
    }
    log.push(on_1);
    log.push(rec(
        5_000,
        json!({"type": "reference_prepared", "problem": "1/8", "device": "cuda:1",
        "held_ms": 1_000, "outcome": {"status": "ready", "built": [], "trials_ready": 5,
        "done": true, "next": null, "duration_ms": 1_000, "error": null}}),
    ));
    let t = throughput(&fold(&log), 100.0);
    assert_eq!(t.devices, 2);
    let share = |d: &str| t.per_device[d].clone();
    // 100 trials of 2 ms each; the reference counted where measured (100 x 4 ms).
    assert_eq!(
        share("cuda:0"),
        DeviceShare {
            candidates: 1,
            lease_wait_s: 0.0,
            lease_held_s: 4.0,
            busy_s: 3.0,
            gpu_work_s: 0.6
        }
    );
    assert_eq!(
        share("cuda:1"),
        DeviceShare {
            candidates: 1,
            lease_wait_s: 2.0,
            lease_held_s: 7.0,
            busy_s: 5.0,
            gpu_work_s: 0.2
        }
    );
    let text = render(&[("cold", &t)]);
    assert!(text.contains("cold, per device:"), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with("cuda:1"))
        .expect("a row for cuda:1");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        ["cuda:1", "1", "7.0", "5.0", "0.20", "2.0", "0", "%"]
    );
    // One device: no per-device table.
    assert!(!render(&[("cold", &throughput(&fold(&log[..3]), 10.0))]).contains("per device"));
}
