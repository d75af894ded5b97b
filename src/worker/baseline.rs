//! KernelBench baseline timing files: `{"level1": {"19_ReLU.py": {"mean": .., "std": .., "min": ..,
//! "max": .., "num_trials": .., "hardware": .., "device": ..}}}` (times in ms, `null` where the
//! measurement failed). Used as the reference runtime instead of timing the reference.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::WorkerError;
use super::protocol::BaselineRuntime;
use crate::types::Problem;

/// One problem's baseline statistics (ms). Only `mean` is required; KernelBench files have no median.
#[derive(Debug, Clone, PartialEq)]
pub struct BaselineEntry {
    pub mean: f64,
    pub median: Option<f64>,
    pub std: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub num_trials: Option<u32>,
}

/// A loaded baseline file, looked up by (level, problem file name).
#[derive(Debug, Clone, PartialEq)]
pub struct BaselineTable {
    path: PathBuf,
    /// `baseline:<parent folder>/<file>`, e.g. `baseline:H100_Modal/baseline_time_torch.json`
    /// (the folder names the hardware, so the file name alone would be ambiguous).
    source: String,
    entries: HashMap<(u32, String), BaselineEntry>,
}

impl BaselineTable {
    pub async fn load(path: &Path) -> Result<BaselineTable, WorkerError> {
        let text = tokio::fs::read_to_string(path)
            .await
            .map_err(|e| WorkerError::io("read baseline", path, e))?;
        BaselineTable::parse(path, &text)
    }

