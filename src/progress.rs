//! Progress for runs without the terminal UI (`--no-tui`, a stdout that is not a terminal, a
//! process not in the terminal's foreground): on a terminal, one indicatif bar over all turns of all
//! tasks with the stages tasks are in and the running tally of outcomes; when stderr is not a
//! terminal (a log file, a pipe, a batch job), plain lines instead: one per finished turn, and a
//! status line at least every [`DEFAULT_INTERVAL`] (`KREFINE_PROGRESS_INTERVAL_S` sets another), so
//! a headless run is never silent for long.
//!
//! The numbers come from [`RunView`], the same fold of the log the terminal UI draws, so the bar, the
//! lines and the UI cannot disagree; when the broadcast lags, the view is rebuilt from the log file.
//! The lines are pure functions of the view and the clock they are given ([`turn_line`],
//! [`status_line`]).

use std::io::Write;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::types::{LogRecord, TaskId};
use crate::view::source::{Feed, Live};
use crate::view::{RunView, Stage};

/// The longest a headless run goes without a progress line.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// An indicatif bar redrawn in place (stderr is a terminal).
    Bar,
    /// One line per finished turn and a status line at least every `interval`.
    Lines { interval: Duration },
}

impl Style {
    /// The bar when stderr is a terminal, lines otherwise (interval from
    /// `KREFINE_PROGRESS_INTERVAL_S`, else [`DEFAULT_INTERVAL`]).
    pub fn for_stderr() -> Style {
        use std::io::IsTerminal;
        if std::io::stderr().is_terminal() {
            return Style::Bar;
        }
        let interval = std::env::var("KREFINE_PROGRESS_INTERVAL_S")
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(DEFAULT_INTERVAL, Duration::from_secs_f64);
        Style::Lines { interval }
    }
}

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

