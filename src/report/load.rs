//! Reading a run directory into everything reports, comparisons, plots and exports need: the fold of
//! its log (turn records), its metrics and ledger, its attempts with their costs, and what describes
//! the run (method, model, hardware, evaluation settings) so comparisons can say what differs.
//!
//! The log is read by the store's one reader and folded once by the run's one reducer
//! ([`RunState`]): the turns, the ledger and the GPU-seconds per turn here are that fold's, the same
//! the terminal UI shows and the Python package returns.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::Config;
use crate::machine::{MachineError, TaskTurns};
use crate::metrics::{RunAttempts, RunInput, run_attempts, run_metrics, run_problems};
use crate::state::RunState;
use crate::store::{ReadLog, RunDir, StoreError, read_log};
use crate::types::{FeedbackMode, MethodKind, TaskId};

use super::{RunReport, feedback_key};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}: no such directory")]
    Missing(PathBuf),
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{path} does not fold into task states: {source}")]
    Fold {
        path: PathBuf,
        #[source]
        source: MachineError,
    },
    #[error("{path}: the log has no run_started record")]
    NotStarted { path: PathBuf },
    #[error("{path}: {source}")]
    Config {
        path: PathBuf,
        #[source]
        source: ConfigFileError,
    },
}

/// Why a run's frozen `config.toml` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("cannot read it: {0}")]
    Io(#[from] std::io::Error),
    #[error("not valid TOML: {0}")]
    Toml(#[from] toml::de::Error),
}

/// The frozen config of the run in `dir` (`config.toml`) as written, key for key.
pub fn frozen_config(dir: &Path) -> Result<toml::Table, LoadError> {
    let path = dir.join(crate::store::CONFIG_FILE);
    let wrap = |source: ConfigFileError| LoadError::Config {
        path: path.clone(),
        source,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| wrap(e.into()))?;
    toml::from_str(&text).map_err(|e| wrap(e.into()))
}

/// What describes a run, as `(field, value)` pairs in a fixed order; a comparison lists the fields
/// whose values differ between runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunInfo {
    pub run: String,
    pub method: MethodKind,
    pub feedback: Option<FeedbackMode>,
    pub model: String,
    /// Device names that measured the run's candidates (`cpu`, `NVIDIA H100 80GB HBM3`).
    pub hardware: Vec<String>,
    /// As the first result that recorded them says (`None`: no result did).
    pub precision: Option<String>,
    pub eval_mode: Option<String>,
    pub timing_method: Option<String>,
    /// The correctness tolerance (`kernelbench (atol = rtol = 1e-4)`); `None` where the results
    /// recorded none (KernelBench's per-precision table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<String>,
    /// Where reference timings came from (`measured`, `cached`, `baseline:<file>`).
    pub reference: Vec<String>,
    /// The dataset folder's name, level and problems, from the frozen config (`None` without one).
    pub dataset: Option<String>,
    /// Turns (refine) or samples (sampling) per problem.
    pub axis: u32,
    pub simulated: bool,
}

impl RunInfo {
    /// The fields a comparison looks at, with their values as text.
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let list = |v: &[String]| {
            if v.is_empty() {
                "-".to_string()
            } else {
                v.join(", ")
            }
        };
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        vec![
            ("method", self.method.to_string()),
            (
                "feedback",
                self.feedback.map_or("-".into(), |f| feedback_key(f).into()),
            ),
            (
                "model",
                if self.model.is_empty() {
                    "-".into()
                } else {
                    self.model.clone()
                },
            ),
            ("hardware", list(&self.hardware)),
            ("precision", opt(&self.precision)),
            ("eval_mode", opt(&self.eval_mode)),
            ("timing", opt(&self.timing_method)),
            (
                "tolerance",
                super::provenance::tolerance_label(self.tolerance.as_deref()),
            ),
            ("reference", list(&self.reference)),
            ("dataset", opt(&self.dataset)),
            (
                "budget",
                format!(
                    "{} {}",
                    self.axis,
                    match self.method {
                        MethodKind::Sampling => "samples",
                        _ => "turns",
                    }
                ),
            ),
            ("simulated", self.simulated.to_string()),
        ]
    }
}

/// A run directory, read and folded.
#[derive(Debug, Clone)]
pub struct LoadedRun {
    pub dir: PathBuf,
    pub report: RunReport,
    pub info: RunInfo,
    /// Each problem's attempts with outcome and cost, in budget order (for matched-budget
    /// comparisons).
    pub attempts: RunAttempts,
    /// Every task's turn records.
    pub turns: TaskTurns,
    /// Milliseconds of device leases held per (task, turn) (execution and profiling).
    pub device_ms: BTreeMap<(TaskId, u32), u64>,
    /// The planned tasks, in the logged order.
    pub task_ids: Vec<TaskId>,
    /// A torn last line of the log that was dropped, to warn about.
    pub torn_tail: Option<String>,
    /// Why `provenance.json` could not be read, when it exists but is damaged.
    pub provenance_warning: Option<String>,
    /// `report.fast_p` of the run's frozen config, as written (Fast@1.2 where the config has none or
    /// cannot be read); [`LoadedRun::configured_fast_p`] checks it.
    pub fast_p: Vec<f64>,
}

