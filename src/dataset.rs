//! Loading KernelBench problems and problem selections like `"1-10,42"`.
//!
//! Four layouts are accepted, so a user can point `dataset.path` at whatever they have:
//! - a KernelBench checkout (`KernelBench/level{L}/{id}_{name}.py`),
//! - a folder with `level{L}/` subfolders (the `KernelBench/` folder itself, or a copy of it),
//! - a folder of `{id}_{name}.py` files (the level is the configured one),
//! - a JSONL file with `level, problem_id, name, code` per line (the HuggingFace columns; `name` may lack
//!   `.py`, and a `file` field, when present, is the file name).
//!
//! `Problem::name` is always the file name with `.py`, because KernelBench's baseline JSON is keyed by it.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::types::{Problem, ProblemKey};

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("dataset path {} does not exist", path.display())]
    NotFound { path: PathBuf },
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is neither a folder nor a .jsonl file", path.display())]
    UnsupportedFile { path: PathBuf },
    #[error(
        "dataset {}: no level{level}/ folder (looked for {}){}",
        path.display(),
        looked.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" and "),
        levels_found(found)
    )]
    NoLevel {
        path: PathBuf,
        level: u32,
        looked: Vec<PathBuf>,
        found: Vec<u32>,
    },
    #[error(
        "{}: file name does not start with a numeric problem id (expected `<id>_<name>.py`, like `19_ReLU.py`)",
        path.display()
    )]
    BadFileName { path: PathBuf },
    #[error("duplicate problem id {problem_id} in level {level}: {first} and {second}")]
    DuplicateId {
        level: u32,
        problem_id: u32,
        first: String,
        second: String,
    },
    #[error("{}:{line}: {message}", path.display())]
    BadLine {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error(
        "{}:{line}: missing field `{field}` (each line needs level, problem_id, name, code)",
        path.display()
    )]
    MissingField {
        path: PathBuf,
        line: usize,
        field: &'static str,
    },
    #[error("{origin}: the problem's code is empty")]
    EmptyCode { origin: String },
    #[error("dataset {}: no problems of level {level} ({detail})", path.display())]
    Empty {
        path: PathBuf,
        level: u32,
        detail: String,
    },
    #[error("invalid problem selection {selection:?}: {token:?}: {reason}")]
    BadSelection {
        selection: String,
        token: String,
        reason: String,
    },
    #[error(
        "problem selection {selection:?} names ids that level {level} of {} does not have: {missing} (it has {available})",
        path.display()
    )]
    UnknownIds {
        path: PathBuf,
        level: u32,
        selection: String,
        /// The unknown ids, compacted into ranges (`"101-200, 205"`).
        missing: String,
        available: String,
    },
}

fn levels_found(found: &[u32]) -> String {
    if found.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = found.iter().map(|l| format!("level{l}")).collect();
        format!("; found {}", list.join(", "))
    }
}

/// A parsed problem selection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    All,
    /// Inclusive id ranges in the order written; a single id `42` is `42..=42`.
    Ids(Vec<RangeInclusive<u32>>),
}

impl Selection {
    pub fn contains(&self, id: u32) -> bool {
        match self {
            Selection::All => true,
            Selection::Ids(ranges) => ranges.iter().any(|r| r.contains(&id)),
        }
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selection::All => f.write_str("all"),
            Selection::Ids(ranges) => {
                let parts: Vec<String> = ranges.iter().map(range_text).collect();
                f.write_str(&parts.join(","))
            }
        }
    }
}

fn range_text(r: &RangeInclusive<u32>) -> String {
    if r.start() == r.end() {
        r.start().to_string()
    } else {
        format!("{}-{}", r.start(), r.end())
    }
}

