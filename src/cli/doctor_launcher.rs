//! `krefine doctor CONFIG` with a remote launcher: the allocation or the hosts, and one worker
//! started at every place a run would start one (each evaluation device, one compile worker per
//! SSH host or one compile step), each reporting where it runs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::config::LoadedConfig;
use crate::launcher::{self, Launcher, Placement};
use crate::worker::process::{Remote, SpawnSpec, WorkerProcess};
use crate::worker::protocol::WorkerRole;

/// Print the launcher section; false when a worker could not be started somewhere.
pub(super) async fn check(loaded: &LoadedConfig, python: Option<&PathBuf>) -> bool {
    let r = &loaded.config.resources;
    println!("Launcher (resources.launcher = {}):", r.launcher.as_str());
    if r.launcher == launcher::LauncherKind::Local {
        println!("  workers are child processes of krefine on this machine");
        return true;
    }
    let Some(python) = python else {
        println!("  workers not checked (no Python with torch)");
        return false;
    };
    let l = match Launcher::start(r, &tokio_util::sync::CancellationToken::new()).await {
        Ok(l) => Arc::new(l),
        Err(e) => {
            println!("  {e}");
            return false;
        }
    };
    println!("  {}", l.describe());
    let ok = start_each(loaded, python, &l).await;
    l.release().await;
    ok
}

async fn start_each(loaded: &LoadedConfig, python: &Path, l: &Arc<Launcher>) -> bool {
    let out = match std::path::absolute(&loaded.config.output.dir) {
        Ok(o) => o,
        Err(e) => {
            println!("  output.dir: {e}");
            return false;
        }
    };
    let harness = match crate::worker::deploy_harness(&out.join(".harness")).await {
        Ok(h) => h,
        Err(e) => {
            println!("  {e}");
            return false;
        }
    };
    println!(
        "  harness {} and build cache {} must be at these paths on every node (a shared file \
         system)",
        harness.display(),
        loaded
            .config
            .eval
            .build_cache
            .clone()
            .unwrap_or_else(|| out.join(".build-cache"))
            .display()
    );
    let scratch = std::env::temp_dir().join(format!("krefine-doctor-{}", std::process::id()));
    let devices = match launcher::planned_devices(&loaded.config.resources) {
        Ok(Some(d)) => d,
        Ok(None) => Vec::new(),
        Err(e) => {
            println!("  {e}");
            return false;
        }
    };
    let mut places: Vec<(String, WorkerRole, Placement, Option<String>)> = devices
        .iter()
        .map(|d| {
            // As the pool does: a GPU step gets its GPU from the launcher, the CPU device none.
            let cvd = (d.id == crate::services::DeviceId::Cpu).then(String::new);
            (
                format!("eval {}", d.id),
                WorkerRole::Gpu,
                l.eval_placement(&d.id),
                cvd,
            )
        })
        .collect();
    let compile_places = match loaded.config.resources.launcher {
        launcher::LauncherKind::Ssh => l.ssh_hosts().len(),
        _ => 1,
    };
    for i in 0..compile_places {
        places.push((
            format!("compile {i}"),
            WorkerRole::Compile,
            l.compile_placement(i),
            Some(String::new()),
        ));
    }
    let checks = places.into_iter().map(|(what, role, at, cvd)| {
        let name = what.replace(' ', "-").replace(':', "");
        let spec = SpawnSpec {
            scratch: scratch.join(&name),
            log_path: scratch.join(format!("{name}.log")),
            name,
            role,
            python: python.to_path_buf(),
            harness_dir: harness.clone(),
            cuda_visible_devices: cvd,
            arch_list: None,
            load_timeout: Duration::from_secs(300),
            extra_env: Vec::new(),
            sandbox: None,
            remote: Some(Remote {
                launcher: l.clone(),
                placement: at,
            }),
        };
        async move {
            let started = std::time::Instant::now();
            let r = WorkerProcess::spawn(&spec).await;
            (what, spec, r, started.elapsed())
        }
    });
    let mut ok = true;
    for (what, _spec, r, took) in futures::future::join_all(checks).await {
        match r {
            Ok(w) => {
                let on = l.ran_on(w.ready().placement.as_deref());
                let mut line = format!(
                    "  {what}: ready in {:.1} s on {}",
                    took.as_secs_f64(),
                    on.host
                );
                if let (Some(j), Some(s)) = (&on.slurm_job, &on.slurm_step) {
                    line.push_str(&format!(" (step {j}.{s})"));
                }
                if let Some(d) = &w.ready().device {
                    line.push_str(&format!(", {}", d.name));
                }
                if let Some(u) = &on.gpu_uuid {
                    line.push_str(&format!(" {u}"));
                }
                if let Some(t) = w
                    .ready()
                    .placement
                    .as_ref()
                    .and_then(|p| p.toolchain.clone())
                {
                    line.push_str(&format!("; toolchain {t}"));
                }
                println!("{line}");
                w.shutdown(Duration::from_secs(5)).await;
            }
            Err(e) => {
                ok = false;
                println!("  {what}: CANNOT START A WORKER: {e}");
            }
        }
    }
    let _ = tokio::fs::remove_dir_all(&scratch).await;
    ok
}