/// The fast_p thresholds `report` and `compare` show besides KernelBench's set when neither the
/// run's config (`report.fast_p`) nor the command line (`--fast-p`) names any: Fast@1.2.
pub use crate::config::DEFAULT_EXTRA_FAST_P;

impl LoadedRun {
    /// The run's `report.fast_p`, or why it cannot be used (a hand-edited frozen config), naming the
    /// file and the key.
    pub fn configured_fast_p(&self) -> Result<&[f64], String> {
        crate::config::check_fast_p(&self.fast_p)
            .map(|()| self.fast_p.as_slice())
            .map_err(|m| {
                format!(
                    "{}: key `report.fast_p`: {m} (or choose thresholds with --fast-p)",
                    self.dir.join(crate::store::CONFIG_FILE).display()
                )
            })
    }

    /// Its report with fast_p at `thresholds` (those beyond KernelBench's set) and the mean fraction
    /// of speed of light, per step (`report` and `compare` with `--fast-p`).
    pub fn with_extra(&self, thresholds: &[f64]) -> RunReport {
        let r = &self.report;
        let input = crate::metrics::RunInput {
            method: r.method,
            axis: r.metrics.axis,
            problems: &r.metrics.problems,
            turns: &self.turns,
        };
        RunReport {
            extra: crate::metrics::extra_metrics(&input, thresholds),
            ..r.clone()
        }
    }
}

/// Read and fold the run in `dir`.
pub fn load_run(dir: &Path) -> Result<LoadedRun, LoadError> {
    load_run_with_log(dir).map(|(run, _)| run)
}

/// [`load_run`], also returning the log as read (its records, a torn last line dropped, and the
/// length of the valid prefix) for callers that show the events themselves.
pub fn load_run_with_log(dir: &Path) -> Result<(LoadedRun, ReadLog), LoadError> {
    if !dir.exists() {
        return Err(LoadError::Missing(dir.to_path_buf()));
    }
    if !dir.is_dir() {
        return Err(LoadError::NotADirectory(dir.to_path_buf()));
    }
    let run = RunDir::existing(dir)?;
    let log = read_log(&run.events_path())?;
    let state = RunState::from_records(&log.records);
    let turns = state.task_turns().map_err(|source| LoadError::Fold {
        path: run.events_path(),
        source,
    })?;
    let Some(started) = &state.info else {
        return Err(LoadError::NotStarted {
            path: run.events_path(),
        });
    };
    let (name, method, feedback, task_ids, n_turns, samples, simulated) = (
        started.run.clone(),
        started.method,
        started.logged_feedback,
        started.task_ids.clone(),
        started.turns,
        started.samples,
        started.simulated,
    );
    let config = std::fs::read_to_string(run.config_path())
        .ok()
        .and_then(|t| toml::from_str::<Config>(&t).ok());
    let model = config
        .as_ref()
        .map(|c| c.model.name.clone())
        .unwrap_or_default();
    let axis = match method {
        MethodKind::Refine => n_turns,
        MethodKind::Sampling => samples,
        MethodKind::OneShot => 1,
    };
    let problems = run_problems(&task_ids);
    let input = RunInput {
        method,
        axis,
        problems: &problems,
        turns: &turns,
    };
    let metrics = run_metrics(&input);
    let mut ledger = state.ledger();
    // `krefine eval` serves generations made elsewhere through the scripted provider: they are no
    // LLM calls, so the run spent no answers, tokens or USD.
    let served = config.as_ref().is_some_and(|c| {
        c.model.provider == crate::config::Provider::Scripted
            && c.model.name == crate::llm::scripted::SERVED_MODEL
    });
    let served = served.then(|| {
        let n = ledger.total.answers;
        ledger.total = Default::default();
        ledger.per_turn.clear();
        ledger.per_task.clear();
        ledger.per_task_turn.clear();
        n
    });
    let device_ms = state.device_ms().clone();
    let attempts = run_attempts(&input, &ledger, &device_ms);
    let complete = state.complete;
    let feedback = (method == MethodKind::Refine).then_some(feedback).flatten();
    // A damaged provenance.json must not hide the run's numbers: say so and report without it.
    let (recorded, provenance_warning) = match crate::provenance::read(dir) {
        Ok(p) => (p, None),
        Err(e) => (None, Some(e.to_string())),
    };
    let provenance = crate::report::provenance::provenance(
        &crate::report::provenance::Started {
            method,
            turns: n_turns,
            samples,
            feedback,
        },
        config.as_ref(),
        recorded.as_ref(),
        turns.values().flatten().filter_map(|t| t.exec.as_ref()),
    );
    let info = describe(
        &name,
        method,
        feedback,
        &model,
        axis,
        simulated,
        config.as_ref(),
        &turns,
    );
    let loaded = LoadedRun {
        dir: dir.to_path_buf(),
        report: RunReport {
            run: name,
            method,
            feedback,
            model,
            metrics,
            ledger,
            complete,
            provenance: Some(provenance),
            served,
            extra: crate::metrics::ExtraMetrics::default(),
        },
        info,
        attempts,
        turns,
        device_ms,
        task_ids,
        torn_tail: log.torn_tail,
        provenance_warning,
        fast_p: config.as_ref().map_or_else(
            || DEFAULT_EXTRA_FAST_P.to_vec(),
            |c| c.report.fast_p.clone(),
        ),
    };
    let log = ReadLog {
        torn_tail: loaded.torn_tail.clone(),
        ..log
    };
    Ok((loaded, log))
}

