//! `krefine bench throughput SRC --dataset D`: evaluate a runs folder or submission twice, as
//! `krefine eval` does, and say how fast the candidates went through the GPU.
//!
//! - **cold**: fresh build cache and fresh reference-input store (`<work>/refs`), nothing cached;
//! - **warm**: the reference inputs the cold pass stored, a fresh build cache again (unless
//!   `--warm-builds`), so the difference is the reference data's.
//!
//! Each pass's numbers are a pure function of its event log (folded by the run's one reducer), the
//! wall time and the device count ([`throughput`]): candidates per GPU-hour (candidates / (wall hours x devices)), time to the first
//! result, totals per stage (build, CPU preparation of inputs, reference work on the device, load,
//! check, timing, isolation, lease waits), the lease-held time, and the GPU's measured work: the
//! candidates' and references' timed trials as their CUDA events measured them (mean x trials) — a
//! lower bound of the time the GPU ran work (correctness forwards are not timed), shown next to the
//! lease-held time so that "busy" means work, not a lease.
//!
//! Each pass also gets its **floors** ([`floors`]): the least wall time its CPU work needs on the
//! cores the run had (the builds' measured CPU seconds plus the input makers' process-seconds, over
//! the cores), and the least its GPU work needs (the busiest device's lease-held time), with the
//! candidates per GPU-hour each floor would allow and the pass's wall time as a ratio to each: a
//! pass at 1.3x its CPU floor and 3x its GPU floor is bound by its CPUs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;

use crate::state::RunState;
use crate::types::{Event, LogRecord};

pub struct ThroughputBench {
    pub src: PathBuf,
    pub dataset: PathBuf,
    pub level: Option<u32>,
    /// `--set` overrides for both passes (e.g. `resources.compile_workers=16`).
    pub sets: Vec<String>,
    /// Keep the cold pass's builds for the warm pass.
    pub warm_builds: bool,
    /// Skip the warm pass.
    pub cold_only: bool,
    /// Where the passes' run directories and caches go (default: a temporary folder, removed).
    pub work_dir: Option<PathBuf>,
}

/// One pass's numbers (seconds unless named otherwise).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Throughput {
    /// Candidates that got a verdict from a device (one `executed` event each).
    pub candidates: u32,
    pub wall_s: f64,
    /// Devices that held a lease in the run (at least 1).
    pub devices: u32,
    /// candidates / (wall hours x devices).
    pub per_gpu_hour: f64,
    /// From the run's first record to its first `executed` one.
    pub first_result_s: Option<f64>,
    /// Compile time of the builds made (cache hits excluded).
    pub build_s: f64,
    /// Inputs made on the CPU, no lease held (`inputs_prepared`).
    pub cpu_prep_s: f64,
    /// Reference work on the device: ahead of candidates (`reference_prepared`), and inside
    /// evaluations (`reference_s`, `ref_timing_s`).
    pub gpu_prep_s: f64,
    pub load_s: f64,
    pub check_s: f64,
    pub timing_s: f64,
    /// Waiting for and handing work to single-use candidate processes.
    pub isolation_s: f64,
    /// Summed over steps: time waited for a device lease.
    pub lease_wait_s: f64,
    pub lease_held_s: f64,
    /// Timed trials as CUDA events (or the CPU timer) measured them: candidates' and references'
    /// mean x trials, references counted where measured.
    pub gpu_work_s: f64,
    /// The device's work as the worker measured it: each lease's `busy_ms` (forwards, correctness,
    /// timing, profiles) and each reference step's worker time ahead of candidates.
    pub gpu_busy_s: f64,
    /// The same by device (name as in the log: `cuda:0`), for runs on several devices.
    pub per_device: BTreeMap<String, DeviceShare>,
}

/// One device's part of a pass (seconds).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceShare {
    pub candidates: u32,
    /// Waits of the leases granted on this device.
    pub lease_wait_s: f64,
    /// Leases held, reference preparation ahead of candidates included.
    pub lease_held_s: f64,
    /// The workers' time on requests inside candidates' leases (`busy_ms`).
    pub busy_s: f64,
    pub gpu_work_s: f64,
}

