//! End to end, as a person uses it: the real binary in tmux (`send-keys`, `capture-pane`) against the
//! quickstart with the simulated executor — a live run, `watch` from a second session, then `replay`
//! with Enter into a detail view and `q` out. Skipped (with a note) where tmux is not installed; CI
//! installs it (`.ci/run`).

mod cli_support;

use std::path::Path;

use cli_support::tmux::Tmux;

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
