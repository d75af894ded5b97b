//! The leaderboard submission format:
//! `{"metadata": {"display_name": "...", "organization": "...", "notes": "...", ...},
//!   "kernels": {"level_1_problem_19_sample_0": "<code>", ...}}`.
//!
//! Reading keeps every key of `kernels` in order, so a key given twice is reported instead of
//! silently keeping the last one (what a JSON map would do).

use std::fmt;
use std::path::Path;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::{Map, Value, json};

use super::{Generation, Generations, Issue, parse_sample_key, sample_key};
use crate::metrics::RunInput;
use crate::report::LoadedRun;
use crate::types::{TurnRecord, Verdict};

/// Which of a problem's candidates goes into a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SubmissionPick {
    /// The fastest correct candidate; with none correct, the last candidate that has code.
    #[default]
    Best,
    /// The last candidate that has code (what a refinement run ended with).
    Last,
}

/// What a submission export left out, to tell the user.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExportSummary {
    pub kernels: usize,
    pub correct: usize,
    /// Problems with no candidate code at all.
    pub without_code: Vec<String>,
}

/// A submission's metadata fields the user sets.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SubmissionMeta {
    pub display_name: Option<String>,
    pub organization: Option<String>,
    pub notes: Option<String>,
}

/// Build the submission of a run: one kernel per problem, as `sample_0`.
pub fn export(
    run: &LoadedRun,
    pick: SubmissionPick,
    meta: &SubmissionMeta,
) -> (Value, ExportSummary) {
    let r = &run.report;
    let input = RunInput {
        method: r.method,
        axis: r.metrics.axis,
        problems: &r.metrics.problems,
        turns: &run.turns,
    };
    let mut kernels = Map::new();
    let mut summary = ExportSummary::default();
    for &problem in &r.metrics.problems {
        let with_code: Vec<&TurnRecord> = input
            .attempts(problem)
            .into_iter()
            .flatten()
            .filter(|t| t.verdict.is_some() && t.code.is_some())
            .collect();
        let best = || {
            with_code
                .iter()
                .filter(|t| t.verdict == Some(Verdict::Correct))
                .fold(None::<(&TurnRecord, f64)>, |acc, t| {
                    // The same rule as fast_p: in strict mode an unverified excessive speedup does not count.
                    let s = crate::metrics::counted_speedup(t)
                        .filter(|s| s.is_finite())
                        .unwrap_or(0.0);
                    match acc {
                        // The earliest of equals wins, as a user stopping there would have it.
                        Some((_, b)) if b >= s => acc,
                        _ => Some((t, s)),
                    }
                })
                .map(|(t, _)| t)
        };
        let chosen = match pick {
            SubmissionPick::Best => best().or_else(|| with_code.last().copied()),
            SubmissionPick::Last => with_code.last().copied(),
        };
        match chosen.and_then(|t| t.code.clone().map(|c| (t, c))) {
            Some((t, code)) => {
                summary.kernels += 1;
                summary.correct += usize::from(t.verdict == Some(Verdict::Correct));
                kernels.insert(sample_key(problem, 0), Value::String(code));
            }
            None => summary.without_code.push(problem.to_string()),
        }
    }
    let notes = meta.notes.clone().unwrap_or_else(|| {
        format!(
            "krefine {}: {} run {:?}, model {:?}, {} candidate per problem",
            env!("CARGO_PKG_VERSION"),
            r.method,
            r.run,
            r.model,
            match pick {
                SubmissionPick::Best => "fastest correct",
                SubmissionPick::Last => "last",
            }
        )
    });
    let value = json!({
        "metadata": {
            "display_name": meta.display_name.clone().unwrap_or_else(|| r.run.clone()),
            "organization": meta.organization.clone().unwrap_or_default(),
            "notes": notes,
            "krefine_run": r.run,
            "method": r.method.to_string(),
            "model": r.model,
            "pick": match pick { SubmissionPick::Best => "best", SubmissionPick::Last => "last" },
            // How the scores were measured, where a reader of the leaderboard looks first: the
            // correctness tolerance (published KernelBench numbers mostly used v0's 1e-2) and the timer.
            // A run that recorded no tolerance used KernelBench's per-precision table.
            "tolerance": r.provenance.as_ref().and_then(|p| p.eval.tolerance.clone())
                .unwrap_or_else(|| "kernelbench (KernelBench's per-precision table)".into()),
            "timing_method": r.provenance.as_ref().and_then(|p| p.eval.timing_method.clone()),
            // What every score must carry (KernelBench's run guide): hardware, software, model and
            // sampling, method, dataset revision, baseline file, evaluation mode.
            "provenance": r.provenance.as_ref().map(|p| serde_json::to_value(p).unwrap_or(Value::Null)),
        },
        "kernels": kernels,
    });
    (value, summary)
}

