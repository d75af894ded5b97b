//! Checking generations against a dataset before anything runs: every problem must exist in the
//! dataset (ids in range for its level), and the messages say, per key, what was found.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::{Generations, Issue};
use crate::dataset::{self, DatasetError};
use crate::types::Problem;

/// The outcome of validation: one line per key (found or wrong), and the problems by level.
#[derive(Debug, Clone, PartialEq)]
pub struct Validated {
    /// `(key, message)` for every key: `ok: ...` for a usable generation, the issue otherwise.
    pub lines: Vec<(String, String)>,
    pub errors: usize,
    /// The dataset's problems of each level the generations use.
    pub problems: BTreeMap<u32, Vec<Problem>>,
}

/// Check `g`'s problems against the dataset at `dataset_path` (every level they name must exist).
/// Issues found earlier (format, keys, duplicates, code type) are kept; the returned generations
/// hold only usable items.
pub fn validate(
    mut g: Generations,
    dataset_path: &Path,
) -> Result<(Generations, Validated), DatasetError> {
    let levels: BTreeSet<u32> = g.items.iter().map(|i| i.problem.level).collect();
    let mut problems = BTreeMap::new();
    for level in levels {
        match dataset::load(dataset_path, level, "all") {
            Ok(p) => {
                problems.insert(level, p);
            }
            Err(DatasetError::NoLevel { .. }) | Err(DatasetError::Empty { .. }) => {
                problems.insert(level, Vec::new());
            }
            Err(e) => return Err(e),
        }
    }
    let mut lines = Vec::new();
    let mut kept = Vec::new();
    for item in std::mem::take(&mut g.items) {
        let Some(list) = problems.get(&item.problem.level) else {
            continue;
        };
        match list.iter().find(|p| p.key == item.problem) {
            Some(p) => {
                lines.push((
                    item.origin.clone(),
                    format!(
                        "ok: {} sample {}, {} lines",
                        p.name,
                        item.sample,
                        item.code.lines().count()
                    ),
                ));
                kept.push(item);
            }
            None => {
                let ids: Vec<u32> = list.iter().map(|p| p.key.problem_id).collect();
                let message = if ids.is_empty() {
                    format!(
                        "level {} is not in the dataset {}",
                        item.problem.level,
                        dataset_path.display()
                    )
                } else {
                    format!(
                        "problem {} is not in level {} of the dataset (it has ids {})",
                        item.problem.problem_id,
                        item.problem.level,
                        compact(&ids)
                    )
                };
                g.issues.push(Issue {
                    key: item.origin.clone(),
                    message,
                });
            }
        }
    }
    g.items = kept;
    let errors = g.issues.len();
    lines.extend(
        g.issues
            .iter()
            .map(|i| (i.key.clone(), format!("error: {}", i.message))),
    );
    Ok((
        g,
        Validated {
            lines,
            errors,
            problems,
        },
    ))
}

/// Sorted ids as ranges: `1-4, 7`.
fn compact(ids: &[u32]) -> String {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let start = ids[i];
        let mut end = start;
        while i + 1 < ids.len() && ids[i + 1] == end + 1 {
            i += 1;
            end = ids[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compacts_ids() {
        assert_eq!(compact(&[4, 1, 2, 3, 7, 9, 10]), "1-4, 7, 9-10");
        assert_eq!(compact(&[]), "");
    }
}
