//! `krefine bench compile`: every candidate built the plain `load_inline` way and krefine's fast way,
//! side by side in one run, each build cold (a fresh Python process and a fresh build directory).
//!
//! The builds run through the harness's own build code (`kb_bench.py build`), so the fast path measured
//! is the one compile workers use. Precompiled headers are per (compiler, torch, flags), not per
//! candidate: they are made once before the timed builds and their cost is reported on its own line.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::Context;
use serde::Deserialize;

use crate::worker::harness::deploy_harness;
use crate::worker::python::find_python;

/// What the command was asked to do.
pub struct CompileBench {
    pub paths: Vec<PathBuf>,
    pub python: Option<PathBuf>,
    pub arch: Option<String>,
    pub jobs: usize,
    pub compare_code: bool,
    pub work_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Plain,
    Fast,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Fast => "fast",
        }
    }
}

/// One build's report (`kb_bench.py build` prints it as one JSON line).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct BuildReport {
    pub ok: bool,
    pub seconds: f64,
    #[serde(default)]
    pub cpu_seconds: f64,
    #[serde(default)]
    pub build_path: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
}

#[derive(Debug, Deserialize)]
struct PchReport {
    ok: bool,
    pch: Option<String>,
    seconds: f64,
}

#[derive(Debug, Deserialize)]
struct CompareReport {
    objects: std::collections::BTreeMap<String, String>,
}

/// A candidate's two builds and, when asked, whether their machine code matched.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub name: String,
    pub plain: BuildReport,
    pub fast: BuildReport,
    pub code: Option<String>,
}

/// The side-by-side builds (`--across-runs` is `bench_pch::run`, chosen by the caller).
pub fn run(args: CompileBench) -> anyhow::Result<String> {
    let candidates = collect(&args.paths)?;
    anyhow::ensure!(!candidates.is_empty(), "no candidate files (*.py) found");
    let rt = super::runtime()?;
    let python = rt
        .block_on(find_python(args.python.as_deref(), None))
        .context("finding the worker Python")?;
    let (work, temporary) = match &args.work_dir {
        Some(dir) => (dir.clone(), false),
        None => (
            std::env::temp_dir().join(format!("krefine-bench-compile-{}", std::process::id())),
            true,
        ),
    };
    let builds = work.join("builds");
    std::fs::create_dir_all(&builds).with_context(|| format!("creating {}", builds.display()))?;
    let harness = rt
        .block_on(deploy_harness(&work.join("harness")))
        .context("deploying the harness")?;
    let driver = harness.join("kb_bench.py");
    let runner = Runner {
        python: python.clone(),
        driver,
        arch: args.arch.clone(),
        builds: builds.clone(),
    };

    // Precompiled headers first: shared by every candidate with the same flags (concurrent warm-ups
    // of one header wait for a single builder).
    let warm: Vec<(String, PathBuf)> = candidates.clone();
    let warmed = pool(warm, args.jobs, |(name, path)| {
        let out = runner.python_json(&[
            "pch",
            "--source",
            &path.to_string_lossy(),
            "--build-dir",
            &builds.join(format!("{name}-warm")).to_string_lossy(),
            "--log",
            &builds.join(format!("{name}-warm.log")).to_string_lossy(),
        ])?;
        let report: PchReport = serde_json::from_str(&out)
            .with_context(|| format!("reading the warm-up report of {name}: {out}"))?;
        eprintln!("warm-up {name}: {out}");
        Ok(report)
    })?;
    let mut pch_s: f64 = 0.0;
    let mut headers = std::collections::BTreeSet::new();
    for report in warmed {
        if report.ok
            && let Some(pch) = report.pch.filter(|p| !p.is_empty())
        {
            headers.insert(pch);
            pch_s = pch_s.max(report.seconds);
        }
    }

    let mut jobs = Vec::new();
    for (i, (name, path)) in candidates.iter().enumerate() {
        // Alternate which build goes first, so neither path always meets the busier moment.
        let order = if i % 2 == 0 {
            [Mode::Plain, Mode::Fast]
        } else {
            [Mode::Fast, Mode::Plain]
        };
        for mode in order {
            jobs.push((i, name.clone(), path.clone(), mode));
        }
    }
    let started = Instant::now();
    let results = pool(jobs, args.jobs, |(i, name, path, mode)| {
        let report = runner.build(&name, &path, mode)?;
        eprintln!("{name} {}: {report:?}", mode.as_str());
        Ok((i, mode, report))
    })?;
    let wall = started.elapsed().as_secs_f64();
    let mut rows: Vec<Row> = candidates
        .iter()
        .map(|(name, _)| Row {
            name: name.clone(),
            plain: BuildReport::default(),
            fast: BuildReport::default(),
            code: None,
        })
        .collect();
    for (i, mode, report) in results {
        match mode {
            Mode::Plain => rows[i].plain = report,
            Mode::Fast => rows[i].fast = report,
        }
    }
    if args.compare_code {
        // Disassembling is quick but not free (a debug-sized main.o per build): in parallel too.
        let both: Vec<(usize, String)> = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.plain.ok && r.fast.ok)
            .map(|(i, r)| (i, r.name.clone()))
            .collect();
        let verdicts = pool(both, args.jobs, |(i, name)| {
            let out = runner.python_json(&[
                "compare",
                &builds.join(format!("{name}-plain")).to_string_lossy(),
                &builds.join(format!("{name}-fast")).to_string_lossy(),
            ])?;
            let report: CompareReport = serde_json::from_str(&out)
                .with_context(|| format!("reading the code comparison of {name}: {out}"))?;
            eprintln!("compare {name}: {out}");
            Ok((i, code_verdict(&report.objects)))
        })?;
        for (i, verdict) in verdicts {
            rows[i].code = Some(verdict);
        }
    }
    if temporary {
        let _ = std::fs::remove_dir_all(&work);
    }
    let header = format!(
        "compile benchmark: {} candidates, python {}, {} build(s) at once, arch {}\nprecompiled headers made before the timed builds: {} (longest warm-up {:.1} s; once per compiler, torch and flags)\nall timed builds: {:.1} s wall\n",
        rows.len(),
        python.display(),
        args.jobs.max(1),
        args.arch.as_deref().unwrap_or("(worker default)"),
        headers.len(),
        pch_s,
        wall
    );
    Ok(format!("{header}\n{}", table(&rows)))
}

