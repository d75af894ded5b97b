//! Appending to `events.jsonl`: a writer thread of its own, one `write` per batch of records.
//!
//! Appenders hand their events over a channel and wait for the answer. The writer takes everything
//! queued, numbers the records in arrival order, writes them with one `write` (and one `fdatasync`
//! when asked to), and only then answers each appender with its record. So an event is in the file
//! before whoever appended it acts on it (the engine's write-ahead rule), the file's order is `seq`
//! order, and a crash leaves at most the last line torn, which [`super::read_log`] drops. Under load
//! the lines of many tasks share one system call instead of each taking a blocking-pool round trip
//! and a flush of its own.

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::{Arc, mpsc};

use tokio::sync::{broadcast, oneshot};

use super::{StoreError, io, now_ms};
use crate::types::{Event, LogRecord, SCHEMA_VERSION, TaskId};

/// The most records written with one `write`: a bound on the batch's buffer, never a wait for more.
const MAX_BATCH: usize = 1024;

/// The append side of a run's event log.
pub struct EventLog {
    path: Arc<Path>,
    /// To the writer thread, which numbers, stamps and writes the records in the order queued.
    queue: mpsc::Sender<Entry>,
}

/// An event to log, and where its appender waits for the record.
struct Entry {
    task: Option<TaskId>,
    event: Event,
    /// Answered once the record is in the file (synced with `fsync`), or with why it is not.
    answer: oneshot::Sender<Result<Arc<LogRecord>, StoreError>>,
}

impl EventLog {
    /// Open for appending after `valid_len` bytes (cutting a torn tail), continuing at `next_seq`;
    /// `fsync` syncs every batch to the disk before answering its appenders.
    pub async fn open(
        path: &Path,
        valid_len: u64,
        next_seq: u64,
        fsync: bool,
    ) -> Result<Self, StoreError> {
        Self::open_broadcasting(path, valid_len, next_seq, fsync, None).await
    }

    /// As [`EventLog::open`], and every record written is also sent on `bus`, by the writer, in the
    /// file's order. Live views fold records as a log reader would; were each appender to send its own
    /// once answered, records written in one batch could reach them in any order (a task's turn events
    /// out of order were a "log error" in the live TUI).
    pub async fn open_broadcasting(
        path: &Path,
        valid_len: u64,
        next_seq: u64,
        fsync: bool,
        bus: Option<broadcast::Sender<Arc<LogRecord>>>,
    ) -> Result<Self, StoreError> {
        let path: Arc<Path> = Arc::from(path);
        let at = path.clone();
        let file = tokio::task::spawn_blocking(move || open_at(&at, valid_len))
            .await
            .map_err(|e| StoreError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::other(e),
            })??;
        let (queue, entries) = mpsc::channel();
        let writer = Writer {
            file,
            path: path.clone(),
            next_seq,
            fsync,
            broken: None,
            bus,
        };
        std::thread::Builder::new()
            .name("krefine-log".into())
            .spawn(move || writer.run(entries))
            .map_err(io(&path))?;
        Ok(EventLog { path, queue })
    }

    /// Append one event; resolves to the record as written once it is in the file.
    ///
    /// The event is queued at once, so appends made one after another are written in that order;
    /// the returned future holds nothing of the event.
    pub fn append(
        &self,
        task: Option<TaskId>,
        event: Event,
    ) -> impl Future<Output = Result<Arc<LogRecord>, StoreError>> + Send + 'static {
        let (answer, answered) = oneshot::channel();
        // A writer that is gone drops the entry and with it `answer`, which the future reports.
        let _ = self.queue.send(Entry {
            task,
            event,
            answer,
        });
        let path = self.path.clone();
        async move {
            match answered.await {
                Ok(written) => written,
                Err(_) => Err(StoreError::Io {
                    path: path.to_path_buf(),
                    source: std::io::Error::other("the event log's writer has stopped"),
                }),
            }
        }
    }
}

fn open_at(path: &Path, valid_len: u64) -> Result<std::fs::File, StoreError> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io(path))?;
    // Only a torn tail is cut; a device such as /dev/full (in tests) has no length to set.
    if file.metadata().map_err(io(path))?.len() != valid_len {
        file.set_len(valid_len).map_err(io(path))?;
    }
    file.seek(SeekFrom::Start(valid_len)).map_err(io(path))?;
    Ok(file)
}

/// The writer thread's side: the file, and what the next record gets.
struct Writer {
    file: std::fs::File,
    path: Arc<Path>,
    /// The next record's `seq`: one more than the last record in the file.
    next_seq: u64,
    /// Sync each batch to the disk before answering its appenders (`output.fsync`).
    fsync: bool,
    /// Set by a failed write. How much of that batch reached the file is unknown, so nothing is
    /// written after it: a line appended behind a cut one would turn the torn tail into corruption.
    broken: Option<(std::io::ErrorKind, String)>,
    /// Where each record goes once written, in the file's order (the engine's live subscribers).
    bus: Option<broadcast::Sender<Arc<LogRecord>>>,
}

