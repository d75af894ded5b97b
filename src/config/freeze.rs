//! What makes a run directory's `config.toml` stand on its own, and how two configs differ.
//!
//! [`freeze`] writes the run's name and every path of the config as an absolute path, resolved the
//! way the run resolves it (input files from the working directory when they exist there, else from
//! the config's folder; output folders and caches from the working directory), so the frozen copy
//! means the same files wherever it is read from: `krefine run DIR/config.toml --out DIR --resume`
//! works from any working directory and after the original config's folder moved.
//! [`differences`] names each key in which two configs differ, with both values, for a refused
//! resume.

use std::path::{Path, PathBuf};

use super::sections::Config;
use crate::launcher::config::LauncherKind;
use crate::settings::resolve_config_path;

/// The config as the run directory keeps it: `run.name` filled in (the config file's stem when
/// unset, so a resume from the frozen copy keeps the name) and every path absolute (see the module
/// docs). `config_file` is the file the config was read from.
pub fn freeze(config: &mut Config, config_file: &Path) {
    if config.run.name.is_none() {
        config.run.name = Some(
            config_file
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "run".into()),
        );
    }
    // Input files: relative to the working directory when they exist there, else to the config's
    // folder (`resolve_config_path`), as every reader of them resolves them.
    let input = |p: &mut PathBuf| *p = absolute(&resolve_config_path(config_file, p));
    // Outputs and caches: relative to the working directory.
    let here = |p: &mut PathBuf| *p = absolute(p);
    input(&mut config.dataset.path);
    config.model.answers.as_mut().map(input);
    config.model.replay_run.as_mut().map(input);
    config.prompt.templates.as_mut().map(input);
    config.eval.baseline.as_mut().map(input);
    config.eval.hf.cache.as_mut().map(input);
    config.eval.build_cache.as_mut().map(here);
    config.eval.reference_cache.as_mut().map(here);
    here(&mut config.output.dir);
    // The workers' interpreter is a path on this machine only with the local launcher; a bare
    // command name (`python3`) is looked up on PATH and stays one.
    if config.resources.launcher == LauncherKind::Local
        && let Some(p) = config.resources.python.as_mut()
        && p.components().count() > 1
    {
        input(p);
    }
    if let Some(p) = config.resources.ssh.identity.as_mut()
        && !p.starts_with("~")
    {
        here(p);
    }
}

/// `p` made absolute against the working directory (unchanged when that cannot be read).
fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// One key in which two configs differ: its dotted name and its value in each (`None`: unset).
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    pub key: String,
    pub before: Option<String>,
    pub after: Option<String>,
}

/// Every key (dotted, `eval.timeouts.execute_s`) in which `before` and `after` differ, outside the
/// top-level sections named in `except`; in key order.
pub fn differences(before: &Config, after: &Config, except: &[&str]) -> Vec<Difference> {
    let table = |c: &Config| toml::Table::try_from(c).unwrap_or_default();
    let (a, b) = (table(before), table(after));
    let mut out = Vec::new();
    diff_tables("", &a, &b, &mut out);
    out.retain(|d| {
        let section = d.key.split('.').next().unwrap_or("");
        !except.contains(&section)
    });
    out.sort_by(|x, y| x.key.cmp(&y.key));
    out
}

fn diff_tables(prefix: &str, a: &toml::Table, b: &toml::Table, out: &mut Vec<Difference>) {
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    for k in keys {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match (a.get(k), b.get(k)) {
            (Some(toml::Value::Table(x)), Some(toml::Value::Table(y))) => {
                diff_tables(&key, x, y, out)
            }
            (x, y) if x != y => out.push(Difference {
                key,
                before: x.map(show),
                after: y.map(show),
            }),
            _ => {}
        }
    }
}

/// A value as it would be written in the config (`3`, `"GEP"`, `[0, 1]`).
fn show(v: &toml::Value) -> String {
    match v {
        toml::Value::Table(t) => toml::to_string(t)
            .map(|s| format!("{{ {} }}", s.trim().replace('\n', ", ")))
            .unwrap_or_else(|_| "{...}".into()),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::config::tests::{MIN, p};

    #[test]
    fn every_path_is_frozen_absolute_and_the_name_is_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg_file = tmp.path().join("exp.toml");
        let text = format!("{MIN}[eval]\nbaseline = \"b.json\"\n[prompt]\ntemplates = \"t\"\n");
        let mut c: Config = toml::from_str(&text).unwrap();
        freeze(&mut c, &cfg_file);
        assert_eq!(c.run.name.as_deref(), Some("exp"));
        // Absent from the working directory: relative to the config's folder.
        assert_eq!(c.dataset.path, tmp.path().join("problems"));
        assert_eq!(c.model.answers, Some(tmp.path().join("answers.jsonl")));
        assert_eq!(c.eval.baseline, Some(tmp.path().join("b.json")));
        assert_eq!(c.prompt.templates, Some(tmp.path().join("t")));
        // Outputs: relative to the working directory.
        assert!(c.output.dir.is_absolute());
        assert!(c.output.dir.ends_with("trajectories"));
        // Freezing a frozen config changes nothing.
        let again = {
            let mut d = c.clone();
            freeze(&mut d, Path::new("/elsewhere/config.toml"));
            d
        };
        assert_eq!(again, c);
    }

    #[test]
    fn differences_name_each_key_with_both_values() {
        let a = p(MIN, &["method.turns=3"]).unwrap().config;
        let b = p(
            MIN,
            &["method.turns=5", "eval.mode=\"strict\"", "budget.usd=9"],
        )
        .unwrap()
        .config;
        let d = differences(&a, &b, &["budget"]);
        let shown: Vec<String> = d
            .iter()
            .map(|d| format!("{}: {:?} -> {:?}", d.key, d.before, d.after))
            .collect();
        assert_eq!(
            shown,
            vec![
                "eval.mode: Some(\"\\\"faithful\\\"\") -> Some(\"\\\"strict\\\"\")",
                "method.turns: Some(\"3\") -> Some(\"5\")",
            ]
        );
        assert!(differences(&a, &a, &[]).is_empty());
    }
}