/// Parse `"all"` (any case) or comma-separated ids and inclusive ranges (`"1-10, 42"`).
pub fn parse_selection(s: &str) -> Result<Selection, DatasetError> {
    let bad = |token: &str, reason: &str| DatasetError::BadSelection {
        selection: s.to_string(),
        token: token.to_string(),
        reason: reason.to_string(),
    };
    let trimmed = s.trim();
    if trimmed.eq_ignore_ascii_case("all") {
        return Ok(Selection::All);
    }
    if trimmed.is_empty() {
        return Err(bad(
            "",
            "the selection is empty (use \"all\" or ids like \"1-10,42\")",
        ));
    }
    let mut ranges = Vec::new();
    for raw in trimmed.split(',') {
        let token = raw.trim();
        if token.is_empty() {
            return Err(bad(
                token,
                "empty item (two commas in a row or a trailing comma)",
            ));
        }
        let range = match token.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (parse_id(a), parse_id(b));
                match (a, b) {
                    (Some(a), Some(b)) if a <= b => a..=b,
                    (Some(_), Some(_)) => {
                        return Err(bad(token, "the range's start is greater than its end"));
                    }
                    _ => {
                        return Err(bad(
                            token,
                            "expected an id or an inclusive range like 3-7 (non-negative integers)",
                        ));
                    }
                }
            }
            None => match parse_id(token) {
                Some(id) => id..=id,
                None => {
                    return Err(bad(
                        token,
                        "expected an id or an inclusive range like 3-7 (non-negative integers)",
                    ));
                }
            },
        };
        ranges.push(range);
    }
    Ok(Selection::Ids(ranges))
}

fn parse_id(s: &str) -> Option<u32> {
    let s = s.trim();
    // `u32::from_str` accepts a leading `+`; an id is digits only.
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Load the problems of `level` under `path` selected by `selection` (`"all"`, `"1-10,42"`), sorted by id.
pub fn load(path: &Path, level: u32, selection: &str) -> Result<Vec<Problem>, DatasetError> {
    let selection_parsed = parse_selection(selection)?;
    if !path.exists() {
        return Err(DatasetError::NotFound {
            path: path.to_path_buf(),
        });
    }
    let entries = if path.is_file() {
        if path.extension().and_then(|e| e.to_str()) != Some("jsonl") {
            return Err(DatasetError::UnsupportedFile {
                path: path.to_path_buf(),
            });
        }
        jsonl_entries(path, level)?
    } else {
        folder_entries(&problem_folder(path, level)?, level)?
    };
    if entries.is_empty() {
        return Err(DatasetError::Empty {
            path: path.to_path_buf(),
            level,
            detail: if path.is_file() {
                "no line has this level".to_string()
            } else {
                "no `<id>_<name>.py` files".to_string()
            },
        });
    }

    if let Selection::Ids(ranges) = &selection_parsed {
        let missing = unknown_ids(ranges, &entries);
        if !missing.is_empty() {
            let known: Vec<u32> = entries.keys().copied().collect();
            return Err(DatasetError::UnknownIds {
                path: path.to_path_buf(),
                level,
                selection: selection.to_string(),
                missing: compact_ranges(&missing),
                available: compact_ids(&known),
            });
        }
    }

    let mut problems = Vec::new();
    // BTreeMap iteration is by id, which is the order promised to callers.
    for (id, entry) in entries {
        if !selection_parsed.contains(id) {
            continue;
        }
        let code = match entry.code {
            Code::Inline(code) => code,
            Code::File(ref file) => {
                std::fs::read_to_string(file).map_err(|source| DatasetError::Io {
                    path: file.clone(),
                    source,
                })?
            }
        };
        // Only selected problems are checked for empty code: a broken problem the run does not use
        // should not stop it.
        if code.trim().is_empty() {
            return Err(DatasetError::EmptyCode {
                origin: entry.origin,
            });
        }
        problems.push(Problem {
            key: ProblemKey {
                level,
                problem_id: id,
            },
            name: entry.name,
            code,
        });
    }
    Ok(problems)
}

/// A problem found in the dataset before its code is needed.
struct Entry {
    name: String,
    /// Where it came from, for error messages (`path/19_ReLU.py` or `problems.jsonl:19`).
    origin: String,
    code: Code,
}

enum Code {
    Inline(String),
    /// Read only when the problem is selected.
    File(PathBuf),
}

/// The folder holding the `{id}_{name}.py` files of `level`.
fn problem_folder(path: &Path, level: u32) -> Result<PathBuf, DatasetError> {
    let level_dir = format!("level{level}");
    let checkout = path.join("KernelBench").join(&level_dir);
    let levels = path.join(&level_dir);
    if checkout.is_dir() {
        return Ok(checkout);
    }
    if levels.is_dir() {
        return Ok(levels);
    }
    // A folder that has other levels (or a KernelBench/ folder) is a checkout or a levels folder that
    // lacks this level; treating it as a flat folder would only produce a confusing "no files" error.
    let mut found = level_folders(path)?;
    let kb = path.join("KernelBench");
    if kb.is_dir() {
        found.extend(level_folders(&kb)?);
    }
    found.sort_unstable();
    found.dedup();
    if !found.is_empty() || kb.is_dir() {
        return Err(DatasetError::NoLevel {
            path: path.to_path_buf(),
            level,
            looked: vec![checkout, levels],
            found,
        });
    }
    Ok(path.to_path_buf())
}

fn level_folders(dir: &Path) -> Result<Vec<u32>, DatasetError> {
    let mut levels = Vec::new();
    for entry in read_dir_sorted(dir)? {
        if !entry.is_dir() {
            continue;
        }
        let level = entry
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("level"))
            .and_then(parse_id);
        if let Some(level) = level {
            levels.push(level);
        }
    }
    Ok(levels)
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<PathBuf>, DatasetError> {
    let io = |source| DatasetError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        paths.push(entry.map_err(io)?.path());
    }
    // read_dir order is unspecified; sorting makes duplicate-id errors name files deterministically.
    paths.sort();
    Ok(paths)
}

