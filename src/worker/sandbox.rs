//! Confining worker processes (the namespaces layer of the sandbox, README "Threat model").
//!
//! Every worker that imports, builds or runs candidate code starts inside fresh user, PID, network,
//! mount, IPC and UTS namespaces, set up between `fork` and `exec` (a `pre_exec` hook) with the
//! kernel's own system calls:
//!
//! - **PID**: the worker is PID 1 of its own namespace and sees no other process, so it can neither
//!   read another process's `/proc/*/environ` nor signal the orchestrator.
//! - **network**: a namespace with only a loopback device, left down: no connection anywhere.
//! - **mount**: the whole file system is made read-only (recursively), then
//!   - `hidden` folders (the user's home, `/tmp`, `/dev/shm`, the workers' scratch root) are covered
//!     by empty private tmpfs,
//!   - `writable` folders (the worker's own scratch) are bound back read-write,
//!   - `visible` folders that lie under a hidden one (the Python install, the harness) are bound back
//!     read-only,
//!   - `overlays` (the build cache) show their content copy-on-write: writes land in the worker's
//!     scratch, never in the shared folder;
//!
//!   and a fresh `/proc` for the new PID namespace is mounted.
//! - **user**: the namespace that makes all this possible without privileges. The worker runs as a
//!   non-root user inside it (its own uid, or 1000 when krefine runs as root), so after `exec` it holds
//!   no capabilities and cannot undo a mount; `no_new_privs` is set as well.
//!
//! A PID namespace applies to the children of the process that creates it, so the spawned process
//! forks once more: the first process (the one the orchestrator spawned: its pid, session and process
//! group are what `kill_group` uses) stays outside as a small supervisor that waits for its child and
//! exits with the same status (re-raising a fatal signal), and the child, PID 1 inside, `exec`s the
//! worker with the protocol pipes on fds 0/1 unchanged. Killing the process group kills both; when PID
//! 1 dies the kernel kills everything else in the namespace, so nothing a candidate started survives
//! its worker.
//!
//! Everything the hook needs is prepared before `fork` ([`Prepared`]): between `fork` and `exec` of a
//! multi-threaded program only async-signal-safe calls are allowed, so the hook makes raw system calls
//! on pre-built C strings and never allocates. (That is also why this uses `libc` directly rather than
//! a wrapper crate whose path arguments may allocate.) A failing step writes one line naming itself and
//! the errno to fd 2, which is the worker log.
//!
//! This file owns the spec and its preparation, the probe and the diagnostics; the hook itself
//! (entering the namespaces, the mounts, the supervisor) is `sandbox_enter`.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::sandbox_enter::Op;
pub use super::sandbox_enter::Prepared;

/// What `eval.sandbox` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxMode {
    /// The strongest sandbox this machine allows; without one, run unconfined and say so.
    #[default]
    Auto,
    /// Refuse to evaluate without the namespaces sandbox.
    Required,
    /// No sandbox (explicit).
    Off,
}

impl SandboxMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::Auto => "auto",
            SandboxMode::Required => "required",
            SandboxMode::Off => "off",
        }
    }
}

/// What a worker actually runs in; recorded in every result's `env.sandbox`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxLevel {
    /// user + PID + network + mount + IPC namespaces, read-only file system view.
    Namespaces,
    /// `eval.sandbox = "off"`.
    Off,
    /// `auto` on a machine that does not allow it; the reason says why.
    Unavailable(String),
}

impl SandboxLevel {
    /// The short name results record.
    pub fn as_str(&self) -> &'static str {
        match self {
            SandboxLevel::Namespaces => "namespaces",
            SandboxLevel::Off => "off",
            SandboxLevel::Unavailable(_) => "none",
        }
    }

    pub fn is_confined(&self) -> bool {
        matches!(self, SandboxLevel::Namespaces)
    }
}

/// A copy-on-write view of `target`: its content stays visible, writes land in `upper` (with `work`,
/// overlayfs's work folder, on the same file system).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlay {
    pub target: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
}