/// The `kernels` value as read: its entries in order (duplicates kept), or what it was instead.
enum Kernels {
    Entries(Vec<(String, Value)>),
    Other(&'static str),
}

struct Top {
    entries: Vec<(String, Value)>,
    kernels: Vec<Kernels>,
}

impl<'de> Deserialize<'de> for Kernels {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Kernels;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of kernels")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Kernels, A::Error> {
                let mut entries = Vec::new();
                while let Some(k) = map.next_key::<String>()? {
                    entries.push((k, map.next_value::<Value>()?));
                }
                Ok(Kernels::Entries(entries))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Kernels, A::Error> {
                while seq.next_element::<de::IgnoredAny>()?.is_some() {}
                Ok(Kernels::Other("an array"))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Kernels, E> {
                Ok(Kernels::Other("a string"))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Kernels, E> {
                Ok(Kernels::Other("a boolean"))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Kernels, E> {
                Ok(Kernels::Other("a number"))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Kernels, E> {
                Ok(Kernels::Other("a number"))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Kernels, E> {
                Ok(Kernels::Other("a number"))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Kernels, E> {
                Ok(Kernels::Other("null"))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Top {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Top;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object with \"metadata\" and \"kernels\"")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top, A::Error> {
                let mut top = Top {
                    entries: Vec::new(),
                    kernels: Vec::new(),
                };
                while let Some(k) = map.next_key::<String>()? {
                    if k == "kernels" {
                        top.kernels.push(map.next_value::<Kernels>()?);
                    } else {
                        top.entries.push((k, map.next_value::<Value>()?));
                    }
                }
                Ok(top)
            }
        }
        d.deserialize_map(V)
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

/// Read a submission's text. Syntax errors give a single `(file)` issue with line and column; every
/// other problem is an issue naming its key. Generations of keys with issues are left out.
pub fn parse(text: &str, path: &Path) -> Generations {
    let mut g = Generations::default();
    let file_issue = |message: String| Issue {
        key: "(file)".into(),
        message,
    };
    // Syntax first, so a broken file gets serde_json's line and column.
    if let Err(e) = serde_json::from_str::<de::IgnoredAny>(text) {
        g.issues.push(file_issue(format!(
            "{} is not valid JSON: {} at line {}, column {}",
            path.display(),
            strip_position(&e.to_string()),
            e.line(),
            e.column()
        )));
        return g;
    }
    let top: Top = match serde_json::from_str(text) {
        Ok(t) => t,
        Err(e) => {
            g.issues.push(file_issue(format!(
                "{}: expected an object with \"metadata\" and \"kernels\" ({})",
                path.display(),
                strip_position(&e.to_string())
            )));
            return g;
        }
    };
    // Metadata: display_name required; organization and notes strings when present.
    let mut seen_meta = false;
    for (k, v) in &top.entries {
        match k.as_str() {
            "metadata" if seen_meta => g.issues.push(Issue {
                key: "metadata".into(),
                message: "given twice".into(),
            }),
            "metadata" => {
                seen_meta = true;
                check_metadata(v, &mut g);
            }
            other => g.issues.push(Issue {
                key: other.to_string(),
                message: "unknown top-level key (expected \"metadata\" and \"kernels\")".into(),
            }),
        }
    }
    if !seen_meta {
        g.issues.push(Issue {
            key: "metadata".into(),
            message: "missing: a submission needs {\"metadata\": {\"display_name\": ..., \"organization\": ..., \"notes\": ...}}".into(),
        });
    }
    let entries = match top.kernels.as_slice() {
        [] => {
            g.issues.push(Issue {
                key: "kernels".into(),
                message: "missing: expected {\"kernels\": {\"level_<L>_problem_<P>_sample_<S>\": \"<code>\"}}".into(),
            });
            return g;
        }
        [Kernels::Other(t)] => {
            g.issues.push(Issue {
                key: "kernels".into(),
                message: format!("expected an object of kernels, got {t}"),
            });
            return g;
        }
        [Kernels::Entries(e)] => e,
        _ => {
            g.issues.push(Issue {
                key: "kernels".into(),
                message: "given twice".into(),
            });
            return g;
        }
    };
    if entries.is_empty() {
        g.issues.push(Issue {
            key: "kernels".into(),
            message: "no kernels".into(),
        });
    }
    let mut seen: std::collections::BTreeMap<(crate::types::ProblemKey, u32), String> =
        Default::default();
    for (key, value) in entries {
        let issue = |message: String| Issue {
            key: key.clone(),
            message,
        };
        let (problem, sample) = match parse_sample_key(key) {
            Ok(k) => k,
            Err(m) => {
                g.issues.push(issue(format!("bad key: {m}")));
                continue;
            }
        };
        if let Some(first) = seen.get(&(problem, sample)) {
            g.issues.push(issue(if first == key {
                "duplicate key".into()
            } else {
                format!("duplicate of {first}")
            }));
            continue;
        }
        seen.insert((problem, sample), key.clone());
        match value {
            Value::String(code) if code.trim().is_empty() => {
                g.issues.push(issue("the code is empty".into()))
            }
            Value::String(code) => g.items.push(Generation {
                problem,
                sample,
                code: code.clone(),
                origin: key.clone(),
            }),
            other => g.issues.push(issue(format!(
                "the code must be a string, got {}",
                type_name(other)
            ))),
        }
    }
    g
}

fn check_metadata(v: &Value, g: &mut Generations) {
    let Value::Object(m) = v else {
        g.issues.push(Issue {
            key: "metadata".into(),
            message: format!("expected an object, got {}", type_name(v)),
        });
        return;
    };
    g.metadata = m.clone();
    match m.get("display_name") {
        Some(Value::String(s)) if !s.trim().is_empty() => {}
        Some(Value::String(_)) => g.issues.push(Issue {
            key: "metadata.display_name".into(),
            message: "is empty".into(),
        }),
        Some(other) => g.issues.push(Issue {
            key: "metadata.display_name".into(),
            message: format!("expected a string, got {}", type_name(other)),
        }),
        None => g.issues.push(Issue {
            key: "metadata.display_name".into(),
            message: "missing (the name shown on the leaderboard)".into(),
        }),
    }
    for field in ["organization", "notes"] {
        if let Some(other) = m.get(field).filter(|v| !v.is_string()) {
            g.issues.push(Issue {
                key: format!("metadata.{field}"),
                message: format!("expected a string, got {}", type_name(other)),
            });
        }
    }
}

/// serde_json appends " at line L column C"; the message states them once, in its own words.
fn strip_position(msg: &str) -> &str {
    msg.rfind(" at line ").map_or(msg, |i| &msg[..i])
}

/// Read a submission file.
pub fn read(path: &Path) -> Result<Generations, std::io::Error> {
    let text = std::fs::read_to_string(path)?;
    Ok(parse(&text, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issues(text: &str) -> Vec<String> {
        parse(text, Path::new("sub.json"))
            .issues
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn reads_a_valid_submission() {
        let g = parse(
            r#"{"metadata": {"display_name": "x", "organization": "o", "notes": "n", "extra": 1},
                "kernels": {"level_1_problem_19_sample_0": "code a", "level_1_problem_2_sample_1": "code b"}}"#,
            Path::new("sub.json"),
        );
        assert!(g.issues.is_empty(), "{:?}", g.issues);
        assert_eq!(g.items.len(), 2);
        assert_eq!(g.items[0].origin, "level_1_problem_19_sample_0");
        assert_eq!((g.items[1].problem.problem_id, g.items[1].sample), (2, 1));
        assert_eq!(g.metadata["extra"], 1);
    }

    #[test]
    fn syntax_errors_have_line_and_column() {
        let e = issues("{\n  \"metadata\": {,\n}");
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with(
                "(file): sub.json is not valid JSON: key must be a string at line 2, column 16"
            ),
            "{e:?}"
        );
    }

    #[test]
    fn every_bad_key_is_named() {
        let e = issues(
            r#"{"kernels": {
                "level_1_problem_3_sample_0": "a",
                "level_1_problem_3_sample_0": "b",
                "level_1_problem_03_sample_0": "c",
                "level_1_problem_x_sample_0": "d",
                "level_1_problem_4_sample_0": 5,
                "level_1_problem_5_sample_0": "  "
            }, "extra": true}"#,
        );
        assert_eq!(
            e,
            vec![
                "extra: unknown top-level key (expected \"metadata\" and \"kernels\")",
                "metadata: missing: a submission needs {\"metadata\": {\"display_name\": ..., \"organization\": ..., \"notes\": ...}}",
                "level_1_problem_3_sample_0: duplicate key",
                "level_1_problem_03_sample_0: duplicate of level_1_problem_3_sample_0",
                "level_1_problem_x_sample_0: bad key: problem id \"x\" is not a non-negative integer (expected level_<L>_problem_<P>_sample_<S>, like level_1_problem_19_sample_0)",
                "level_1_problem_4_sample_0: the code must be a string, got a number",
                "level_1_problem_5_sample_0: the code is empty",
            ]
        );
    }

    #[test]
    fn metadata_and_kernels_shapes_are_checked() {
        assert_eq!(
            issues(r#"{"metadata": {"organization": 3}, "kernels": []}"#),
            vec![
                "metadata.display_name: missing (the name shown on the leaderboard)",
                "metadata.organization: expected a string, got a number",
                "kernels: expected an object of kernels, got an array",
            ]
        );
        assert_eq!(
            issues(r#"{"metadata": "me"}"#),
            vec![
                "metadata: expected an object, got a string",
                "kernels: missing: expected {\"kernels\": {\"level_<L>_problem_<P>_sample_<S>\": \"<code>\"}}",
            ]
        );
        let e = issues("[1, 2]");
        assert!(
            e[0].contains("expected an object with \"metadata\" and \"kernels\""),
            "{e:?}"
        );
    }
}
