//! End to end, as a person uses it: the real binary in tmux (`send-keys`, `capture-pane`) against the
//! quickstart with the simulated executor — a live run, `watch` from a second session, then `replay`
//! with Enter into a detail view and `q` out. Skipped (with a note) where tmux is not installed; CI
//! installs it (`.ci/run`).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

struct Tmux {
    socket: String,
}

impl Tmux {
    fn new() -> Option<Tmux> {
        let ok = Command::new("tmux")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
        ok.then(|| Tmux {
            socket: format!("krefine-test-{}", std::process::id()),
        })
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A session running `cmd` in a 120x36 terminal; the shell stays to show the exit status.
    fn start(&self, name: &str, cmd: &str) {
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

    fn capture(&self, name: &str) -> String {
        self.run(&["capture-pane", "-p", "-t", name])
    }

    fn keys(&self, name: &str, keys: &[&str]) {
        for k in keys {
            self.run(&["send-keys", "-t", name, k]);
            // One key a frame, as a person types.
            std::thread::sleep(Duration::from_millis(150));
        }
    }

    /// Wait (polling) until the screen of `name` shows every one of `parts`.
    fn wait_for(&self, name: &str, parts: &[&str]) -> String {
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

fn quote(p: &Path) -> String {
    format!("'{}'", p.display())
}

#[test]
fn live_watch_and_replay_in_tmux() {
    let Some(tmux) = Tmux::new() else {
        eprintln!("tmux is not installed: skipping the terminal end-to-end test");
        return;
    };
    let bin = env!("CARGO_BIN_EXE_krefine");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    // Simulated evaluation, slowed so the run is still going when `watch` attaches.
    tmux.start(
        "live",
        &format!(
            "{bin} run configs/quickstart.toml --out {} --set eval.executor=simulated --set eval.simulated.time_scale=0.25",
            quote(&out)
        ),
    );
    tmux.wait_for("live", &["krefine quickstart", "Tasks 4/4", "1_Vector_add"]);

    tmux.start("watch", &format!("{bin} watch {}", quote(&out)));
    tmux.wait_for("watch", &["krefine quickstart", "4_Row_sum"]);

    // Both sessions see the run finish, with the same tally.
    let live = tmux.wait_for("live", &["finished", "turns 12/12 (11 correct, 1 failed)"]);
    assert!(live.contains("fast_p 0:100.0%"), "{live}");
    tmux.wait_for("watch", &["finished", "turns 12/12 (11 correct, 1 failed)"]);

    // q leaves the finished run: the report follows, and the run's status.
    tmux.keys("live", &["q"]);
    let after = tmux.wait_for("live", &["EXIT=0"]);
    assert!(after.contains("4 of 4 task(s) finished"), "{after}");
    assert!(
        after.contains("quickstart (refine, feedback G+E+P"),
        "{after}"
    );
    tmux.keys("watch", &["q"]);
    tmux.wait_for("watch", &["EXIT=0"]);

    // Replay at a speed that shows the end at once; open 1/2/0 and its first turn.
    tmux.start(
        "replay",
        &format!("{bin} replay {} --speed 100000", quote(&out)),
    );
    tmux.wait_for("replay", &["replay playing", "turns 12/12"]);
    tmux.keys("replay", &["Down", "Enter"]);
    tmux.wait_for("replay", &["1/2/0 2_ReLU.py · turn 3/3", "── Prompt"]);
    tmux.keys("replay", &["Left", "Left"]);
    tmux.keys("replay", &["End"]);
    let detail = tmux.wait_for(
        "replay",
        &["Feedback for turn 2, mode G+E+P", "[execution]"],
    );
    assert!(detail.contains("turn 1/3"), "{detail}");
    // q goes back to the table first, then quits.
    tmux.keys("replay", &["q"]);
    tmux.wait_for("replay", &["Tasks 4/4"]);
    tmux.keys("replay", &["q"]);
    tmux.wait_for("replay", &["EXIT=0"]);
}
