//! `--set key.path=value` overrides: each one is applied to the parsed TOML table before the table
//! is deserialised, so an override is checked as the file's own keys are.

use super::error::ConfigError;

/// Apply one `key.path=value` override. The value is read as a TOML value when it parses as one
/// (`3`, `0.7`, `true`, `[0, 1]`, `"x"`), else taken as a plain string (`GEP`, `refine`).
pub(super) fn apply_set(table: &mut toml::Table, assignment: &str) -> Result<(), ConfigError> {
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

#[cfg(test)]
mod tests {
    use crate::config::DeviceSelection;
    use crate::config::tests::{MIN, p};
    use crate::types::{FeedbackMode, MethodKind, Precision};

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
    fn bad_set_is_named() {
        let e = p(MIN, &["method.turns=lots"]).unwrap_err().to_string();
        assert!(e.contains("--set method.turns=lots"), "{e}");
        let e = p(MIN, &["method.bogus=1"]).unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");
        let e = p(MIN, &["noequals"]).unwrap_err().to_string();
        assert!(e.contains("key=value"), "{e}");
    }
}
