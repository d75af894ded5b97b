//! Run directories and the append-only event log.
//!
//! A run directory holds `config.toml` (the frozen effective config), `events.jsonl` (one
//! [`LogRecord`] a line, written ahead of acting on it: see [`EventLog`]), `kernels/` (every candidate's code), `logs/` (compiler and
//! worker logs) and `krefine.log` (tracing). An existing run directory is never overwritten: it is
//! either resumed (`--resume`) or refused. One process writes a run directory at a time: see
//! [`crate::lock::lock_run_dir`].

mod event_log;
mod files;

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::types::{LogRecord, SCHEMA_VERSION, TaskId};

pub use event_log::EventLog;
pub use files::FileWriter;

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

/// The log as read back: valid records, and what was dropped from a torn tail.
#[derive(Debug)]
pub struct ReadLog {
    pub records: Vec<LogRecord>,
    /// Byte length of the valid prefix (a torn tail is cut here before appending).
    pub valid_len: u64,
    /// A warning when a torn last line was dropped.
    pub torn_tail: Option<String>,
}

/// Read `events.jsonl`. A torn last line (a crash mid-write) is dropped with a warning; any other bad
/// line is an error naming file and line.
pub fn read_log(path: &Path) -> Result<ReadLog, StoreError> {
    let file = std::fs::File::open(path).map_err(io(path))?;
    let mut reader = std::io::BufReader::new(file);
    let mut records = Vec::new();
    let mut valid_len = 0u64;
    let mut torn_tail = None;
    let mut line_no = 0usize;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let complete = buf.last() == Some(&b'\n');
        let text = String::from_utf8_lossy(&buf);
        let trimmed = text.trim();
        if trimmed.is_empty() {
            if complete {
                valid_len += n as u64;
            }
            continue;
        }
        match serde_json::from_str::<LogRecord>(trimmed) {
            Ok(rec) if complete => {
                if rec.v > SCHEMA_VERSION {
                    return Err(StoreError::Corrupt {
                        path: path.to_path_buf(),
                        line: line_no,
                        message: format!(
                            "schema version {} is newer than this krefine understands ({SCHEMA_VERSION})",
                            rec.v
                        ),
                    });
                }
                records.push(rec);
                valid_len += n as u64;
            }
            // A last line without its newline was cut by a crash even when it happens to parse.
            Ok(_) | Err(_) if !complete => {
                torn_tail = Some(format!(
                    "{}:{line_no}: dropped a torn last line ({n} bytes) left by an interrupted run",
                    path.display()
                ));
                break;
            }
            Ok(_) => unreachable!("complete lines are handled above"),
            Err(e) => {
                // A complete but unparseable line that is the very last one is also a torn write
                // (the newline made it to disk before the rest); earlier ones are corruption.
                let mut rest = Vec::new();
                std::io::Read::read_to_end(&mut reader, &mut rest).map_err(io(path))?;
                if rest.iter().all(|b| b.is_ascii_whitespace()) {
                    torn_tail = Some(format!(
                        "{}:{line_no}: dropped an unreadable last line ({e})",
                        path.display()
                    ));
                    break;
                }
                return Err(StoreError::Corrupt {
                    path: path.to_path_buf(),
                    line: line_no,
                    message: format!("expected one event record as JSON: {e}"),
                });
            }
        }
    }
    Ok(ReadLog {
        records,
        valid_len,
        torn_tail,
    })
}

/// The text of the records [`read_log`] accepted, as written: the non-blank lines of the log's first
/// `valid_len` bytes. The log only grows, so the prefix read earlier is still there; a log that is
/// shorter now was replaced, which is an error.
pub fn log_lines(path: &Path, valid_len: u64) -> Result<Vec<String>, StoreError> {
    let mut bytes = std::fs::read(path).map_err(io(path))?;
    let len = usize::try_from(valid_len).unwrap_or(usize::MAX);
    if bytes.len() < len {
        return Err(StoreError::Corrupt {
            path: path.to_path_buf(),
            line: 0,
            message: format!(
                "the log is {} bytes now, shorter than the {valid_len} bytes read before: it was replaced",
                bytes.len()
            ),
        });
    }
    bytes.truncate(len);
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Event;

    #[test]
    fn corrupt_middle_line_is_an_error_with_line() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join(EVENTS_FILE);
        let good = serde_json::to_string(&LogRecord {
            v: 1,
            seq: 0,
            ts_ms: 0,
            task: None,
            event: Event::RunEnded { reason: "a".into() },
        })
        .unwrap();
        std::fs::write(&p, format!("{good}\nnot json\n{good}\n")).unwrap();
        let e = read_log(&p).unwrap_err().to_string();
        assert!(e.contains("events.jsonl:2:"), "{e}");
    }
}
