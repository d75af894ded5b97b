//! The shared build cache on disk, as the sandbox needs it: publishing a finished build, and the
//! precompiled headers a compile worker built, from its copy-on-write layer (only the orchestrator
//! writes the cache), sealing them read-only, and telling whether an evaluation worker changed its
//! view of the cache.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::sandbox::SandboxSpec;

/// The harness's lock file at the top of a build dir (`BUILD_LOCK_FILE` in kb_compile.py): held by
/// the worker building or loading there, so that a live build's torch batons are never removed. A
/// finished build needs no such lock, so it is neither published nor left behind.
pub(crate) const HARNESS_LOCK_FILE: &str = "krefine-build.lock";
/// Written into a build dir after a good compile; its presence means "this build is usable".
pub(crate) const SUCCESS_MARKER: &str = "krefine-ok.json";

/// Called while the orchestrator still holds a build dir's lock, when it is done with it: remove
/// the harness's lock file of a finished build (nobody builds there any more; a worker that loads it
/// later takes a new one). An unfinished build keeps it, because a worker left over from a killed
/// run may still be building there.
pub(crate) fn release_build_dir(dir: &Path) {
    if dir.join(SUCCESS_MARKER).exists() {
        let _ = std::fs::remove_file(dir.join(HARNESS_LOCK_FILE));
    }
}

/// Copy a finished build from the compile worker's copy-on-write layer into the shared cache (write
/// to a temporary name, then rename) and make its files read-only. Only the orchestrator writes the
/// cache, so no candidate can change another's build.
pub(crate) async fn publish_build(
    sandbox: &SandboxSpec,
    cache: &Path,
    build_dir: &Path,
) -> std::io::Result<()> {
    let (Some(overlay), Ok(rel)) = (sandbox.overlays.first(), build_dir.strip_prefix(cache)) else {
        return Err(std::io::Error::other(format!(
            "{} is not inside the build cache {}",
            build_dir.display(),
            cache.display()
        )));
    };
    let src = overlay.upper.join(rel);
    let dst = build_dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut tmp = dst.as_os_str().to_os_string();
        tmp.push(format!(".publish-{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        remove_tree(&tmp)?;
        copy_tree(&src, &tmp)?;
        // The compile worker's lock, not part of the build.
        match std::fs::remove_file(tmp.join(HARNESS_LOCK_FILE)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        // A folder without a success marker is a leftover: replace it.
        remove_tree(&dst)?;
        std::fs::rename(&tmp, &dst)?;
        make_files_read_only(&dst)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// The shared precompiled headers' folder in the build cache (`PCH_DIR_NAME` in kb_pch.py).
pub(crate) const PCH_DIR: &str = "pch";
/// A PCH folder's header (`PCH_HEADER` in kb_pch.py); its `.gch` next to it means "complete".
const PCH_HEADER: &str = "krefine_pch.h";
/// Written into a PCH folder when it is published into the shared cache (`PUBLISHED_MARKER` in
/// kb_pch.py): a later build that uses it says it came from the shared cache.
pub(crate) const PCH_PUBLISHED_MARKER: &str = "krefine-published.json";

/// Publish the precompiled headers a compile worker built (in its copy-on-write layer, `upper`) into
/// the shared cache's `pch/`, so that later runs' workers start with them instead of cold. Blocking.
///
/// Only the worker itself and the `ensure-pch` processes it starts write its `pch/` (the confined
/// compile children see it read-only, kb_pch.py), and only complete headers are taken: a folder named
/// like a key (hex) that holds the header and its `.gch`, regular files only (a symlink could point
/// anywhere). Each is copied under a temporary name, sealed read-only and renamed into place, so a
/// reader never sees half a header; a key already in the cache (another run published it) is kept.
/// Returns the keys published.
pub(crate) fn publish_pchs(upper: &Path, cache: &Path) -> std::io::Result<Vec<String>> {
    let from = upper.join(PCH_DIR);
    let entries = match std::fs::read_dir(&from) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        other => other?,
    };
    let to = cache.join(PCH_DIR);
    // What a krefine killed while publishing here left (0.5 GB or more a header).
    sweep_publish_leftovers(&to, STALE_PUBLISH);
    let mut published = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let complete = entry.file_type()?.is_dir()
            && !name.is_empty()
            && name.bytes().all(|b| b.is_ascii_hexdigit())
            && entry.path().join(format!("{PCH_HEADER}.gch")).is_file();
        if !complete || to.join(&name).exists() {
            continue;
        }
        std::fs::create_dir_all(&to)?;
        // Unique per call: two compile workers of one run may publish the same header at once.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = to.join(format!("{name}.publish-{}-{n}", std::process::id()));
        remove_tree(&tmp)?;
        let copied = copy_pch(&entry.path(), &tmp).and_then(|()| {
            std::fs::write(
                tmp.join(PCH_PUBLISHED_MARKER),
                format!("{{\"published_by\": {}}}\n", std::process::id()),
            )?;
            make_files_read_only(&tmp)?;
            std::fs::rename(&tmp, to.join(&name))
        });
        match copied {
            Ok(()) => published.push(name),
            // Another run published the same key first (rename onto a full folder fails).
            Err(_) if to.join(&name).join(format!("{PCH_HEADER}.gch")).is_file() => {
                remove_tree(&tmp)?;
            }
            Err(e) => {
                let _ = remove_tree(&tmp);
                return Err(e);
            }
        }
    }
    Ok(published)
}

/// How often headers being built are looked for ([`publish_pchs_as_built`]), and how long it goes
/// on looking after the last one in progress: a header started as a build ended may not have made
/// its temporary folder yet (a Python start and torch's import, seconds under load).
const PCH_POLL: Duration = Duration::from_secs(2);
const PCH_GRACE: Duration = Duration::from_secs(15);
/// The most a header build may take (`PCH_BUILD_TIMEOUT_S` in kb_pch.py).
const PCH_BUILD_LIMIT: Duration = Duration::from_secs(900);

/// Whether a header is being built in the worker's `pch/` now (`ensure_pch` builds into
/// `<key>.tmp-*` and renames it into place when complete).
fn pch_building(upper: &Path) -> bool {
    std::fs::read_dir(upper.join(PCH_DIR)).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().contains(".tmp-"))
    })
}

