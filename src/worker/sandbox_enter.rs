//! Entering the namespaces sandbox: the code that runs in the spawned worker between `fork` and
//! `exec` (the `pre_exec` hook), and the supervisor that stays outside the new PID namespace.
//!
//! [`Prepared`] holds what [`SandboxSpec::prepare`](super::sandbox::SandboxSpec::prepare) built before
//! the fork (C strings, the ordered mount operations); [`Prepared::enter`] unshares the namespaces,
//! writes the id maps, makes the file system read-only, hides, binds and
//! overlays, forks PID 1 and leaves the first process supervising it. Only async-signal-safe raw
//! system calls on that prepared data, never an allocation; a failing step writes one line naming
//! itself and the errno to fd 2 (the worker log). What the sandbox confines, and why, is
//! `sandbox`'s module doc.

use std::ffi::CString;
use std::io;

// Kernel ABI constants that `libc` does not export for every target (linux/mount.h).
const OPEN_TREE_CLONE: libc::c_uint = 1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOUNT_ATTR_RDONLY: u64 = 0x1;

/// `struct mount_attr` (linux/mount.h).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// One mount operation of the hook, in the order [`Prepared`] keeps them.
pub(super) enum Op {
    /// Empty tmpfs over `path` (`options`: its mode).
    Hide {
        path: CString,
        parents: Vec<CString>,
        options: CString,
    },
    /// A clone of `path` taken before anything was covered, put back in place.
    Bind {
        path: CString,
        parents: Vec<CString>,
        read_only: bool,
    },
}

impl Op {
    #[cfg(test)]
    pub(super) fn path(&self) -> &CString {
        match self {
            Op::Hide { path, .. } | Op::Bind { path, .. } => path,
        }
    }
}

/// A [`SandboxSpec`](super::sandbox::SandboxSpec) turned into C strings, ready for the `pre_exec` hook.
pub struct Prepared {
    pub(super) uid_map: CString,
    pub(super) gid_map: CString,
    pub(super) ops: Vec<Op>,
    /// One fd per op (binds only), filled in the child.
    pub(super) fds: Vec<libc::c_int>,
    pub(super) overlays: Vec<(CString, CString)>,
    pub(super) cwd: CString,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("ops", &self.ops.len())
            .field("overlays", &self.overlays.len())
            .finish()
    }
}

/// Write `krefine sandbox: <step> failed (errno N)` to fd 2 and return the error. Signal-safe.
fn fail(step: &[u8]) -> io::Error {
    let err = io::Error::last_os_error();
    let errno = err.raw_os_error().unwrap_or(0);
    let mut buf = [0u8; 160];
    let mut n = 0;
    for part in [b"krefine sandbox: ".as_slice(), step, b" failed (errno "] {
        for &b in part {
            if n < buf.len() {
                buf[n] = b;
                n += 1;
            }
        }
    }
    let mut digits = [0u8; 12];
    let mut d = 0;
    let mut v = errno.unsigned_abs();
    loop {
        digits[d] = b'0' + (v % 10) as u8;
        d += 1;
        v /= 10;
        if v == 0 || d == digits.len() {
            break;
        }
    }
    while d > 0 && n < buf.len() {
        d -= 1;
        buf[n] = digits[d];
        n += 1;
    }
    for &b in b")\n" {
        if n < buf.len() {
            buf[n] = b;
            n += 1;
        }
    }
    // SAFETY: write(2) on a stack buffer; a failure to log is not worth more than the error itself.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), n);
    }
    err
}

fn check(r: libc::c_long, step: &[u8]) -> io::Result<()> {
    if r < 0 { Err(fail(step)) } else { Ok(()) }
}