/// `[mm:ss]` (hours when it gets there) of `elapsed`.
fn clock(elapsed: Duration) -> String {
    let s = elapsed.as_secs();
    if s >= 3600 {
        format!("[{}:{:02}:{:02}]", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("[{:02}:{:02}]", s / 60, s % 60)
    }
}

/// The line for `task`'s latest finished turn: `[01:12] 1/19/0 turn 2/3: correct 1.35x | 5/12 turns`.
pub fn turn_line(view: &RunView, task: TaskId, elapsed: Duration) -> Option<String> {
    let t = view.tasks.get(&task)?;
    let last = t.turns().iter().rev().find(|r| r.verdict.is_some())?;
    let verdict = last.verdict?;
    let speedup = last
        .correct_speedup()
        .map(|s| format!(" {s:.2}x"))
        .unwrap_or_default();
    let name = view
        .problem_name(task.problem)
        .map(|n| format!(" {n}"))
        .unwrap_or_default();
    Some(format!(
        "{} {task}{name} turn {}/{}: {verdict}{speedup} | {}/{} turns",
        clock(elapsed),
        last.turn,
        t.max_turns,
        view.finished_turns(),
        view.planned_turns()
    ))
}

/// The periodic line: `[05:00] 5/12 turns | llm 2 · compile 1 · execute 0 | correct 3 · ...`;
/// `planned` counts the turns until the log says how many (its first record).
pub fn status_line(view: &RunView, planned: u64, elapsed: Duration) -> String {
    format!(
        "{} {}/{} turns | {}",
        clock(elapsed),
        view.finished_turns(),
        view.planned_turns().max(planned),
        message(view)
    )
}

/// Follow the run until it ends, showing progress on stderr in `style`. `view` holds what the log
/// had before this process continued it (empty for a new run).
pub async fn follow(live: Live, total_turns: u64, view: RunView, style: Style) {
    match style {
        Style::Bar => follow_bar(live, total_turns, view).await,
        Style::Lines { interval } => {
            let mut err = std::io::stderr();
            follow_lines(live, view, total_turns, interval, &mut err).await
        }
    }
}

async fn follow_bar(mut live: Live, total_turns: u64, mut view: RunView) {
    let bar = ProgressBar::with_draw_target(Some(total_turns), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} turns  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_position(view.finished_turns());
    bar.set_message(message(&view));
    while let Some(feed) = live.next().await {
        let ended = match feed {
            Feed::Records(recs) => apply_all(&mut view, &recs, |_, _| {}),
            Feed::Rebuilt(v) => {
                view = *v;
                false
            }
            Feed::Warning(_) => false,
            Feed::Closed => break,
        };
        bar.set_position(view.finished_turns());
        bar.set_message(message(&view));
        if ended {
            break;
        }
    }
    bar.finish_and_clear();
}

/// Apply `recs`, calling `finished(view, task)` for each record that finished a task's turn.
/// Returns whether the run's end was among them.
fn apply_all(
    view: &mut RunView,
    recs: &[std::sync::Arc<LogRecord>],
    mut finished: impl FnMut(&RunView, TaskId),
) -> bool {
    let mut ended = false;
    for r in recs {
        let before = r
            .task
            .and_then(|t| view.tasks.get(&t))
            .map_or(0, |t| t.finished_turns());
        view.apply(r);
        ended |= matches!(r.event, crate::types::Event::RunEnded { .. });
        if let Some(task) = r.task
            && view.tasks.get(&task).map_or(0, |t| t.finished_turns()) > before
        {
            finished(view, task);
        }
    }
    ended
}

/// The line mode of [`follow`], writing to `out` (stderr; a buffer in tests).
pub async fn follow_lines(
    mut live: Live,
    mut view: RunView,
    total_turns: u64,
    interval: Duration,
    out: &mut (dyn Write + Send),
) {
    let started = Instant::now();
    let say = |out: &mut (dyn Write + Send), line: String| {
        // Progress is best effort: a closed stderr must not stop the run.
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    say(out, status_line(&view, total_turns, started.elapsed()));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let feed = tokio::select! {
            f = live.next() => f,
            _ = tick.tick() => {
                say(out, status_line(&view, total_turns, started.elapsed()));
                continue;
            }
        };
        let ended = match feed {
            Some(Feed::Records(recs)) => {
                let mut lines = Vec::new();
                let ended = apply_all(&mut view, &recs, |v, task| {
                    lines.extend(turn_line(v, task, started.elapsed()));
                });
                for l in lines {
                    say(out, l);
                }
                ended
            }
            Some(Feed::Rebuilt(v)) => {
                view = *v;
                false
            }
            Some(Feed::Warning(w)) => {
                say(out, format!("warning: {w}"));
                false
            }
            Some(Feed::Closed) | None => true,
        };
        if ended {
            break;
        }
    }
    say(out, status_line(&view, total_turns, started.elapsed()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture_view(lines: usize) -> (RunView, Vec<LogRecord>) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/runs/quickstart-sim/events.jsonl");
        let records = crate::store::read_log(&path).unwrap().records;
        let view = RunView::from_records(&records[..lines.min(records.len())]);
        (view, records)
    }

    #[test]
    fn a_finished_turn_and_the_status_read_as_lines() {
        let (mut view, records) = fixture_view(0);
        let mut said = Vec::new();
        for r in &records {
            let rec = std::sync::Arc::new(r.clone());
            apply_all(&mut view, &[rec], |v, task| {
                said.push(turn_line(v, task, Duration::from_secs(72)).unwrap());
            });
        }
        // One line per finished turn of every task.
        assert_eq!(said.len() as u64, view.finished_turns());
        assert!(said[0].starts_with("[01:12] 1/"), "{}", said[0]);
        assert!(said[0].contains(" turn 1/3: "), "{}", said[0]);
        assert!(
            said.iter()
                .any(|l| l.contains("correct ") && l.contains('x')),
            "{said:?}"
        );
        let last = said.last().unwrap();
        let total = view.planned_turns();
        assert!(
            last.ends_with(&format!("| {total}/{total} turns")),
            "{last}"
        );
        let status = status_line(&view, 0, Duration::from_secs(3725));
        assert_eq!(
            status_line(&RunView::new(), 12, Duration::ZERO),
            "[00:00] 0/12 turns | llm 0 · compile 0 · execute 0 | correct 0 · failed 0 | 0 tokens"
        );
        assert!(
            status.starts_with(&format!("[1:02:05] {total}/{total} turns | llm 0")),
            "{status}"
        );
    }
}
