//! A worker's log file: opening (and rotating) it, copying the worker's stderr into it under a per-request
//! cap, and quoting its last lines in a verdict.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio::process::ChildStderr;
use tokio::sync::watch;

use super::WorkerError;
use super::spawn_spec::SpawnSpec;

/// A worker log is rotated (to `.log.1`) at spawn once it is this big: print floods must not fill the
/// disk over a long run.
const LOG_ROTATE_BYTES: u64 = 64 * 1024 * 1024;
/// What one request (or the start-up) may add to the worker log: everything a candidate prints goes
/// there, and a candidate that prints without end must not fill the disk. The rest is dropped with a
/// note; the next request starts a fresh allowance.
pub const LOG_BYTES_PER_REQUEST: u64 = 8 * 1024 * 1024;

/// The last `max_lines` lines written to `path` after byte `from` (this incarnation's part of a log
/// shared across respawns), each clipped, for verdict feedback.
pub async fn log_tail(path: &Path, from: u64, max_lines: usize) -> String {
    const WINDOW: u64 = 16 * 1024;
    const LINE_CHARS: usize = 300;
    let Ok(mut f) = tokio::fs::File::open(path).await else {
        return String::new();
    };
    let Ok(meta) = f.metadata().await else {
        return String::new();
    };
    let start = from.max(meta.len().saturating_sub(WINDOW));
    if start >= meta.len() || f.seek(std::io::SeekFrom::Start(start)).await.is_err() {
        return String::new();
    }
    let mut bytes = Vec::new();
    if f.read_to_end(&mut bytes).await.is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let first = lines.len().saturating_sub(max_lines);
    lines[first..]
        .iter()
        .map(|l| {
            if l.chars().count() > LINE_CHARS {
                let cut: String = l.chars().take(LINE_CHARS).collect();
                format!("{cut} ... [line truncated]")
            } else {
                (*l).to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Copy the worker's stderr into its log, at most [`LOG_BYTES_PER_REQUEST`] per request (`used` is
/// reset by each request); beyond that the output is read and dropped, so the worker never blocks
/// on a full pipe. Says `true` on `done` once the stream has ended and everything is written.
pub(super) async fn pump_log(
    mut from: ChildStderr,
    mut to: tokio::fs::File,
    used: Arc<AtomicU64>,
    done: watch::Sender<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let before = used.fetch_add(n as u64, Ordering::SeqCst);
        let room = LOG_BYTES_PER_REQUEST.saturating_sub(before);
        if room == 0 {
            continue;
        }
        let keep = n.min(usize::try_from(room).unwrap_or(usize::MAX));
        let mut write = to.write_all(&buf[..keep]).await;
        if keep < n && write.is_ok() {
            let note = format!(
                "\n[krefine: more than {} MiB of output in one request; the rest of it is dropped]\n",
                LOG_BYTES_PER_REQUEST / (1024 * 1024)
            );
            write = to.write_all(note.as_bytes()).await;
        }
        // Flushed per read so a log tail read right after sees it (tokio's File buffers writes).
        if write.is_err() || to.flush().await.is_err() {
            // The log cannot be written (disk full?): keep draining so the worker never blocks.
            used.store(u64::MAX / 2, Ordering::SeqCst);
        }
    }
    let _ = to.flush().await;
    let _ = done.send(true);
}

/// Open the worker log for appending (rotating an oversized one) and write a header; returns the file
/// for the child's stderr and the offset where this incarnation's output starts.
pub(super) async fn open_log(spec: &SpawnSpec) -> Result<(std::fs::File, u64), WorkerError> {
    let path = &spec.log_path;
    if let Some(dir) = path.parent() {
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| WorkerError::io("create log folder", dir, e))?;
    }
    if let Ok(meta) = tokio::fs::metadata(path).await
        && meta.len() > LOG_ROTATE_BYTES
    {
        let mut rotated = path.as_os_str().to_os_string();
        rotated.push(".1");
        tokio::fs::rename(path, &rotated)
            .await
            .map_err(|e| WorkerError::io("rotate worker log", path, e))?;
    }
    let mut file = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .await
        .map_err(|e| WorkerError::io("open worker log", path, e))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let header = format!(
        "===== krefine: starting worker {} (role {}, python {}) at unix time {now} =====\n",
        spec.name,
        spec.role.as_str(),
        spec.python.display()
    );
    file.write_all(header.as_bytes())
        .await
        .map_err(|e| WorkerError::io("write worker log", path, e))?;
    file.flush()
        .await
        .map_err(|e| WorkerError::io("write worker log", path, e))?;
    let start = file
        .metadata()
        .await
        .map_err(|e| WorkerError::io("stat worker log", path, e))?
        .len();
    Ok((file.into_std().await, start))
}