/// The file system view of one worker. Paths must be absolute; those that do not exist are skipped
/// (a missing home, no `/dev/shm`), except `writable` and overlay paths, which must exist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxSpec {
    /// Bound back read-write over the read-only view.
    pub writable: Vec<PathBuf>,
    /// Kept readable where they lie under a hidden folder.
    pub visible: Vec<PathBuf>,
    /// Covered by an empty private tmpfs.
    pub hidden: Vec<PathBuf>,
    pub overlays: Vec<Overlay>,
    /// Working directory of the worker (re-entered after the mounts changed under it).
    pub cwd: PathBuf,
}

impl SandboxSpec {
    /// The folders every worker hides: the user's home, `/tmp`, `/var/tmp`, `/dev/shm` and the
    /// per-user runtime folders (sockets of agents and session buses).
    pub fn default_hidden() -> Vec<PathBuf> {
        let mut hidden: Vec<PathBuf> = ["/tmp", "/var/tmp", "/dev/shm", "/run/user"]
            .iter()
            .map(PathBuf::from)
            .collect();
        if let Some(home) = std::env::var_os("HOME").map(PathBuf::from)
            && home.is_absolute()
            && home != Path::new("/")
        {
            hidden.push(home);
        }
        hidden
    }
}

/// Why the sandbox could not be set up.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct SandboxError(pub String);

fn cstr(p: &Path) -> Result<CString, SandboxError> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| SandboxError(format!("path {} contains a NUL byte", p.display())))
}

fn depth(p: &Path) -> usize {
    p.components().count()
}

fn under_any(p: &Path, dirs: &[PathBuf]) -> bool {
    dirs.iter().any(|d| p.starts_with(d))
}

impl SandboxSpec {
    /// Check the paths and build the C strings the hook uses.
    pub fn prepare(&self) -> Result<Prepared, SandboxError> {
        for p in self
            .writable
            .iter()
            .chain(&self.visible)
            .chain(&self.hidden)
            .chain(std::iter::once(&self.cwd))
        {
            if !p.is_absolute() {
                return Err(SandboxError(format!(
                    "sandbox path {} is not absolute",
                    p.display()
                )));
            }
        }
        for p in &self.writable {
            if !p.is_dir() {
                return Err(SandboxError(format!(
                    "writable folder {} does not exist",
                    p.display()
                )));
            }
        }
        // Hide only folders that exist and are not inside another hidden folder (already gone) —
        // unless a bind brings their parent back.
        let hidden: Vec<PathBuf> = self.hidden.iter().filter(|p| p.is_dir()).cloned().collect();
        let mut planned: Vec<(PathBuf, Op)> = Vec::new();
        for h in &hidden {
            let options = if ["/tmp", "/var/tmp", "/dev/shm"].contains(&h.to_str().unwrap_or("")) {
                "mode=1777"
            } else {
                "mode=0755"
            };
            planned.push((
                h.clone(),
                Op::Hide {
                    path: cstr(h)?,
                    parents: Vec::new(),
                    options: CString::new(options).map_err(|e| SandboxError(e.to_string()))?,
                },
            ));
        }
        for w in &self.writable {
            planned.push((
                w.clone(),
                Op::Bind {
                    path: cstr(w)?,
                    parents: Vec::new(),
                    read_only: false,
                },
            ));
        }
        let overlay_targets: Vec<PathBuf> =
            self.overlays.iter().map(|o| o.target.clone()).collect();
        for v in self.visible.iter().chain(&overlay_targets) {
            // Overlay targets are always bound (read-only) first: the overlay's lower layer must be
            // the real folder even where a hidden folder covers it.
            let needed = overlay_targets.contains(v) || under_any(v, &hidden);
            if needed && v.exists() && !planned.iter().any(|(p, _)| p == v) {
                planned.push((
                    v.clone(),
                    Op::Bind {
                        path: cstr(v)?,
                        parents: Vec::new(),
                        read_only: true,
                    },
                ));
            }
        }
        // Parents before children; at one depth, hide before bind.
        planned.sort_by_key(|(p, op)| (depth(p), matches!(op, Op::Bind { .. })));
        // Mount points under a tmpfs put there earlier must be created first.
        let covered: Vec<PathBuf> = planned.iter().map(|(p, _)| p.clone()).collect();
        let mut ops = Vec::with_capacity(planned.len());
        for (i, (path, mut op)) in planned.into_iter().enumerate() {
            let mut parents = Vec::new();
            if covered[..i]
                .iter()
                .any(|c| path.starts_with(c) && *c != path)
            {
                for a in path.ancestors().collect::<Vec<_>>().into_iter().rev() {
                    if a != Path::new("/") {
                        parents.push(cstr(a)?);
                    }
                }
            }
            match &mut op {
                Op::Hide { parents: p, .. } | Op::Bind { parents: p, .. } => *p = parents,
            }
            ops.push(op);
        }
        let mut overlays = Vec::new();
        for o in &self.overlays {
            for p in [&o.target, &o.upper, &o.work] {
                if !p.is_dir() {
                    return Err(SandboxError(format!(
                        "overlay folder {} does not exist",
                        p.display()
                    )));
                }
            }
            let bad = |p: &Path| {
                let s = p.as_os_str().as_bytes();
                s.contains(&b',') || s.contains(&b':')
            };
            if bad(&o.target) || bad(&o.upper) || bad(&o.work) {
                return Err(SandboxError(format!(
                    "overlay paths may not contain ',' or ':' ({})",
                    o.target.display()
                )));
            }
            let options = format!(
                "lowerdir={},upperdir={},workdir={},userxattr",
                o.target.display(),
                o.upper.display(),
                o.work.display()
            );
            overlays.push((
                cstr(&o.target)?,
                CString::new(options).map_err(|e| SandboxError(e.to_string()))?,
            ));
        }
        // SAFETY: getuid/getgid cannot fail and touch no memory.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        // Inside, never root: a process that is root in its user namespace could undo the mounts.
        let inside = |id: u32| if id == 0 { 1000 } else { id };
        let n = ops.len();
        Ok(Prepared {
            uid_map: CString::new(format!("{} {uid} 1\n", inside(uid)))
                .map_err(|e| SandboxError(e.to_string()))?,
            gid_map: CString::new(format!("{} {gid} 1\n", inside(gid)))
                .map_err(|e| SandboxError(e.to_string()))?,
            ops,
            fds: vec![-1; n],
            overlays,
            cwd: cstr(&self.cwd)?,
        })
    }
}

