//! Writing a run's per-turn files (prompts, candidates) on a thread of its own, one after another.
//!
//! A run makes a prompt file and a candidate file per turn, by the hundred thousand at cluster scale,
//! all in two folders. Created concurrently from the blocking pool, the creations contend for the
//! folder's lock (the threads spin on it) and each costs a blocking-pool round trip; created one
//! after another by one thread (one a folder) they cost only the creation.

use std::path::{Path, PathBuf};

use tokio::sync::{mpsc, oneshot};

use super::{StoreError, io};

/// Files queued at once; an appender waits for room before it makes its file's bytes, so a queue
/// that falls behind holds no more than this many files' contents.
const QUEUE: usize = 32;

/// One file to write, and where its appender waits for the result.
struct Job {
    path: PathBuf,
    data: Vec<u8>,
    done: oneshot::Sender<std::io::Result<()>>,
}

/// The writer thread's handle; the thread ends when the handle is dropped and its queue is done.
pub struct FileWriter {
    queue: mpsc::Sender<Job>,
}

impl FileWriter {
    /// Start a writer thread named `krefine-{name}`.
    pub fn start(name: &str) -> Result<Self, StoreError> {
        let (queue, mut jobs) = mpsc::channel::<Job>(QUEUE);
        let name = format!("krefine-{name}");
        std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                while let Some(Job { path, data, done }) = jobs.blocking_recv() {
                    let _ = done.send(std::fs::write(&path, data));
                }
            })
            .map_err(io(Path::new(&name)))?;
        Ok(FileWriter { queue })
    }

    /// Write the bytes `data` makes as the whole of `path`; resolves once they are written. `data`
    /// runs when the queue has room.
    pub async fn write(
        &self,
        path: PathBuf,
        data: impl FnOnce() -> std::io::Result<Vec<u8>>,
    ) -> Result<(), StoreError> {
        let stopped = || std::io::Error::other("the file writer has stopped");
        let Ok(room) = self.queue.reserve().await else {
            return Err(io(&path)(stopped()));
        };
        let data = data().map_err(io(&path))?;
        let (done, written) = oneshot::channel();
        let job_path = path.clone();
        room.send(Job {
            path: job_path,
            data,
            done,
        });
        written
            .await
            .unwrap_or_else(|_| Err(stopped()))
            .map_err(io(&path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writes_files_and_reports_failures_with_the_path() {
        let tmp = tempfile::tempdir().unwrap();
        let files = FileWriter::start("test-files").unwrap();
        let pending: Vec<_> = (0..100)
            .map(|i| {
                files.write(tmp.path().join(format!("f{i}.txt")), move || {
                    Ok(format!("file {i}").into_bytes())
                })
            })
            .collect();
        // More files than the queue holds, all in flight at once.
        for r in futures::future::join_all(pending).await {
            r.unwrap();
        }
        for i in 0..100 {
            let text = std::fs::read_to_string(tmp.path().join(format!("f{i}.txt"))).unwrap();
            assert_eq!(text, format!("file {i}"));
        }
        let missing = tmp.path().join("no-such-folder").join("f.txt");
        let e = files
            .write(missing, || Ok(b"x".to_vec()))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no-such-folder"), "{e}");
    }
}
