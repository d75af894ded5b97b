//! Experiment configuration: TOML with serde defaults, `--set key=value` overrides and validation.
//!
//! Every section denies unknown keys, so a typo is an error that names the file, the line and the key
//! instead of a silently ignored setting. A run directory keeps a frozen copy (`config.toml`) of the
//! effective configuration, overrides applied.
//!
//! Each room owns its section (`llm::config`, `prompt::config`, `launcher::config`, `worker::config`,
//! `sim`, `checks`) and the enums several rooms share live in [`crate::settings`]; this module only
//! assembles them, and re-exports them where callers have always found them. The sections no lower
//! room owns are its own: `[dataset]` (`dataset`) and `[report]` (`report`, read by the report room
//! above) in submodules, `[run]`, `[method]` and `[output]` here.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::llm::LlmParts;
use crate::settings::resolve_config_path;
use crate::types::{EvalMode, FeedbackMode, MethodKind};

// Each room owns its section; this module assembles them (and re-exports them where callers have
// always found them).
pub use crate::checks::ChecksSection;
pub use crate::launcher::config::{LauncherKind, ResourcesSection, SlurmSection, SshSection};
pub use crate::llm::config::{BudgetSection, ModelSection, Price, Provider};
pub use crate::prompt::config::{PromptSection, PromptStyle};
pub use crate::settings::{Backend, DeviceSelection, HistoryPolicy};
pub use crate::sim::SimulatedSection;
pub use crate::worker::config::{BuildMode, EvalSection, ExecutorKind, InputsMode, Timeouts};
pub use crate::worker::sandbox::SandboxMode;
pub use dataset::DatasetSection;
pub use report::{DEFAULT_EXTRA_FAST_P, ReportSection, check_fast_p};

mod dataset;
mod report;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("--set {assignment}: {message}")]
    Override { assignment: String, message: String },
    #[error("config {path}: key `{key}`: {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub run: RunSection,
    pub dataset: DatasetSection,
    #[serde(default)]
    pub method: MethodSection,
    pub model: ModelSection,
    #[serde(default)]
    pub resources: ResourcesSection,
    #[serde(default)]
    pub budget: BudgetSection,
    #[serde(default)]
    pub eval: EvalSection,
    #[serde(default)]
    pub prompt: PromptSection,
    #[serde(default)]
    pub report: ReportSection,
    #[serde(default)]
    pub output: OutputSection,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// Run name; the run directory is `<output.dir>/<name>`. Defaults to the config file's stem.
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MethodSection {
    #[serde(default = "default_method")]
    pub kind: MethodKind,
    /// Turns per task for `refine`.
    #[serde(default = "default_turns")]
    pub turns: u32,
    /// Independent samples per problem for `sampling`.
    #[serde(default = "default_k")]
    pub k: u32,
    #[serde(default = "default_feedback")]
    pub feedback: FeedbackMode,
    #[serde(default)]
    pub history: HistoryPolicy,
}

fn default_method() -> MethodKind {
    MethodKind::Refine
}
fn default_turns() -> u32 {
    10
}
fn default_k() -> u32 {
    1
}
fn default_feedback() -> FeedbackMode {
    FeedbackMode::GEP
}

impl Default for MethodSection {
    fn default() -> Self {
        MethodSection {
            kind: default_method(),
            turns: default_turns(),
            k: default_k(),
            feedback: default_feedback(),
            history: HistoryPolicy::default(),
        }
    }
}