#[allow(
    clippy::too_many_arguments,
    reason = "the run's facts from three sources (its start record, config and results); one call site"
)]
fn describe(
    name: &str,
    method: MethodKind,
    feedback: Option<FeedbackMode>,
    model: &str,
    axis: u32,
    simulated: bool,
    config: Option<&Config>,
    turns: &TaskTurns,
) -> RunInfo {
    let mut hardware = BTreeSet::new();
    let mut reference = BTreeSet::new();
    let mut precision = None;
    let mut mode = None;
    let mut timing = None;
    let mut tolerance = None;
    for e in turns.values().flatten().filter_map(|r| r.exec.as_ref()) {
        if !e.env.device_name.is_empty() {
            hardware.insert(e.env.device_name.clone());
        } else if !e.device.is_empty() {
            hardware.insert(e.device.clone());
        }
        if let Some(s) = &e.ref_source {
            reference.insert(s.clone());
        }
        precision = precision.or(e.env.precision.clone());
        mode = mode.or(e.env.mode.clone());
        timing = timing.or(e.env.timing_method.clone());
        tolerance = tolerance.or(e.env.tolerance.as_ref().map(|t| t.to_string()));
    }
    let dataset = config.map(|c| {
        let file = c
            .dataset
            .path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        format!("{file} level {} ({})", c.dataset.level, c.dataset.problems)
    });
    RunInfo {
        run: name.to_string(),
        method,
        feedback,
        model: model.to_string(),
        hardware: hardware.into_iter().collect(),
        precision: precision.or_else(|| config.map(|c| c.eval.precision.as_str().to_string())),
        eval_mode: mode.or_else(|| config.map(|c| c.eval.mode.as_str().to_string())),
        timing_method: timing,
        tolerance,
        reference: reference.into_iter().collect(),
        dataset,
        axis,
        simulated,
    }
}

/// Fields whose values differ between runs: the field and each run's value.
pub type Differing = Vec<(&'static str, Vec<String>)>;
/// Fields with one value for all runs.
pub type Shared = Vec<(&'static str, String)>;

/// Which fields of [`RunInfo::fields`] differ between runs, and which are the same (with the value).
pub fn differences(infos: &[RunInfo]) -> (Differing, Shared) {
    let fields: Vec<Vec<(&'static str, String)>> = infos.iter().map(RunInfo::fields).collect();
    let mut differ = Vec::new();
    let mut same = Vec::new();
    let Some(first) = fields.first() else {
        return (differ, same);
    };
    for (i, (key, value)) in first.iter().enumerate() {
        let values: Vec<String> = fields.iter().map(|f| f[i].1.clone()).collect();
        if values.iter().all(|v| v == value) {
            same.push((*key, value.clone()));
        } else {
            differ.push((*key, values));
        }
    }
    (differ, same)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(run: &str, method: MethodKind, feedback: Option<FeedbackMode>, hw: &str) -> RunInfo {
        RunInfo {
            run: run.into(),
            method,
            feedback,
            model: "m".into(),
            hardware: vec![hw.into()],
            precision: Some("fp32".into()),
            eval_mode: Some("faithful".into()),
            timing_method: None,
            tolerance: None,
            reference: vec![],
            dataset: None,
            axis: 3,
            simulated: false,
        }
    }

    #[test]
    fn differences_list_each_runs_value() {
        let (differ, same) = differences(&[
            info("a", MethodKind::Refine, Some(FeedbackMode::GEP), "H100"),
            info("b", MethodKind::Sampling, None, "H100"),
            info("c", MethodKind::Refine, Some(FeedbackMode::G), "A100"),
        ]);
        assert_eq!(
            differ,
            vec![
                (
                    "method",
                    vec!["refine".into(), "sampling".into(), "refine".into()]
                ),
                ("feedback", vec!["GEP".into(), "-".into(), "G".into()]),
                (
                    "hardware",
                    vec!["H100".into(), "H100".into(), "A100".into()]
                ),
                (
                    "budget",
                    vec!["3 turns".into(), "3 samples".into(), "3 turns".into()]
                ),
            ]
        );
        let keys: Vec<&str> = same.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            [
                "model",
                "precision",
                "eval_mode",
                "timing",
                "tolerance",
                "reference",
                "dataset",
                "simulated"
            ]
        );
        assert_eq!(differences(&[]), (vec![], vec![]));
    }
}
