//! Progress display for `--no-tui` runs (and runs whose stdout is not a terminal): one indicatif bar
//! over all turns of all tasks, with the stages tasks are in and the running tally of outcomes.
//!
//! The numbers come from [`RunView`], the same fold of the log the terminal UI draws, so the bar and
//! the UI cannot disagree; when the broadcast lags, the view is rebuilt from the log file.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::view::source::{Feed, Live};
use crate::view::{RunView, Stage};

/// The text next to the bar.
pub fn message(view: &RunView) -> String {
    let stages = view.stage_counts();
    let count = |s: Stage| stages.get(&s).copied().unwrap_or(0);
    let (correct, failed) = view.verdict_tally();
    format!(
        "llm {} · compile {} · execute {} | correct {correct} · failed {failed} | {} tokens",
        count(Stage::Generate),
        count(Stage::Compile),
        count(Stage::Execute) + count(Stage::Profile),
        view.spend.tokens()
    )
}

/// Follow the run until it ends, drawing progress on stderr. `view` holds what the log had before
/// this process continued it (empty for a new run).
pub async fn follow(mut live: Live, total_turns: u64, mut view: RunView) {
    let bar = ProgressBar::with_draw_target(Some(total_turns), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} turns  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_position(view.finished_turns());
    bar.set_message(message(&view));
    while let Some(feed) = live.next().await {
        let mut ended = false;
        match feed {
            Feed::Records(recs) => {
                for r in recs {
                    view.apply(&r);
                    ended |= matches!(r.event, crate::types::Event::RunEnded { .. });
                }
            }
            Feed::Rebuilt(v) => view = *v,
            Feed::Warning(_) => {}
            Feed::Closed => break,
        }
        bar.set_position(view.finished_turns());
        bar.set_message(message(&view));
        if ended {
            break;
        }
    }
    bar.finish_and_clear();
}