impl MethodSection {
    /// Turns each task runs (1 for one-shot and sampling).
    pub fn turns_per_task(&self) -> u32 {
        match self.kind {
            MethodKind::Refine => self.turns,
            MethodKind::OneShot | MethodKind::Sampling => 1,
        }
    }
    /// Samples (independent conversations) per problem.
    pub fn samples_per_problem(&self) -> u32 {
        match self.kind {
            MethodKind::Sampling => self.k,
            MethodKind::OneShot | MethodKind::Refine => 1,
        }
    }
    /// Length of the fast_p@N curve: turns for refinement, samples for sampling.
    pub fn budget_axis(&self) -> u32 {
        match self.kind {
            MethodKind::Refine => self.turns,
            MethodKind::Sampling => self.k,
            MethodKind::OneShot => 1,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OutputSection {
    /// Parent folder of run directories.
    #[serde(default = "default_out_dir")]
    pub dir: PathBuf,
    /// fsync the event log after every batch of events, before any of them is acted on (slower;
    /// survives power loss, not only crashes).
    #[serde(default)]
    pub fsync: bool,
}

fn default_out_dir() -> PathBuf {
    PathBuf::from("trajectories")
}

impl Default for OutputSection {
    fn default() -> Self {
        OutputSection {
            dir: default_out_dir(),
            fsync: false,
        }
    }
}

/// A loaded configuration with where it came from.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub config: Config,
    /// The config file; relative paths inside it are resolved against its folder.
    pub path: PathBuf,
    /// The effective configuration as TOML (overrides applied), frozen into the run directory.
    pub effective_toml: String,
}

impl LoadedConfig {
    /// Resolve a path from the config relative to the config file's folder.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        resolve_config_path(&self.path, p)
    }

    /// What the LLM room builds its provider from: its sections, `[resources]` and this file.
    pub fn llm_parts(&self) -> LlmParts<'_> {
        LlmParts {
            model: &self.config.model,
            budget: &self.config.budget,
            resources: &self.config.resources,
            config_file: &self.path,
        }
    }

    /// The run name: `run.name` or the config file's stem.
    pub fn run_name(&self) -> String {
        self.config.run.name.clone().unwrap_or_else(|| {
            self.path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "run".into())
        })
    }
}

/// Read, override and validate a config file.
pub fn load(path: &Path, sets: &[String]) -> Result<LoadedConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, path, sets)
}

/// Parse config text (`path` is only used in messages and to resolve relative paths).
pub fn parse(text: &str, path: &Path, sets: &[String]) -> Result<LoadedConfig, ConfigError> {
    let parse_err = |e: toml::de::Error| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string().trim_end().to_string(),
    };
    // Deserialize the file alone first, so errors in it carry its line numbers.
    let _: Config = toml::from_str(text).map_err(parse_err)?;
    let mut table: toml::Table = toml::from_str(text).map_err(parse_err)?;
    for assignment in sets {
        apply_set(&mut table, assignment)?;
    }
    let mut config: Config = if sets.is_empty() {
        toml::from_str(text).map_err(parse_err)?
    } else {
        toml::Value::Table(table.clone())
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Override {
                assignment: sets.join(" "),
                message: e.to_string().trim_end().to_string(),
            })?
    };
    let given_timeouts = table
        .get("eval")
        .and_then(|e| e.get("timeouts"))
        .and_then(|t| t.as_table());
    let level = config.dataset.level;
    config
        .eval
        .timeouts
        .fill_level_defaults(level, given_timeouts);
    let given_precision = table.get("eval").and_then(|e| e.get("precision")).is_some();
    crate::prompt::config::backend_precision(
        config.prompt.backend,
        &mut config.eval.precision,
        given_precision,
    )
    .map_err(|message| ConfigError::Invalid {
        path: path.to_path_buf(),
        key: "eval.precision".into(),
        message,
    })?;
    validate(&config, path)?;
    let effective_toml = toml::to_string_pretty(&config).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: format!("cannot serialise the effective config: {e}"),
    })?;
    Ok(LoadedConfig {
        config,
        path: path.to_path_buf(),
        effective_toml,
    })
}

