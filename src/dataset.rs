//! Loading KernelBench problems: a checkout (`KernelBench/level{L}/{id}_{name}.py`), a folder of such
//! files, or JSONL with `level, problem_id, name, code`; and problem selections like `"1-10,42"`.

use std::path::{Path, PathBuf};

use crate::types::Problem;

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("dataset {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// Load the problems of `level` under `path` selected by `selection` (`"all"`, `"1-10,42"`), sorted by id.
pub fn load(path: &Path, level: u32, selection: &str) -> Result<Vec<Problem>, DatasetError> {
    let _ = (level, selection);
    Err(DatasetError::Invalid {
        path: path.to_path_buf(),
        message: "not implemented yet".into(),
    })
}