impl Writer {
    /// Write batches until every [`EventLog`] handle is gone.
    fn run(mut self, entries: mpsc::Receiver<Entry>) {
        let mut batch = Vec::new();
        let mut buf = Vec::new();
        while let Ok(first) = entries.recv() {
            batch.push(first);
            batch.extend(entries.try_iter().take(MAX_BATCH - 1));
            self.write_batch(&mut batch, &mut buf);
        }
    }

    fn error(&self, kind: std::io::ErrorKind, message: &str) -> StoreError {
        StoreError::Io {
            path: self.path.to_path_buf(),
            source: std::io::Error::new(kind, message.to_string()),
        }
    }

    fn write_batch(&mut self, batch: &mut Vec<Entry>, buf: &mut Vec<u8>) {
        buf.clear();
        let mut written = Vec::with_capacity(batch.len());
        for Entry {
            task,
            event,
            answer,
        } in batch.drain(..)
        {
            if let Some((kind, message)) = &self.broken {
                let _ = answer.send(Err(self.error(*kind, message)));
                continue;
            }
            let rec = LogRecord {
                v: SCHEMA_VERSION,
                seq: self.next_seq,
                ts_ms: now_ms(),
                task,
                event,
            };
            let mark = buf.len();
            match serde_json::to_writer(&mut *buf, &rec) {
                Ok(()) => {
                    buf.push(b'\n');
                    self.next_seq += 1;
                    written.push((rec, answer));
                }
                Err(e) => {
                    buf.truncate(mark);
                    let _ = answer.send(Err(self.error(std::io::ErrorKind::Other, &e.to_string())));
                }
            }
        }
        if written.is_empty() {
            return;
        }
        let result = self.file.write_all(buf).and_then(|()| {
            if self.fsync {
                self.file.sync_data()
            } else {
                Ok(())
            }
        });
        match result {
            Ok(()) => {
                for (rec, answer) in written {
                    let rec = Arc::new(rec);
                    if let Some(bus) = &self.bus {
                        // Nobody listening is fine: the log is the record, the bus feeds live views.
                        let _ = bus.send(rec.clone());
                    }
                    let _ = answer.send(Ok(rec));
                }
            }
            Err(e) => {
                let (kind, message) = (e.kind(), e.to_string());
                for (_, answer) in written {
                    let _ = answer.send(Err(self.error(kind, &message)));
                }
                self.broken = Some((kind, message));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{RunDir, read_log};
    use crate::types::ProblemKey;

    fn ev(reason: &str) -> Event {
        Event::RunEnded {
            reason: reason.into(),
        }
    }

    #[tokio::test]
    async fn append_read_and_refuse_overwrite() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("run");
        let dir = RunDir::create(&root, "x = 1\n").unwrap();
        let log = EventLog::open(&dir.events_path(), 0, 0, false)
            .await
            .unwrap();
        log.append(None, ev("a")).await.unwrap();
        let r = log.append(None, ev("b")).await.unwrap();
        assert_eq!(r.seq, 1);
        let read = read_log(&dir.events_path()).unwrap();
        assert_eq!(read.records.len(), 2);
        assert!(read.torn_tail.is_none());
        assert!(matches!(
            RunDir::create(&root, ""),
            Err(StoreError::Exists(_))
        ));
    }

    #[tokio::test]
    async fn torn_tail_is_dropped_and_cut_on_append() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RunDir::create(&tmp.path().join("r"), "").unwrap();
        let log = EventLog::open(&dir.events_path(), 0, 0, false)
            .await
            .unwrap();
        log.append(None, ev("a")).await.unwrap();
        drop(log);
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.events_path())
            .unwrap();
        f.write_all(b"{\"v\":1,\"seq\":1,\"ts_ms\":").unwrap();
        let read = read_log(&dir.events_path()).unwrap();
        assert_eq!(read.records.len(), 1);
        assert!(read.torn_tail.as_deref().unwrap().contains(":2: dropped"));
        let log = EventLog::open(&dir.events_path(), read.valid_len, 1, false)
            .await
            .unwrap();
        log.append(None, ev("b")).await.unwrap();
        let again = read_log(&dir.events_path()).unwrap();
        assert_eq!(again.records.len(), 2);
        assert!(again.torn_tail.is_none());
    }

    fn task(i: u32) -> TaskId {
        TaskId {
            problem: ProblemKey {
                level: 1,
                problem_id: i,
            },
            sample: 0,
        }
    }

