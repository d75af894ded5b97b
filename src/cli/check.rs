//! `krefine check`: run the static checks on candidate files, as a run would before compiling them.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use serde::de::DeserializeOwned;

use crate::checks::{StaticChecks, has_error};
use crate::config::{self, Backend, DeviceSelection};
use crate::types::{EvalMode, Precision, Severity};

#[derive(clap::Args)]
pub struct CheckArgs {
    /// Candidate files (Python with inline C++/CUDA), e.g. a run's `kernels/*.py`.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Take the mode, precision, backend and `[eval.checks]` levels from this experiment config.
    #[arg(long)]
    config: Option<PathBuf>,
    /// `faithful` (every category warns) or `strict`; overrides the config.
    #[arg(long)]
    mode: Option<String>,
    /// `cuda`, `triton`, `cute`, `tilelang`, `thunderkittens` or `cpu`: which custom kernel
    /// `missing_kernel` expects (default: the config's `prompt.backend`, else as a run picks it:
    /// `cuda` with a GPU, `cpu` without one or with `resources.devices = "cpu"`).
    #[arg(long)]
    backend: Option<String>,
    /// `fp32`, `fp16` or `bf16`: precision downgrades are only checked for `fp32` (the default).
    #[arg(long)]
    precision: Option<String>,
}

/// The backend a run on `devices` asks for when `prompt.backend` is unset: `cuda` when it uses a GPU
/// (one is found, for `auto`), else `cpu` (`crate::prompt::PromptSettings::from_config`'s rule).
fn default_backend(devices: &DeviceSelection) -> Backend {
    let gpu = match devices {
        DeviceSelection::Cpu => false,
        DeviceSelection::Gpus(_) => true,
        DeviceSelection::Auto => !crate::gpu::discover().gpus.is_empty(),
    };
    if gpu { Backend::Cuda } else { Backend::Cpu }
}

/// A config enum from its config spelling (`strict`, `cuda`, `fp16`).
fn parse<T: DeserializeOwned>(flag: &str, value: &str) -> anyhow::Result<T> {
    T::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(value))
        .map_err(|e| anyhow::anyhow!("--{flag} {value:?}: {e}"))
}

/// Prints one line per finding (`file:line: error timing_patch: ...`); exits 1 when any finding is
/// an error, so it can gate a script.
pub fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let (mut mode, mut precision, mut backend, section) = match &args.config {
        Some(path) => {
            let c = config::load(path, &[])?.config;
            let backend = match (c.prompt.backend, &args.backend) {
                (Some(b), _) => b,
                // Given on the command line: no need to look for GPUs.
                (None, Some(_)) => Backend::Cpu,
                (None, None) => default_backend(&c.resources.devices),
            };
            (c.eval.mode, c.eval.precision, backend, c.eval.checks)
        }
        None => (
            EvalMode::Faithful,
            Precision::Fp32,
            match &args.backend {
                Some(_) => Backend::Cpu,
                None => default_backend(&DeviceSelection::Auto),
            },
            Default::default(),
        ),
    };
    if let Some(m) = &args.mode {
        mode = parse("mode", m)?;
    }
    if let Some(p) = &args.precision {
        precision = parse("precision", p)?;
    }
    if let Some(b) = &args.backend {
        backend = parse("backend", b)?;
    }
    let checks = StaticChecks::new(&section, mode, backend, precision);
    let mut out = String::new();
    let mut errors = false;
    for file in &args.files {
        let code = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let findings = checks.check(&code);
        errors |= has_error(&findings);
        for f in findings {
            let at = match f.line {
                Some(l) => format!("{}:{l}", file.display()),
                None => file.display().to_string(),
            };
            let severity = match f.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            };
            out.push_str(&format!("{at}: {severity} {}: {}\n", f.category, f.message));
        }
    }
    if !out.is_empty() {
        super::print_out(out.trim_end())?;
    }
    Ok(if errors {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
