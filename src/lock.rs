//! Advisory file locks between krefine processes on one machine: the run directory's (one writer per
//! run) and the build cache's (one user per build directory).
//!
//! Both are `flock`-style exclusive locks taken through std's `File::try_lock` (Rust 1.89), which
//! is what the `fs4` crate would give us on older toolchains; no extra dependency is needed. The
//! kernel drops such a lock when its holder exits, however it exits, so a lock left by a killed run
//! never blocks the next one: there is nothing stale to clean up.
//!
//! The build cache's lock files do not outlive their builds: [`lock_exclusive`]'s holder removes the
//! file while it still holds the lock. That is safe because a waiter, once granted the lock, checks
//! that the path still names the file it locked (same device and inode); a waiter that locked a
//! removed file lets go and opens the path again, so two holders never hold "the" lock at once.

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

/// An exclusive lock on a lock file that removes the file when released (see the module docs).
#[derive(Debug)]
pub struct FileLock {
    // Held for its lock; closed (releasing it) after `drop` below removed the path.
    _file: File,
    path: PathBuf,
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // Still holding the lock: any waiter that opened this file finds it unlinked once granted,
        // and opens the path again. Closing `file` afterwards releases the lock.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Whether `path` still names the open `file` (a holder may have removed it since it was opened).
fn names_file(path: &Path, file: &File) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let open = file.metadata()?;
    match std::fs::metadata(path) {
        Ok(now) => Ok(now.dev() == open.dev() && now.ino() == open.ino()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Wait (without blocking the runtime) for an exclusive lock on `path`, creating the file. The
/// lock is held until the returned guard is dropped, which also removes the file. Dropping the
/// future while it waits is fine.
pub async fn lock_exclusive(path: &Path) -> std::io::Result<FileLock> {
    // Polling instead of a blocking `lock()` on a blocking thread: a cancelled waiter must not leave
    // a thread behind that takes the lock later. Builds hold it for seconds to minutes, so a wait of
    // up to half a second after release costs nothing.
    let mut wait = Duration::from_millis(10);
    loop {
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .await?
            .into_std()
            .await;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_millis(500));
                }
                Err(TryLockError::Error(e)) => return Err(e),
            }
        }
        // The previous holder removed the file we waited on: ours is no lock any more.
        if names_file(path, &file)? {
            return Ok(FileLock {
                _file: file,
                path: path.to_path_buf(),
            });
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
        // No lock file outlives its holder.
        assert!(!path.exists());
    }

    /// Many holders in turn, each removing the file on release while others wait on the file they
    /// opened before: never two holders at once, and nothing left behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn removed_lock_files_never_admit_two_holders() {
        let tmp = tempfile::tempdir().unwrap();
        let path = Arc::new(tmp.path().join("b.lock"));
        let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (path, inside) = (path.clone(), inside.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    let _held = lock_exclusive(&path).await.unwrap();
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert!(!path.exists());
    }
}