/// A pass's numbers from its log, folded by the run's reducer; `wall_s` is the pass's wall time.
pub fn throughput(run: &RunState, wall_s: f64) -> Throughput {
    let times = run.times();
    let ledger = run.ledger();
    let secs = |ms: u64| ms as f64 / 1000.0;
    let mut t = Throughput {
        wall_s,
        candidates: times.evaluated(),
        first_result_s: times
            .first_result_ts
            .zip(run.first_ts)
            .map(|(first, start)| secs(first.saturating_sub(start))),
        build_s: secs(times.build_ms),
        cpu_prep_s: secs(times.inputs_ms),
        load_s: times.phase_s("load_s"),
        check_s: times.phase_s("correctness_s"),
        timing_s: times.phase_s("timing_s"),
        isolation_s: times.phase_s("isolation_s") + times.phase_s("spawn_wait_s"),
        lease_wait_s: secs(ledger.device_total.wait_ms),
        gpu_work_s: secs(ledger.gpu_work_ms),
        ..Throughput::default()
    };
    // Devices that held a lease or prepared reference data (a device retired before either did
    // no work here).
    let used = run
        .devices
        .iter()
        .filter(|(_, d)| d.leases > 0 || d.prepares > 0);
    let mut prepare_ms = 0;
    let mut prepare_busy_ms = 0;
    for (name, d) in used {
        t.devices += 1;
        prepare_ms += d.prepare_ms;
        prepare_busy_ms += d.prepare_busy_ms;
        t.per_device.insert(
            name.clone(),
            DeviceShare {
                lease_wait_s: secs(d.wait_ms),
                lease_held_s: secs(d.held_ms + d.prepare_ms),
                busy_s: secs(d.busy_ms),
                ..DeviceShare::default()
            },
        );
    }
    for (name, n) in &times.evaluations {
        let d = t.per_device.entry(name.clone()).or_default();
        d.candidates = *n;
        d.gpu_work_s = secs(ledger.devices.get(name).map_or(0, |u| u.work_ms));
    }
    t.gpu_prep_s = secs(prepare_ms) + times.phase_s("reference_s") + times.phase_s("ref_timing_s");
    t.lease_held_s = secs(ledger.device_total.held_ms + prepare_ms);
    t.gpu_busy_s = secs(ledger.device_total.busy_ms + prepare_busy_ms);
    t.devices = t.devices.max(1);
    let gpu_hours = wall_s * f64::from(t.devices) / 3600.0;
    t.per_gpu_hour = if gpu_hours > 0.0 {
        f64::from(t.candidates) / gpu_hours
    } else {
        0.0
    };
    t
}

/// What bounds a pass from below (seconds unless named otherwise).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Floors {
    /// The cores the pass ran on (`resources.cpu_budget`, else the machine's).
    pub cores: u32,
    /// CPU seconds of the builds made, as their workers measured them (a build without a measure
    /// counts its wall time at one core).
    pub build_cpu_s: f64,
    /// Input makers' process-seconds (wall x processes: an upper bound of their CPU time).
    pub inputs_cpu_s: f64,
    /// (build + inputs CPU seconds) / cores.
    pub cpu_floor_s: f64,
    /// The busiest device's lease-held time, reference preparation included.
    pub gpu_floor_s: f64,
    /// Median CPU seconds of the builds made (0 when none was measured).
    pub median_build_cpu_s: f64,
}

