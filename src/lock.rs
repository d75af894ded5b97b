//! Advisory file locks between krefine processes on one machine: the run directory's (one writer per
//! run) and the build cache's (one user per build directory).
//!
//! Both are `flock`-style exclusive locks taken through std's `File::try_lock` (Rust 1.89), which
//! is what the `fs4` crate would give us on older toolchains; no extra dependency is needed. The
//! kernel drops such a lock when its holder exits, however it exits, so a lock left by a killed run
//! never blocks the next one: there is nothing stale to clean up.

use std::fs::{File, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The lock file inside a run directory; its content is irrelevant, only the lock on it counts.
pub const RUN_LOCK_FILE: &str = "krefine.lock";
/// Next to it: the pid of the process holding the lock, for the message a second process gets.
pub const RUN_PID_FILE: &str = "krefine.pid";

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "run directory {dir} is in use by another krefine process ({holder}); wait for it to end or stop it, then resume"
    )]
    Held { dir: PathBuf, holder: String },
    #[error("cannot lock {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Exclusive hold on a run directory for the life of the process (or until dropped).
#[derive(Debug)]
pub struct RunLock {
    // Held for its lock; closing it (drop, or the process ending) releases the lock.
    _file: File,
    pid_path: PathBuf,
}

impl Drop for RunLock {
    fn drop(&mut self) {
        // Only ours to remove while we hold the lock; a stale one is harmless (never trusted
        // without the lock being held).
        let _ = std::fs::remove_file(&self.pid_path);
    }
}

/// Take the run directory's lock without waiting; refuse with the holder's pid when another process
/// holds it. The directory must exist.
pub fn lock_run_dir(dir: &Path) -> Result<RunLock, LockError> {
    let path = dir.join(RUN_LOCK_FILE);
    let io = |source| LockError::Io {
        path: path.clone(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io)?;
    let pid_path = dir.join(RUN_PID_FILE);
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let holder = match std::fs::read_to_string(&pid_path)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
            {
                Some(pid) => format!("pid {pid}"),
                // It took the lock but has not written its pid yet.
                None => "pid not yet recorded".into(),
            };
            return Err(LockError::Held {
                dir: dir.to_path_buf(),
                holder,
            });
        }
        Err(TryLockError::Error(e)) => return Err(io(e)),
    }
    let mut pid_file = std::fs::File::create(&pid_path).map_err(|source| LockError::Io {
        path: pid_path.clone(),
        source,
    })?;
    writeln!(pid_file, "{}", std::process::id()).map_err(|source| LockError::Io {
        path: pid_path.clone(),
        source,
    })?;
    Ok(RunLock {
        _file: file,
        pid_path,
    })
}

/// Wait (without blocking the runtime) for an exclusive lock on `path`, creating the file. The
/// lock is held until the returned file is dropped. Dropping the future while it waits is fine.
pub async fn lock_exclusive(path: &Path) -> std::io::Result<File> {
    let file = tokio::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .await?
        .into_std()
        .await;
    // Polling instead of a blocking `lock()` on a blocking thread: a cancelled waiter must not leave
    // a thread behind that takes the lock later. Builds hold it for seconds to minutes, so a wait of
    // up to half a second after release costs nothing.
    let mut wait = Duration::from_millis(10);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(TryLockError::WouldBlock) => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_millis(500));
            }
            Err(TryLockError::Error(e)) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[test]
    fn a_second_run_lock_names_the_holder_and_a_released_one_is_free() {
        let tmp = tempfile::tempdir().unwrap();
        let first = lock_run_dir(tmp.path()).unwrap();
        let pid = std::fs::read_to_string(tmp.path().join(RUN_PID_FILE)).unwrap();
        assert_eq!(pid.trim(), std::process::id().to_string());
        // flock locks belong to the open file, so a second open in this process conflicts too.
        let e = lock_run_dir(tmp.path()).unwrap_err().to_string();
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        drop(first);
        assert!(!tmp.path().join(RUN_PID_FILE).exists());
        let _again = lock_run_dir(tmp.path()).unwrap();
    }

    #[tokio::test]
    async fn exclusive_lock_waits_for_the_holder() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("k.lock");
        let held = lock_exclusive(&path).await.unwrap();
        let released = Arc::new(AtomicBool::new(false));
        let r = released.clone();
        let p = path.clone();
        let waiter = tokio::spawn(async move {
            let _f = lock_exclusive(&p).await.unwrap();
            // The lock is only granted once the holder let go.
            r.load(Ordering::SeqCst)
        });
        for _ in 0..5 {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!waiter.is_finished());
        released.store(true, Ordering::SeqCst);
        drop(held);
        assert!(waiter.await.unwrap());
    }
}
