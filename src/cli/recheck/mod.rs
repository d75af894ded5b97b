//! `krefine recheck RUN_DIR`: re-evaluate a run's candidates under today's checks and report what
//! changed, without writing anything into the run.
//!
//! The run is read through the store's one reader and folded by the one reducer
//! ([`crate::report::load_run_with_log`]); its frozen `config.toml` gives the evaluation settings
//! (`--set` changes them) and its `provenance.json` where its problems were. The candidates taken
//! ([`select`]) go through `krefine eval`'s path ([`super::eval::evaluate_with`]) into a run directory
//! of their own beside the run (sample `j` of a problem is its `j`-th candidate; `recheck.json` there
//! maps them back). Each recorded result is compared with its recheck ([`compare`]: verdict, counted
//! speedup beyond noise, integrity findings), fast_p is computed again with the rechecked results in
//! place, and [`render`] prints it all; the exit status says whether a credited result no longer
//! stands. [`setup`] owns where things are read and written.

mod compare;
mod render;
mod select;
mod setup;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};

use super::eval::{EvalBase, evaluate_with};
use crate::config::{Config, DEFAULT_EXTRA_FAST_P};
use crate::interchange::{Generation, sample_key};
use crate::provenance::{self, Build, RunProvenance};
use crate::report::{LoadedRun, frozen_config, load_run_with_log};
use crate::types::{Event, ProblemKey, TaskId};

use compare::{Rechecked, Shape, Standing};
use render::{Document, FastPChange, Setting};
use select::{Picked, Which};

/// The recheck's result, written into its run directory.
pub const RECHECK_FILE: &str = "recheck.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutFormat {
    Text,
    Json,
}

#[derive(clap::Args)]
pub struct RecheckArgs {
    /// The run directory to recheck. Nothing in it is written.
    run: PathBuf,
    /// The recheck's own run directory (default: `<RUN_DIR>-recheck-<UTC time>` beside the run).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Change a key of the run's evaluation settings (`[eval]`, `[resources]`, `[prompt]`,
    /// `[report]`), e.g. `--set eval.mode=strict`, `--set resources.devices=0` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// text or json.
    #[arg(long, value_enum, default_value = "text")]
    format: OutFormat,
    /// Which candidates to recheck: `correct` (the results that count) or `all` (every candidate
    /// with a verdict).
    #[arg(long, value_enum, default_value = "correct")]
    candidates: Which,
    /// Where the run's problems are, when no longer where the run took them.
    #[arg(long)]
    dataset: Option<PathBuf>,
    /// The smallest change of a counted speedup that counts as a change, as a fraction (0.05: 5 %);
    /// the band widens where the timings' own spread says the noise is larger.
    #[arg(long, default_value_t = 0.05, value_name = "FRACTION")]
    speedup_tolerance: f64,
}