fn folder_entries(dir: &Path, level: u32) -> Result<BTreeMap<u32, Entry>, DatasetError> {
    let mut entries: BTreeMap<u32, Entry> = BTreeMap::new();
    for file in read_dir_sorted(dir)? {
        if !file.is_file() || file.extension().and_then(|e| e.to_str()) != Some("py") {
            continue;
        }
        let Some(name) = file.file_name().and_then(|n| n.to_str()) else {
            return Err(DatasetError::BadFileName { path: file });
        };
        // Hidden files (editor swap files) and package markers are not problems.
        if name.starts_with('.') || name == "__init__.py" {
            continue;
        }
        // KernelBench parses `int(file.split("_")[0])`; the same rule, without its crash.
        let id = name
            .split_once('_')
            .and_then(|(prefix, _)| parse_id(prefix));
        let Some(id) = id else {
            return Err(DatasetError::BadFileName { path: file });
        };
        let entry = Entry {
            name: name.to_string(),
            origin: file.display().to_string(),
            code: Code::File(file.clone()),
        };
        insert_unique(&mut entries, level, id, entry)?;
    }
    Ok(entries)
}

fn insert_unique(
    entries: &mut BTreeMap<u32, Entry>,
    level: u32,
    id: u32,
    entry: Entry,
) -> Result<(), DatasetError> {
    if let Some(first) = entries.get(&id) {
        return Err(DatasetError::DuplicateId {
            level,
            problem_id: id,
            first: first.origin.clone(),
            second: entry.origin,
        });
    }
    entries.insert(id, entry);
    Ok(())
}