    /// Live views get the records in the file's order, however the appenders' futures are polled:
    /// events queued together (one batch) and awaited in the reverse order still arrive by seq.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_bus_carries_records_in_file_order() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RunDir::create(&tmp.path().join("r"), "").unwrap();
        let (bus, mut rx) = broadcast::channel(1024);
        let log = EventLog::open_broadcasting(&dir.events_path(), 0, 0, false, Some(bus))
            .await
            .unwrap();
        let pending: Vec<_> = (0..200)
            .map(|n| log.append(Some(task(1)), ev(&n.to_string())))
            .collect();
        for written in pending.into_iter().rev() {
            written.await.unwrap();
        }
        let seqs: Vec<u64> = (0..200).map(|_| rx.try_recv().unwrap().seq).collect();
        assert_eq!(seqs, (0..200).collect::<Vec<u64>>());
        let file: Vec<u64> = read_log(&dir.events_path())
            .unwrap()
            .records
            .iter()
            .map(|r| r.seq)
            .collect();
        assert_eq!(file, seqs);
    }

    /// Many tasks appending at once: every append answered means its record is in the file, with
    /// the seq it was answered with; the file is in seq order and each task's events in its order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_appends_are_durable_when_answered_and_in_seq_order() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RunDir::create(&tmp.path().join("r"), "").unwrap();
        let path = dir.events_path();
        let log = Arc::new(EventLog::open(&path, 0, 0, false).await.unwrap());
        let (tasks, per_task) = (32u32, 50u32);
        let mut handles = Vec::new();
        for t in 1..=tasks {
            let (log, path) = (log.clone(), path.clone());
            handles.push(tokio::spawn(async move {
                for n in 0..per_task {
                    let rec = log
                        .append(Some(task(t)), ev(&format!("{t}:{n}")))
                        .await
                        .unwrap();
                    // Answered, so it is in the file for any reader (no flush or close needed).
                    if n % 10 == 0 {
                        let path = path.clone();
                        let read = tokio::task::spawn_blocking(move || read_log(&path).unwrap())
                            .await
                            .unwrap();
                        let found = read.records.iter().find(|r| r.seq == rec.seq);
                        assert_eq!(found.map(|r| &r.event), Some(&rec.event));
                    }
                }
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
        let read = read_log(&path).unwrap();
        assert!(read.torn_tail.is_none());
        let seqs: Vec<u64> = read.records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, (0..(tasks * per_task) as u64).collect::<Vec<_>>());
        for t in 1..=tasks {
            let mine: Vec<String> = read
                .records
                .iter()
                .filter(|r| r.task == Some(task(t)))
                .map(|r| match &r.event {
                    Event::RunEnded { reason } => reason.to_string(),
                    other => panic!("unexpected {other:?}"),
                })
                .collect();
            let want: Vec<String> = (0..per_task).map(|n| format!("{t}:{n}")).collect();
            assert_eq!(mine, want);
        }
    }

    /// A crash that cut a batch mid-line: the complete lines before the cut are kept, the cut one is
    /// dropped, and the reopened log continues right after the last complete record.
    #[tokio::test]
    async fn a_batch_cut_by_a_crash_resumes_after_its_last_whole_line() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RunDir::create(&tmp.path().join("r"), "").unwrap();
        let path = dir.events_path();
        let log = EventLog::open(&path, 0, 0, false).await.unwrap();
        let pending: Vec<_> = (0..20)
            .map(|i| log.append(Some(task(i)), ev(&i.to_string())))
            .collect();
        for p in pending {
            p.await.unwrap();
        }
        drop(log);
        // Cut the file in the middle of its 13th line, as a crash during the batch's write would.
        let bytes = std::fs::read(&path).unwrap();
        let ends: Vec<usize> = bytes
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'\n')
            .map(|(i, _)| i + 1)
            .collect();
        let cut = ends[11] + (ends[12] - ends[11]) / 2;
        std::fs::write(&path, &bytes[..cut]).unwrap();

        let read = read_log(&path).unwrap();
        assert_eq!(read.records.len(), 12);
        assert!(read.torn_tail.is_some());
        let next = read.records.last().unwrap().seq + 1;
        let log = EventLog::open(&path, read.valid_len, next, true)
            .await
            .unwrap();
        let r = log.append(None, ev("after")).await.unwrap();
        assert_eq!(r.seq, 12);
        let again = read_log(&path).unwrap();
        assert!(again.torn_tail.is_none());
        assert_eq!(
            again.records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            (0..13).collect::<Vec<_>>()
        );
    }

    /// A failed write stops the log: what the failed batch left in the file is unknown, so later
    /// appends are refused rather than written behind a possibly cut line.
    #[tokio::test]
    async fn a_failed_write_refuses_later_appends() {
        let full = Path::new("/dev/full");
        if !full.exists() {
            return;
        }
        let log = EventLog::open(full, 0, 0, false).await.unwrap();
        let first = log.append(None, ev("a")).await.unwrap_err().to_string();
        assert!(first.contains("/dev/full"), "{first}");
        let second = log.append(None, ev("b")).await.unwrap_err().to_string();
        assert!(second.contains("/dev/full"), "{second}");
    }
}