/// A pass's floors from its log, its numbers and the cores it ran on.
pub fn floors(records: &[LogRecord], t: &Throughput, cores: u32) -> Floors {
    let mut f = Floors {
        cores: cores.max(1),
        ..Floors::default()
    };
    let mut builds = Vec::new();
    for r in records {
        match &r.event {
            Event::Compiled { outcome, .. } if !outcome.cached => {
                let cpu_s = outcome
                    .cpu
                    .as_ref()
                    .map_or(outcome.duration_ms, |c| c.cpu_ms) as f64
                    / 1000.0;
                f.build_cpu_s += cpu_s;
                if outcome.cpu.is_some() {
                    builds.push(cpu_s);
                }
            }
            Event::InputsPrepared { outcome, .. } => {
                f.inputs_cpu_s +=
                    outcome.duration_ms as f64 / 1000.0 * f64::from(outcome.parallel.max(1));
            }
            _ => {}
        }
    }
    builds.sort_by(f64::total_cmp);
    f.median_build_cpu_s = match builds.len() {
        0 => 0.0,
        n if n % 2 == 1 => builds[n / 2],
        n => (builds[n / 2 - 1] + builds[n / 2]) / 2.0,
    };
    f.cpu_floor_s = (f.build_cpu_s + f.inputs_cpu_s) / f64::from(f.cores);
    f.gpu_floor_s = t
        .per_device
        .values()
        .map(|d| d.lease_held_s)
        .fold(0.0, f64::max)
        .max(
            t.lease_held_s / f64::from(t.devices.max(1))
                * f64::from(u8::from(t.per_device.is_empty())),
        );
    f
}

/// Candidates per GPU-hour a pass would reach in `seconds` of wall time.
fn rate(t: &Throughput, seconds: f64) -> String {
    if seconds > 0.0 {
        format!(
            "{:.0}",
            f64::from(t.candidates) * 3600.0 / (seconds * f64::from(t.devices))
        )
    } else {
        "-".into()
    }
}

fn ratio(wall: f64, floor: f64) -> String {
    if floor > 0.0 {
        format!("{:.2}x", wall / floor)
    } else {
        "-".into()
    }
}

