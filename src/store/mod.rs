//! Run directories and the append-only event log.
//!
//! A run directory holds `config.toml` (the frozen effective config), `events.jsonl` (one
//! [`crate::types::LogRecord`] a line, written ahead of acting on it: see [`EventLog`]), `kernels/`
//! (every candidate's code), `logs/` (compiler and worker logs) and `krefine.log` (tracing).
//!
//! This room owns the log's file name ([`EVENTS_FILE`]), its one writer ([`EventLog`]), its one
//! reader (`reader`: [`LineReader`] and [`decode_line`], on which [`read_log`], [`log_lines`] and
//! `watch`'s tail are built, with one rule for a torn last line and one schema check) and its one
//! repair ([`repair`]: cutting a log at a line no reader accepts, the whole file kept as a backup).
//! An existing run directory is never overwritten: it is either resumed (`--resume`) or refused.
//! One process writes a run directory at a time: see [`crate::lock::lock_run_dir`].

mod event_log;
mod files;
mod reader;
mod repair;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::types::TaskId;

pub use event_log::EventLog;
pub use files::FileWriter;
pub use reader::{
    LineError, LineReader, ReadLog, decode_line, events_path, log_lines, read_from, read_log,
};
pub use repair::{Cut, Repaired, find_cut, repair};

pub const CONFIG_FILE: &str = "config.toml";
pub const EVENTS_FILE: &str = "events.jsonl";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "run directory {0} already holds a run; pass --resume to continue it, or choose another --out"
    )]
    Exists(PathBuf),
    #[error("{0} is not a run directory (no {EVENTS_FILE})")]
    NotARun(PathBuf),
    #[error("{path}:{line}: {message}")]
    Corrupt {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Paths inside one run directory.
#[derive(Debug, Clone)]
pub struct RunDir {
    root: PathBuf,
}

impl RunDir {
    /// Create a new run directory; refuses one that already holds a run.
    pub fn create(root: &Path, config_toml: &str) -> Result<Self, StoreError> {
        if root.join(EVENTS_FILE).exists() || root.join(CONFIG_FILE).exists() {
            return Err(StoreError::Exists(root.to_path_buf()));
        }
        let dir = RunDir {
            root: root.to_path_buf(),
        };
        for d in [
            dir.root.clone(),
            dir.kernels_dir(),
            dir.logs_dir(),
            dir.prompts_dir(),
        ] {
            std::fs::create_dir_all(&d).map_err(io(&d))?;
        }
        let cfg = dir.config_path();
        std::fs::write(&cfg, config_toml).map_err(io(&cfg))?;
        let ev = dir.events_path();
        std::fs::File::create(&ev).map_err(io(&ev))?;
        Ok(dir)
    }

    /// Open an existing run directory (for resume, report, replay).
    pub fn open(root: &Path) -> Result<Self, StoreError> {
        if !root.join(EVENTS_FILE).is_file() {
            return Err(StoreError::NotARun(root.to_path_buf()));
        }
        let dir = RunDir {
            root: root.to_path_buf(),
        };
        for d in [dir.kernels_dir(), dir.logs_dir(), dir.prompts_dir()] {
            std::fs::create_dir_all(&d).map_err(io(&d))?;
        }
        Ok(dir)
    }

    /// An existing run directory, only to be read (reports): nothing is created in it.
    pub fn existing(root: &Path) -> Result<Self, StoreError> {
        if !root.join(EVENTS_FILE).is_file() {
            return Err(StoreError::NotARun(root.to_path_buf()));
        }
        Ok(RunDir {
            root: root.to_path_buf(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn config_path(&self) -> PathBuf {
        self.root.join(CONFIG_FILE)
    }
    pub fn events_path(&self) -> PathBuf {
        self.root.join(EVENTS_FILE)
    }
    pub fn kernels_dir(&self) -> PathBuf {
        self.root.join("kernels")
    }
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }
    pub fn prompts_dir(&self) -> PathBuf {
        self.root.join("prompts")
    }
    pub fn trace_log_path(&self) -> PathBuf {
        self.root.join("krefine.log")
    }

    /// Candidate file name, KernelBench-style, relative to the run directory.
    pub fn kernel_rel(task: TaskId, turn: u32) -> String {
        format!(
            "kernels/level_{}_problem_{}_sample_{}_turn_{}_kernel.py",
            task.problem.level, task.problem.problem_id, task.sample, turn
        )
    }

    pub fn compile_log_path(&self, task: TaskId, turn: u32) -> PathBuf {
        self.logs_dir().join(format!(
            "compile_level_{}_problem_{}_sample_{}_turn_{}.log",
            task.problem.level, task.problem.problem_id, task.sample, turn
        ))
    }

    /// A turn's prompt file (the messages as JSON), relative to the run directory.
    pub fn prompt_rel(task: TaskId, turn: u32) -> String {
        format!(
            "prompts/level_{}_problem_{}_sample_{}_turn_{}_prompt.json",
            task.problem.level, task.problem.problem_id, task.sample, turn
        )
    }

    /// Write the messages of a turn's LLM request through `files`; returns the path relative to
    /// the run directory.
    pub async fn write_prompt(
        &self,
        files: &FileWriter,
        task: TaskId,
        turn: u32,
        messages: &[crate::types::ChatMessage],
    ) -> Result<String, StoreError> {
        let rel = Self::prompt_rel(task, turn);
        let path = self.root.join(&rel);
        files
            .write(path, || {
                serde_json::to_vec_pretty(messages).map_err(std::io::Error::other)
            })
            .await?;
        Ok(rel)
    }

    /// Write a candidate's code through `files`; returns its path relative to the run directory.
    pub async fn write_kernel(
        &self,
        files: &FileWriter,
        task: TaskId,
        turn: u32,
        code: &str,
    ) -> Result<String, StoreError> {
        let rel = Self::kernel_rel(task, turn);
        files
            .write(self.root.join(&rel), || Ok(code.as_bytes().to_vec()))
            .await?;
        Ok(rel)
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Write a whole file synchronously (small files outside the hot path, e.g. reports).
pub fn write_file(path: &Path, data: &[u8]) -> Result<(), StoreError> {
    let mut f = std::fs::File::create(path).map_err(io(path))?;
    f.write_all(data).map_err(io(path))
}