/// Start `python -S -c ...` in a minimal sandbox and check it runs as PID 1: whether this machine
/// allows the namespaces sandbox, and how long entering it takes (compared with no sandbox).
/// `overlay`, when given, is mounted too (and its folders bound writable), so the probe also tries
/// the file systems the workers will use. Blocking; call from `spawn_blocking` on a runtime.
pub fn probe(python: &Path, overlay: Option<Overlay>) -> Result<Duration, SandboxError> {
    let mut spec = SandboxSpec {
        writable: Vec::new(),
        visible: python_dirs(python),
        hidden: SandboxSpec::default_hidden(),
        overlays: Vec::new(),
        cwd: PathBuf::from("/"),
    };
    if let Some(o) = overlay {
        for d in [&o.upper, &o.work] {
            if let Some(parent) = d.parent()
                && !spec.writable.iter().any(|w| w == parent)
            {
                spec.writable.push(parent.to_path_buf());
            }
        }
        spec.overlays.push(o);
    }
    let started = Instant::now();
    let out = run_sandboxed(
        python,
        &spec,
        "import os, sys; sys.stdout.write(str(os.getpid()))",
    )
    .map_err(|e| SandboxError(format!("{e}{}", explain_unavailable())))?;
    let took = started.elapsed();
    if out.trim() != "1" {
        return Err(SandboxError(format!(
            "the sandboxed probe did not run as PID 1 of its own namespace (it printed {out:?})"
        )));
    }
    Ok(took)
}