/// The floors' table: one column per pass, under the main table.
pub fn render_floors(passes: &[(&str, &Throughput, &Floors)]) -> String {
    let mut out = String::from(
        "
floors:
",
    );
    let _ = write!(out, "{:<34}", "");
    for (name, _, _) in passes {
        let _ = write!(out, "{name:>14}");
    }
    out.push('\n');
    type Row = (&'static str, fn(&Throughput, &Floors) -> String);
    let rows: [Row; 10] = [
        ("candidates per GPU-hour", |t, _| {
            format!("{:.0}", t.per_gpu_hour)
        }),
        ("cores", |_, f| f.cores.to_string()),
        ("build CPU (s, summed)", |_, f| {
            format!("{:.1}", f.build_cpu_s)
        }),
        ("median build CPU (s)", |_, f| {
            format!("{:.1}", f.median_build_cpu_s)
        }),
        ("inputs CPU, process-s (s)", |_, f| {
            format!("{:.1}", f.inputs_cpu_s)
        }),
        ("CPU floor (s)", |_, f| format!("{:.1}", f.cpu_floor_s)),
        ("per GPU-hour at the CPU floor", |t, f| {
            rate(t, f.cpu_floor_s)
        }),
        ("wall / CPU floor", |t, f| ratio(t.wall_s, f.cpu_floor_s)),
        ("GPU floor (s)", |_, f| format!("{:.1}", f.gpu_floor_s)),
        ("wall / GPU floor", |t, f| ratio(t.wall_s, f.gpu_floor_s)),
    ];
    for (label, value) in rows {
        let _ = write!(out, "{label:<34}");
        for (_, t, f) in passes {
            let _ = write!(out, "{:>14}", value(t, f));
        }
        out.push('\n');
    }
    out.push_str(
        "CPU floor: (builds' measured CPU + input makers' process-seconds) / cores. GPU floor: the busiest\n\
         device's lease-held time. per GPU-hour at the CPU floor: the rate were the pass as long as its CPU floor.\n",
    );
    out
}

/// The cores a pass runs on: `resources.cpu_budget` among the `--set`s, else the machine's.
pub fn cores_of(sets: &[String]) -> u32 {
    sets.iter()
        .rev()
        .find_map(|s| {
            let (key, value) = s.split_once('=')?;
            (key.trim() == "resources.cpu_budget")
                .then(|| value.trim().parse::<u32>().ok())
                .flatten()
        })
        .unwrap_or_else(crate::cpu_budget::available_cores)
}

fn pct(part: f64, whole: f64) -> String {
    if whole > 0.0 {
        format!("{:.0} %", 100.0 * part / whole)
    } else {
        "-".into()
    }
}

/// The table: one column per pass.
pub fn render(passes: &[(&str, &Throughput)]) -> String {
    let mut out = String::new();
    let _ = write!(out, "{:<34}", "");
    for (name, _) in passes {
        let _ = write!(out, "{name:>14}");
    }
    out.push('\n');
    type Row = (&'static str, fn(&Throughput) -> String);
    let rows: [Row; 19] = [
        ("candidates evaluated", |t| t.candidates.to_string()),
        ("devices", |t| t.devices.to_string()),
        ("wall (s)", |t| format!("{:.1}", t.wall_s)),
        ("candidates per GPU-hour", |t| {
            format!("{:.0}", t.per_gpu_hour)
        }),
        ("time to first result (s)", |t| {
            t.first_result_s.map_or("-".into(), |s| format!("{s:.1}"))
        }),
        ("build (s, summed)", |t| format!("{:.1}", t.build_s)),
        ("CPU preparation, no lease (s)", |t| {
            format!("{:.1}", t.cpu_prep_s)
        }),
        ("GPU preparation, reference (s)", |t| {
            format!("{:.1}", t.gpu_prep_s)
        }),
        ("load (s)", |t| format!("{:.1}", t.load_s)),
        ("check (s)", |t| format!("{:.1}", t.check_s)),
        ("timing (s)", |t| format!("{:.1}", t.timing_s)),
        ("isolation (s)", |t| format!("{:.1}", t.isolation_s)),
        ("lease waits (s, summed)", |t| {
            format!("{:.1}", t.lease_wait_s)
        }),
        ("lease held (s)", |t| format!("{:.1}", t.lease_held_s)),
        ("GPU work measured (s)", |t| format!("{:.2}", t.gpu_work_s)),
        ("GPU busy, worker-measured (s)", |t| {
            format!("{:.1}", t.gpu_busy_s)
        }),
        ("lease held / wall x devices", |t| {
            pct(t.lease_held_s, t.wall_s * f64::from(t.devices))
        }),
        ("GPU busy: work / wall x devices", |t| {
            pct(t.gpu_work_s, t.wall_s * f64::from(t.devices))
        }),
        ("GPU busy: worker / wall x devices", |t| {
            pct(t.gpu_busy_s, t.wall_s * f64::from(t.devices))
        }),
    ];
    for (label, value) in rows {
        let _ = write!(out, "{label:<34}");
        for (_, t) in passes {
            let _ = write!(out, "{:>14}", value(t));
        }
        out.push('\n');
    }
    out.push_str(
        "GPU work measured: timed trials only (mean x trials of candidates and references), a lower bound.\n\
         GPU busy, worker-measured: the worker's device phases (forwards, correctness, timing, reference steps).\n",
    );
    for (name, t) in passes {
        if t.per_device.len() > 1 {
            out.push_str(&render_devices(name, t));
        }
    }
    out
}

/// A pass's devices side by side: how evenly the work spread, and how busy each one was.
pub fn render_devices(pass: &str, t: &Throughput) -> String {
    let mut out = format!("\n{pass}, per device:\n");
    let _ = writeln!(
        out,
        "{:<10}{:>12}{:>16}{:>12}{:>18}{:>16}{:>16}",
        "device",
        "candidates",
        "lease held (s)",
        "busy (s)",
        "GPU work (s)",
        "lease waits (s)",
        "work / wall"
    );
    for (device, d) in &t.per_device {
        let _ = writeln!(
            out,
            "{device:<10}{:>12}{:>16.1}{:>12.1}{:>18.2}{:>16.1}{:>16}",
            d.candidates,
            d.lease_held_s,
            d.busy_s,
            d.gpu_work_s,
            d.lease_wait_s,
            pct(d.gpu_work_s, t.wall_s)
        );
    }
    out
}

/// Run the passes and render their table.
pub fn run(b: ThroughputBench) -> anyhow::Result<String> {
    let Some((items, level)) = super::eval::generations_of(&b.src, &b.dataset, b.level, false)?
    else {
        anyhow::bail!("nothing to evaluate");
    };
    let (work, temporary) = match &b.work_dir {
        Some(dir) => (std::path::absolute(dir)?, false),
        None => (
            std::env::temp_dir().join(format!("krefine-bench-throughput-{}", std::process::id())),
            true,
        ),
    };
    let result = passes(&b, &items, level, &work);
    if temporary {
        let _ = std::fs::remove_dir_all(&work);
    }
    result
}

fn passes(
    b: &ThroughputBench,
    items: &[crate::interchange::Generation],
    level: u32,
    work: &std::path::Path,
) -> anyhow::Result<String> {
    let refs = work.join("refs");
    for pass in ["cold", "warm"] {
        anyhow::ensure!(
            !work.join(pass).exists(),
            "{} already exists: choose an empty --work-dir",
            work.join(pass).display()
        );
    }
    let mut results: Vec<(&str, Throughput)> = Vec::new();
    let mut bounds: Vec<Floors> = Vec::new();
    let cores = cores_of(&b.sets);
    let passes: &[&str] = if b.cold_only {
        &["cold"]
    } else {
        &["cold", "warm"]
    };
    for pass in passes {
        let builds = if *pass == "warm" && b.warm_builds {
            work.join("cold").join("build-cache")
        } else {
            work.join(pass).join("build-cache")
        };
        let mut sets = b.sets.clone();
        sets.push(format!("eval.build_cache=\"{}\"", builds.display()));
        sets.push(format!("eval.reference_cache=\"{}\"", refs.display()));
        let out = work.join(pass).join("run");
        eprintln!("bench throughput: {pass} pass into {}", out.display());
        let started = Instant::now();
        super::eval::evaluate(items, &b.dataset, level, &out, &sets, false)
            .with_context(|| format!("the {pass} pass"))?;
        let wall_s = started.elapsed().as_secs_f64();
        let log = crate::store::read_log(&out.join(crate::store::EVENTS_FILE))?;
        let run = RunState::from_records(&log.records);
        let t = throughput(&run, wall_s);
        bounds.push(floors(&log.records, &t, cores));
        results.push((pass, t));
    }
    let mut text = format!(
        "{} candidate(s) of level {level} from {}; caches under {}\n",
        items.len(),
        b.src.display(),
        work.display()
    );
    let table: Vec<(&str, &Throughput)> = results.iter().map(|(n, t)| (*n, t)).collect();
    text.push_str(&render(&table));
    let with_floors: Vec<(&str, &Throughput, &Floors)> = results
        .iter()
        .zip(&bounds)
        .map(|((n, t), f)| (*n, t, f))
        .collect();
    text.push_str(&render_floors(&with_floors));
    Ok(text)
}

#[cfg(test)]
mod tests {
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
            let mut o = json!({"status": "ok", "cached": cached, "feedback": "", "duration_ms": duration_ms});
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
            compiled(2_000, false, Some(20_000), 10_000),
            compiled(3_000, false, Some(10_000), 5_000),
            compiled(3_500, false, Some(14_000), 7_000),
            compiled(3_600, true, None, 1),
            // A build without its measure counts its wall time at one core.
            compiled(4_000, false, None, 4_000),
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
        assert_eq!(f.build_cpu_s, 48.0);
        assert_eq!(f.median_build_cpu_s, 14.0, "the measured builds' median");
        assert_eq!(f.inputs_cpu_s, 60.0);
        assert_eq!(f.cpu_floor_s, 27.0, "(48 + 60) / 4 cores");
        assert_eq!(f.gpu_floor_s, 40.0, "the busiest device");
        let text = render_floors(&[("cold", &t, &f)]);
        let row = |label: &str| {
            text.lines()
                .find(|l| l.starts_with(label))
                .map(|l| l[34..].trim().to_string())
                .unwrap_or_default()
        };
        // 2 candidates in 100 s on 2 devices: 36 per GPU-hour; in 27 s: 133.
        assert_eq!(row("candidates per GPU-hour"), "36");
        assert_eq!(row("per GPU-hour at the CPU floor"), "133");
        assert_eq!(row("wall / CPU floor"), "3.70x");
        assert_eq!(row("wall / GPU floor"), "2.50x");
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
}
