//! The `[report]` section: what `krefine report` and `compare` show of a run by default. It is
//! frozen with the run's config, so a report of the run shows what the experiment asked for; the
//! command line (`--fast-p`) overrides it.

use serde::{Deserialize, Serialize};

/// The fast_p thresholds shown besides KernelBench's set when neither the run's config nor the
/// command line names any: Fast@1.2.
pub const DEFAULT_EXTRA_FAST_P: [f64; 1] = [1.2];

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReportSection {
    /// fast_p thresholds shown besides KernelBench's (0, 0.5, 0.8, 1, 1.5, 2), in increasing order,
    /// each once; empty for none.
    #[serde(default = "default_fast_p", deserialize_with = "threshold_list")]
    pub fast_p: Vec<f64>,
}

fn default_fast_p() -> Vec<f64> {
    DEFAULT_EXTRA_FAST_P.to_vec()
}

impl Default for ReportSection {
    fn default() -> Self {
        ReportSection {
            fast_p: default_fast_p(),
        }
    }
}

/// `report.fast_p` as a list of numbers; whether the numbers make sense is [`check_fast_p`]'s
/// (so the error names the key, through the config's validation).
fn threshold_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        List(Vec<f64>),
        Other(toml::Value),
    }
    match Raw::deserialize(d)? {
        Raw::List(v) => Ok(v),
        Raw::Other(v) => Err(serde::de::Error::custom(format!(
            "report.fast_p: expected a list of speedup thresholds such as [1.2, 3] ([] for none), \
             got {v}"
        ))),
    }
}

/// Why `thresholds` cannot be `report.fast_p`: each must be a finite number >= 0, and the list in
/// increasing order with no repeats (a repeat or a shuffle is most likely a typo).
pub fn check_fast_p(thresholds: &[f64]) -> Result<(), String> {
    for (i, p) in thresholds.iter().enumerate() {
        if !(p.is_finite() && *p >= 0.0) {
            return Err(format!(
                "expected speedup thresholds >= 0, like 1.2 or 3; entry {} is {p}",
                i + 1
            ));
        }
    }
    if let Some(w) = thresholds.windows(2).find(|w| w[0] >= w[1]) {
        let what = if w[0] == w[1] {
            "twice"
        } else {
            "out of order"
        };
        return Err(format!(
            "expected thresholds in increasing order, each once; {} then {} is {what}",
            w[0], w[1]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::config::ConfigError;
    use crate::config::tests::{MIN, p};

    #[test]
    fn fast_p_defaults_to_fast_at_1_2_and_is_frozen_with_the_run() {
        let c = p(MIN, &[]).unwrap();
        assert_eq!(c.config.report.fast_p, vec![1.2]);
        assert!(
            c.effective_toml.contains("[report]\nfast_p = [1.2]"),
            "{}",
            c.effective_toml
        );
        let text = format!("{MIN}[report]\nfast_p = [0, 1.2, 1.5, 3]\n");
        let c = p(&text, &[]).unwrap();
        assert_eq!(c.config.report.fast_p, vec![0.0, 1.2, 1.5, 3.0]);
        let frozen: crate::config::Config = toml::from_str(&c.effective_toml).unwrap();
        assert_eq!(frozen.report.fast_p, vec![0.0, 1.2, 1.5, 3.0]);
        let c = p(MIN, &["report.fast_p=[1.7]"]).unwrap();
        assert_eq!(c.config.report.fast_p, vec![1.7]);
        let c = p(MIN, &["report.fast_p=[]"]).unwrap();
        assert!(c.config.report.fast_p.is_empty());
    }

    #[test]
    fn bad_fast_p_values_name_the_key_and_the_entry() {
        let invalid = |text: &str| match p(text, &[]) {
            Err(ConfigError::Invalid { key, message, .. }) => format!("{key}: {message}"),
            other => panic!("expected an invalid key, got {other:?}"),
        };
        let with = |list: &str| format!("{MIN}[report]\nfast_p = {list}\n");
        assert_eq!(
            invalid(&with("[1.2, -1]")),
            "report.fast_p: expected speedup thresholds >= 0, like 1.2 or 3; entry 2 is -1"
        );
        assert_eq!(
            invalid(&with("[nan]")),
            "report.fast_p: expected speedup thresholds >= 0, like 1.2 or 3; entry 1 is NaN"
        );
        assert_eq!(
            invalid(&with("[inf]")),
            "report.fast_p: expected speedup thresholds >= 0, like 1.2 or 3; entry 1 is inf"
        );
        assert_eq!(
            invalid(&with("[1.2, 1.2]")),
            "report.fast_p: expected thresholds in increasing order, each once; 1.2 then 1.2 is twice"
        );
        assert_eq!(
            invalid(&with("[2, 1.5]")),
            "report.fast_p: expected thresholds in increasing order, each once; 2 then 1.5 is out of order"
        );
        // Not a list: the parse error shows the line and names the key.
        let e = p(&with("1.2"), &[]).unwrap_err().to_string();
        assert!(
            e.contains("line 8")
                && e.contains(
                    "report.fast_p: expected a list of speedup thresholds such as [1.2, 3]"
                ),
            "{e}"
        );
        let e = p(&with("[\"1.2\"]"), &[]).unwrap_err().to_string();
        assert!(e.contains("report.fast_p: expected a list"), "{e}");
        let e = p(MIN, &["report.fast_p=1.2"]).unwrap_err().to_string();
        assert!(
            e.starts_with("--set report.fast_p=1.2: ") && e.contains("expected a list"),
            "{e}"
        );
        let e = p(&format!("{MIN}[report]\nfast = [1]\n"), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `fast`"), "{e}");
    }
}
