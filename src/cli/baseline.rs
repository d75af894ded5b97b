//! `krefine baseline`: reference timings in KernelBench's baseline JSON shape
//! (`{"level1": {"19_ReLU.py": {"mean", "std", "min", "max", "num_trials", "hardware", "device"}}}`,
//! milliseconds), for `eval.baseline` in configs.
//!
//! Each problem's reference is evaluated as a candidate through `krefine eval`'s pipeline (the same
//! workers, devices, trials and timer as every candidate): `ModelNew = Model` for eager timings, or a
//! `ModelNew` whose forward is `torch.compile(Model.forward, mode=...)` for compiled ones. The
//! candidate's timing is the baseline. One run directory per level is kept, so every number can be
//! traced to its log.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use serde_json::{Map, Value, json};

use crate::dataset;
use crate::interchange::Generation;
use crate::types::Verdict;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BaselineMode {
    /// The reference module as written.
    Eager,
    /// The reference forward under `torch.compile` (inductor).
    Compile,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompileMode {
    Default,
    ReduceOverhead,
    MaxAutotune,
}

impl CompileMode {
    fn as_str(self) -> &'static str {
        match self {
            CompileMode::Default => "default",
            CompileMode::ReduceOverhead => "reduce-overhead",
            CompileMode::MaxAutotune => "max-autotune",
        }
    }
}

#[derive(clap::Args)]
pub struct BaselineArgs {
    /// The problems: a KernelBench checkout, a folder, or a JSONL file.
    #[arg(long)]
    dataset: PathBuf,
    /// Levels to time, e.g. `1,2`.
    #[arg(long, value_delimiter = ',', required = true)]
    levels: Vec<u32>,
    /// Problem selection within each level, e.g. `1-10,42`.
    #[arg(long, default_value = "all")]
    problems: String,
    #[arg(long, value_enum, default_value = "eager")]
    mode: BaselineMode,
    /// torch.compile mode (with `--mode compile`).
    #[arg(long, value_enum, default_value = "default")]
    compile_mode: CompileMode,
    /// The baseline JSON to write (default, with `--hardware`: KernelBench's layout,
    /// `results/timing/<NAME>/baseline_time_torch.json`, or `baseline_time_torch_compile_inductor_<mode>.json`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The hardware name recorded in every entry (KernelBench's `hardware` field), e.g. `H100_PCIe`;
    /// default: the device name the workers report. Level 4 has no published baselines: name the
    /// machine you generate them on.
    #[arg(long, value_name = "NAME")]
    hardware: Option<String>,
    /// Where the per-level run directories go (default: `<out without .json>.runs/`).
    #[arg(long)]
    runs_dir: Option<PathBuf>,
    /// Override a key of the evaluation's config, e.g. `--set resources.devices=0`,
    /// `--set eval.timing_trials=100` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

/// The candidate that times the reference `code` in `mode`.
pub fn reference_candidate(code: &str, mode: BaselineMode, compile: CompileMode) -> String {
    let suffix = match mode {
        BaselineMode::Eager => {
            "\n\n# krefine baseline: the reference itself, timed as a candidate.\nModelNew = Model\n"
                .to_string()
        }
        BaselineMode::Compile => format!(
            r#"

# krefine baseline: the reference forward under torch.compile, timed as a candidate.
import torch as _krefine_torch


class ModelNew(Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._krefine_forward = _krefine_torch.compile(
            super().forward, backend="inductor", mode="{}"
        )

    def forward(self, *args, **kwargs):
        return self._krefine_forward(*args, **kwargs)
"#,
            compile.as_str()
        ),
    };
    format!("{}{suffix}", code.trim_end())
}

/// A hardware name that is safe as one folder name and a JSON label.
fn check_hardware(name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= 100
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '+'));
    if !ok {
        bail!(
            "--hardware {name:?}: expected a name of letters, digits, '_', '-', '.' or '+' (it becomes a folder name), e.g. H100_PCIe"
        );
    }
    Ok(())
}

