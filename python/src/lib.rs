//! `krefine._native`: the Rust side of the `krefine` Python package.
//!
//! Every number comes from the krefine library itself ([`krefine::report`], [`krefine::metrics`]):
//! this crate only loads runs and hands their tables to Python as column dictionaries
//! (`{"turn": [1, 2, 3], "fast_1": [...], ...}`), events, configs and reports as JSON text. The
//! Python layer (python/krefine/__init__.py) turns the columns into pandas DataFrames.

use std::path::PathBuf;

use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use krefine::metrics::FAST_P_LABELS;
use krefine::metrics::bootstrap::Interval;
use krefine::metrics::compare::{BudgetAxis, CompareSettings};
use krefine::report::{
    Format, LoadedRun, axis_title, candidate_rows, compare_runs, differences, frozen_config,
    load_run_with_log, reference_time_warnings, render, run_labels, turn_rows,
};
use krefine::store::{EVENTS_FILE, log_lines};

pyo3::create_exception!(
    krefine,
    LoadError,
    PyException,
    "A run directory is missing or cannot be read; the message names the path and what is wrong."
);

/// A run directory, read and folded by krefine.
#[pyclass(frozen, name = "Run", module = "krefine._native")]
struct Run {
    run: LoadedRun,
    /// Length of the log's valid prefix and its record count, as read.
    log_len: u64,
    records: usize,
}

/// Column dictionaries keep their insertion order, which is the DataFrame's column order.
struct Columns<'py> {
    dict: Bound<'py, PyDict>,
}

impl<'py> Columns<'py> {
    fn new(py: Python<'py>) -> Self {
        Columns {
            dict: PyDict::new(py),
        }
    }

    fn add<T, I>(&self, name: &str, values: I) -> PyResult<()>
    where
        I: IntoIterator<Item = T>,
        T: IntoPyObject<'py>,
    {
        let list = PyList::new(self.dict.py(), values)?;
        self.dict.set_item(name, list)
    }
}

fn json_error(e: serde_json::Error) -> PyErr {
    PyValueError::new_err(format!("cannot write as JSON: {e}"))
}

#[pymethods]
impl Run {
    /// The run directory as given to `load_run`.
    #[getter]
    fn path(&self) -> PathBuf {
        self.run.dir.clone()
    }

    /// The run's name (`run.name` of its config).
    #[getter]
    fn name(&self) -> &str {
        &self.run.report.run
    }

    /// `one_shot`, `sampling` or `refine`.
    #[getter]
    fn method(&self) -> String {
        self.run.report.method.to_string()
    }

    /// The model name, `""` when the config does not say.
    #[getter]
    fn model(&self) -> &str {
        &self.run.report.model
    }

    /// True when the run ended with every task finished.
    #[getter]
    fn complete(&self) -> bool {
        self.run.report.complete
    }

    /// Every problem of the run (`"level/problem"`), sorted: the denominator of fast_p.
    #[getter]
    fn problems(&self) -> Vec<String> {
        let problems = &self.run.report.metrics.problems;
        problems.iter().map(ToString::to_string).collect()
    }

    /// What reading the run warned about (a torn last line dropped, a damaged provenance.json).
    #[getter]
    fn warnings(&self) -> Vec<String> {
        let run = &self.run;
        run.torn_tail
            .iter()
            .chain(&run.provenance_warning)
            .cloned()
            .collect()
    }

    /// `krefine report --format json` of this run, as text (with the run's `report.fast_p`
    /// thresholds beyond KernelBench's; Fast@1.2 where its frozen config's are not usable).
    fn report_json(&self) -> String {
        let thresholds = self
            .run
            .configured_fast_p()
            .unwrap_or(&krefine::report::load::DEFAULT_EXTRA_FAST_P);
        let report = self.run.with_extra(thresholds);
        render(std::slice::from_ref(&report), Format::Json)
    }

