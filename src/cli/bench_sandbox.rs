//! `krefine bench sandbox`: what the sandbox costs.
//!
//! - per worker start: `python -S -c pass` started plainly and started in a worker's sandbox
//!   (namespaces, read-only view, hidden home and /tmp, a copy-on-write build cache), side by side;
//! - per candidate: `kb_sandbox.enter_candidate` (no_new_privs and Landlock), timed inside Python,
//!   as the harness calls it in each single-use candidate process.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::worker::sandbox::{self, Overlay, SandboxSpec};

pub fn bench_sandbox(python: Option<PathBuf>, runs: u32) -> anyhow::Result<ExitCode> {
    let rt = super::runtime()?;
    let python = rt.block_on(crate::worker::find_python(python.as_deref(), None))?;
    let tmp = std::env::temp_dir().join(format!("krefine-bench-sandbox-{}", std::process::id()));
    let result = run(&rt, &python, &tmp, runs.max(3));
    let _ = std::fs::remove_dir_all(&tmp);
    let text = result?;
    super::print_out(&text)?;
    Ok(ExitCode::SUCCESS)
}

fn run(
    rt: &tokio::runtime::Runtime,
    python: &Path,
    tmp: &Path,
    runs: u32,
) -> anyhow::Result<String> {
    let scratch = tmp.join("scratch/w0");
    let cow = tmp.join("scratch/w0.cow");
    let cache = tmp.join("build-cache");
    for d in [&scratch, &cow.join("upper"), &cow.join("work"), &cache] {
        std::fs::create_dir_all(d).with_context(|| format!("create {}", d.display()))?;
    }
    let harness = rt.block_on(crate::worker::deploy_harness(&tmp.join("harness")))?;
    let mut hidden = SandboxSpec::default_hidden();
    hidden.push(tmp.join("scratch"));
    let mut visible = sandbox::python_dirs(python);
    visible.push(harness.clone());
    let spec = SandboxSpec {
        writable: vec![scratch.clone(), cow.clone()],
        visible,
        hidden,
        overlays: vec![Overlay {
            target: cache,
            upper: cow.join("upper"),
            work: cow.join("work"),
        }],
        cwd: scratch.clone(),
    };
    let mut plain = Vec::new();
    let mut boxed = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let status = Command::new(python)
            .args(["-S", "-c", "pass"])
            .current_dir(&scratch)
            .env_clear()
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("start python")?;
        anyhow::ensure!(status.success(), "plain python failed: {status}");
        plain.push(t.elapsed());
        // A fresh overlay work folder each time, as at every worker spawn.
        let _ = std::fs::remove_dir_all(cow.join("work"));
        std::fs::create_dir_all(cow.join("work"))?;
        let t = Instant::now();
        sandbox::run_sandboxed(python, &spec, "pass")
            .map_err(|e| anyhow::anyhow!("sandboxed python failed: {e}"))?;
        boxed.push(t.elapsed());
    }
    let code = format!(
        "import sys, time\nsys.path.insert(0, {h:?})\nimport kb_sandbox\nt = time.perf_counter()\nr = kb_sandbox.enter_candidate({s:?}, [])\nprint((time.perf_counter() - t) * 1e3, ','.join(r['layers']))",
        h = harness.display().to_string(),
        s = scratch.display().to_string()
    );
    let mut enter = Vec::new();
    let mut layers = String::new();
    for _ in 0..runs {
        let out = Command::new(python)
            .args(["-S", "-c", &code])
            .current_dir(&scratch)
            .env_clear()
            .output()
            .context("start python")?;
        anyhow::ensure!(
            out.status.success(),
            "enter_candidate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (ms, names) = text.trim().split_once(' ').unwrap_or((text.trim(), ""));
        let ms: f64 = ms.parse().unwrap_or(f64::NAN);
        layers = names.to_string();
        enter.push(Duration::from_secs_f64(ms.max(0.0) / 1e3));
    }
    let (p, b, e) = (stats(&mut plain), stats(&mut boxed), stats(&mut enter));
    Ok(format!(
        "sandbox cost, {runs} runs each ({python})\n\
         per worker start   plain python -S:      median {:.1} ms  p90 {:.1} ms\n\
         \x20                  sandboxed python -S:  median {:.1} ms  p90 {:.1} ms\n\
         \x20                  overhead:             median {:.1} ms\n\
         per candidate      enter_candidate:      median {:.2} ms  p90 {:.2} ms  ({layers})",
        p.0,
        p.1,
        b.0,
        b.1,
        b.0 - p.0,
        e.0,
        e.1,
        python = python.display()
    ))
}

/// (median, p90) in milliseconds.
fn stats(v: &mut [Duration]) -> (f64, f64) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (ms(at(0.5)), ms(at(0.9)))
}