/// Publish each header a sandboxed compile worker builds in the background as soon as it is
/// complete, until none is being built. Without it a header waited for the end of that worker's
/// next build (on the GPU host's cold batch, 20-30 s during which every other worker's builds went
/// without it). Failures only cost speed: logged.
pub(crate) async fn publish_pchs_as_built(upper: PathBuf, cache: PathBuf, worker: String) {
    let started = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(PCH_POLL).await;
        let (u, c) = (upper.clone(), cache.clone());
        let Ok((published, building)) =
            tokio::task::spawn_blocking(move || (publish_pchs(&u, &c), pch_building(&u))).await
        else {
            return;
        };
        match published {
            Ok(keys) if !keys.is_empty() => tracing::info!(
                "published the precompiled header(s) {} of worker {worker} into the build cache",
                keys.join(", ")
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("could not publish worker {worker}'s precompiled headers: {e}")
            }
        }
        let waited = started.elapsed();
        if (!building && waited >= PCH_GRACE) || waited >= PCH_BUILD_LIMIT {
            return;
        }
    }
}

/// How long a publish folder whose publisher is gone from this machine must have sat untouched before
/// [`sweep_publish_leftovers`] removes it. The build cache may be shared by runs on other machines
/// (a cluster's shared file system), where a live publisher's pid means nothing here; a publish
/// copies one build or header (seconds, a minute on a slow file system), so a folder untouched this
/// long is no live copy's.
pub(crate) const STALE_PUBLISH: Duration = Duration::from_secs(10 * 60);