pub fn recheck(args: RecheckArgs) -> anyhow::Result<ExitCode> {
    if !(args.speedup_tolerance.is_finite() && args.speedup_tolerance >= 0.0) {
        bail!(
            "--speedup-tolerance {}: expected a fraction of 0 or more, such as 0.05",
            args.speedup_tolerance
        );
    }
    setup::check_sets(&args.sets)?;
    let source = Source::read(&args.run)?;
    let mut notes = source.notes.clone();
    let picked = select::pick(&source.dir, &source.loaded.turns, args.candidates);

    let (items, slots) = generations(&picked);
    if picked.is_empty() {
        notes.push(match args.candidates {
            Which::Correct => {
                "nothing to recheck: the run has no correct candidate (--candidates all takes the others)".into()
            }
            Which::All => "nothing to recheck: the run has no candidate with a verdict".to_string(),
        });
    }
    let evaluated = if items.is_empty() {
        None
    } else {
        Some(source.evaluate(&args, &items, &mut notes)?)
    };
    let results: Vec<Rechecked> = picked
        .iter()
        .zip(&slots)
        .filter_map(|(p, slot)| source.result(p, *slot, evaluated.as_ref(), args.speedup_tolerance))
        .collect();

    let shape_extra = source.fast_p_thresholds(&mut notes);
    let shape = Shape {
        method: source.loaded.report.method,
        axis: source.loaded.report.metrics.axis,
        problems: &source.loaded.report.metrics.problems,
        extra: &shape_extra,
    };
    let before = compare::headline(&shape, &source.loaded.turns);
    let after_turns = compare::replaced(
        &source.loaded.turns,
        results.iter().filter_map(|r| {
            let sample = r.recheck_sample?;
            r.new.as_ref()?;
            let run = evaluated.as_ref()?;
            let record = run.record(r.problem, sample)?;
            Some((r.task(), r.turn, record))
        }),
    );
    let after = compare::headline(&shape, &after_turns);
    let then = source.setting_then();
    let now = setting_now(evaluated.as_ref());
    if !then.devices.is_empty() && !now.devices.is_empty() && then.devices != now.devices {
        notes.push(format!(
            "measured on {} then and on {} now: speedups compare across devices",
            then.devices.join(", "),
            now.devices.join(", ")
        ));
    }
    if let Some(e) = &evaluated
        && e.interrupted
    {
        notes.push(
            "the recheck was interrupted: candidates it did not reach are not rechecked".into(),
        );
    }
    let summary = compare::Counts::of(&results);
    let mut doc = Document {
        run: source.dir.display().to_string(),
        recheck_run: evaluated.as_ref().map(|e| e.dir.display().to_string()),
        candidates: args.candidates,
        sets: args.sets.clone(),
        speedup_tolerance: args.speedup_tolerance,
        then,
        now,
        notes,
        results,
        summary,
        fast_p: FastPChange {
            axis: render::axis_of(source.loaded.report.method),
            before,
            after,
        },
        exit_status: 0,
    };
    doc.exit_status = Document::status_of(&doc.summary);
    let json = serde_json::to_string_pretty(&doc)? + "\n";
    if let Some(e) = &evaluated {
        let path = e.dir.join(RECHECK_FILE);
        std::fs::write(&path, &json).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("recheck written to {}", path.display());
    }
    match args.format {
        OutFormat::Json => super::print_out(json.trim_end())?,
        OutFormat::Text => super::print_out(&render::text(&doc))?,
    }
    if evaluated.as_ref().is_some_and(|e| e.interrupted) {
        return Ok(ExitCode::from(130));
    }
    Ok(ExitCode::from(doc.exit_status))
}

/// The generations the recheck run serves, and each candidate's sample in it: sample `j` of a
/// problem is its `j`-th candidate with code (`None`: no code, not evaluated).
fn generations(picked: &[Picked]) -> (Vec<Generation>, Vec<Option<u32>>) {
    let mut next: BTreeMap<ProblemKey, u32> = BTreeMap::new();
    let mut items = Vec::new();
    let slots = picked
        .iter()
        .map(|p| {
            let code = p.code.as_ref().ok()?;
            let n = next.entry(p.task.problem).or_insert(0);
            let sample = *n;
            *n += 1;
            items.push(Generation {
                problem: p.task.problem,
                sample,
                code: code.clone(),
                origin: format!(
                    "{}_turn_{}",
                    sample_key(p.task.problem, p.task.sample),
                    p.turn
                ),
            });
            Some(sample)
        })
        .collect();
    (items, slots)
}

/// The settings of the recheck: this build, and what its run measured with.
fn setting_now(evaluated: Option<&Evaluated>) -> Setting {
    Setting {
        krefine: Some(build_label(&Build::current())),
        mode: evaluated.and_then(|e| e.run.info.eval_mode.clone()),
        devices: evaluated.map_or_else(Vec::new, |e| e.run.info.hardware.clone()),
    }
}

/// `0.1.0 (85fd0484c593)`, as reports name a build.
fn build_label(b: &Build) -> String {
    let commit: String = b.commit.chars().take(12).collect();
    format!("{} ({commit})", b.version)
}

/// The run being rechecked, read once.
struct Source {
    /// The run directory, canonical.
    dir: PathBuf,
    loaded: LoadedRun,
    /// Its frozen config, as written and as read.
    frozen_table: toml::Table,
    frozen: Config,
    recorded: Option<RunProvenance>,
    /// Problem file names the run recorded.
    names: BTreeMap<ProblemKey, String>,
    /// Run-level notes found while reading.
    notes: Vec<String>,
}