    /// The curve's steps as columns (see `krefine.Run.turns`).
    fn turn_columns<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let rows = turn_rows(&self.run);
        let c = Columns::new(py);
        c.add("turn", rows.iter().map(|r| r.turn))?;
        for (i, label) in FAST_P_LABELS.iter().enumerate() {
            c.add(
                &format!("fast_{label}"),
                rows.iter().map(|r| r.summary.fast_p.0[i]),
            )?;
        }
        c.add("correct_rate", rows.iter().map(|r| r.summary.correct_rate))?;
        c.add(
            "geomean_speedup",
            rows.iter().map(|r| r.summary.geomean_speedup),
        )?;
        c.add("tokens", rows.iter().map(|r| r.spend.tokens()))?;
        c.add("usd", rows.iter().map(|r| r.spend.usd()))?;
        c.add("gpu_s", rows.iter().map(|r| r.gpu_s))?;
        c.add(
            "compiled_rate",
            rows.iter().map(|r| r.summary.compiled_rate),
        )?;
        c.add("correct", rows.iter().map(|r| r.summary.correct))?;
        c.add("compiled", rows.iter().map(|r| r.summary.compiled))?;
        c.add("timed", rows.iter().map(|r| r.summary.timed))?;
        c.add("pending", rows.iter().map(|r| r.pending))?;
        c.add("prompt_tokens", rows.iter().map(|r| r.spend.prompt_tokens))?;
        c.add(
            "completion_tokens",
            rows.iter().map(|r| r.spend.completion_tokens),
        )?;
        c.add(
            "cumulative_tokens",
            rows.iter().map(|r| r.cumulative.tokens()),
        )?;
        c.add("cumulative_usd", rows.iter().map(|r| r.cumulative.usd()))?;
        c.add("cumulative_gpu_s", rows.iter().map(|r| r.cumulative_gpu_s))?;
        Ok(c.dict)
    }

    /// One row per finished turn of every task, as columns (see `krefine.Run.candidates`).
    fn candidate_columns<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let rows = candidate_rows(&self.run);
        let c = Columns::new(py);
        c.add("problem", rows.iter().map(|r| r.task.problem.problem_id))?;
        c.add("level", rows.iter().map(|r| r.task.problem.level))?;
        c.add("sample", rows.iter().map(|r| r.task.sample))?;
        c.add("turn", rows.iter().map(|r| r.turn))?;
        c.add("verdict", rows.iter().map(|r| r.verdict.as_str()))?;
        c.add("speedup", rows.iter().map(|r| r.speedup))?;
        c.add("runtime_ms", rows.iter().map(|r| r.runtime_ms))?;
        c.add("ref_runtime_ms", rows.iter().map(|r| r.ref_runtime_ms))?;
        c.add("compile_ms", rows.iter().map(|r| r.compile_ms))?;
        c.add("execute_ms", rows.iter().map(|r| r.execute_ms))?;
        c.add("profile_ms", rows.iter().map(|r| r.profile_ms))?;
        c.add("tokens", rows.iter().map(|r| r.tokens))?;
        c.add("prompt_tokens", rows.iter().map(|r| r.prompt_tokens))?;
        c.add(
            "completion_tokens",
            rows.iter().map(|r| r.completion_tokens),
        )?;
        c.add("usd", rows.iter().map(|r| r.usd))?;
        c.add("gpu_s", rows.iter().map(|r| r.gpu_s))?;
        c.add("compiled", rows.iter().map(|r| r.compiled))?;
        c.add("counted", rows.iter().map(|r| r.counted))?;
        c.add("device", rows.iter().map(|r| r.device.clone()))?;
        c.add("code", rows.iter().map(|r| r.code.clone()))?;
        Ok(c.dict)
    }

    /// The event log as a JSON array of its records (`{"v", "seq", "ts_ms", "task", "event"}`), the
    /// text of each exactly as written; the records krefine read (a torn last line dropped).
    fn events_json(&self) -> PyResult<String> {
        let path = self.run.dir.join(EVENTS_FILE);
        let lines =
            log_lines(&path, self.log_len).map_err(|e| LoadError::new_err(e.to_string()))?;
        if lines.len() != self.records {
            return Err(LoadError::new_err(format!(
                "{}: {} records now where {} were read: the log was replaced",
                path.display(),
                lines.len(),
                self.records
            )));
        }
        Ok(format!("[{}]", lines.join(",")))
    }

    /// The frozen config (`config.toml`) as a JSON object.
    fn config_json(&self) -> PyResult<String> {
        let table = frozen_config(&self.run.dir).map_err(|e| LoadError::new_err(e.to_string()))?;
        serde_json::to_string(&table).map_err(json_error)
    }

    fn __repr__(&self) -> String {
        format!(
            "Run({:?}, {} {}, {} problem(s))",
            self.run.dir.display().to_string(),
            self.run.report.method,
            self.run.report.run,
            self.run.report.metrics.problems.len()
        )
    }
}

