//! `krefine bench tui`: how long the terminal UI takes to fold a big run's log and to draw a frame
//! of it (main view and a task's detail), against ratatui's in-memory backend.

use std::collections::BTreeMap;
use std::time::Instant;

use ratatui::Terminal;
use ratatui::backend::TestBackend;

use crate::tui::app::{App, Meta, Mode};
use crate::tui::ui;
use crate::types::{
    CompileOutcome, CompileStatus, Event, ExecOutcome, FeedbackMode, LlmAnswer, LogRecord,
    MethodKind, ProblemKey, SCHEMA_VERSION, TaskId, Usage, Verdict,
};

/// A refine run of `tasks` tasks and `turns` turns, caught with task `i` having finished
/// `i % (turns + 1)` turns (so every stage and turn count is on screen), answers of ~4 KB.
pub fn synthetic_log(tasks: u32, turns: u32) -> Vec<LogRecord> {
    let ids: Vec<TaskId> = (0..tasks)
        .map(|i| TaskId {
            problem: ProblemKey {
                level: 1 + i % 3,
                problem_id: i + 1,
            },
            sample: 0,
        })
        .collect();
    let mut out = Vec::new();
    let mut push = |task: Option<TaskId>, event: Event| {
        let seq = out.len() as u64;
        out.push(LogRecord {
            v: SCHEMA_VERSION,
            seq,
            ts_ms: 1_700_000_000_000 + seq * 50,
            task,
            event,
        });
    };
    push(
        None,
        Event::RunStarted {
            run: "bench".into(),
            method: MethodKind::Refine,
            feedback: Some(FeedbackMode::GE),
            task_ids: ids.clone(),
            turns,
            samples: 1,
            krefine_version: env!("CARGO_PKG_VERSION").into(),
            resumed: false,
            simulated: true,
            problem_names: ids
                .iter()
                .map(|t| {
                    (
                        t.problem,
                        format!("{}_Problem_{}.py", t.problem.problem_id, t.problem.level),
                    )
                })
                .collect::<BTreeMap<_, _>>(),
        },
    );
    let code = "x = 1\n".repeat(700);
    for turn in 1..=turns {
        for (i, &t) in ids.iter().enumerate() {
            if (i as u32) % (turns + 1) < turn {
                continue;
            }
            push(
                Some(t),
                Event::LlmStarted {
                    turn,
                    prompt_file: None,
                },
            );
            push(
                Some(t),
                Event::LlmAnswered {
                    turn,
                    answer: LlmAnswer {
                        content: code.clone(),
                        usage: Some(Usage {
                            prompt_tokens: 3000,
                            completion_tokens: 1000,
                            reasoning_tokens: 0,
                        }),
                        cost_usd: Some(0.01),
                        model: "bench".into(),
                        finish_reason: None,
                        latency_ms: 1000,
                        attempts: 1,
                    },
                    code: Some(code.clone()),
                    code_file: None,
                },
            );
            push(
                Some(t),
                Event::Compiled {
                    turn,
                    outcome: CompileOutcome {
                        ran_on: None,
                        worker_losses: Vec::new(),
                        status: CompileStatus::Ok,
                        cached: false,
                        error_name: None,
                        error: None,
                        feedback: String::new(),
                        log_path: None,
                        build_dir: None,
                        duration_ms: 30_000,
                        findings: Vec::new(),
                        build_path: None,
                        cpu: None,
                    },
                },
            );
            let device = format!("cuda:{}", i % 8);
            push(
                Some(t),
                Event::LeaseGranted {
                    device: device.clone(),
                    wait_ms: 0,
                    turn,
                },
            );
            push(
                Some(t),
                Event::LeaseReleased {
                    device: device.clone(),
                    held_ms: 3000,
                    busy_ms: 2500,
                    turn,
                },
            );
            let mut o = ExecOutcome::failure(Verdict::Incorrect, &device, "mismatch".into(), 3000);
            if !(i as u32 + turn).is_multiple_of(3) {
                o.verdict = Verdict::Correct;
                o.correctness = true;
                o.speedup = Some(0.5 + ((i as u32 * 7 + turn) % 10) as f64 / 4.0);
            }
            push(Some(t), Event::Executed { turn, outcome: o });
        }
    }
    out
}

/// Fold and draw timings as a text report.
pub fn run(tasks: u32, turns: u32, width: u16, height: u16, frames: u32) -> anyhow::Result<String> {
    let records = synthetic_log(tasks, turns);
    let mut app = App::new(Mode::Watch, Meta::default());
    let t0 = Instant::now();
    for r in &records {
        app.apply(r);
    }
    app.before_draw();
    let fold = t0.elapsed();
    let now = records.last().map_or(0, |r| r.ts_ms);
    let mut term = Terminal::new(TestBackend::new(width, height))?;
    let mut time = |app: &App| -> anyhow::Result<(f64, f64)> {
        let mut samples = Vec::with_capacity(frames as usize);
        for _ in 0..frames.max(1) {
            let t = Instant::now();
            term.draw(|f| ui::draw(f, app, now))?;
            samples.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let mean = samples.iter().sum::<f64>() / samples.len() as f64;
        let max = samples.iter().copied().fold(0.0, f64::max);
        Ok((mean, max))
    };
    let (main_mean, main_max) = time(&app)?;
    app.handle_key(ratatui::crossterm::event::KeyEvent::from(
        ratatui::crossterm::event::KeyCode::End,
    ));
    app.handle_key(ratatui::crossterm::event::KeyEvent::from(
        ratatui::crossterm::event::KeyCode::Enter,
    ));
    app.before_draw();
    let (detail_mean, detail_max) = time(&app)?;
    Ok(format!(
        "tui: {tasks} tasks x {turns} turns, {} records, {width}x{height} terminal (in-memory backend)\n\
         fold     {:.1} ms ({:.2} us a record)\n\
         main     {main_mean:.2} ms a frame (max {main_max:.2}) over {frames} frames\n\
         detail   {detail_mean:.2} ms a frame (max {detail_max:.2}) over {frames} frames",
        records.len(),
        fold.as_secs_f64() * 1000.0,
        fold.as_secs_f64() * 1e6 / records.len().max(1) as f64,
    ))
}