/// The recheck run, evaluated.
struct Evaluated {
    dir: PathBuf,
    run: LoadedRun,
    /// The evaluation was stopped by Ctrl-C.
    interrupted: bool,
}

impl Evaluated {
    /// The recheck's record of sample `sample` of `problem` (its only turn).
    fn record(&self, problem: ProblemKey, sample: u32) -> Option<&crate::types::TurnRecord> {
        self.run
            .turns
            .get(&TaskId { problem, sample })?
            .iter()
            .find(|r| r.turn == 1)
    }
}

impl Source {
    fn read(run: &Path) -> anyhow::Result<Source> {
        let (loaded, log) =
            load_run_with_log(run).with_context(|| format!("cannot recheck {}", run.display()))?;
        let dir = setup::canonical_run(run)?;
        // The error names the file and what is wrong with it (its chain would repeat it).
        let frozen_table = frozen_config(run)
            .map_err(|e| anyhow::anyhow!("cannot recheck {}: {e}", run.display()))?;
        let config_path = dir.join(crate::store::CONFIG_FILE);
        let frozen: Config = toml::Value::Table(frozen_table.clone())
            .try_into()
            .map_err(|e: toml::de::Error| {
                anyhow::anyhow!(
                    "cannot recheck {}: {} is not a config this krefine reads: {}",
                    run.display(),
                    config_path.display(),
                    e.to_string().trim_end()
                )
            })?;
        let mut notes = Vec::new();
        let recorded = match provenance::read(&dir) {
            Ok(p) => p,
            Err(e) => {
                notes.push(format!("{e}: the run's problems and build are not checked"));
                None
            }
        };
        if let Some(w) = &loaded.torn_tail {
            eprintln!("warning: {w}");
            notes.push(w.clone());
        }
        if !loaded.report.complete {
            notes.push(
                "the run has not finished (or stopped early): its candidates with a verdict so far are rechecked".into(),
            );
        }
        let names = log
            .records
            .iter()
            .find_map(|r| match &r.event {
                Event::RunStarted { problem_names, .. } => Some(problem_names.clone()),
                _ => None,
            })
            .unwrap_or_default();
        Ok(Source {
            dir,
            loaded,
            frozen_table,
            frozen,
            recorded,
            names,
            notes,
        })
    }

    /// The settings the run's candidates were measured with.
    fn setting_then(&self) -> Setting {
        Setting {
            krefine: self.recorded.as_ref().map(|p| build_label(&p.krefine)),
            mode: self.loaded.info.eval_mode.clone(),
            devices: self.loaded.info.hardware.clone(),
        }
    }

    /// The run's `report.fast_p` (Fast@1.2 where its config's value cannot be used, noted).
    fn fast_p_thresholds(&self, notes: &mut Vec<String>) -> Vec<f64> {
        match self.loaded.configured_fast_p() {
            Ok(t) => t.to_vec(),
            Err(e) => {
                notes.push(e);
                DEFAULT_EXTRA_FAST_P.to_vec()
            }
        }
    }