/// Apply one `key.path=value` override. The value is read as a TOML value when it parses as one
/// (`3`, `0.7`, `true`, `[0, 1]`, `"x"`), else taken as a plain string (`GEP`, `refine`).
fn apply_set(table: &mut toml::Table, assignment: &str) -> Result<(), ConfigError> {
    let err = |message: String| ConfigError::Override {
        assignment: assignment.to_string(),
        message,
    };
    let (key, raw) = assignment
        .split_once('=')
        .ok_or_else(|| err("expected key=value, e.g. method.turns=5".into()))?;
    let key = key.trim();
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(err(format!("malformed key {key:?}")));
    }
    let value = parse_set_value(raw.trim());
    let (last, parents) = parts.split_last().ok_or_else(|| err("empty key".into()))?;
    let mut cur = table;
    for p in parents {
        let entry = cur
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = match entry {
            toml::Value::Table(t) => t,
            _ => return Err(err(format!("`{p}` is not a section"))),
        };
    }
    cur.insert(last.to_string(), value);
    Ok(())
}

fn parse_set_value(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_string())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

fn validate(c: &Config, path: &Path) -> Result<(), ConfigError> {
    let invalid = |key: &str, message: &str| ConfigError::Invalid {
        path: path.to_path_buf(),
        key: key.to_string(),
        message: message.to_string(),
    };
    if c.method.turns == 0 {
        return Err(invalid("method.turns", "expected at least 1 turn"));
    }
    if c.method.k == 0 {
        return Err(invalid("method.k", "expected at least 1 sample"));
    }
    if let Some(name) = &c.run.name
        && (name.is_empty() || name.contains('/') || name.contains('\\') || name == "..")
    {
        return Err(invalid("run.name", "expected a plain folder name"));
    }
    match c.model.provider {
        Provider::Scripted if c.model.answers.is_none() => {
            return Err(invalid(
                "model.answers",
                "the scripted provider needs a JSONL file of answers",
            ));
        }
        Provider::Openai if c.model.name.is_empty() => {
            return Err(invalid(
                "model.name",
                "the openai provider needs a model name",
            ));
        }
        _ => {}
    }
    if let Some(t) = c.model.temperature
        && !(0.0..=2.0).contains(&t)
    {
        return Err(invalid(
            "model.temperature",
            "expected a number from 0 to 2",
        ));
    }
    if let Some(p) = c.model.top_p
        && !(p > 0.0 && p <= 1.0)
    {
        return Err(invalid("model.top_p", "expected a number in (0, 1]"));
    }
    if c.model.request_timeout_s.is_nan() || c.model.request_timeout_s <= 0.0 {
        return Err(invalid(
            "model.request_timeout_s",
            "expected a positive number",
        ));
    }
    if c.resources.llm_concurrency == 0 {
        return Err(invalid("resources.llm_concurrency", "expected at least 1"));
    }
    if !(c.resources.reference_cache_gb.is_finite() && c.resources.reference_cache_gb >= 0.0) {
        return Err(invalid(
            "resources.reference_cache_gb",
            &format!(
                "expected a size in GB, 0 or more (0 turns the reference input store off), got {}",
                c.resources.reference_cache_gb
            ),
        ));
    }
    if let Some(gb) = c.resources.reference_ram_gb
        && !(gb.is_finite() && gb >= 0.0)
    {
        return Err(invalid(
            "resources.reference_ram_gb",
            &format!("expected a size in GB, 0 or more (0 turns the in-memory tier off), got {gb}"),
        ));
    }
    if c.resources.prepare_ahead > crate::refprep::MAX_AHEAD {
        return Err(invalid(
            "resources.prepare_ahead",
            &format!(
                "expected 0 to {} (a worker keeps the reference data of {} problems; more prepared \
                 ahead would evict each other before their candidates arrive), got {}",
                crate::refprep::MAX_AHEAD,
                crate::refprep::MAX_AHEAD + 1,
                c.resources.prepare_ahead
            ),
        ));
    }
    if c.resources.compile_workers == Some(0) {
        return Err(invalid("resources.compile_workers", "expected at least 1"));
    }
    if c.resources.cpu_budget == Some(0) {
        return Err(invalid(
            "resources.cpu_budget",
            "expected at least 1 (cores shared by builds, input preparation and CPU timing)",
        ));
    }
    if c.resources.drain_after == 0 {
        return Err(invalid("resources.drain_after", "expected at least 1"));
    }
    let r = &c.resources;
    crate::launcher::config::validate(
        r.launcher,
        &r.slurm,
        &r.ssh,
        r.devices == DeviceSelection::Cpu,
    )
    .map_err(|(key, message)| invalid(&key, &message))?;
    if c.eval.correct_trials == 0 {
        return Err(invalid("eval.correct_trials", "expected at least 1"));
    }
    if let Some(message) =
        crate::prompt::config::backend_device(c.prompt.backend, r.devices == DeviceSelection::Cpu)
    {
        return Err(invalid("prompt.backend", &message));
    }
    let method = c.eval.timing_method;
    if method.needs_gpu() && r.devices == DeviceSelection::Cpu {
        return Err(invalid(
            "eval.timing_method",
            &format!(
                "\"{}\" times with Triton on a CUDA device, but resources.devices = \"cpu\" \
                 (on a CPU use \"cuda_event\" or \"host_time\", which time with perf_counter)",
                method.as_str()
            ),
        ));
    }
    if !method.is_default() && c.eval.mode == EvalMode::Strict {
        return Err(invalid(
            "eval.timing_method",
            &format!(
                "\"{}\" is a faithful-mode timer; strict mode times with its own loop (fresh \
                 inputs per call, device-wide fence), so leave timing_method unset there",
                method.as_str()
            ),
        ));
    }
    if let Some(m) = &c.eval.compile_mode
        && !crate::worker::config::COMPILE_MODES.contains(&m.as_str())
    {
        return Err(invalid(
            "eval.compile_mode",
            &format!(
                "expected one of {}, got {m:?}",
                crate::worker::config::COMPILE_MODES.join(", ")
            ),
        ));
    }
    if c.eval.reference != crate::worker::config::ReferenceMode::Compile
        && (c.eval.compile_backend.is_some() || c.eval.compile_mode.is_some())
    {
        return Err(invalid(
            "eval.compile_backend",
            "compile_backend and compile_mode apply with eval.reference = \"compile\" only",
        ));
    }
    for (key, value) in [("eval.atol", c.eval.atol), ("eval.rtol", c.eval.rtol)] {
        if let Some(v) = value
            && !(v.is_finite() && v >= 0.0)
        {
            return Err(invalid(
                key,
                &format!("expected a finite number >= 0, got {v}"),
            ));
        }
    }
    if c.eval.timing_trials == 0 {
        return Err(invalid("eval.timing_trials", "expected at least 1"));
    }
    if let Some(bound) = c.eval.max_speedup
        && !(bound.is_finite() && bound > 0.0)
    {
        return Err(invalid("eval.max_speedup", "expected a positive number"));
    }
    let t = &c.eval.timeouts;
    for (key, v) in [
        ("eval.timeouts.compile_s", t.compile_s),
        ("eval.timeouts.load_s", t.load_s),
        ("eval.timeouts.reference_s", t.reference_s),
        ("eval.timeouts.execute_s", t.execute_s),
        ("eval.timeouts.profile_s", t.profile_s),
    ] {
        if v.is_nan() || v <= 0.0 {
            return Err(invalid(key, "expected a positive number of seconds"));
        }
    }
    let s = &c.eval.simulated;
    if s.time_scale.is_nan() || s.time_scale <= 0.0 {
        return Err(invalid(
            "eval.simulated.time_scale",
            "expected a positive number",
        ));
    }
    if s.execute_min_s > s.execute_max_s {
        return Err(invalid(
            "eval.simulated.execute_min_s",
            "must not be larger than eval.simulated.execute_max_s",
        ));
    }
    if let Some(u) = c.budget.usd
        && (u.is_nan() || u < 0.0)
    {
        return Err(invalid("budget.usd", "expected a non-negative number"));
    }
    report::check_fast_p(&c.report.fast_p).map_err(|m| invalid("report.fast_p", &m))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Precision;

    /// The smallest valid config (the room's other test modules use it too).
    pub(super) const MIN: &str = r#"
[dataset]
path = "problems"
[model]
provider = "scripted"
answers = "answers.jsonl"
"#;

    /// `text` parsed with `sets` (`--set` overrides).
    pub(super) fn p(text: &str, sets: &[&str]) -> Result<LoadedConfig, ConfigError> {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        parse(text, Path::new("exp.toml"), &sets)
    }

    #[test]
    fn level_4_gets_whole_model_timeouts_unless_set() {
        let t = p(MIN, &[]).unwrap().config.eval.timeouts;
        assert_eq!(t, Timeouts::default());
        let l4 = p(MIN, &["dataset.level=4", "eval.timeouts.execute_s=99"]).unwrap();
        let t = &l4.config.eval.timeouts;
        assert_eq!(
            (
                t.compile_s,
                t.load_s,
                t.reference_s,
                t.execute_s,
                t.profile_s
            ),
            (600.0, 600.0, 3600.0, 99.0, 900.0)
        );
        // The effective config states them, so a resume reads the same values.
        assert!(l4.effective_toml.contains("reference_s = 3600.0"));
        let text = format!("{MIN}[eval.timeouts]\nreference_s = 10\n");
        let t = p(&text, &["dataset.level=4"]).unwrap().config.eval.timeouts;
        assert_eq!((t.reference_s, t.execute_s), (10.0, 1800.0));
    }

    #[test]
    fn integer_inputs_and_hf_cache_keys() {
        let c = p(MIN, &[]).unwrap().config;
        assert!(!c.eval.cast_integer_inputs);
        assert!(c.eval.hf.offline);
        assert_eq!(c.eval.hf.cache, None);
        let text = format!(
            "{MIN}[eval]\ncast_integer_inputs = true\n[eval.hf]\ncache = \"/m/hub\"\noffline = false\n"
        );
        let c = p(&text, &[]).unwrap().config;
        assert!(c.eval.cast_integer_inputs && !c.eval.hf.offline);
        assert_eq!(c.eval.hf.cache, Some(PathBuf::from("/m/hub")));
        let err = p(&format!("{MIN}[eval.hf]\ncahce = 1\n"), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("cahce"), "{err}");
    }

    #[test]
    fn defaults_fill_in() {
        let c = p(MIN, &[]).unwrap().config;
        assert_eq!(c.method.kind, MethodKind::Refine);
        assert_eq!(c.method.turns, 10);
        assert_eq!(c.method.feedback, FeedbackMode::GEP);
        assert_eq!(c.eval.correct_trials, 5);
        assert_eq!(c.eval.timing_trials, 100);
        assert_eq!(c.eval.warmup, 3);
        assert_eq!(c.eval.precision, Precision::Fp32);
        assert_eq!(c.resources.devices, DeviceSelection::Auto);
        assert_eq!(c.dataset.problems, "all");
    }

    #[test]
    fn eval_build_defaults_to_fast_and_takes_plain() {
        assert_eq!(p(MIN, &[]).unwrap().config.eval.build, BuildMode::Fast);
        let plain = p(MIN, &["eval.build=plain"]).unwrap().config;
        assert_eq!(plain.eval.build, BuildMode::Plain);
        let e = p(&format!("{MIN}\n[eval]\nbuild = \"quick\"\n"), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("build") && e.contains("line 9"), "{e}");
    }

    #[test]
    fn sandbox_mode_defaults_to_required_in_strict_mode() {
        let mode = |sets: &[&str]| p(MIN, sets).unwrap().config.eval.sandbox_mode();
        assert_eq!(mode(&[]), SandboxMode::Auto);
        assert_eq!(mode(&["eval.mode=\"strict\""]), SandboxMode::Required);
        assert_eq!(
            mode(&["eval.mode=\"strict\"", "eval.sandbox=\"off\""]),
            SandboxMode::Off
        );
        assert_eq!(mode(&["eval.sandbox=\"required\""]), SandboxMode::Required);
        let e = p(MIN, &["eval.sandbox=\"maybe\""]).unwrap_err().to_string();
        assert!(e.contains("sandbox"), "{e}");
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let text = format!("{MIN}\n[method]\nturnz = 3\n");
        let e = p(&text, &[]).unwrap_err().to_string();
        assert!(e.contains("exp.toml"), "{e}");
        assert!(e.contains("turnz"), "{e}");
        assert!(e.contains("line 9"), "{e}");
    }

    #[test]
    fn wrong_type_names_key() {
        let text = format!("{MIN}\n[method]\nturns = \"many\"\n");
        let e = p(&text, &[]).unwrap_err().to_string();
        assert!(e.contains("turns"), "{e}");
        assert!(e.contains("line 9"), "{e}");
    }

    #[test]
    fn sets_override_and_parse_types() {
        let c = p(
            MIN,
            &[
                "method.kind=sampling",
                "method.k=4",
                "method.feedback=GE",
                "model.temperature=0.7",
                "resources.devices=[0, 1]",
                "eval.precision=bf16",
                "dataset.problems=1-3,7",
            ],
        )
        .unwrap()
        .config;
        assert_eq!(c.method.kind, MethodKind::Sampling);
        assert_eq!(c.method.k, 4);
        assert_eq!(c.method.feedback, FeedbackMode::GE);
        assert_eq!(c.model.temperature, Some(0.7));
        assert_eq!(c.resources.devices, DeviceSelection::Gpus(vec![0, 1]));
        assert_eq!(c.eval.precision, Precision::Bf16);
        assert_eq!(c.dataset.problems, "1-3,7");
    }

    #[test]
    fn problem_ids_as_integers_and_lists() {
        for (set, want) in [
            ("dataset.problems=1", "1"),
            ("dataset.problems=[1, 3]", "1,3"),
            ("dataset.problems=[2, \"5-7\"]", "2,5-7"),
            ("dataset.problems=all", "all"),
        ] {
            let c = p(MIN, &[set]).unwrap().config;
            assert_eq!(c.dataset.problems, want, "{set}");
        }
        for bad in [
            "dataset.problems=-1",
            "dataset.problems=[]",
            "dataset.problems=1.5",
        ] {
            let e = p(MIN, &[bad]).unwrap_err().to_string();
            assert!(e.contains("problem id"), "{bad}: {e}");
        }
    }

    #[test]
    fn devices_forms() {
        for (v, want) in [
            ("cpu", DeviceSelection::Cpu),
            ("auto", DeviceSelection::Auto),
            ("0,2", DeviceSelection::Gpus(vec![0, 2])),
            ("3", DeviceSelection::Gpus(vec![3])),
        ] {
            let c = p(MIN, &[&format!("resources.devices={v}")]).unwrap().config;
            assert_eq!(c.resources.devices, want, "{v}");
        }
        let e = p(MIN, &["resources.devices=gpu"]).unwrap_err().to_string();
        assert!(e.contains("devices") || e.contains("auto"), "{e}");
    }

    #[test]
    fn bad_set_is_named() {
        let e = p(MIN, &["method.turns=lots"]).unwrap_err().to_string();
        assert!(e.contains("--set method.turns=lots"), "{e}");
        let e = p(MIN, &["method.bogus=1"]).unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");
        let e = p(MIN, &["noequals"]).unwrap_err().to_string();
        assert!(e.contains("key=value"), "{e}");
    }

    #[test]
    fn reference_store_and_inputs_keys() {
        let c = p(MIN, &[]).unwrap().config;
        assert_eq!(c.resources.reference_cache_gb, 40.0);
        assert_eq!(c.eval.inputs, InputsMode::Kernelbench);
        assert!(c.eval.reference_cache.is_none());
        let c = p(
            MIN,
            &[
                "eval.inputs=\"device\"",
                "resources.reference_cache_gb=0",
                "eval.reference_cache=\"/tmp/refs\"",
            ],
        )
        .unwrap()
        .config;
        assert_eq!(c.eval.inputs, InputsMode::Device);
        assert_eq!(c.resources.reference_cache_gb, 0.0);
        assert_eq!(
            c.eval.reference_cache.as_deref(),
            Some(Path::new("/tmp/refs"))
        );
        let e = p(MIN, &["resources.reference_cache_gb=-1"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("resources.reference_cache_gb") && e.contains("got -1"),
            "{e}"
        );
        let e = p(MIN, &["eval.inputs=\"gpu\""]).unwrap_err().to_string();
        assert!(e.contains("inputs"), "{e}");
        // The in-memory tier: unset (the machine's share), a size, 0 (off); never negative.
        assert_eq!(p(MIN, &[]).unwrap().config.resources.reference_ram_gb, None);
        let c = p(MIN, &["resources.reference_ram_gb=0"]).unwrap().config;
        assert_eq!(c.resources.reference_ram_gb, Some(0.0));
        let e = p(MIN, &["resources.reference_ram_gb=-2"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("resources.reference_ram_gb") && e.contains("got -2"),
            "{e}"
        );
    }

    #[test]
    fn semantic_validation_names_key() {
        let e = p(MIN, &["method.turns=0"]).unwrap_err().to_string();
        assert!(e.contains("method.turns"), "{e}");
        let e = p(MIN, &["model.temperature=5"]).unwrap_err().to_string();
        assert!(e.contains("model.temperature"), "{e}");
        let text = "[dataset]\npath = \"x\"\n[model]\nprovider = \"scripted\"\n";
        let e = p(text, &[]).unwrap_err().to_string();
        assert!(e.contains("model.answers"), "{e}");
        let e = p(MIN, &["resources.prepare_ahead=4"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("resources.prepare_ahead")
                && e.contains("expected 0 to 3")
                && e.contains("got 4"),
            "{e}"
        );
        let c = p(MIN, &[]).unwrap().config;
        assert_eq!(c.resources.prepare_ahead, 2);
        // Compile workers follow the CPU budget unless set.
        let r = p(MIN, &["resources.cpu_budget=6"])
            .unwrap()
            .config
            .resources;
        assert_eq!((r.cpu_cores(), r.compile_workers()), (6, 6));
        let r = p(
            MIN,
            &["resources.cpu_budget=64", "resources.compile_workers=3"],
        )
        .unwrap()
        .config
        .resources;
        assert_eq!((r.cpu_cores(), r.compile_workers()), (64, 3));
        let e = p(MIN, &["resources.cpu_budget=0"]).unwrap_err().to_string();
        assert!(e.contains("resources.cpu_budget"), "{e}");
        assert_eq!(
            p(MIN, &["resources.prepare_ahead=0"])
                .unwrap()
                .config
                .resources
                .prepare_ahead,
            0
        );
    }

    #[test]
    fn checks_levels_parse_and_unknown_categories_are_named() {
        use crate::checks::{Category, Level};
        let text =
            format!("{MIN}\n[eval]\nmode = \"strict\"\n[eval.checks]\ncode_bypass = \"warn\"\n");
        let c = p(&text, &["eval.checks.pytorch_wrap=off"]).unwrap().config;
        assert_eq!(
            c.eval.checks.level(Category::CodeBypass, c.eval.mode),
            Level::Warn
        );
        assert_eq!(
            c.eval.checks.level(Category::TimingPatch, c.eval.mode),
            Level::Error
        );
        assert_eq!(
            c.eval.checks.level(Category::PytorchWrap, c.eval.mode),
            Level::Off
        );
        let text = format!("{MIN}\n[eval.checks]\ntiming_hack = \"error\"\n");
        let e = p(&text, &[]).unwrap_err().to_string();
        assert!(e.contains("timing_hack") && e.contains("line 9"), "{e}");
        let e = p(MIN, &["eval.checks.lazy_eval=fatal"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("lazy_eval=fatal") && e.contains("`warn`"), "{e}");
        // Unset, the table stays out of the frozen config (older runs resume unchanged).
        assert!(!p(MIN, &[]).unwrap().effective_toml.contains("checks"));
    }

    #[test]
    fn effective_toml_round_trips() {
        let l = p(MIN, &["method.turns=3", "eval.checks.timing_patch=off"]).unwrap();
        let again: Config = toml::from_str(&l.effective_toml).unwrap();
        assert_eq!(again, l.config);
    }
    #[test]
    fn timing_method_and_tolerance_keys() {
        use crate::types::{TimingMethod, TolerancePreset};
        let c = p(
            MIN,
            &[
                "eval.timing_method=\"do_bench\"",
                "eval.tolerance=\"kernelbench-v0\"",
            ],
        );
        let c = c.unwrap().config;
        assert_eq!(c.eval.timing_method, TimingMethod::DoBench);
        assert_eq!(c.eval.tolerance, Some(TolerancePreset::KernelBenchV0));
        let t = c.eval.tolerance_in_effect();
        assert_eq!(
            (t.name.as_str(), t.atol, t.rtol),
            ("kernelbench-v0", 1e-2, 1e-2)
        );
        let t = p(MIN, &["eval.rtol=0.5"])
            .unwrap()
            .config
            .eval
            .tolerance_in_effect();
        assert_eq!((t.name.as_str(), t.atol, t.rtol), ("explicit", 1e-4, 0.5));
        assert_eq!(p(MIN, &[]).unwrap().config.eval.tolerance_request(), None);
        for (sets, key, says) in [
            (
                &[
                    "eval.timing_method=\"do_bench_impl\"",
                    "resources.devices=\"cpu\"",
                ][..],
                "eval.timing_method",
                "CUDA",
            ),
            (
                &["eval.timing_method=\"host_time\"", "eval.mode=\"strict\""][..],
                "eval.timing_method",
                "strict",
            ),
            (&["eval.atol=-1.0"][..], "eval.atol", ">= 0"),
        ] {
            let e = p(MIN, sets).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(says), "{sets:?}: {e}");
        }
        assert!(p(MIN, &["eval.tolerance=\"v0\""]).is_err());
        let c = p(
            MIN,
            &[
                "eval.reference=\"compile\"",
                "eval.compile_mode=\"max-autotune\"",
            ],
        );
        let rc = c.unwrap().config.eval.reference_compile().unwrap();
        assert_eq!(
            (rc.backend.as_str(), rc.mode.as_str()),
            ("inductor", "max-autotune")
        );
        assert_eq!(p(MIN, &[]).unwrap().config.eval.reference_compile(), None);
        let e = p(MIN, &["eval.compile_mode=\"default\""])
            .unwrap_err()
            .to_string();
        assert!(e.contains("eval.reference = \"compile\" only"), "{e}");
        let e = p(
            MIN,
            &["eval.reference=\"compile\"", "eval.compile_mode=\"fast\""],
        );
        assert!(
            e.unwrap_err()
                .to_string()
                .contains("max-autotune-no-cudagraphs")
        );
        let c = p(MIN, &["eval.profiler=\"ncu\""]).unwrap().config;
        assert_eq!(
            c.eval.profiler,
            Some(crate::worker::config::ProfilerKind::Ncu)
        );
        assert!(p(MIN, &["eval.profiler=\"nsight\""]).is_err());
        // host_time runs on a CPU (perf_counter, nothing to synchronise).
        assert!(
            p(
                MIN,
                &[
                    "eval.timing_method=\"host_time\"",
                    "resources.devices=\"cpu\""
                ]
            )
            .is_ok()
        );
    }
}
