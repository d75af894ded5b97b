//! The `[dataset]` section: where the problems come from and which of them a run takes.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DatasetSection {
    /// A KernelBench checkout, a folder of `{id}_{name}.py` files (or of `level{L}/` folders), or a
    /// JSONL file with `level, problem_id, name, code`.
    pub path: PathBuf,
    #[serde(default = "default_level")]
    pub level: u32,
    /// Problem selection such as `"1-10,42"`, or `"all"`; a problem id (`1`) or a list of ids
    /// (`[1, 3]`) is taken as that selection.
    #[serde(default = "default_problems", deserialize_with = "problem_selection")]
    pub problems: String,
}

/// `dataset.problems` as the selection string: a string as is, an integer as that problem id (so
/// `--set dataset.problems=1`, which reads as a TOML integer, just works), a list of ids (and
/// ranges as strings) joined with commas.
fn problem_selection<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Item {
        Id(i64),
        Text(String),
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        One(Item),
        List(Vec<Item>),
    }
    let expected = "expected a selection such as \"1-10,42\" or \"all\", a problem id, or a list of problem ids";
    let item = |i: Item| match i {
        Item::Id(n) if n >= 0 => Ok(n.to_string()),
        Item::Id(n) => Err(serde::de::Error::custom(format!(
            "{expected}; got {n}, and problem ids are not negative"
        ))),
        Item::Text(t) => Ok(t),
    };
    match Raw::deserialize(d).map_err(|_| serde::de::Error::custom(expected))? {
        Raw::One(i) => item(i),
        Raw::List(v) if v.is_empty() => {
            Err(serde::de::Error::custom(format!("{expected}; got []")))
        }
        Raw::List(v) => Ok(v
            .into_iter()
            .map(item)
            .collect::<Result<Vec<_>, _>>()?
            .join(",")),
    }
}

fn default_level() -> u32 {
    1
}
fn default_problems() -> String {
    "all".into()
}
