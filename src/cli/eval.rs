//! `krefine eval`: evaluate existing generations (a leaderboard submission JSON or a KernelBench runs
//! folder) without an LLM. The generations are validated against the dataset first, then served to
//! the normal pipeline by the scripted provider (each task's answer is its kernel), so the output is
//! an ordinary run directory — report, compare and replay work on it — plus KernelBench's
//! `eval_results.json`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::config;
use crate::interchange::validate::validate;
use crate::interchange::{Generation, Generations, runs_folder, submission};
use crate::report::{LoadedRun, Pick, kernelbench_eval_results, load_run};

/// File of the served answers inside the run directory.
pub const GENERATIONS_FILE: &str = "generations.jsonl";
/// KernelBench's results file, written next to the run's log.
pub const EVAL_RESULTS_FILE: &str = "eval_results.json";

#[derive(clap::Args)]
pub struct EvalArgs {
    /// A submission JSON (`{"metadata": {...}, "kernels": {"level_1_problem_19_sample_0": "..."}}`)
    /// or a KernelBench runs folder (`level_<L>_problem_<P>_sample_<S>_kernel.py` files).
    src: PathBuf,
    /// The problems the generations are for: a KernelBench checkout, a folder, or a JSONL file.
    #[arg(long)]
    dataset: PathBuf,
    /// Run directory (default: `runs/eval-<name of SRC>`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// The level to evaluate when the generations span several.
    #[arg(long)]
    level: Option<u32>,
    /// Override a key of the evaluation's config, e.g. `--set eval.mode=strict`,
    /// `--set resources.devices=cpu`, `--set dataset.problems=all` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Validate only: print one line per key and stop.
    #[arg(long)]
    check: bool,
    /// Continue an interrupted evaluation in --out.
    #[arg(long)]
    resume: bool,
}

pub fn eval(args: EvalArgs) -> anyhow::Result<ExitCode> {
    let Some((items, level)) = generations_of(&args.src, &args.dataset, args.level, args.check)?
    else {
        return Ok(ExitCode::SUCCESS);
    };
    let stem = args
        .src
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "generations".into());
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs").join(format!("eval-{stem}")));
    let (code, _) = evaluate(&items, &args.dataset, level, &out, &args.sets, args.resume)?;
    Ok(code)
}

/// The validated generations of `src` for one level (`level`, or the only one they have); `None`
/// when `check_only` (validated, nothing more to do). Problems found are listed on stderr.
pub(super) fn generations_of(
    src: &Path,
    dataset: &Path,
    level: Option<u32>,
    check_only: bool,
) -> anyhow::Result<Option<(Vec<Generation>, u32)>> {
    let gens = read_source(src)?;
    let (gens, checked) = validate(gens, dataset)?;
    for (key, message) in &checked.lines {
        eprintln!("{key}: {message}");
    }
    if checked.errors > 0 {
        bail!(
            "{}: {} problem(s) found (listed above); nothing was evaluated",
            src.display(),
            checked.errors
        );
    }
    if let Some(name) = gens.metadata.get("display_name").and_then(|v| v.as_str()) {
        eprintln!("submission {name:?}: {} kernel(s)", gens.items.len());
    }
    let levels: Vec<u32> = checked.problems.keys().copied().collect();
    let level = match (level, levels.as_slice()) {
        (Some(l), _) if levels.contains(&l) => l,
        (Some(l), _) => bail!(
            "--level {l}: the generations have no problem of level {l} (they have levels {levels:?})"
        ),
        (None, [l]) => *l,
        (None, _) => bail!(
            "the generations span levels {levels:?}; evaluate one at a time with --level (one run directory each)"
        ),
    };
    if check_only {
        eprintln!("valid: {} generation(s)", gens.items.len());
        return Ok(None);
    }
    let items: Vec<Generation> = gens
        .items
        .into_iter()
        .filter(|g| g.problem.level == level)
        .collect();
    Ok(Some((items, level)))
}

