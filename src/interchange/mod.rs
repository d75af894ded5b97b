//! KernelBench interchange: existing generations in (a leaderboard submission JSON, or a KernelBench
//! runs folder of `level_{L}_problem_{P}_sample_{S}_kernel.py` files), validated against a dataset,
//! and a run's kernels out as a submission.
//!
//! - [`submission`]: the submission format `{"metadata": {...}, "kernels": {"level_1_problem_19_sample_0":
//!   "<code>"}}`, read with duplicate keys detected, and written from a run.
//! - [`runs_folder`]: KernelBench's `runs/<run>/` layout.
//! - [`validate`]: checking generations against a dataset, one message per key.

pub mod runs_folder;
pub mod submission;
pub mod validate;

use std::fmt;

use crate::types::ProblemKey;

/// One generation: the code for sample `sample` of a problem, and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub problem: ProblemKey,
    pub sample: u32,
    pub code: String,
    /// The key (`level_1_problem_19_sample_0`) or file name it came from, for messages.
    pub origin: String,
}

/// Generations read from a source, with any problems found on the way (one per key or file).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Generations {
    pub items: Vec<Generation>,
    /// The submission's metadata (empty for a runs folder).
    pub metadata: serde_json::Map<String, serde_json::Value>,
    pub issues: Vec<Issue>,
}

/// A problem with one key (or file) of the source, or with the source as a whole.
#[derive(Debug, Clone, PartialEq)]
pub struct Issue {
    /// The key or file name; `(file)` for the source as a whole, `metadata.<field>` for metadata.
    pub key: String,
    pub message: String,
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// The key KernelBench uses for a sample: `level_{L}_problem_{P}_sample_{S}`.
pub fn sample_key(problem: ProblemKey, sample: u32) -> String {
    format!(
        "level_{}_problem_{}_sample_{sample}",
        problem.level, problem.problem_id
    )
}

/// Parse `level_{L}_problem_{P}_sample_{S}` (decimal numbers without sign or leading `+`).
pub fn parse_sample_key(key: &str) -> Result<(ProblemKey, u32), String> {
    let expected = "expected level_<L>_problem_<P>_sample_<S>, like level_1_problem_19_sample_0";
    let num = |s: Option<&str>, what: &str| -> Result<u32, String> {
        let s = s.ok_or_else(|| expected.to_string())?;
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "{what} {s:?} is not a non-negative integer ({expected})"
            ));
        }
        s.parse()
            .map_err(|_| format!("{what} {s:?} is out of range ({expected})"))
    };
    let rest = key
        .strip_prefix("level_")
        .ok_or_else(|| expected.to_string())?;
    let (level, rest) = rest
        .split_once("_problem_")
        .ok_or_else(|| expected.to_string())?;
    let (problem, sample) = rest
        .split_once("_sample_")
        .ok_or_else(|| expected.to_string())?;
    let level = num(Some(level), "level")?;
    let problem_id = num(Some(problem), "problem id")?;
    let sample = num(Some(sample), "sample")?;
    Ok((ProblemKey { level, problem_id }, sample))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_keys_round_trip_and_reject_junk() {
        let p = ProblemKey {
            level: 2,
            problem_id: 17,
        };
        assert_eq!(sample_key(p, 3), "level_2_problem_17_sample_3");
        assert_eq!(parse_sample_key("level_2_problem_17_sample_3"), Ok((p, 3)));
        for bad in [
            "level_2_problem_17",
            "level_x_problem_1_sample_0",
            "level_1_problem_-1_sample_0",
            "level_1_problem_1_sample_",
            "lvl_1_problem_1_sample_0",
            "level_1_problem_1_sample_0_kernel",
        ] {
            assert!(parse_sample_key(bad).is_err(), "{bad}");
        }
    }
}
