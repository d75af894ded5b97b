//! Experiment configuration: TOML with serde defaults, `--set key=value` overrides and validation.
//!
//! Every section denies unknown keys, so a typo is an error that names the file, the line and the key
//! instead of a silently ignored setting. A run directory keeps a frozen copy (`config.toml`) of the
//! effective configuration, overrides applied.
//!
//! Each room owns its section (`llm::config`, `prompt::config`, `launcher::config`, `worker::config`,
//! `sim`, `checks`) and the enums several rooms share live in [`crate::settings`]; this module only
//! assembles them, and re-exports them where callers have always found them. The sections no lower
//! room owns are its own, in submodules: `[dataset]` (`dataset`), `[report]` (`report`, read by the
//! report room above), and `[run]`, `[method]` and `[output]` with the whole [`Config`]
//! (`sections`). This file loads a config: read, apply the overrides (`overrides`), deserialise,
//! fill the level's defaults, validate (`validate`), freeze (`freeze`: absolute paths, the run's
//! name; and how two configs differ, key by key). The error of every step is
//! [`ConfigError`] (`error`). The submodules' floors, from the bottom: `error`, `dataset`, `report`
//! < `sections` < `overrides`, `validate`, `freeze` < this file.

use std::path::{Path, PathBuf};

use crate::llm::LlmParts;
use crate::settings::resolve_config_path;

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
pub use error::ConfigError;
pub use freeze::{Difference, differences, freeze};
pub use report::{DEFAULT_EXTRA_FAST_P, ReportSection, check_fast_p};
pub use sections::{Config, MethodSection, OutputSection, RunSection};

mod dataset;
mod error;
mod freeze;
mod overrides;
mod report;
mod sections;
mod validate;

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
        overrides::apply_set(&mut table, assignment)?;
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
    validate::validate(&config, path)?;
    // The run directory's copy stands on its own: absolute paths, the run's name written out.
    freeze::freeze(&mut config, path);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{FeedbackMode, MethodKind, Precision};

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
}