/// A fence longer than any run of backticks in `code`, so the answer's block holds it whole.
fn fenced(code: &str) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in code.chars() {
        if c == '`' {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    let fence = "`".repeat((longest + 1).max(3));
    format!("{fence}python\n{}\n{fence}\n", code.trim_end())
}

/// The scripted answers serving `items` (turn 1 of each sample).
fn answers_jsonl(items: &[Generation]) -> String {
    items
        .iter()
        .map(|g| {
            serde_json::json!({
                "problem": g.problem.to_string(),
                "sample": g.sample,
                "turn": 1,
                "content": fenced(&g.code),
                "served": true,
            })
            .to_string()
                + "\n"
        })
        .collect()
}

/// Evaluate `items` (all of `level`) through the normal pipeline into the run directory `out`, then
/// write `eval_results.json` there. Returns the run's exit code and the loaded run.
pub(super) fn evaluate(
    items: &[Generation],
    dataset: &Path,
    level: u32,
    out: &Path,
    sets: &[String],
    resume: bool,
) -> anyhow::Result<(ExitCode, LoadedRun)> {
    evaluate_with(
        items,
        dataset,
        level,
        out,
        sets,
        resume,
        EvalBase::default(),
    )
}

/// A check of the loaded config before anything runs (an error stops the evaluation).
pub(super) type ConfigCheck = Box<dyn Fn(&config::LoadedConfig) -> anyhow::Result<()>>;

/// What a caller of [`evaluate_with`] brings besides the generations: `krefine recheck` evaluates a
/// run's candidates with that run's own settings.
#[derive(Default)]
pub(super) struct EvalBase {
    /// Config sections to start from (`[eval]`, `[resources]`, ...); the sections an evaluation of
    /// served generations fixes (`[run]`, `[dataset]`, `[method]`, `[model]`, `[output]`) replace
    /// theirs, and `--set` applies last.
    pub sections: toml::Table,
    /// Leave the run's report off stdout (the caller prints its own).
    pub quiet: bool,
    /// Checked once the config is loaded, before the run starts.
    pub check: Option<ConfigCheck>,
}

/// [`evaluate`], starting from `base`.
pub(super) fn evaluate_with(
    items: &[Generation],
    dataset: &Path,
    level: u32,
    out: &Path,
    sets: &[String],
    resume: bool,
    base: EvalBase,
) -> anyhow::Result<(ExitCode, LoadedRun)> {
    if items.is_empty() {
        bail!("no generations of level {level} to evaluate");
    }
    if !resume && out.join(crate::store::EVENTS_FILE).exists() {
        bail!(
            "run directory {} already holds a run; pass --resume to continue it, or choose another --out",
            out.display()
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let out = std::path::absolute(out)?;
    let answers = out.join(GENERATIONS_FILE);
    std::fs::write(&answers, answers_jsonl(items))
        .with_context(|| format!("cannot write {}", answers.display()))?;
    let samples = items.iter().map(|g| g.sample + 1).max().unwrap_or(1);
    let mut ids: Vec<u32> = items.iter().map(|g| g.problem.problem_id).collect();
    ids.sort_unstable();
    ids.dedup();
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    let name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "eval".into());
    let EvalBase {
        sections,
        quiet,
        check,
    } = base;
    let mut cfg = sections;
    let table = |pairs: Vec<(&str, toml::Value)>| {
        toml::Value::Table(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    };
    let s = |v: &str| toml::Value::String(v.to_string());
    let path = |p: &Path| -> anyhow::Result<toml::Value> {
        Ok(s(&std::path::absolute(p)?.to_string_lossy()))
    };
    cfg.insert("run".into(), table(vec![("name", s(&name))]));
    cfg.insert(
        "dataset".into(),
        table(vec![
            ("path", path(dataset)?),
            ("level", toml::Value::Integer(i64::from(level))),
            ("problems", s(&ids.join(","))),
        ]),
    );
    cfg.insert(
        "method".into(),
        if samples > 1 {
            table(vec![
                ("kind", s("sampling")),
                ("k", toml::Value::Integer(i64::from(samples))),
            ])
        } else {
            table(vec![("kind", s("one_shot"))])
        },
    );
    cfg.insert(
        "model".into(),
        table(vec![
            ("provider", s("scripted")),
            ("name", s(crate::llm::scripted::SERVED_MODEL)),
            ("answers", path(&answers)?),
        ]),
    );
    let parent = out.parent().unwrap_or(Path::new("."));
    cfg.insert("output".into(), table(vec![("dir", path(parent)?)]));
    let text = toml::to_string(&cfg)?;
    let config_path = out.join(crate::store::CONFIG_FILE);
    let loaded = config::parse(&text, &config_path, sets)?;
    if let Some(check) = check {
        check(&loaded)?;
    }
    let args = super::run::RunArgs {
        config: config_path,
        out: Some(out.clone()),
        resume,
        no_tui: true,
        sets: sets.to_vec(),
        replay_llm: None,
        quiet_report: quiet,
    };
    let code = super::run::run_loaded(args, loaded)?;
    let run = load_run(&out)?;
    let results = kernelbench_eval_results(level, &run.turns, Pick::Best);
    let results_path = out.join(EVAL_RESULTS_FILE);
    std::fs::write(
        &results_path,
        serde_json::to_string_pretty(&results)? + "\n",
    )
    .with_context(|| format!("cannot write {}", results_path.display()))?;
    eprintln!("KernelBench results: {}", results_path.display());
    Ok((code, run))
}

/// Generations of a submission or runs folder, unvalidated.
fn read_source(src: &Path) -> anyhow::Result<Generations> {
    Ok(if src.is_dir() {
        runs_folder::read(src)
            .with_context(|| format!("cannot read the runs folder {}", src.display()))?
    } else {
        submission::read(src)
            .with_context(|| format!("cannot read the submission {}", src.display()))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_outgrow_backticks_in_the_code() {
        assert_eq!(fenced("x = 1\n"), "```python\nx = 1\n```\n");
        let code = "s = '````'";
        let f = fenced(code);
        assert!(f.starts_with("`````python\n"), "{f}");
        assert_eq!(crate::llm::extract::extract_code(&f).as_deref(), Some(code));
    }
}
