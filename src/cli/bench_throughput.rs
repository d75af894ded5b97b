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
    /// Median CPU seconds of the builds that compiled an extension (`build_path` recorded: fast,
    /// plain or fallback), 0 when none was measured. A candidate in plain PyTorch also passes through
    /// a build (its import checked in a fraction of a second): counted, it would pull the median of a
    /// batch's CUDA builds down (12.9 against 19.9 CPU s on the H200 batch of 2026-12-02).
    pub median_build_cpu_s: f64,
    /// The builds that compiled an extension and were measured (the median's sample).
    pub extension_builds: u32,
    /// Problems whose inputs the pass made, and those it found stored (`hit`): by an earlier pass,
    /// or, in the in-memory tier kept between runs (`resources.reference_ram_keep`), by an earlier
    /// run on the machine.
    pub inputs_made: u32,
    pub inputs_found: u32,
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
                if outcome.cpu.is_some() && outcome.build_path.is_some() {
                    builds.push(cpu_s);
                }
            }
            Event::InputsPrepared { outcome, .. } => {
                f.inputs_cpu_s +=
                    outcome.duration_ms as f64 / 1000.0 * f64::from(outcome.parallel.max(1));
                match outcome.status.as_str() {
                    "generated" => f.inputs_made += 1,
                    "hit" => f.inputs_found += 1,
                    _ => {}
                }
            }
            _ => {}
        }
    }
    builds.sort_by(f64::total_cmp);
    f.extension_builds = u32::try_from(builds.len()).unwrap_or(u32::MAX);
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
    let rows: [Row; 12] = [
        ("candidates per GPU-hour", |t, _| {
            format!("{:.0}", t.per_gpu_hour)
        }),
        ("cores", |_, f| f.cores.to_string()),
        ("problems' inputs made / found", |_, f| {
            format!("{} / {}", f.inputs_made, f.inputs_found)
        }),
        ("build CPU (s, summed)", |_, f| {
            format!("{:.1}", f.build_cpu_s)
        }),
        ("extension builds", |_, f| f.extension_builds.to_string()),
        ("median extension build CPU (s)", |_, f| {
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
    if let Some((_, _, f)) = passes
        .iter()
        .find(|(name, _, f)| *name == "cold" && f.inputs_found > 0)
    {
        // The cold pass's stores are fresh folders, but the in-memory tier kept between runs is the
        // machine's: what it held was not made in this pass, and the pass is not cold for it.
        let _ = writeln!(
            out,
            "NOT COLD: the cold pass found {} problem(s)' inputs stored by an earlier run (the in-memory tier\n\
             kept between runs on this machine, /dev/shm/krefine-inputs.kept, or the work dir's refs/); for a\n\
             cold figure remove them first, or pass --set resources.reference_ram_keep=false.",
            f.inputs_found
        );
    }
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
    let mut traces: Vec<(&str, super::lease_trace::TraceSum)> = Vec::new();
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
        // The lease trace on (first, so a `--set eval.lease_trace=false` of the user's wins).
        let mut sets = vec!["eval.lease_trace=true".to_string()];
        sets.extend(b.sets.iter().cloned());
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
        traces.push((
            *pass,
            super::lease_trace::sum_logs(&out.join("logs").join("workers")),
        ));
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
    let traced: Vec<(&str, &super::lease_trace::TraceSum)> =
        traces.iter().map(|(n, s)| (*n, s)).collect();
    text.push_str(&super::lease_trace::render(&traced));
    Ok(text)
}

#[cfg(test)]
#[path = "bench_throughput_tests.rs"]
mod tests;