    /// Parse the file's text; `path` names it in errors and in the `source` tag.
    pub fn parse(path: &Path, text: &str) -> Result<BaselineTable, WorkerError> {
        let err = |key: &str, detail: String| WorkerError::Baseline {
            path: path.to_path_buf(),
            key: key.to_string(),
            detail,
        };
        let root: Value = serde_json::from_str(text)
            .map_err(|e| err("(file)", format!("not valid JSON: {e}")))?;
        let Value::Object(levels) = root else {
            return Err(err(
                "(file)",
                format!("expected an object of levels, got {}", type_name(&root)),
            ));
        };
        let mut entries = HashMap::new();
        for (level_key, problems) in &levels {
            let level: u32 = level_key
                .strip_prefix("level")
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| err(level_key, "expected a key like \"level1\"".into()))?;
            let Value::Object(problems) = problems else {
                return Err(err(
                    level_key,
                    format!(
                        "expected an object of problems, got {}",
                        type_name(problems)
                    ),
                ));
            };
            for (file, stats) in problems {
                let key = format!("{level_key}/{file}");
                if let Some(entry) = parse_entry(stats).map_err(|d| err(&key, d))? {
                    entries.insert((level, file.clone()), entry);
                }
            }
        }
        let file = path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        let source = match path
            .parent()
            .and_then(|p| p.file_name())
            .map(|d| d.to_string_lossy().into_owned())
        {
            Some(dir) if !dir.is_empty() => format!("baseline:{dir}/{file}"),
            _ => format!("baseline:{file}"),
        };
        Ok(BaselineTable {
            path: path.to_path_buf(),
            source,
            entries,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry for a problem file (`19_ReLU.py`; a name without `.py` is tried with it).
    pub fn get(&self, level: u32, name: &str) -> Option<&BaselineEntry> {
        self.entries.get(&(level, name.to_string())).or_else(|| {
            if name.ends_with(".py") {
                None
            } else {
                self.entries.get(&(level, format!("{name}.py")))
            }
        })
    }

    /// The `reference_runtime` of an evaluate request for `problem`, when the file has it.
    ///
    /// The protocol wants a median and KernelBench files have none: the mean stands in (speedups use
    /// the mean only), and `std`/`min`/`max`/`num_trials` the file leaves null become 0.
    pub fn reference_runtime(&self, problem: &Problem) -> Option<BaselineRuntime> {
        let e = self.get(problem.key.level, &problem.name)?;
        Some(BaselineRuntime {
            mean: e.mean,
            median: e.median.unwrap_or(e.mean),
            std: e.std.unwrap_or(0.0),
            min: e.min.unwrap_or(e.mean),
            max: e.max.unwrap_or(e.mean),
            num_trials: e.num_trials.unwrap_or(0),
            source: self.source.clone(),
        })
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `Ok(None)` for a missing measurement (`null` entry or `null` mean).
fn parse_entry(stats: &Value) -> Result<Option<BaselineEntry>, String> {
    let obj = match stats {
        Value::Null => return Ok(None),
        Value::Object(o) => o,
        other => {
            return Err(format!(
                "expected an object of stats, got {}",
                type_name(other)
            ));
        }
    };
    let number = |field: &str| -> Result<Option<f64>, String> {
        match obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => n
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| format!("{field}: {n} is not a finite number")),
            Some(other) => Err(format!(
                "{field}: expected a number, got {}",
                type_name(other)
            )),
        }
    };
    let Some(mean) = number("mean")? else {
        return Ok(None);
    };
    if mean <= 0.0 {
        return Err(format!("mean: {mean} ms is not a positive time"));
    }
    let num_trials = match obj.get("num_trials") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(
            n.as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .ok_or_else(|| format!("num_trials: {n} is not a non-negative integer"))?,
        ),
        Some(other) => {
            return Err(format!(
                "num_trials: expected an integer, got {}",
                type_name(other)
            ));
        }
    };
    Ok(Some(BaselineEntry {
        mean,
        median: number("median")?,
        std: number("std")?,
        min: number("min")?,
        max: number("max")?,
        num_trials,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::ProblemKey;

    fn table(text: &str) -> Result<BaselineTable, WorkerError> {
        BaselineTable::parse(Path::new("/b/H100_Modal/baseline_time_torch.json"), text)
    }

    #[test]
    fn parses_kernelbench_format_with_nulls() {
        let t = table(
            r#"{"level1": {"19_ReLU.py": {"mean": 1.5, "std": 0.01, "min": 1.4, "max": 1.9,
                "num_trials": 100, "hardware": "NVIDIA H100 80GB HBM3", "device": "cuda:0"},
                "20_X.py": null, "21_Y.py": {"mean": null}},
               "level2": {"1_Conv.py": {"mean": 4.35, "std": null}}}"#,
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.source(), "baseline:H100_Modal/baseline_time_torch.json");
        let e = t.get(1, "19_ReLU.py").unwrap();
        assert_eq!((e.mean, e.num_trials), (1.5, Some(100)));
        assert!(t.get(1, "19_ReLU").is_some());
        assert!(t.get(1, "20_X.py").is_none());
        assert!(t.get(2, "1_Conv.py").unwrap().std.is_none());
        let problem = Problem {
            key: ProblemKey {
                level: 1,
                problem_id: 19,
            },
            name: "19_ReLU.py".into(),
            code: String::new(),
        };
        let r = t.reference_runtime(&problem).unwrap();
        assert_eq!((r.mean, r.median, r.num_trials), (1.5, 1.5, 100));
        assert_eq!(r.source, "baseline:H100_Modal/baseline_time_torch.json");
    }

    #[test]
    fn errors_name_the_file_and_key() {
        let e = table(r#"{"level1": {"19_ReLU.py": {"mean": "fast"}}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("baseline_time_torch.json"), "{e}");
        assert!(e.contains("level1/19_ReLU.py"), "{e}");
        assert!(e.contains("mean: expected a number, got a string"), "{e}");
        let e = table(r#"{"levelX": {}}"#).unwrap_err().to_string();
        assert!(e.contains("levelX"), "{e}");
        let e = table("[1]").unwrap_err().to_string();
        assert!(e.contains("expected an object of levels"), "{e}");
        let e = table("{").unwrap_err().to_string();
        assert!(e.contains("not valid JSON"), "{e}");
    }
}