/// The publisher's pid in the name of a publish folder: `<key>.publish-<pid>` ([`publish_build`]) or
/// `<key>.publish-<pid>-<n>` ([`publish_pchs`]); None for any other name.
fn publisher_pid(name: &str) -> Option<i32> {
    let (key, tail) = name.rsplit_once(".publish-")?;
    let (pid, n) = tail.split_once('-').unwrap_or((tail, "0"));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (!key.is_empty() && digits(pid) && digits(n))
        .then(|| pid.parse().ok())
        .flatten()
        .filter(|p| *p > 0)
}

/// Remove the temporary folders a krefine killed mid-publish left in `dir` (the build cache, or its
/// `pch/`): those named by a publisher that no process of this machine is any more, untouched for
/// `stale_after` (see [`STALE_PUBLISH`]). A folder whose publisher lives, or that changed lately, is
/// kept. Returns the folders removed. Blocking.
pub(crate) fn sweep_publish_leftovers(dir: &Path, stale_after: Duration) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(publisher_pid) else {
            continue;
        };
        // Signal 0: only asks whether the process exists (EPERM: it does, someone else's).
        let alive = !matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
        let Ok(meta) = entry.metadata() else { continue };
        let untouched = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age >= stale_after);
        if alive || !untouched || !meta.is_dir() {
            continue;
        }
        let path = entry.path();
        match remove_tree(&path) {
            Ok(()) => removed.push(path),
            Err(e) => tracing::warn!(
                "could not remove {} (left by a publisher that is gone): {e}",
                path.display()
            ),
        }
    }
    removed
}

/// Copy one PCH folder: its regular files only (a PCH folder holds nothing else).
fn copy_pch(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), dst.join(entry.file_name()))?;
        }
    }
    Ok(())
}

fn remove_tree(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Copy folders, regular files and symlinks (overlayfs whiteouts and other special files are
/// skipped: a fresh build has none).
fn copy_tree(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let to = dst.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &to)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &to)?;
            // Keep modification times: ninja and Python's bytecode cache compare them, and a copy
            // that looked newer than its outputs would be rebuilt (or rewritten) at every load.
            let meta = entry.metadata()?;
            let times = std::fs::FileTimes::new()
                .set_modified(meta.modified()?)
                .set_accessed(meta.accessed()?);
            std::fs::File::options()
                .write(true)
                .open(&to)?
                .set_times(times)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &to)?;
        }
    }
    Ok(())
}

/// Make every regular file under `dir` read-only (folders stay writable: loading a build takes
/// torch's lock file in it).
pub(crate) fn make_files_read_only(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            make_files_read_only(&entry.path())?;
        } else if kind.is_file() {
            let mode = entry.metadata()?.permissions().mode();
            std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(mode & 0o555))?;
        }
    }
    Ok(())
}

/// What an evaluation legitimately leaves in its worker's copy-on-write layer of the build cache:
/// folders copied up on the way to a file it wrote (torch's transient `lock` in the extension's
/// folder), each build's `load.log` and the harness's lock file there (taken to load the build). Anything else — a changed `.so`, a planted file, a deleted
/// one (an overlayfs whiteout) or an emptied folder (an opaque one) — would change what later
/// candidates in this worker load, so the worker is replaced; the path found is returned.
pub(crate) fn cow_tainted(upper: &Path) -> Option<PathBuf> {
    fn walk(dir: &Path, depth: usize) -> Option<PathBuf> {
        let entries = std::fs::read_dir(dir).ok()?;
        for e in entries.flatten() {
            let path = e.path();
            let Ok(kind) = e.file_type() else {
                return Some(path);
            };
            if kind.is_dir() {
                if is_opaque(&path) {
                    return Some(path);
                }
                if let Some(p) = walk(&path, depth + 1) {
                    return Some(p);
                }
            } else if !(kind.is_file()
                && depth == 1
                && (e.file_name() == "load.log" || e.file_name() == HARNESS_LOCK_FILE))
            {
                return Some(path);
            }
        }
        None
    }
    walk(upper, 0)
}

