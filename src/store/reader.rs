//! Reading `events.jsonl` back: the one place that turns the log's bytes into [`LogRecord`]s.
//!
//! [`LineReader`] splits bytes into lines (an incomplete last line is kept back until its newline
//! arrives) and [`decode_line`] checks each one (a JSON record, of a schema version this krefine
//! understands). Every reader of the log is built on the two: [`read_log`] and [`read_from`] (the
//! whole log, with the one rule for a torn last line: report, resume, `--replay-llm`, the Python
//! package), [`log_lines`] (the records' text as written) and `watch`'s tail, which feeds the bytes
//! appended since its last read.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::{EVENTS_FILE, StoreError, io};
use crate::types::{LogRecord, SCHEMA_VERSION};

/// The log of a run: `run` is the run directory (its `events.jsonl`) or the log file itself.
pub fn events_path(run: &Path) -> PathBuf {
    if run.is_dir() {
        run.join(EVENTS_FILE)
    } else {
        run.to_path_buf()
    }
}

/// Splits a log's bytes into numbered lines, across reads.
#[derive(Debug)]
pub struct LineReader {
    path: PathBuf,
    /// Lines handed out so far (the next one is `line + 1`).
    line: usize,
    /// Bytes of an incomplete last line.
    partial: Vec<u8>,
}

