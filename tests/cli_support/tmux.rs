//! A private tmux server for the tests that drive the binary in a real terminal (`send-keys`,
//! `capture-pane`).

use std::process::Command;
use std::time::{Duration, Instant};

pub struct Tmux {
    socket: String,
}

impl Tmux {
    /// `None` where tmux is not installed.
    pub fn new() -> Option<Tmux> {
        let ok = Command::new("tmux")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
        // One server per Tmux, so that tests of one binary running side by side never share one.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        ok.then(|| Tmux {
            socket: format!("krefine-test-{}-{n}", std::process::id()),
        })
    }

    pub fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A session running `cmd` in a 120x36 terminal; the shell stays to show the exit status.
    pub fn start(&self, name: &str, cmd: &str) {
        let script = format!("{cmd}; echo EXIT=$?; sleep 120");
        self.run(&[
            "new-session",
            "-d",
            "-s",
            name,
            "-x",
            "120",
            "-y",
            "36",
            &script,
        ]);
    }

    pub fn capture(&self, name: &str) -> String {
        self.run(&["capture-pane", "-p", "-t", name])
    }

    pub fn keys(&self, name: &str, keys: &[&str]) {
        for k in keys {
            self.run(&["send-keys", "-t", name, k]);
            // One key a frame, as a person types.
            std::thread::sleep(Duration::from_millis(150));
        }
    }

    /// Wait (polling) until the screen of `name` shows every one of `parts`.
    pub fn wait_for(&self, name: &str, parts: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let screen = self.capture(name);
            if parts.iter().all(|p| screen.contains(p)) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "session {name} never showed {parts:?}; it shows:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        // Only this test's own server (its private socket).
        self.run(&["kill-server"]);
    }
}