    /// Where the run's problems are, checked against what the run recorded of them (differences
    /// are noted).
    fn dataset(&self, given: Option<&Path>, notes: &mut Vec<String>) -> anyhow::Result<PathBuf> {
        let ds = &self.frozen.dataset;
        let path = setup::dataset_path(given, self.recorded.as_ref(), &ds.path)?;
        let problems = crate::dataset::load(&path, ds.level, &ds.problems).with_context(|| {
            format!(
                "cannot load the run's problems (level {}, {:?}) from {}",
                ds.level,
                ds.problems,
                path.display()
            )
        })?;
        for p in &problems {
            if let Some(then) = self.names.get(&p.key)
                && *then != p.name
            {
                notes.push(format!(
                    "problem {} is {} in {}, {then} in the run",
                    p.key,
                    p.name,
                    path.display()
                ));
            }
        }
        match &self.recorded {
            Some(r) => {
                let now = provenance::dataset_revision(&path, ds.level, &ds.problems, &problems)?;
                if now.content_hash != r.dataset.content_hash {
                    notes.push(format!(
                        "the problems in {} differ from those the run used ({} now, {} then): verdicts may change because the references did",
                        path.display(),
                        now.content_hash,
                        r.dataset.content_hash
                    ));
                }
            }
            None => notes.push(
                "the run recorded no provenance.json: whether its problems changed since cannot be told".into(),
            ),
        }
        if let Some(b) = self.recorded.as_ref().and_then(|r| r.baseline.as_ref())
            && b.path.exists()
            && provenance::hash_file(&b.path).is_ok_and(|now| now.hash != b.hash)
        {
            notes.push(format!(
                "the baseline file {} changed since the run: reference times differ",
                b.path.display()
            ));
        }
        Ok(path)
    }

    /// Evaluate `items` into the recheck's run directory, with the run's settings and `--set`.
    fn evaluate(
        &self,
        args: &RecheckArgs,
        items: &[Generation],
        notes: &mut Vec<String>,
    ) -> anyhow::Result<Evaluated> {
        let dataset = self.dataset(args.dataset.as_deref(), notes)?;
        let now_s = crate::store::now_ms() / 1000;
        let out = setup::out_dir(&self.dir, args.out.as_deref(), now_s)?;
        let existed = out.exists();
        let run = self.dir.clone();
        let base = EvalBase {
            sections: setup::base_sections(&self.frozen_table, self.recorded.as_ref()),
            quiet: true,
            check: Some(Box::new(move |loaded| setup::check_writes(&run, loaded))),
        };
        eprintln!(
            "rechecking {} candidate(s) of {} into {}",
            items.len(),
            self.dir.display(),
            out.display()
        );
        let result = evaluate_with(
            items,
            &dataset,
            self.frozen.dataset.level,
            &out,
            &args.sets,
            false,
            base,
        );
        let (code, run) = match result {
            Ok(r) => r,
            Err(e) => {
                // Nothing evaluated: leave no half-made directory behind.
                if !existed && !out.join(crate::store::EVENTS_FILE).exists() {
                    let _ = std::fs::remove_file(out.join(super::eval::GENERATIONS_FILE));
                    let _ = std::fs::remove_dir(&out);
                }
                return Err(e);
            }
        };
        let dir = std::path::absolute(&out).unwrap_or(out);
        Ok(Evaluated {
            dir,
            run,
            interrupted: code == ExitCode::from(130),
        })
    }

    /// The result of candidate `p` (evaluated as `slot` of the recheck run); `None` for a turn
    /// without a verdict (never picked).
    fn result(
        &self,
        p: &Picked,
        slot: Option<u32>,
        evaluated: Option<&Evaluated>,
        tolerance: f64,
    ) -> Option<Rechecked> {
        let old_record = self
            .loaded
            .turns
            .get(&p.task)?
            .iter()
            .find(|r| r.turn == p.turn)?;
        let old = Standing::of(old_record)?;
        let mut notes = p.notes.clone();
        if let Err(why) = &p.code {
            notes.push(format!("not rechecked: {why}"));
        }
        let new_record = slot.and_then(|s| evaluated?.record(p.task.problem, s));
        let new = new_record.and_then(Standing::of);
        if slot.is_some() && new.is_none() {
            notes.push(
                "not rechecked: the recheck gave it no verdict (see its run directory)".into(),
            );
        }
        let (changes, new_findings, gone_findings, noise_band) = match &new {
            Some(n) => compare::compare(
                &old,
                old_record.exec.as_ref(),
                n,
                new_record.and_then(|r| r.exec.as_ref()),
                tolerance,
            ),
            None => Default::default(),
        };
        Some(Rechecked {
            problem: p.task.problem,
            name: self.names.get(&p.task.problem).cloned(),
            sample: p.task.sample,
            turn: p.turn,
            recheck_sample: slot,
            old,
            new,
            changes,
            new_findings,
            gone_findings,
            noise_band,
            notes,
        })
    }
}