fn jsonl_entries(path: &Path, level: u32) -> Result<BTreeMap<u32, Entry>, DatasetError> {
    let text = std::fs::read_to_string(path).map_err(|source| DatasetError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut entries: BTreeMap<u32, Entry> = BTreeMap::new();
    // Duplicates in other levels are reported too: they mean the file is broken, whatever level runs.
    let mut other_levels: BTreeMap<(u32, u32), usize> = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let row = parse_line(path, line, raw)?;
        if row.level == level {
            let entry = Entry {
                name: row.name,
                origin: format!("{}:{line}", path.display()),
                code: Code::Inline(row.code),
            };
            insert_unique(&mut entries, level, row.problem_id, entry)?;
        } else if let Some(first) = other_levels.insert((row.level, row.problem_id), line) {
            return Err(DatasetError::DuplicateId {
                level: row.level,
                problem_id: row.problem_id,
                first: format!("{}:{first}", path.display()),
                second: format!("{}:{line}", path.display()),
            });
        }
    }
    Ok(entries)
}

struct Row {
    level: u32,
    problem_id: u32,
    name: String,
    code: String,
}

fn parse_line(path: &Path, line: usize, raw: &str) -> Result<Row, DatasetError> {
    let bad = |message: String| DatasetError::BadLine {
        path: path.to_path_buf(),
        line,
        message,
    };
    let value: Value = serde_json::from_str(raw).map_err(|e| {
        bad(format!(
            "expected a JSON object, but the line is not valid JSON ({e})"
        ))
    })?;
    let Value::Object(obj) = value else {
        return Err(bad(
            "expected a JSON object with level, problem_id, name, code".to_string(),
        ));
    };
    let field = |name: &'static str| {
        obj.get(name).ok_or(DatasetError::MissingField {
            path: path.to_path_buf(),
            line,
            field: name,
        })
    };
    let int = |name: &'static str| -> Result<u32, DatasetError> {
        let v = field(name)?;
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad(format!("`{name}` must be a non-negative integer, got {v}")))
    };
    let string = |name: &'static str, v: &Value| -> Result<String, DatasetError> {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| bad(format!("`{name}` must be a string, got {}", json_kind(v))))
    };
    let level = int("level")?;
    let problem_id = int("problem_id")?;
    let name = string("name", field("name")?)?;
    let code = string("code", field("code")?)?;
    let file = match obj.get("file") {
        Some(v) => Some(string("file", v)?),
        None => None,
    };
    // The `file` field (our export) is the file name; otherwise `name` is, without `.py` in the
    // HuggingFace form. Baselines are keyed by the name with `.py`.
    let name = match file.filter(|f| !f.trim().is_empty()) {
        Some(file) => file,
        None if name.trim().is_empty() => return Err(bad("`name` is empty".to_string())),
        None if name.ends_with(".py") => name,
        None => format!("{name}.py"),
    };
    Ok(Row {
        level,
        problem_id,
        name,
        code,
    })
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Ids inside `ranges` that the dataset does not have, sorted and deduplicated, as ranges.
fn unknown_ids(ranges: &[RangeInclusive<u32>], entries: &BTreeMap<u32, Entry>) -> Vec<(u32, u32)> {
    // Walk the known ids inside each range and collect the gaps, so a range like `1-4000000000`
    // costs as much as the dataset, not as much as the range.
    let mut gaps = Vec::new();
    for r in ranges {
        let mut next = Some(*r.start());
        for &id in entries.range(r.clone()).map(|(id, _)| id) {
            if let Some(n) = next
                && n < id
            {
                gaps.push((n, id - 1));
            }
            next = id.checked_add(1);
        }
        if let Some(n) = next
            && n <= *r.end()
        {
            gaps.push((n, *r.end()));
        }
    }
    merge(gaps)
}

fn merge(mut spans: Vec<(u32, u32)>) -> Vec<(u32, u32)> {
    spans.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::new();
    for (a, b) in spans {
        match out.last_mut() {
            Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

fn compact_ranges(spans: &[(u32, u32)]) -> String {
    let parts: Vec<String> = spans.iter().map(|&(a, b)| range_text(&(a..=b))).collect();
    parts.join(", ")
}

fn compact_ids(ids: &[u32]) -> String {
    compact_ranges(&merge(ids.iter().map(|&i| (i, i)).collect()))
}