/// Run `python -S -c code` inside `spec`, returning its stdout. Blocking.
pub fn run_sandboxed(python: &Path, spec: &SandboxSpec, code: &str) -> Result<String, String> {
    use std::os::unix::process::CommandExt;
    let mut prepared = spec.prepare().map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(python);
    cmd.args(["-S", "-c", code])
        .current_dir(&spec.cwd)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: `enter` makes only async-signal-safe system calls on data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || prepared.enter());
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot start {}: {e}", python.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if !out.status.success() {
        return Err(format!(
            "the sandboxed probe failed ({}): {}",
            out.status,
            if stderr.is_empty() {
                "no output"
            } else {
                &stderr
            }
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The folders a Python install lives in (the interpreter's own folder and, resolved, the one its
/// symlink points to; the `venv` prefix is the parent of `bin/`). Used as `visible` so an interpreter
/// under the user's home keeps working when the home is hidden.
pub fn python_dirs(python: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut add = |p: &Path| {
        // `<prefix>/bin/python` -> `<prefix>` (a venv's site-packages and pyvenv.cfg live there).
        let prefix = p.parent().and_then(|bin| {
            if bin.file_name().is_some_and(|n| n == "bin") {
                bin.parent()
            } else {
                Some(bin)
            }
        });
        if let Some(prefix) = prefix
            && prefix != Path::new("/")
            && prefix != Path::new("/usr")
            && !dirs.iter().any(|d: &PathBuf| d == prefix)
        {
            dirs.push(prefix.to_path_buf());
        }
    };
    add(python);
    if let Ok(real) = std::fs::canonicalize(python) {
        add(&real);
    }
    dirs
}

/// Why unprivileged user namespaces are unavailable here and what to enable, from the sysctls that
/// control them (empty when none of them is the cause).
pub fn explain_unavailable() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let mut why = Vec::new();
    if read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        why.push(
            "kernel.unprivileged_userns_clone = 0 (Debian kernels): enable with \
             `sysctl -w kernel.unprivileged_userns_clone=1`",
        );
    }
    if read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        why.push(
            "user.max_user_namespaces = 0: enable with `sysctl -w user.max_user_namespaces=15000`",
        );
    }
    if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
        why.push(
            "kernel.apparmor_restrict_unprivileged_userns = 1 (Ubuntu 23.10 and later): allow it with \
             `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`, or give the krefine binary an \
             AppArmor profile with `userns,`",
        );
    }
    if why.is_empty() {
        String::new()
    } else {
        format!(
            "\nuser namespaces are disabled on this machine: {}",
            why.join("; ")
        )
    }
}

/// The Landlock ABI version of this kernel (0: none), as the per-candidate layer in the harness
/// (`kb_sandbox.py`) will find it.
pub fn landlock_abi() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: a query: null attribute, size 0, the version flag.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    v.max(0)
}

/// Make this process non-dumpable, so processes of the same user cannot read its memory or its
/// `/proc/<pid>/environ` (where API keys live). Children get the default back at `exec`.
pub fn make_non_dumpable() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    let r = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_names() {
        assert_eq!(SandboxMode::default(), SandboxMode::Auto);
        assert_eq!(SandboxMode::Required.as_str(), "required");
        assert_eq!(SandboxLevel::Namespaces.as_str(), "namespaces");
        assert_eq!(SandboxLevel::Unavailable("x".into()).as_str(), "none");
    }

    #[test]
    fn python_dirs_of_a_venv() {
        let d = python_dirs(Path::new("/opt/torch/.venv/bin/python3"));
        assert_eq!(d[0], PathBuf::from("/opt/torch/.venv"));
    }

    #[test]
    fn relative_paths_are_refused() {
        let spec = SandboxSpec {
            writable: vec!["rel".into()],
            cwd: "/".into(),
            ..SandboxSpec::default()
        };
        assert!(spec.prepare().unwrap_err().0.contains("not absolute"));
    }

    #[test]
    fn ops_are_ordered_parents_first_with_mount_points() {
        let tmp = std::env::temp_dir().join(format!("krefine-sbx-unit-{}", std::process::id()));
        let scratch = tmp.join("scratch/w0");
        std::fs::create_dir_all(&scratch).unwrap();
        let spec = SandboxSpec {
            writable: vec![scratch.clone()],
            visible: Vec::new(),
            hidden: vec![tmp.join("scratch")],
            overlays: Vec::new(),
            cwd: scratch.clone(),
        };
        let p = spec.prepare().unwrap();
        let paths: Vec<String> = p
            .ops
            .iter()
            .map(|o| o.path().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            paths,
            vec![
                tmp.join("scratch").display().to_string(),
                scratch.display().to_string()
            ]
        );
        // The bind lies under the tmpfs: its mount point is created, from the top down.
        match &p.ops[1] {
            Op::Bind {
                parents, read_only, ..
            } => {
                assert!(!read_only);
                assert_eq!(
                    parents.last().unwrap().to_string_lossy(),
                    scratch.display().to_string()
                );
            }
            Op::Hide { .. } => panic!("expected a bind"),
        }
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