/// Where the baseline goes: `--out`, else KernelBench's `results/timing/<hardware>/<file>`.
fn out_path(args: &BaselineArgs) -> anyhow::Result<PathBuf> {
    if let Some(out) = &args.out {
        return Ok(out.clone());
    }
    let Some(hardware) = &args.hardware else {
        bail!(
            "say where the baseline goes: --out FILE.json, or --hardware NAME for results/timing/NAME/"
        );
    };
    let file = match args.mode {
        BaselineMode::Eager => "baseline_time_torch.json".to_string(),
        BaselineMode::Compile => format!(
            "baseline_time_torch_compile_inductor_{}.json",
            args.compile_mode.as_str()
        ),
    };
    Ok(PathBuf::from("results/timing").join(hardware).join(file))
}

pub fn baseline(args: BaselineArgs) -> anyhow::Result<ExitCode> {
    if args.mode == BaselineMode::Eager && args.compile_mode != CompileMode::Default {
        bail!("--compile-mode applies to --mode compile only");
    }
    if let Some(h) = &args.hardware {
        check_hardware(h)?;
    }
    let out_file = out_path(&args)?;
    let runs_dir = args.runs_dir.clone().unwrap_or_else(|| {
        let mut p = out_file.clone().into_os_string();
        p.push(".runs");
        PathBuf::from(p)
    });
    // Timings are only meaningful in KernelBench's own mode; a user may still override it.
    let mut sets = vec!["eval.mode=faithful".to_string()];
    sets.extend(args.sets.iter().cloned());
    let mut root = Map::new();
    let mut code = ExitCode::SUCCESS;
    let mut failed = Vec::new();
    for &level in &args.levels {
        let problems = dataset::load(&args.dataset, level, &args.problems)?;
        if problems.is_empty() {
            bail!(
                "level {level} of {} has no problems",
                args.dataset.display()
            );
        }
        let items: Vec<Generation> = problems
            .iter()
            .map(|p| Generation {
                problem: p.key,
                sample: 0,
                code: reference_candidate(&p.code, args.mode, args.compile_mode),
                origin: p.name.clone(),
            })
            .collect();
        let mode = match args.mode {
            BaselineMode::Eager => "eager".to_string(),
            BaselineMode::Compile => format!("compile-{}", args.compile_mode.as_str()),
        };
        let out = runs_dir.join(format!("level{level}-{mode}"));
        eprintln!(
            "baseline level {level}: {} problem(s), {mode}, run directory {}",
            problems.len(),
            out.display()
        );
        let (c, run) = super::eval::evaluate(&items, &args.dataset, level, &out, &sets, false)?;
        if c != ExitCode::SUCCESS {
            code = c;
        }
        let names: BTreeMap<u32, &str> = problems
            .iter()
            .map(|p| (p.key.problem_id, p.name.as_str()))
            .collect();
        let mut entries = Map::new();
        for (task, turns) in &run.turns {
            let Some(name) = names.get(&task.problem.problem_id) else {
                continue;
            };
            let timed = turns
                .iter()
                .rev()
                .find_map(|t| t.exec.as_ref())
                .filter(|e| e.verdict == Verdict::Correct)
                .and_then(|e| e.runtime_stats.map(|s| (e, s)));
            let entry = match timed {
                Some((e, s)) => {
                    json!({
                        "mean": s.mean, "std": s.std, "min": s.min, "max": s.max,
                        "num_trials": s.num_trials,
                        "hardware": args.hardware.clone().unwrap_or_else(|| e.env.device_name.clone()),
                        "device": e.device,
                    })
                }
                _ => {
                    let why = turns
                        .last()
                        .and_then(|t| t.verdict)
                        .map_or("unfinished".to_string(), |v| v.to_string());
                    failed.push(format!("level{level}/{name} ({why})"));
                    Value::Null
                }
            };
            entries.insert((*name).to_string(), entry);
        }
        root.insert(format!("level{level}"), Value::Object(entries));
    }
    let text = serde_json::to_string_pretty(&Value::Object(root))? + "\n";
    if let Some(parent) = out_file.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::write(&out_file, text)
        .with_context(|| format!("cannot write {}", out_file.display()))?;
    if !failed.is_empty() {
        eprintln!(
            "warning: no timing for {} problem(s), written as null: {}",
            failed.len(),
            failed.join(", ")
        );
    }
    eprintln!("baseline written to {}", out_file.display());
    Ok(code)
}
