//! Where a display's records come from: the engine's broadcast (live), another process's growing
//! `events.jsonl` (watch), or a recorded log played back in recorded time (replay).
//!
//! Every source hands out plain [`LogRecord`]s; [`crate::view::RunView`] drops what it has already
//! applied, so overlaps (a rebuild after the broadcast lagged, a file read again) are harmless.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};

use super::RunView;
use crate::store::{LineReader, decode_line, read_log};
use crate::types::LogRecord;

/// What a live or watched source sends the display.
#[derive(Debug)]
pub enum Feed {
    Records(Vec<Arc<LogRecord>>),
    /// The broadcast lagged: start over from this view, rebuilt from the log file.
    Rebuilt(Box<RunView>),
    /// A problem reading the source (shown, not fatal).
    Warning(String),
    /// No more records will come (the live run's engine is gone).
    Closed,
}

/// Follow the engine's broadcast until it closes. On lag (the display fell more than the channel's
/// capacity behind) the view is rebuilt from the log file, which holds every persisted record.
pub struct Live {
    rx: broadcast::Receiver<Arc<LogRecord>>,
    events_path: PathBuf,
}

impl Live {
    /// `rx` must be subscribed before the engine appends anything the log file does not hold yet.
    pub fn new(rx: broadcast::Receiver<Arc<LogRecord>>, events_path: PathBuf) -> Self {
        Live { rx, events_path }
    }

    /// The next batch: everything queued now, or a rebuilt view after a lag. `None` once closed.
    pub async fn next(&mut self) -> Option<Feed> {
        let first = match self.rx.recv().await {
            Ok(r) => r,
            Err(broadcast::error::RecvError::Closed) => return None,
            Err(broadcast::error::RecvError::Lagged(_)) => return Some(self.rebuild().await),
        };
        let mut batch = vec![first];
        loop {
            match self.rx.try_recv() {
                Ok(r) => batch.push(r),
                Err(broadcast::error::TryRecvError::Lagged(_)) => {
                    return Some(self.rebuild().await);
                }
                Err(_) => break,
            }
        }
        Some(Feed::Records(batch))
    }

    async fn rebuild(&self) -> Feed {
        let path = self.events_path.clone();
        let read = tokio::task::spawn_blocking(move || read_log(&path)).await;
        match read {
            Ok(Ok(log)) => Feed::Rebuilt(Box::new(RunView::from_records(&log.records))),
            Ok(Err(e)) => Feed::Warning(format!("cannot rebuild from the log: {e}")),
            Err(e) => Feed::Warning(format!("cannot rebuild from the log: {e}")),
        }
    }

    /// Forward batches into `tx` until the broadcast closes or the receiver goes away.
    pub async fn forward(mut self, tx: mpsc::UnboundedSender<Feed>) {
        while let Some(feed) = self.next().await {
            if tx.send(feed).is_err() {
                return;
            }
        }
        let _ = tx.send(Feed::Closed);
    }
}

/// Reads the records appended to a log file since the last read, through the store's line reader.
/// A last line without its newline is kept back until the rest arrives (the writer is mid-line); a
/// complete line that is not a record is reported and skipped.
pub struct Tail {
    path: PathBuf,
    /// Bytes of the file read so far: the next read starts here.
    offset: u64,
    /// Splits what was read into lines, keeping an incomplete last line back.
    lines: LineReader,
}

impl Tail {
    pub fn new(path: &Path) -> Self {
        Tail {
            path: path.to_path_buf(),
            offset: 0,
            lines: LineReader::new(path),
        }
    }

    /// New complete records, and a warning for each complete line that could not be read.
    pub fn poll(&mut self) -> std::io::Result<(Vec<LogRecord>, Vec<String>)> {
        let mut file = std::fs::File::open(&self.path)?;
        let len = file.metadata()?.len();
        if len < self.offset {
            // The file shrank: a resume cut a torn tail. What was read stays; read on from the cut.
            self.offset = len;
            self.lines.forget_pending();
        }
        file.seek(SeekFrom::Start(self.offset))?;
        let mut buf = Vec::new();
        file.read_to_end(&mut buf)?;
        self.offset += buf.len() as u64;
        let mut records = Vec::new();
        let mut warnings = Vec::new();
        let path = self.path.clone();
        let read = self.lines.feed(&buf, |line, text, _| {
            match decode_line(&path, line, text) {
                Ok(r) => records.extend(r),
                Err(e) => warnings.push(e.to_string()),
            }
            Ok::<(), std::convert::Infallible>(())
        });
        let Ok(()) = read;
        Ok((records, warnings))
    }

