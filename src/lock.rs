//! Advisory file locks between krefine processes on one machine: the run directory's (one writer per
//! run), the build cache's (one user per build directory) and the devices' (one timer per device:
//! [`lock_device`], in a folder every krefine process of every user on the host shares).
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

/// The folder of the device locks that every krefine process on this machine shares, whoever runs
/// it: `KREFINE_LOCK_DIR` when set, else `/run/lock/krefine` (the system's folder for device lock
/// files, writable by everyone), else `krefine-locks` in the temporary folder.
pub fn device_lock_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KREFINE_LOCK_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let system = Path::new("/run/lock");
    if writable_dir(system) {
        return system.join("krefine");
    }
    std::env::temp_dir().join("krefine-locks")
}

fn writable_dir(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    dir.is_dir() && unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0
}

/// An exclusive hold on one device across every krefine process on the machine; released when
/// dropped (or when the process ends, however it ends).
#[derive(Debug)]
pub struct DeviceLock {
    // Held for its lock; the holder's line is written into it.
    file: File,
}

impl Drop for DeviceLock {
    fn drop(&mut self) {
        // The holder's line goes with the hold (a later reader would otherwise name us). The file
        // stays: it is shared by every user's processes, and removing it could split the lock.
        let _ = self.file.set_len(0);
    }
}

/// What a lock attempt found: the lock, or the line its holder wrote (`pid 123, run DIR`).
#[derive(Debug)]
pub enum DeviceLockTry {
    Held(DeviceLock),
    Busy(String),
}

/// The lock file of `key` (a GPU's UUID, `cpu`) in `dir`.
pub fn device_lock_path(dir: &Path, key: &str) -> PathBuf {
    let name: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    dir.join(format!("{name}.lock"))
}

/// Open (creating) the lock file of `key`: readable and writable by every user, in a folder
/// every user may create files in (sticky, as `/tmp`), so that colleagues' runs share it.
fn open_device_lock(dir: &Path, key: &str) -> std::io::Result<File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if !dir.is_dir() {
        std::fs::create_dir_all(dir)?;
        // Ours: open it to everyone (a race with another creator ends the same way).
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777));
    }
    let path = device_lock_path(dir, key);
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .open(&path);
    match opened {
        Ok(file) => {
            // The umask may have narrowed the mode; only the file's owner can widen it.
            let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
            Ok(file)
        }
        // Another user's file that we may not write: a lock needs only an open descriptor.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => File::open(&path),
        Err(e) => Err(e),
    }
}

/// Try to take the device lock of `key` in `dir` without waiting; `holder` is the line this process
/// writes into it once it holds it, for the next one to show (`pid 123, run DIR`).
pub fn try_lock_device(dir: &Path, key: &str, holder: &str) -> std::io::Result<DeviceLockTry> {
    let mut file = open_device_lock(dir, key)?;
    match file.try_lock() {
        Ok(()) => {
            // Best effort: a file we could only open for reading keeps no holder's line.
            if file.set_len(0).is_ok() {
                let _ = writeln!(file, "{holder}");
                let _ = file.flush();
            }
            Ok(DeviceLockTry::Held(DeviceLock { file }))
        }
        Err(TryLockError::WouldBlock) => {
            let text = std::fs::read_to_string(device_lock_path(dir, key)).unwrap_or_default();
            let line = text.lines().next().unwrap_or("").trim();
            Ok(DeviceLockTry::Busy(if line.is_empty() {
                "holder not yet recorded".to_string()
            } else {
                line.to_string()
            }))
        }
        Err(TryLockError::Error(e)) => Err(e),
    }
}

/// Wait (without blocking the runtime) for the device lock of `key` in `dir`. When another process
/// holds it, `on_wait` is told its line once, before the wait. Dropping the future while it waits
/// is fine: nothing is held.
pub async fn lock_device(
    dir: &Path,
    key: &str,
    holder: &str,
    on_wait: impl FnOnce(&str),
) -> std::io::Result<DeviceLock> {
    // Polling, as `lock_exclusive` does: a cancelled waiter leaves no thread behind that takes the
    // lock later. Another process holds a device for a candidate's evaluation (seconds to minutes),
    // so a quarter of a second after its release costs nothing.
    let mut on_wait = Some(on_wait);
    let mut wait = Duration::from_millis(10);
    loop {
        match try_lock_device(dir, key, holder)? {
            DeviceLockTry::Held(lock) => return Ok(lock),
            DeviceLockTry::Busy(by) => {
                if let Some(tell) = on_wait.take() {
                    tell(&by);
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_millis(250));
            }
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

    #[tokio::test]
    async fn a_device_lock_names_its_holder_to_a_waiter_and_passes_on_release() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("locks");
        let DeviceLockTry::Held(held) = try_lock_device(&dir, "GPU-1/2", "pid 1, run A").unwrap()
        else {
            panic!("a free lock");
        };
        let path = device_lock_path(&dir, "GPU-1/2");
        assert!(path.ends_with("GPU-1_2.lock"));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o666
        );
        // flock locks belong to the open file: a second open in this process waits like another
        // process would.
        match try_lock_device(&dir, "GPU-1/2", "pid 2, run B").unwrap() {
            DeviceLockTry::Busy(by) => assert_eq!(by, "pid 1, run A"),
            DeviceLockTry::Held(_) => panic!("two holders"),
        }
        let told = Arc::new(std::sync::Mutex::new(Vec::new()));
        let t = told.clone();
        let d = dir.clone();
        let waiter = tokio::spawn(async move {
            lock_device(&d, "GPU-1/2", "pid 2, run B", |by| {
                t.lock().unwrap().push(by.to_string())
            })
            .await
            .unwrap()
        });
        while told.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!waiter.is_finished());
        drop(held);
        let second = waiter.await.unwrap();
        assert_eq!(*told.lock().unwrap(), vec!["pid 1, run A".to_string()]);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "pid 2, run B\n");
        drop(second);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
    }
}
