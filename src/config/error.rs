//! The configuration's one error: a file that cannot be read or parsed, a `--set` that cannot be
//! applied, or a key whose value is out of range. Each variant names the file (or the override) and
//! the key, so a typo is reported where it is.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("--set {assignment}: {message}")]
    Override { assignment: String, message: String },
    #[error("config {path}: key `{key}`: {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
}