    /// Poll every `every` and forward what arrives, until the receiver goes away.
    pub async fn forward(mut self, every: Duration, tx: mpsc::UnboundedSender<Feed>) {
        loop {
            let joined = tokio::task::spawn_blocking(move || {
                let r = self.poll();
                (self, r)
            })
            .await;
            let (tail, polled) = match joined {
                Ok(j) => j,
                Err(e) => {
                    let _ = tx.send(Feed::Warning(format!("the log reader stopped: {e}")));
                    return;
                }
            };
            self = tail;
            let sent = match polled {
                Ok((records, warnings)) => {
                    let mut ok = true;
                    for w in warnings {
                        ok &= tx.send(Feed::Warning(w)).is_ok();
                    }
                    if !records.is_empty() {
                        ok &= tx
                            .send(Feed::Records(records.into_iter().map(Arc::new).collect()))
                            .is_ok();
                    }
                    ok
                }
                Err(e) => tx
                    .send(Feed::Warning(format!("{}: {e}", self.path.display())))
                    .is_ok(),
            };
            if !sent {
                return;
            }
            tokio::time::sleep(every).await;
        }
    }
}

/// How long the pause before a resumption (`run_started` with `resumed`) plays at most: the hours a
/// run may have stood stopped are not part of it. Every other gap plays as recorded.
pub const MAX_GAP_MS: u64 = 1_000;

/// A recorded log played back in recorded time scaled by `speed`. Driven by the caller's clock
/// (`advance` takes the real time that passed), so it is deterministic and testable without sleeping.
pub struct Replay {
    /// The whole log, played from `next` on.
    records: Vec<LogRecord>,
    next: usize,
    /// Position in recorded time (unix ms of the log).
    clock_ms: f64,
    /// Recorded time played per real second.
    pub speed: f64,
    /// Nothing plays while paused; stepping still does.
    pub paused: bool,
}

impl Replay {
    pub fn new(records: Vec<LogRecord>, speed: f64) -> Self {
        let clock_ms = records.first().map(|r| r.ts_ms as f64).unwrap_or(0.0);
        Replay {
            records,
            next: 0,
            clock_ms,
            speed,
            paused: false,
        }
    }

    /// The records whose time has come after `real` more time passed (none while paused).
    pub fn advance(&mut self, real: Duration) -> Vec<LogRecord> {
        if self.paused {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut budget = real.as_secs_f64() * 1000.0 * self.speed;
        while let Some(r) = self.records.get(self.next) {
            let due = r.ts_ms as f64;
            // The pause before a resumption is cut short by moving the clock up to its last stretch.
            let resumed = matches!(
                r.event,
                crate::types::Event::RunStarted { resumed: true, .. }
            );
            if resumed && due - self.clock_ms > MAX_GAP_MS as f64 {
                self.clock_ms = due - MAX_GAP_MS as f64;
            }
            let gap = (due - self.clock_ms).max(0.0);
            if gap > budget {
                self.clock_ms += budget;
                return out;
            }
            budget -= gap;
            self.clock_ms = self.clock_ms.max(due);
            out.push(r.clone());
            self.next += 1;
        }
        out
    }

    /// The next record, whatever its time.
    pub fn step(&mut self) -> Option<LogRecord> {
        let r = self.records.get(self.next)?.clone();
        self.next += 1;
        self.clock_ms = self.clock_ms.max(r.ts_ms as f64);
        Some(r)
    }

    /// Everything left.
    pub fn to_end(&mut self) -> Vec<LogRecord> {
        let mut out = Vec::new();
        while let Some(r) = self.step() {
            out.push(r);
        }
        out
    }

    /// The position in recorded time, for the display's clock.
    pub fn now_ms(&self) -> u64 {
        self.clock_ms as u64
    }

    /// (records played, records in the log).
    pub fn position(&self) -> (usize, usize) {
        (self.next, self.records.len())
    }

    pub fn at_end(&self) -> bool {
        self.next >= self.records.len()
    }
}
