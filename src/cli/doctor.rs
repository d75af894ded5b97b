//! `krefine doctor`: what this machine offers for experiments.

use std::path::Path;
use std::process::ExitCode;

use crate::config::{self, LoadedConfig};
use crate::worker::sandbox::{self, SandboxMode};
use crate::{gpu, llm, worker};

pub fn doctor(config: Option<&Path>) -> anyhow::Result<ExitCode> {
    let loaded: Option<LoadedConfig> = config.map(|p| config::load(p, &[])).transpose()?;
    let d = gpu::discover();
    println!("GPUs:");
    if d.gpus.is_empty() {
        println!(
            "  none ({}); runs use the CPU device",
            d.note.as_deref().unwrap_or("no GPU")
        );
    }
    for g in &d.gpus {
        println!(
            "  {}: {} (compute capability {}, {} GiB)",
            g.id,
            g.name,
            g.capability
                .map(|(a, b)| format!("{a}.{b}"))
                .unwrap_or_else(|| "?".into()),
            g.total_memory_bytes
                .map(|m| format!("{:.1}", m as f64 / (1u64 << 30) as f64))
                .unwrap_or_else(|| "?".into())
        );
    }
    if let Some(v) = &d.driver_version {
        println!("  CUDA driver API {v}");
    }
    print_device_locks(&d.gpus);

    let configured = loaded
        .as_ref()
        .and_then(|l| l.config.resources.python.as_deref().map(|p| l.resolve(p)));
    let rt = super::runtime()?;
    println!("Python:");
    let config_dir = loaded
        .as_ref()
        .and_then(|l| l.path.parent().map(Path::to_path_buf));
    let python = rt.block_on(worker::find_python(
        configured.as_deref(),
        config_dir.as_deref(),
    ));
    match &python {
        Ok(py) => {
            println!("  {}", py.display());
            let probe = std::process::Command::new(py)
                .args([
                    "-c",
                    "import sys, torch\nprint('  python', sys.version.split()[0])\nprint('  torch', torch.__version__, '(CUDA', str(torch.version.cuda) + ',', 'GPU available:', str(torch.cuda.is_available()) + ')')\ntry:\n    import ninja; print('  ninja', ninja.__version__)\nexcept Exception:\n    print('  ninja: missing (load_inline needs it)')\nfrom torch.utils.cpp_extension import CUDA_HOME\nprint('  CUDA_HOME', CUDA_HOME)\nimport importlib.metadata as m\ntry:\n    print('  transformers', m.version('transformers'))\nexcept m.PackageNotFoundError:\n    print('  transformers: missing (KernelBench level 4 needs it)')",
                ])
                .output();
            match probe {
                Ok(o) => print!("{}", String::from_utf8_lossy(&o.stdout)),
                Err(e) => println!("  cannot run it: {e}"),
            }
        }
        Err(e) => println!("  {e}"),
    }
    match which("nvcc") {
        Some(p) => println!("  nvcc {}", p.display()),
        None => println!("  nvcc: not on PATH (needed for CUDA candidates)"),
    }
    let hf = loaded
        .as_ref()
        .map(|l| l.config.eval.hf.clone())
        .unwrap_or_default();
    let cache = match &loaded {
        Some(l) => super::run::hf_cache_dir(l),
        None => hf.cache_dir(None),
    };
    println!("Hugging Face (KernelBench level 4):");
    match &cache {
        Some(c) => {
            let models = std::fs::read_dir(c)
                .map(|d| {
                    d.filter_map(|e| e.ok())
                        .filter(|e| e.file_name().to_string_lossy().starts_with("models--"))
                        .count()
                })
                .ok();
            println!(
                "  cache {} ({})",
                c.display(),
                models.map_or("does not exist".to_string(), |n| format!("{n} model(s)"))
            );
        }
        None => println!("  no cache folder found (set eval.hf.cache)"),
    }
    println!(
        "  workers {}",
        if hf.offline {
            "offline (HF_HUB_OFFLINE=1): models must be in the cache"
        } else {
            "online: missing models are downloaded"
        }
    );
    print_sandbox(loaded.as_ref(), python.as_ref().ok());
    if let Some(l) = &loaded {
        let problems = crate::dataset::load(
            &l.resolve(&l.config.dataset.path),
            l.config.dataset.level,
            &l.config.dataset.problems,
        );
        if let Ok(problems) = problems
            && let Err(e) = hf.check_models(cache.as_deref(), &problems)
        {
            println!("  {e}");
        }
        println!(
            "LLM endpoint:\n  {}",
            llm::describe_endpoint(&l.llm_parts())
        );
        // The config's own inputs: what `krefine run` would refuse to start without.
        println!("Inputs ({}):", l.path.display());
        let mut inputs_ok = true;
        for f in super::preflight::inputs(l) {
            match f.result {
                Ok(what) => println!("  {}: {what}", f.key),
                Err(why) => {
                    inputs_ok = false;
                    println!("  {}: PROBLEM: {why}", f.key);
                }
            }
        }
        if !rt.block_on(super::doctor_launcher::check(l, python.as_ref().ok())) || !inputs_ok {
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Which devices another krefine process on this machine holds now (it is timing there), from the
/// devices' shared locks.
fn print_device_locks(gpus: &[gpu::DeviceInfo]) {
    let dir = crate::lock::device_lock_dir();
    println!(
        "Device locks ({}, shared by every krefine process here):",
        dir.display()
    );
    let mut devices = gpus.to_vec();
    devices.push(gpu::DeviceInfo::cpu());
    let holder = format!("pid {} (krefine doctor)", std::process::id());
    let locks = gpu::HostLocks::new(dir.clone(), holder.clone(), &devices);
    for d in &devices {
        let key = locks.key(&d.id);
        // Taken and let go at once when free: only a look.
        let state = match crate::lock::try_lock_device(&dir, &key, &holder) {
            Ok(crate::lock::DeviceLockTry::Held(_)) => "free".to_string(),
            Ok(crate::lock::DeviceLockTry::Busy(by)) => format!("in use by {by}"),
            Err(e) => format!("cannot be checked: {e}"),
        };
        println!("  {} ({key}): {state}", d.id);
    }
}

/// Whether workers can be sandboxed here, and what `eval.sandbox` makes of it.
fn print_sandbox(loaded: Option<&LoadedConfig>, python: Option<&std::path::PathBuf>) {
    let mode = loaded
        .map(|l| l.config.eval.sandbox_mode())
        .unwrap_or_default();
    println!("Sandbox (eval.sandbox = {}):", mode.as_str());
    match python.map(|p| sandbox::probe(p, None)) {
        Some(Ok(took)) => println!(
            "  namespaces: available (user, pid, network, mount, ipc; read-only file system view); \
             a sandboxed python -S started in {:.1} ms",
            took.as_secs_f64() * 1e3
        ),
        Some(Err(e)) => {
            println!("  namespaces: UNAVAILABLE: {e}");
            match mode {
                SandboxMode::Required => {
                    println!("  eval.sandbox = \"required\": runs will refuse to evaluate")
                }
                SandboxMode::Auto => println!(
                    "  eval.sandbox = \"auto\": candidates would run with your user's rights"
                ),
                SandboxMode::Off => {}
            }
        }
        None => println!("  namespaces: not checked (no Python with torch)"),
    }
    match sandbox::landlock_abi() {
        0 => println!("  landlock: not available (per-candidate write confinement off)"),
        abi => println!("  landlock: ABI {abi} (per-candidate write confinement)"),
    }
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .or_else(|| {
            let p = Path::new("/usr/local/cuda/bin").join(name);
            p.is_file().then_some(p)
        })
}