/// Run `f` over `items` on `jobs` threads; results in completion order, or the first error.
fn pool<T: Send, R: Send>(
    items: Vec<T>,
    jobs: usize,
    f: impl Fn(T) -> anyhow::Result<R> + Sync,
) -> anyhow::Result<Vec<R>> {
    let queue = Mutex::new(VecDeque::from(items));
    let results = Mutex::new(Vec::new());
    let first_error: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| {
                loop {
                    let next = queue.lock().ok().and_then(|mut q| q.pop_front());
                    let Some(item) = next else { break };
                    match f(item) {
                        Ok(r) => {
                            if let Ok(mut out) = results.lock() {
                                out.push(r);
                            }
                        }
                        Err(e) => {
                            if let Ok(mut slot) = first_error.lock() {
                                slot.get_or_insert(e);
                            }
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = first_error.into_inner().ok().flatten() {
        return Err(e);
    }
    Ok(results.into_inner().unwrap_or_default())
}

/// `identical (n objects)`, or which objects differ or could not be read. A split build (two
/// units where the plain build has one) is compared function by function, and always says so:
/// `split candidate functions identical, split other functions 194 of 220 identical`.
fn code_verdict(objects: &std::collections::BTreeMap<String, String>) -> String {
    let odd: Vec<String> = objects
        .iter()
        .filter(|(k, v)| v.as_str() != "identical" || k.starts_with("split "))
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    if odd.is_empty() {
        format!("identical ({} objects)", objects.len())
    } else {
        odd.join(", ")
    }
}

pub(super) struct Runner {
    python: PathBuf,
    driver: PathBuf,
    arch: Option<String>,
    builds: PathBuf,
}

impl Runner {
    pub(super) fn new(
        python: PathBuf,
        driver: PathBuf,
        args: &CompileBench,
        builds: &Path,
    ) -> Self {
        Runner {
            python,
            driver,
            arch: args.arch.clone(),
            builds: builds.to_path_buf(),
        }
    }

    pub(super) fn build(
        &self,
        name: &str,
        source: &Path,
        mode: Mode,
    ) -> anyhow::Result<BuildReport> {
        let dir = self.builds.join(format!("{name}-{}", mode.as_str()));
        // A cold build: nothing of an earlier run may be reused.
        let _ = std::fs::remove_dir_all(&dir);
        let log = self.builds.join(format!("{name}-{}.log", mode.as_str()));
        let mut args = vec![
            "build".to_string(),
            "--mode".into(),
            mode.as_str().into(),
            "--source".into(),
            source.to_string_lossy().into_owned(),
            "--build-dir".into(),
            dir.to_string_lossy().into_owned(),
            "--log".into(),
            log.to_string_lossy().into_owned(),
        ];
        if let Some(arch) = &self.arch {
            args.extend(["--arch".to_string(), arch.clone()]);
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self.python_json(&refs)?;
        serde_json::from_str(&out).with_context(|| {
            format!(
                "reading the {} build report of {name}: {out}",
                mode.as_str()
            )
        })
    }

    /// Run the driver; its last stdout line is a JSON report.
    fn python_json(&self, args: &[&str]) -> anyhow::Result<String> {
        // ninja and the compilers next to the interpreter (a venv's bin) come first, as for workers.
        let mut path = std::env::var_os("PATH").unwrap_or_default();
        if let Some(bin) = self.python.parent() {
            let mut dirs = vec![bin.to_path_buf()];
            dirs.extend(std::env::split_paths(&path));
            path = std::env::join_paths(dirs).context("building PATH")?;
        }
        let out = Command::new(&self.python)
            .arg(&self.driver)
            .args(args)
            .env("PATH", path)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", self.python.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let last = stdout.lines().rev().find(|l| l.starts_with('{'));
        match last {
            Some(line) if out.status.success() => Ok(line.to_string()),
            _ => anyhow::bail!(
                "{} {} failed ({}): {}",
                self.driver.display(),
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .rev()
                    .take(20)
                    .collect::<Vec<_>>()
                    .join("\n")
            ),
        }
    }
}

/// Candidate files: the `*.py` files named, and those directly inside the folders named, by name.
pub(super) fn collect(paths: &[PathBuf]) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let entries =
                std::fs::read_dir(p).with_context(|| format!("reading {}", p.display()))?;
            for e in entries {
                let path = e?.path();
                if path.extension().is_some_and(|x| x == "py") {
                    files.push(path);
                }
            }
        } else if p.is_file() {
            files.push(p.clone());
        } else {
            anyhow::bail!("{}: no such file or folder", p.display());
        }
    }
    files.sort();
    files.dedup();
    let mut out = Vec::new();
    for f in files {
        let stem = f
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let canonical =
            std::fs::canonicalize(&f).with_context(|| format!("reading {}", f.display()))?;
        // Two folders may hold files of one name; builds are keyed by name.
        let name = if out.iter().any(|(n, _): &(String, PathBuf)| *n == stem) {
            format!("{stem}-{}", out.len())
        } else {
            stem
        };
        out.push((name, canonical));
    }
    Ok(out)
}

fn ratio(fast: f64, plain: f64) -> Option<f64> {
    (plain > 0.0 && fast > 0.0).then(|| fast / plain)
}

/// The side-by-side table: per candidate, then totals over candidates whose both builds succeeded.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| candidate | plain s | fast s | ratio | plain CPU s | fast CPU s | CPU ratio | fast build path | machine code |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    let (mut plain_s, mut fast_s, mut plain_cpu, mut fast_cpu) = (0.0, 0.0, 0.0, 0.0);
    let mut logs = Vec::new();
    for r in rows {
        let cell = |b: &BuildReport, v: f64| {
            if b.ok {
                format!("{v:.1}")
            } else {
                format!("failed ({v:.1})")
            }
        };
        let both = r.plain.ok && r.fast.ok;
        let fmt_ratio = |x: Option<f64>| x.map(|v| format!("{v:.2}")).unwrap_or("-".into());
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            cell(&r.plain, r.plain.seconds),
            cell(&r.fast, r.fast.seconds),
            fmt_ratio(ratio(r.fast.seconds, r.plain.seconds).filter(|_| both)),
            cell(&r.plain, r.plain.cpu_seconds),
            cell(&r.fast, r.fast.cpu_seconds),
            fmt_ratio(ratio(r.fast.cpu_seconds, r.plain.cpu_seconds).filter(|_| both)),
            r.fast.build_path.as_deref().unwrap_or("-"),
            r.code.as_deref().unwrap_or("-"),
        );
        if both {
            plain_s += r.plain.seconds;
            fast_s += r.fast.seconds;
            plain_cpu += r.plain.cpu_seconds;
            fast_cpu += r.fast.cpu_seconds;
            if let Some(x) = ratio(r.fast.seconds, r.plain.seconds) {
                logs.push(x.ln());
            }
        }
    }
    let fmt = |x: Option<f64>| x.map(|v| format!("{v:.2}")).unwrap_or("-".into());
    let _ = writeln!(
        out,
        "| **total** ({} built both ways) | {plain_s:.1} | {fast_s:.1} | **{}** | {plain_cpu:.1} | {fast_cpu:.1} | **{}** | | |",
        logs.len(),
        fmt(ratio(fast_s, plain_s)),
        fmt(ratio(fast_cpu, plain_cpu)),
    );
    let geomean = (!logs.is_empty()).then(|| (logs.iter().sum::<f64>() / logs.len() as f64).exp());
    let _ = write!(
        out,
        "\ngeomean of per-candidate wall ratios: {}",
        fmt(geomean)
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(ok: bool, seconds: f64, cpu: f64, path: Option<&str>) -> BuildReport {
        BuildReport {
            ok,
            seconds,
            cpu_seconds: cpu,
            build_path: path.map(str::to_string),
            error: None,
        }
    }

    #[test]
    fn table_totals_only_candidates_built_both_ways() {
        let rows = vec![
            Row {
                name: "a".into(),
                plain: report(true, 20.0, 40.0, Some("plain")),
                fast: report(true, 5.0, 10.0, Some("fast")),
                code: Some("identical (1 objects)".into()),
            },
            Row {
                name: "b".into(),
                plain: report(true, 10.0, 20.0, Some("plain")),
                fast: report(true, 10.0, 20.0, Some("fallback:fast-build-failed")),
                code: None,
            },
            Row {
                name: "c".into(),
                plain: report(false, 3.0, 6.0, Some("plain")),
                fast: report(false, 4.0, 8.0, Some("fallback:fast-build-failed")),
                code: None,
            },
        ];
        let t = table(&rows);
        assert!(t.contains(
            "| a | 20.0 | 5.0 | 0.25 | 40.0 | 10.0 | 0.25 | fast | identical (1 objects) |"
        ));
        assert!(t.contains("| b | 10.0 | 10.0 | 1.00 |"));
        assert!(t.contains("| c | failed (3.0) | failed (4.0) | - |"));
        assert!(t.contains(
            "| **total** (2 built both ways) | 30.0 | 15.0 | **0.50** | 60.0 | 30.0 | **0.50** |"
        ));
        assert!(t.ends_with("geomean of per-candidate wall ratios: 0.50"));
    }

    #[test]
    fn code_verdict_names_the_objects_that_differ() {
        let mut m = std::collections::BTreeMap::new();
        m.insert("e/main.o".to_string(), "identical".to_string());
        assert_eq!(code_verdict(&m), "identical (1 objects)");
        let mut split = std::collections::BTreeMap::new();
        split.insert(
            "split candidate functions".to_string(),
            "identical".to_string(),
        );
        split.insert(
            "split other functions".to_string(),
            "194 of 220 identical".to_string(),
        );
        assert_eq!(
            code_verdict(&split),
            "split candidate functions identical, split other functions 194 of 220 identical"
        );
        m.insert("e/cuda.cuda.o".to_string(), "different".to_string());
        assert_eq!(code_verdict(&m), "e/cuda.cuda.o different");
    }

    #[test]
    fn collect_rejects_missing_paths_and_keeps_names_unique() {
        let dir = tempfile::tempdir().expect("tempdir");
        for sub in ["x", "y"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
            std::fs::write(dir.path().join(sub).join("k.py"), "").expect("write");
            std::fs::write(dir.path().join(sub).join("notes.txt"), "").expect("write");
        }
        let got = collect(&[dir.path().join("x"), dir.path().join("y")]).expect("collect");
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["k", "k-1"]);
        assert!(collect(&[dir.path().join("missing")]).is_err());
    }
}