/// Whether overlayfs marked this upper folder opaque (it hides the lower folder's content).
fn is_opaque(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    let mut buf = [0u8; 4];
    // SAFETY: NUL-terminated path and attribute name, a buffer of the length passed.
    let n = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            c"user.overlay.opaque".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    n >= 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A publish folder as a killed publisher leaves it: a sealed file inside, last changed `ago`.
    fn leftover(dir: &Path, name: &str, ago: Duration) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::create_dir_all(&path).unwrap();
        let file = path.join("krefine_pch.h.gch");
        std::fs::write(&file, b"half a header").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o444)).unwrap();
        let then = std::time::SystemTime::now() - ago;
        std::fs::File::open(&path)
            .unwrap()
            .set_modified(then)
            .unwrap();
        path
    }

    #[test]
    fn publish_leftovers_of_gone_publishers_are_swept_live_ones_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        // A pid no process has any more: a child that ended and was reaped.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        child.wait().unwrap();
        let gone = child.id();
        let me = std::process::id();
        let old = STALE_PUBLISH + Duration::from_secs(60);
        let stale_pch = leftover(dir, &format!("0a1b.publish-{gone}-3"), old);
        let stale_build = leftover(dir, &format!("77ff00aa11bb22cc.publish-{gone}"), old);
        // A live publisher's (ours), however old; a gone one's changed lately; other names.
        let live = leftover(dir, &format!("0a1b.publish-{me}-0"), old);
        let recent = leftover(dir, &format!("0c0d.publish-{gone}-1"), Duration::ZERO);
        let build = leftover(dir, "77ff00aa11bb22cc", old);
        let odd = leftover(dir, &format!("x.publish-{gone}-y"), old);
        let lock = dir.join(format!("0e0f.publish-{gone}"));
        std::fs::write(&lock, b"a file, not a folder").unwrap();

        let mut removed = sweep_publish_leftovers(dir, STALE_PUBLISH);
        removed.sort();
        let mut want = vec![stale_pch.clone(), stale_build.clone()];
        want.sort();
        assert_eq!(removed, want);
        assert!(!stale_pch.exists() && !stale_build.exists());
        for kept in [&live, &recent, &build, &odd, &lock] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
        // Once it is old enough, the gone publisher's recent folder goes too.
        assert_eq!(sweep_publish_leftovers(dir, Duration::ZERO), vec![recent]);
        assert!(live.exists());
        assert!(sweep_publish_leftovers(&dir.join("missing"), Duration::ZERO).is_empty());
    }

    /// A header the worker's background build completes while the worker is between builds is
    /// published then (not at its next build's end), and the watch ends once nothing is building.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_header_is_published_as_soon_as_its_build_completes() {
        let tmp = tempfile::tempdir().unwrap();
        let (upper, cache) = (tmp.path().join("upper"), tmp.path().join("cache"));
        let building = upper.join(PCH_DIR).join("0a1b.tmp-xyz");
        std::fs::create_dir_all(&building).unwrap();
        std::fs::create_dir_all(cache.join(PCH_DIR)).unwrap();
        let watch = tokio::spawn(publish_pchs_as_built(
            upper.clone(),
            cache.clone(),
            "compile-0".into(),
        ));
        tokio::time::sleep(PCH_POLL * 2).await;
        assert!(
            !cache.join(PCH_DIR).join("0a1b").exists(),
            "not complete yet"
        );
        assert!(!watch.is_finished(), "a header is being built");
        // ensure_pch's last step: the complete folder renamed into place.
        std::fs::write(building.join(PCH_HEADER), b"#include <vector>\n").unwrap();
        std::fs::write(building.join(format!("{PCH_HEADER}.gch")), b"gch").unwrap();
        std::fs::rename(&building, upper.join(PCH_DIR).join("0a1b")).unwrap();
        let published = cache.join(PCH_DIR).join("0a1b").join(PCH_PUBLISHED_MARKER);
        for _ in 0..50 {
            if published.exists() {
                break;
            }
            tokio::time::sleep(PCH_POLL / 4).await;
        }
        assert!(
            published.is_file(),
            "published while the worker builds nothing"
        );
        // Nothing is being built any more: the watch ends (after its grace).
        tokio::time::timeout(PCH_GRACE * 4, watch)
            .await
            .expect("the watch ends")
            .unwrap();
    }

    #[test]
    fn publisher_pids_are_read_from_publish_names_only() {
        assert_eq!(publisher_pid("0a1b.publish-123-4"), Some(123));
        assert_eq!(publisher_pid("77ff.publish-99"), Some(99));
        for name in [
            "0a1b",
            "0a1b.lock",
            ".publish-5",
            "0a1b.publish-",
            "0a1b.publish-0",
            "0a1b.publish-5-",
            "0a1b.publish-a-1",
            "0a1b.tmp-5",
        ] {
            assert_eq!(publisher_pid(name), None, "{name}");
        }
    }

    #[test]
    fn only_complete_headers_are_published_sealed_and_once() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let (upper, cache) = (tmp.path().join("upper"), tmp.path().join("cache"));
        let pch = upper.join(PCH_DIR);
        for (dir, files) in [
            (
                "0a1b2c",
                &["krefine_pch.h", "krefine_pch.h.gch", "flags.json"][..],
            ),
            ("0a1b2c.tmp-x1", &["krefine_pch.h", "krefine_pch.h.gch"][..]),
            ("3d4e5f", &["krefine_pch.h"][..]),
        ] {
            std::fs::create_dir_all(pch.join(dir)).unwrap();
            for f in files {
                std::fs::write(pch.join(dir).join(f), dir).unwrap();
            }
        }
        std::fs::write(pch.join("0a1b2c.lock"), "").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", pch.join("0a1b2c/extra")).unwrap();
        assert_eq!(publish_pchs(&upper, &cache).unwrap(), vec!["0a1b2c"]);
        let mut names: Vec<String> = std::fs::read_dir(cache.join(PCH_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            vec!["0a1b2c"],
            "no temporary, lock or incomplete folder"
        );
        let published = cache.join(PCH_DIR).join("0a1b2c");
        let mut files: Vec<String> = std::fs::read_dir(&published)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(
            files,
            vec![
                "flags.json",
                PCH_PUBLISHED_MARKER,
                "krefine_pch.h",
                "krefine_pch.h.gch"
            ]
        );
        for f in &files {
            let mode = std::fs::metadata(published.join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o222, 0, "{f} is sealed read-only");
        }
        // Published once: a second pass (or another run's) keeps what is there.
        assert_eq!(publish_pchs(&upper, &cache).unwrap(), Vec::<String>::new());
        assert_eq!(
            publish_pchs(&tmp.path().join("none"), &cache).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn copy_on_write_layer_taint() {
        let tmp = tempfile::tempdir().unwrap();
        let upper = tmp.path();
        assert_eq!(cow_tainted(upper), None);
        std::fs::create_dir_all(upper.join("k1/ext")).unwrap();
        std::fs::write(upper.join("k1/load.log"), "x").unwrap();
        std::fs::write(upper.join("k1").join(HARNESS_LOCK_FILE), "").unwrap();
        assert_eq!(
            cow_tainted(upper),
            None,
            "copied-up folders, load.log and the load's lock"
        );
        std::fs::write(upper.join("k1/ext/model.so"), "forged").unwrap();
        assert_eq!(cow_tainted(upper), Some(upper.join("k1/ext/model.so")));
        std::fs::remove_file(upper.join("k1/ext/model.so")).unwrap();
        std::fs::write(upper.join("k1/ext/load.log"), "x").unwrap();
        assert!(
            cow_tainted(upper).is_some(),
            "load.log only at a build's top"
        );
    }
}