/// Write a whole small buffer to a /proc file. Signal-safe.
fn write_proc(path: &[u8], data: &[u8], step: &[u8]) -> io::Result<()> {
    // SAFETY: `path` is NUL-terminated by the caller; open/write/close on our own buffers.
    unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(fail(step));
        }
        let w = libc::write(fd, data.as_ptr().cast(), data.len());
        let saved = if w < 0 { Some(fail(step)) } else { None };
        libc::close(fd);
        match saved {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Prepared {
    /// Enter the sandbox. Runs in the forked child before `exec`: only system calls on data prepared
    /// before the fork. Returns in the new PID 1 (which then `exec`s); the first process never
    /// returns from here, it supervises PID 1 and exits with its status.
    ///
    /// # Safety
    /// Call only between `fork` and `exec` (a `pre_exec` hook).
    pub unsafe fn enter(&mut self) -> io::Result<()> {
        // SAFETY: this function's own contract (between fork and exec); each step makes raw system
        // calls on data prepared before the fork, in this order.
        unsafe {
            self.enter_namespaces()?;
            self.make_view()?;
            self.cover_and_bind_back()?;
            self.become_pid1()
        }
    }

    /// New user, mount, PID, network, IPC and UTS namespaces, mapped to the caller's ids; mounts private.
    ///
    /// # Safety
    /// Call only between `fork` and `exec`, in [`Self::enter`]'s order.
    unsafe fn enter_namespaces(&self) -> io::Result<()> {
        // SAFETY (whole body): raw system calls on C strings and plain structs owned by `self`.
        unsafe {
            let flags = libc::CLONE_NEWUSER
                | libc::CLONE_NEWNS
                | libc::CLONE_NEWPID
                | libc::CLONE_NEWNET
                | libc::CLONE_NEWIPC
                | libc::CLONE_NEWUTS;
            check(
                libc::unshare(flags) as libc::c_long,
                b"unshare(user, pid, net, mount, ipc, uts)",
            )?;
            // The orchestrator is non-dumpable, and so is this fork of it; /proc/self of a
            // non-dumpable process belongs to root, so a normal user could not write its own id
            // maps. Dumpable only while writing them: this process still holds a copy of the
            // orchestrator's memory (its environment included), which no one else may read.
            libc::prctl(libc::PR_SET_DUMPABLE, 1 as libc::c_ulong, 0, 0, 0);
            write_proc(
                b"/proc/self/setgroups\0",
                b"deny",
                b"writing /proc/self/setgroups",
            )?;
            write_proc(
                b"/proc/self/uid_map\0",
                self.uid_map.as_bytes(),
                b"writing /proc/self/uid_map",
            )?;
            write_proc(
                b"/proc/self/gid_map\0",
                self.gid_map.as_bytes(),
                b"writing /proc/self/gid_map",
            )?;
            libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0);
            check(
                libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) as libc::c_long,
                b"making mounts private",
            )?;
            Ok(())
        }
    }

    /// Clones of every folder that comes back (taken before anything is covered), then `/` read-only.
    ///
    /// # Safety
    /// Call only between `fork` and `exec`, in [`Self::enter`]'s order.
    unsafe fn make_view(&mut self) -> io::Result<()> {
        // SAFETY (whole body): raw system calls on C strings and plain structs owned by `self`.
        unsafe {
            let ro = MountAttr {
                attr_set: MOUNT_ATTR_RDONLY,
                attr_clr: 0,
                propagation: 0,
                userns_fd: 0,
            };
            // Clones of everything that comes back, taken before anything is covered or read-only.
            for (i, op) in self.ops.iter().enumerate() {
                if let Op::Bind {
                    path, read_only, ..
                } = op
                {
                    let fd = libc::syscall(
                        libc::SYS_open_tree,
                        libc::AT_FDCWD,
                        path.as_ptr(),
                        OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_RECURSIVE as libc::c_uint,
                    );
                    check(fd, b"open_tree (cloning a folder to bind)")?;
                    self.fds[i] = fd as libc::c_int;
                    if *read_only {
                        check(
                            libc::syscall(
                                libc::SYS_mount_setattr,
                                fd as libc::c_int,
                                c"".as_ptr(),
                                libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
                                &ro as *const MountAttr,
                                std::mem::size_of::<MountAttr>(),
                            ),
                            b"mount_setattr (read-only bind)",
                        )?;
                    }
                }
            }
            check(
                libc::syscall(
                    libc::SYS_mount_setattr,
                    libc::AT_FDCWD,
                    c"/".as_ptr(),
                    libc::AT_RECURSIVE,
                    &ro as *const MountAttr,
                    std::mem::size_of::<MountAttr>(),
                ),
                b"mount_setattr (making / read-only)",
            )?;
            Ok(())
        }
    }

    /// Hidden folders covered by empty tmpfs, the cloned folders bound back, the overlays mounted.
    ///
    /// # Safety
    /// Call only between `fork` and `exec`, in [`Self::enter`]'s order.
    unsafe fn cover_and_bind_back(&mut self) -> io::Result<()> {
        // SAFETY (whole body): raw system calls on C strings and plain structs owned by `self`.
        unsafe {
            for (i, op) in self.ops.iter().enumerate() {
                match op {
                    Op::Hide {
                        path,
                        parents,
                        options,
                    } => {
                        for p in parents {
                            libc::mkdir(p.as_ptr(), 0o755);
                        }
                        check(
                            libc::mount(
                                c"tmpfs".as_ptr(),
                                path.as_ptr(),
                                c"tmpfs".as_ptr(),
                                libc::MS_NOSUID | libc::MS_NODEV,
                                options.as_ptr().cast(),
                            ) as libc::c_long,
                            b"mounting a tmpfs over a hidden folder",
                        )?;
                    }
                    Op::Bind { path, parents, .. } => {
                        for p in parents {
                            libc::mkdir(p.as_ptr(), 0o755);
                        }
                        check(
                            libc::syscall(
                                libc::SYS_move_mount,
                                self.fds[i],
                                c"".as_ptr(),
                                libc::AT_FDCWD,
                                path.as_ptr(),
                                MOVE_MOUNT_F_EMPTY_PATH,
                            ),
                            b"move_mount (binding a folder back)",
                        )?;
                        libc::close(self.fds[i]);
                        self.fds[i] = -1;
                    }
                }
            }
            for (target, options) in &self.overlays {
                check(
                    libc::mount(
                        c"overlay".as_ptr(),
                        target.as_ptr(),
                        c"overlay".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV,
                        options.as_ptr().cast(),
                    ) as libc::c_long,
                    b"mounting the copy-on-write overlay",
                )?;
            }
            Ok(())
        }
    }

    /// Fork into the new PID namespace (the first process supervises and never returns), then, as its
    /// PID 1: a fresh /proc, the working folder, no new privileges.
    ///
    /// # Safety
    /// Call only between `fork` and `exec`, in [`Self::enter`]'s order.
    unsafe fn become_pid1(&self) -> io::Result<()> {
        // SAFETY (whole body): raw system calls on C strings and plain structs owned by `self`.
        unsafe {
            let child = libc::fork();
            if child < 0 {
                return Err(fail(b"fork (into the new PID namespace)"));
            }
            if child > 0 {
                supervise(child);
            }
            // PID 1 of the new namespace.
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            );
            check(
                libc::mount(
                    c"proc".as_ptr(),
                    c"/proc".as_ptr(),
                    c"proc".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    std::ptr::null(),
                ) as libc::c_long,
                b"mounting /proc for the new PID namespace",
            )?;
            check(
                libc::chdir(self.cwd.as_ptr()) as libc::c_long,
                b"entering the working folder",
            )?;
            check(
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) as libc::c_long,
                b"prctl(PR_SET_NO_NEW_PRIVS)",
            )?;
            Ok(())
        }
    }
}

/// The first process: keep no fd that matters (protocol pipes, std's exec-error pipe), wait for PID 1
/// and leave with its status. Never returns.
unsafe fn supervise(child: libc::pid_t) -> ! {
    // SAFETY: plain system calls; `status` is a local.
    unsafe {
        libc::close(0);
        libc::close(1);
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            u32::MAX,
            0 as libc::c_uint,
        );
        let mut status: libc::c_int = 0;
        loop {
            let r = libc::waitpid(child, &mut status, 0);
            if r == child {
                break;
            }
            if r < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(127);
            }
        }
        // PID 1 cannot kill itself with its own signal (the kernel protects a namespace's init), so
        // the harness exits with 128 + signal to say "die of this signal" (a worker ending the way
        // its candidate process ended).
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            0
        };
        if libc::WIFEXITED(status) && !(129..128 + 32).contains(&code) {
            libc::_exit(code);
        }
        if libc::WIFSIGNALED(status) || libc::WIFEXITED(status) {
            let sig = if libc::WIFSIGNALED(status) {
                libc::WTERMSIG(status)
            } else {
                code - 128
            };
            // Die of the same signal, so the orchestrator sees what happened to the worker.
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(127)
    }
}
