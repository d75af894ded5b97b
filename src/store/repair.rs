//! Cutting a run's log at a line no reader accepts (`krefine repair`), the whole file kept first.
//!
//! The reader never drops a complete line (see [`super::read_from`]): a line that is not a record
//! this krefine reads stops a resume with its number. Repair is the explicit way past it: the log is
//! copied whole to a backup next to it, then cut before that line, so a resume redoes what the lines
//! from there on recorded and nothing that was in the file is lost.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::reader::{LineReader, decode_line};
use super::{StoreError, io, now_ms};

/// Where a log is cut and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Cut {
    /// The first line removed (from 1).
    pub line: usize,
    /// Its byte offset: the log keeps this many bytes.
    pub offset: u64,
    /// Why the log is cut there (the reader's error for that line, or the line asked for).
    pub why: String,
    /// Records kept before it.
    pub kept_records: usize,
    /// Lines removed, that one included (a torn last line counts as one).
    pub removed_lines: usize,
    pub removed_bytes: u64,
}

/// A log cut by [`repair`].
#[derive(Debug, Clone, PartialEq)]
pub struct Repaired {
    pub cut: Cut,
    /// The whole log as it was before the cut.
    pub backup: PathBuf,
}

/// Where [`repair`] would cut the log at `path`: before `at` (a line number) when given, else before
/// the first complete line that is not a record, else before a torn last line; `None` when the log
/// reads whole and no line was asked for.
pub fn find_cut(path: &Path, at: Option<usize>) -> Result<Option<Cut>, StoreError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let mut reader = LineReader::new(path);
    // (line, start offset, records before it, first error) of every complete line.
    let mut starts = Vec::new();
    let mut offset = 0u64;
    let mut records = 0usize;
    let mut first_bad: Option<(usize, String)> = None;
    let split = reader.feed(&bytes, |line, text, len| {
        starts.push((offset, records));
        match decode_line(path, line, text) {
            Ok(Some(_)) => records += 1,
            Ok(None) => {}
            Err(e) => {
                if first_bad.is_none() {
                    first_bad = Some((line, e.to_string()));
                }
            }
        }
        offset += len;
        Ok::<(), std::convert::Infallible>(())
    });
    let Ok(()) = split;
    let complete = starts.len();
    let torn = !reader.pending().iter().all(u8::is_ascii_whitespace);
    let total_lines = complete + usize::from(!reader.pending().is_empty());
    let (line, why) = match (at, first_bad) {
        (Some(n), _) => {
            if n == 0 || n > total_lines {
                return Err(StoreError::Corrupt {
                    path: path.to_path_buf(),
                    line: n,
                    message: format!("no such line: the log has {total_lines} line(s)"),
                });
            }
            (n, format!("cut at line {n} as asked"))
        }
        (None, Some((n, why))) => (n, why),
        (None, None) if torn => (
            complete + 1,
            format!(
                "{}:{}: a torn last line ({} bytes, no newline)",
                path.display(),
                complete + 1,
                reader.pending().len()
            ),
        ),
        (None, None) => return Ok(None),
    };
    let (offset, kept_records) = match starts.get(line - 1) {
        Some(&(o, r)) => (o, r),
        // The torn last line: it starts where the complete lines end.
        None => (offset, records),
    };
    Ok(Some(Cut {
        line,
        offset,
        why,
        kept_records,
        removed_lines: total_lines + 1 - line,
        removed_bytes: bytes.len() as u64 - offset,
    }))
}

/// Cut the log at `path` where [`find_cut`] says, after copying the whole file to
/// `<log>.bak-<unix ms>` (synced to disk before the log is touched). `Ok(None)`: nothing to cut.
/// The caller holds the run directory's lock.
pub fn repair(path: &Path, at: Option<usize>) -> Result<Option<Repaired>, StoreError> {
    let Some(cut) = find_cut(path, at)? else {
        return Ok(None);
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "events.jsonl".into());
    let backup = path.with_file_name(format!("{name}.bak-{}", now_ms()));
    let bytes = std::fs::read(path).map_err(io(path))?;
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&backup)
            .map_err(io(&backup))?;
        f.write_all(&bytes).map_err(io(&backup))?;
        f.sync_all().map_err(io(&backup))?;
    }
    let log = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io(path))?;
    log.set_len(cut.offset).map_err(io(path))?;
    log.sync_all().map_err(io(path))?;
    Ok(Some(Repaired { cut, backup }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::read_log;
    use crate::types::{Event, LogRecord};

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

    #[test]
    fn a_bad_line_is_cut_with_everything_after_it_and_the_whole_log_is_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("events.jsonl");
        let (a, b) = (line(0), line(1));
        let newer = r#"{"v":2,"seq":2,"ts_ms":0,"event":{"type":"from_the_future"}}"#;
        let text = format!("{a}\n{b}\n{newer}\n{a}\n");
        std::fs::write(&path, &text).unwrap();
        assert!(read_log(&path).is_err());
        let fixed = repair(&path, None).unwrap().expect("a cut");
        assert_eq!(fixed.cut.line, 3);
        assert_eq!(fixed.cut.kept_records, 2);
        assert_eq!(fixed.cut.removed_lines, 2);
        assert!(
            fixed.cut.why.contains(":3: not an event record"),
            "{}",
            fixed.cut.why
        );
        assert_eq!(std::fs::read_to_string(&fixed.backup).unwrap(), text);
        assert_eq!(read_log(&path).unwrap().records.len(), 2);
        // Nothing left to cut.
        assert_eq!(repair(&path, None).unwrap(), None);
    }

    #[test]
    fn a_torn_tail_or_a_chosen_line_is_cut_and_other_lines_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("events.jsonl");
        let (a, b) = (line(0), line(1));
        std::fs::write(&path, format!("{a}\n{}", &b[..7])).unwrap();
        let cut = find_cut(&path, None).unwrap().expect("the torn line");
        assert_eq!((cut.line, cut.removed_lines, cut.removed_bytes), (2, 1, 7));
        std::fs::write(&path, format!("{a}\n{b}\n{a}\n")).unwrap();
        let cut = find_cut(&path, Some(2)).unwrap().expect("line 2");
        assert_eq!((cut.offset, cut.kept_records), (a.len() as u64 + 1, 1));
        let e = find_cut(&path, Some(9)).unwrap_err().to_string();
        assert!(e.contains("no such line: the log has 3 line(s)"), "{e}");
    }
}