impl LineReader {
    pub fn new(path: &Path) -> Self {
        LineReader {
            path: path.to_path_buf(),
            line: 0,
            partial: Vec::new(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Hand every complete line of `bytes` (appended to the incomplete line kept from before) to
    /// `each`, with its number (from 1), its text and its length in bytes (newline included); the
    /// first error stops the reading and is returned. An incomplete last line is kept back.
    pub fn feed<E>(
        &mut self,
        bytes: &[u8],
        mut each: impl FnMut(usize, &str, u64) -> Result<(), E>,
    ) -> Result<(), E> {
        self.partial.extend_from_slice(bytes);
        let mut start = 0;
        let mut result = Ok(());
        while let Some(pos) = self.partial[start..].iter().position(|&b| b == b'\n') {
            let line = &self.partial[start..start + pos];
            start += pos + 1;
            self.line += 1;
            let text = String::from_utf8_lossy(line);
            result = each(self.line, &text, pos as u64 + 1);
            if result.is_err() {
                break;
            }
        }
        self.partial.drain(..start);
        result
    }

    /// The bytes of the incomplete last line kept back.
    pub fn pending(&self) -> &[u8] {
        &self.partial
    }

    /// The number the incomplete last line would have.
    pub fn next_line(&self) -> usize {
        self.line + 1
    }

    /// Forget the incomplete last line (the file was cut shorter: a resume dropped a torn tail).
    pub fn forget_pending(&mut self) {
        self.partial.clear();
    }
}

/// What a non-blank line of the log holds, checked. `Ok(None)` for a blank line.
pub fn decode_line(path: &Path, line: usize, text: &str) -> Result<Option<LogRecord>, LineError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let rec: LogRecord = serde_json::from_str(text).map_err(|e| LineError::NotARecord {
        path: path.to_path_buf(),
        line,
        message: e.to_string(),
    })?;
    if rec.v > SCHEMA_VERSION {
        return Err(LineError::Newer {
            path: path.to_path_buf(),
            line,
            version: rec.v,
        });
    }
    Ok(Some(rec))
}

/// Why a line is not a record this krefine can read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LineError {
    #[error("{}:{line}: not an event record: {message}", path.display())]
    NotARecord {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error(
        "{}:{line}: schema version {version} is newer than this krefine understands ({SCHEMA_VERSION})",
        path.display()
    )]
    Newer {
        path: PathBuf,
        line: usize,
        version: u32,
    },
}

impl From<LineError> for StoreError {
    fn from(e: LineError) -> Self {
        let (path, line) = match &e {
            LineError::NotARecord { path, line, .. } | LineError::Newer { path, line, .. } => {
                (path.clone(), *line)
            }
        };
        let full = e.to_string();
        // The Corrupt error prints `path:line: ` itself.
        let prefix = format!("{}:{line}: ", path.display());
        let message = full.strip_prefix(&prefix).unwrap_or(&full).to_string();
        StoreError::Corrupt {
            path,
            line,
            message,
        }
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
    /// The dropped last line when it lacked only its newline and reads as a record. It is not part
    /// of the log (it was never answered, so nothing acted on it, and a resume cuts it); a replay of
    /// recorded answers may still serve it.
    pub unterminated: Option<LogRecord>,
}

/// Read `events.jsonl`. A torn last line (a crash mid-write) is dropped with a warning; any other bad
/// line is an error naming file and line.
pub fn read_log(path: &Path) -> Result<ReadLog, StoreError> {
    let file = std::fs::File::open(path).map_err(io(path))?;
    read_from(file, path)
}

/// [`read_log`] of the log's bytes as `input` gives them; `path` names the log in messages.
///
/// The rule for a torn last line: only a last line without its newline was cut by a crash (even
/// when it happens to parse), since the writer puts a record and its newline into the file with one
/// `write`. It is dropped with a warning. A complete line that is not a record this krefine reads
/// (garbage, an event type or schema of a newer krefine) is an error naming its line, wherever it
/// is: it may hold what a run recorded, so no reader drops it (`krefine repair` cuts a log there,
/// keeping the whole file as a backup).
pub fn read_from(mut input: impl Read, path: &Path) -> Result<ReadLog, StoreError> {
    let mut reader = LineReader::new(path);
    let mut records = Vec::new();
    let mut valid_len = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(path)(e)),
        };
        reader.feed(&buf[..n], |line, text, len| {
            records.extend(decode_line(path, line, text)?);
            valid_len += len;
            Ok::<(), StoreError>(())
        })?;
    }
    let pending = reader.pending();
    let torn = !pending.iter().all(u8::is_ascii_whitespace);
    let unterminated = if torn {
        decode_line(path, reader.next_line(), &String::from_utf8_lossy(pending))
            .ok()
            .flatten()
    } else {
        None
    };
    let torn_tail = torn.then(|| {
        format!(
            "{}:{}: dropped a torn last line ({} bytes, no newline) left by an interrupted run",
            path.display(),
            reader.next_line(),
            pending.len()
        )
    });
    Ok(ReadLog {
        records,
        valid_len,
        torn_tail,
        unterminated,
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
    let mut lines = Vec::new();
    let mut reader = LineReader::new(path);
    let split = reader.feed(&bytes, |_, text, _| {
        let text = text.trim();
        if !text.is_empty() {
            lines.push(text.to_string());
        }
        Ok::<(), std::convert::Infallible>(())
    });
    let Ok(()) = split;
    // The valid prefix ends with a newline unless the last record was accepted without one.
    let rest = String::from_utf8_lossy(reader.pending());
    if !rest.trim().is_empty() {
        lines.push(rest.trim().to_string());
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Event;

    fn line(seq: u64) -> String {
        serde_json::to_string(&LogRecord {
            v: 1,
            seq,
            ts_ms: 0,
            task: None,
            event: Event::RunEnded { reason: "a".into() },
        })
        .unwrap()
    }

    fn read(text: &str) -> Result<ReadLog, StoreError> {
        read_from(text.as_bytes(), Path::new("events.jsonl"))
    }

    #[test]
    fn corrupt_middle_line_is_an_error_with_line() {
        let good = line(0);
        let e = read(&format!("{good}\nnot json\n{good}\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("events.jsonl:2: not an event record"), "{e}");
    }

    #[test]
    fn only_a_line_without_its_newline_is_torn() {
        let (a, b) = (line(0), line(1));
        // Cut mid-line: dropped, and the valid prefix ends after the first line.
        let log = read(&format!("{a}\n{}", &b[..10])).unwrap();
        assert_eq!(log.records.len(), 1);
        assert_eq!(log.valid_len, a.len() as u64 + 1);
        assert!(
            log.torn_tail
                .unwrap()
                .contains(":2: dropped a torn last line")
        );
        // A last line without its newline is torn even when it parses.
        let log = read(&format!("{a}\n{b}")).unwrap();
        assert_eq!(log.records.len(), 1);
        assert_eq!(log.unterminated.map(|r| r.seq), Some(1));
        // A complete unreadable last line is no torn tail: it may hold a record of a newer
        // krefine, so it is an error naming its line, blanks after it or not.
        let e = read(&format!("{a}\nnot json\n\n  \n")).unwrap_err();
        assert!(
            e.to_string()
                .contains("events.jsonl:2: not an event record"),
            "{e}"
        );
        let e = read(&format!("{a}\nnot json\n{}", &b[..5])).unwrap_err();
        assert!(e.to_string().contains("events.jsonl:2:"), "{e}");
        // Blank lines count in the valid prefix; a blank partial line is no torn tail.
        let log = read(&format!("{a}\n\n{b}\n  ")).unwrap();
        assert_eq!(log.records.len(), 2);
        assert!(log.torn_tail.is_none());
        assert_eq!(log.valid_len, (a.len() + b.len() + 3) as u64);
    }

    #[test]
    fn a_newer_schema_is_an_error_even_last() {
        let newer = line(0).replacen("\"v\":1", "\"v\":99", 1);
        let e = read(&format!("{newer}\n")).unwrap_err().to_string();
        assert!(e.contains("events.jsonl:1: schema version 99"), "{e}");
    }

    #[test]
    fn log_lines_are_the_accepted_records_as_written() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(EVENTS_FILE);
        let (a, b) = (line(0), line(1));
        std::fs::write(&path, format!("{a}\n\n  {b}\n{}", &a[..9])).unwrap();
        let log = read_log(&path).unwrap();
        assert_eq!(log.records.len(), 2);
        assert_eq!(log_lines(&path, log.valid_len).unwrap(), vec![a.clone(), b]);
        // A log shorter than what was read was replaced.
        std::fs::write(&path, format!("{a}\n")).unwrap();
        let e = log_lines(&path, log.valid_len).unwrap_err().to_string();
        assert!(e.contains("it was replaced"), "{e}");
    }

    #[test]
    fn lines_split_across_reads_are_joined() {
        let a = line(0);
        let mut reader = LineReader::new(Path::new("e"));
        let mut seen = Vec::new();
        let (head, tail) = a.split_at(7);
        let mut take = |n: usize, t: &str, _: u64| {
            seen.push((n, decode_line(Path::new("e"), n, t).unwrap().map(|r| r.seq)));
            Ok::<(), ()>(())
        };
        reader.feed(head.as_bytes(), &mut take).unwrap();
        reader
            .feed(format!("{tail}\n\n").as_bytes(), &mut take)
            .unwrap();
        assert_eq!(seen, vec![(1, Some(0)), (2, None)]);
        assert!(reader.pending().is_empty());
    }
}