/// Read and fold the run directory `path`; raises `LoadError` naming the path and what is wrong.
#[pyfunction]
fn load_run(py: Python<'_>, path: PathBuf) -> PyResult<Run> {
    let loaded = py.detach(|| load_run_with_log(&path));
    let (run, log) = loaded.map_err(|e| LoadError::new_err(e.to_string()))?;
    Ok(Run {
        run,
        log_len: log.valid_len,
        records: log.records.len(),
    })
}

fn axis_named(name: &str) -> PyResult<BudgetAxis> {
    BudgetAxis::ALL
        .into_iter()
        .find(|a| a.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = BudgetAxis::ALL.iter().map(|a| a.name()).collect();
            PyValueError::new_err(format!(
                "unknown axis '{name}' (expected one of {})",
                names.join(", ")
            ))
        })
}

/// The matched-budget comparison of `runs` along `axis`, as columns, and what describes it.
#[pyfunction]
fn compare_columns<'py>(
    py: Python<'py>,
    runs: Vec<PyRef<'py, Run>>,
    axis: &str,
    resamples: u32,
    seed: u64,
    level: f64,
) -> PyResult<(Bound<'py, PyDict>, Bound<'py, PyDict>)> {
    let axis = axis_named(axis)?;
    let loaded: Vec<&LoadedRun> = runs.iter().map(|r| &r.run).collect();
    let settings = CompareSettings {
        resamples,
        seed,
        level,
    };
    let c = compare_runs(&loaded, settings).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let Some(table) = c.axes.iter().find(|a| a.axis == axis) else {
        return Err(PyValueError::new_err(format!(
            "axis {} is missing from the comparison",
            axis.name()
        )));
    };
    if let Some(why) = &table.unavailable {
        return Err(PyValueError::new_err(format!(
            "axis {} cannot compare these runs: {why}",
            axis.name()
        )));
    }
    let cells: Vec<_> = table
        .rows
        .iter()
        .flat_map(|row| row.runs.iter().map(move |r| (row.budget, r)))
        .collect();
    let ci_of = |pick: &dyn Fn(&krefine::metrics::compare::SummaryCi) -> Option<Interval>| {
        cells
            .iter()
            .map(|(_, r)| r.ci.as_ref().and_then(pick))
            .collect::<Vec<_>>()
    };
    let cols = Columns::new(py);
    let interval = |name: &str, values: Vec<Option<Interval>>| -> PyResult<()> {
        cols.add(
            &format!("{name}_lo"),
            values.iter().map(|i| i.map(|i| i.lo)),
        )?;
        cols.add(
            &format!("{name}_hi"),
            values.iter().map(|i| i.map(|i| i.hi)),
        )
    };
    cols.add("budget", cells.iter().map(|(b, _)| *b))?;
    cols.add("run", cells.iter().map(|(_, r)| r.run.clone()))?;
    cols.add("problems", cells.iter().map(|_| c.shared_problems.len()))?;
    cols.add("attempts", cells.iter().map(|(_, r)| r.attempts))?;
    cols.add("exhausted", cells.iter().map(|(_, r)| r.exhausted))?;
    for (i, label) in FAST_P_LABELS.iter().enumerate() {
        let name = format!("fast_{label}");
        cols.add(&name, cells.iter().map(|(_, r)| r.summary.fast_p.0[i]))?;
        interval(&name, ci_of(&|ci| ci.fast_p.0[i]))?;
    }
    cols.add(
        "correct_rate",
        cells.iter().map(|(_, r)| r.summary.correct_rate),
    )?;
    interval("correct_rate", ci_of(&|ci| ci.correct_rate))?;
    cols.add(
        "geomean_speedup",
        cells.iter().map(|(_, r)| r.summary.geomean_speedup),
    )?;
    interval("geomean_speedup", ci_of(&|ci| ci.geomean_speedup))?;
    cols.add(
        "compiled_rate",
        cells.iter().map(|(_, r)| r.summary.compiled_rate),
    )?;
    cols.add("correct", cells.iter().map(|(_, r)| r.summary.correct))?;
    cols.add("compiled", cells.iter().map(|(_, r)| r.summary.compiled))?;
    cols.add("timed", cells.iter().map(|(_, r)| r.summary.timed))?;
    for (i, label) in FAST_P_LABELS.iter().enumerate() {
        let name = format!("delta_fast_{label}");
        let deltas: Vec<_> = cells.iter().map(|(_, r)| r.vs_first.as_ref()).collect();
        cols.add(&name, deltas.iter().map(|d| d.map(|d| d.fast_p.0[i])))?;
        interval(
            &name,
            deltas
                .iter()
                .map(|d| d.and_then(|d| d.fast_p_ci.0[i]))
                .collect(),
        )?;
    }
    let deltas: Vec<_> = cells.iter().map(|(_, r)| r.vs_first.as_ref()).collect();
    cols.add(
        "delta_correct_rate",
        deltas.iter().map(|d| d.map(|d| d.correct_rate)),
    )?;
    interval(
        "delta_correct_rate",
        deltas
            .iter()
            .map(|d| d.and_then(|d| d.correct_rate_ci))
            .collect(),
    )?;

    let infos: Vec<_> = runs.iter().map(|r| r.run.info.clone()).collect();
    let (differ, same) = differences(&infos);
    let meta = PyDict::new(py);
    meta.set_item("axis", axis.name())?;
    meta.set_item("axis_title", axis_title(axis))?;
    meta.set_item("runs", c.runs.clone())?;
    let shared: Vec<String> = c.shared_problems.iter().map(ToString::to_string).collect();
    meta.set_item("shared_problems", shared)?;
    let dropped = PyDict::new(py);
    for (run, n) in c.runs.iter().zip(&c.dropped) {
        dropped.set_item(run, n)?;
    }
    meta.set_item("dropped", dropped)?;
    let differs = PyDict::new(py);
    for (field, values) in differ {
        differs.set_item(field, values)?;
    }
    meta.set_item("differs", differs)?;
    let same_dict = PyDict::new(py);
    for (field, value) in same {
        same_dict.set_item(field, value)?;
    }
    meta.set_item("same", same_dict)?;
    let settings = PyDict::new(py);
    settings.set_item("resamples", c.settings.resamples)?;
    settings.set_item("seed", c.settings.seed)?;
    settings.set_item("level", c.settings.level)?;
    meta.set_item("settings", settings)?;
    meta.set_item("reference_time_warnings", reference_warnings(py, &loaded)?)?;
    Ok((cols.dict, meta))
}

/// `krefine compare`'s warnings about problems whose reference took very different times in the
/// runs (a shared device, say): each as a dict (problem, ref_ms by run label, ratio, message).
fn reference_warnings<'py>(py: Python<'py>, runs: &[&LoadedRun]) -> PyResult<Bound<'py, PyList>> {
    let labels = run_labels(runs);
    let list = PyList::empty(py);
    for w in reference_time_warnings(runs, &labels) {
        let item = PyDict::new(py);
        item.set_item("problem", w.problem.to_string())?;
        let ref_ms = PyDict::new(py);
        for (run, ms) in &w.ref_ms {
            ref_ms.set_item(run, ms)?;
        }
        item.set_item("ref_ms", ref_ms)?;
        item.set_item("ratio", w.ratio)?;
        item.set_item("message", w.message())?;
        list.append(item)?;
    }
    Ok(list)
}

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("LoadError", m.py().get_type::<LoadError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<Run>()?;
    m.add_function(wrap_pyfunction!(load_run, m)?)?;
    m.add_function(wrap_pyfunction!(compare_columns, m)?)?;
    Ok(())
}
