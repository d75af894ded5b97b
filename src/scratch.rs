//! A run's scratch folder in the system temp folder (`krefine-<pid>`: the workers' homes, temp
//! folders and copy-on-write layers of the build cache, gigabytes on a GPU run). A run removes it
//! when it ends ([`Scratch`]'s `Drop`, also on an error or a panic that unwinds); a run that died
//! (SIGKILL, a crash, a power cut) leaves it behind, so every start sweeps the folders whose owner
//! is gone. The owner is told by an `owner` file (pid and the process's start time, so a reused pid
//! is no owner); a `krefine-<pid>` folder without one (made before the file existed) belongs to a
//! process only while that pid lives.

use std::path::{Path, PathBuf};

/// The file naming a scratch folder's owner: `<pid> <start time in clock ticks since boot>`.
pub const OWNER_FILE: &str = "krefine-owner";

/// A scratch folder this process owns, removed on drop.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
}

impl Scratch {
    /// Sweep the dead runs' scratch folders under `root`, then create (or take over) this
    /// process's `root/<prefix><pid>`, marked as ours.
    pub fn claim(root: &Path, prefix: &str) -> std::io::Result<Scratch> {
        sweep(root, prefix);
        let pid = std::process::id();
        let path = root.join(format!("{prefix}{pid}"));
        std::fs::create_dir_all(&path)?;
        std::fs::write(path.join(OWNER_FILE), owner_line(pid).unwrap_or_default())?;
        Ok(Scratch { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = remove_all(&self.path) {
            tracing::warn!(
                "cannot remove the scratch folder {}: {e}",
                self.path.display()
            );
        }
    }
}

/// `<pid> <start time>` of a live process, from `/proc/<pid>/stat` (field 22); `None` when the
/// process does not exist.
fn owner_line(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    let start = after.split_whitespace().nth(19)?;
    Some(format!("{pid} {start}"))
}

/// Whether the owner a scratch folder names (`<pid> <start time>`) still runs.
pub fn owner_alive(owner: &str) -> bool {
    let mut parts = owner.split_whitespace();
    let Some(pid) = parts.next().and_then(|p| p.parse::<u32>().ok()) else {
        // Unreadable: an owner that was writing it just now, or garbage; not ours to judge.
        return true;
    };
    match (owner_line(pid), parts.next()) {
        (None, _) => false,
        (Some(now), Some(start)) => now.split_whitespace().nth(1) == Some(start),
        // A pid without a start time: alive while the pid lives.
        (Some(_), None) => true,
    }
}

/// Remove `root/<prefix>*` folders whose owner is gone; returns those removed. Folders of live
/// processes, and anything not named like a scratch folder, are left alone.
pub fn sweep(root: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        return removed;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = e.path();
        let alive = match std::fs::read_to_string(path.join(OWNER_FILE)) {
            Ok(owner) => owner_alive(&owner),
            Err(_) => owner_line(pid).is_some(),
        };
        if !alive && remove_all(&path).is_ok() {
            removed.push(path);
        }
    }
    removed
}

/// `remove_dir_all`, after making folders writable where needed (overlayfs leaves its work folder
/// without permissions; sealed builds copied up are read-only files in writable folders).
fn remove_all(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            open_up(path);
            match std::fs::remove_dir_all(path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                other => other,
            }
        }
    }
}

fn open_up(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                open_up(&e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_folder_goes_with_its_run_and_dead_runs_are_swept() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        // A dead run's folder (a pid that cannot exist), a live process's, one whose pid lives
        // but started later (reused), a legacy one without owner file of a dead pid, and a folder
        // not named like scratch.
        let dead = root.join("krefine-4194304999");
        std::fs::create_dir_all(dead.join("w/home")).unwrap();
        std::fs::write(dead.join(OWNER_FILE), "4194304999 12").unwrap();
        let live_pid = std::os::unix::process::parent_id();
        let live = root.join(format!("krefine-{live_pid}"));
        std::fs::create_dir_all(&live).unwrap();
        std::fs::write(live.join(OWNER_FILE), owner_line(live_pid).unwrap()).unwrap();
        let stale_start = root.join("krefine-1");
        std::fs::create_dir_all(&stale_start).unwrap();
        // pid 1 lives, but not since tick 0.
        std::fs::write(stale_start.join(OWNER_FILE), "1 0").unwrap();
        let legacy = root.join("krefine-4194304998");
        std::fs::create_dir_all(legacy.join("x")).unwrap();
        let other = root.join("krefine-bench-7");
        std::fs::create_dir_all(&other).unwrap();
        // Read-only content and a folder without permissions (as overlayfs leaves its work folder).
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(dead.join("w/home/f"), "x").unwrap();
        std::fs::set_permissions(
            dead.join("w/home/f"),
            std::fs::Permissions::from_mode(0o444),
        )
        .unwrap();
        std::fs::set_permissions(dead.join("w"), std::fs::Permissions::from_mode(0o000)).unwrap();

        let s = Scratch::claim(root, "krefine-").unwrap();
        assert!(!dead.exists() && !legacy.exists() && !stale_start.exists());
        assert!(live.exists() && other.exists());
        let mine = root.join(format!("krefine-{}", std::process::id()));
        assert_eq!(s.path(), mine);
        assert!(owner_alive(
            &std::fs::read_to_string(mine.join(OWNER_FILE)).unwrap()
        ));
        std::fs::create_dir_all(mine.join("worker/tmp")).unwrap();
        drop(s);
        assert!(!mine.exists());
    }
}
