//! The terminal UI and the view it draws: RunView folds (a constructed log and a recorded one), every
//! screen rendered with ratatui's TestBackend against insta snapshots (tiny and huge terminals too),
//! keys, `watch` following a growing file, and replay ordering and pacing (driven by an explicit
//! clock, never by sleeping).
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use krefine::store::read_log;
use krefine::tui::app::{Action, App, Meta, Mode, ReplayCmd, Screen, SortKey, StateFilter};
use krefine::tui::source::{MAX_GAP_MS, Replay, Tail};
use krefine::tui::{replay_cmd, ui};
use krefine::types::{
    ChatMessage, CompileOutcome, CompileStatus, Event, ExecOutcome, FeedbackMode, LlmAnswer,
    LogRecord, MethodKind, ProblemKey, ProfileOutcome, Role, SCHEMA_VERSION, TaskId, Usage,
    Verdict,
};
use krefine::view::{RunView, Stage};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

const T0: u64 = 1_700_000_000_000;

fn task(p: u32) -> TaskId {
    TaskId {
        problem: ProblemKey {
            level: 1,
            problem_id: p,
        },
        sample: 0,
    }
}

/// Builds a log record by record, 1 s apart.
struct LogBuilder {
    records: Vec<LogRecord>,
}

impl LogBuilder {
    fn push(&mut self, task: Option<TaskId>, event: Event) {
        let seq = self.records.len() as u64;
        self.records.push(LogRecord {
            v: SCHEMA_VERSION,
            seq,
            ts_ms: T0 + seq * 1000,
            task,
            event,
        });
    }

    fn answered(&mut self, t: TaskId, turn: u32, code: Option<&str>) {
        self.push(
            Some(t),
            Event::LlmStarted {
                turn,
                prompt_file: Some(prompt_rel(t, turn)),
            },
        );
        self.push(
            Some(t),
            Event::LlmAnswered {
                turn,
                answer: LlmAnswer {
                    content: format!(
                        "Turn {turn} answer.\n```python\n{}\n```",
                        code.unwrap_or("")
                    ),
                    usage: Some(Usage {
                        prompt_tokens: 1000,
                        completion_tokens: 200,
                        reasoning_tokens: 0,
                    }),
                    cost_usd: Some(0.01),
                    model: "gpt-test".into(),
                    finish_reason: Some("stop".into()),
                    latency_ms: 2500,
                    attempts: 1,
                },
                code: code.map(String::from),
                code_file: None,
            },
        );
    }

    fn compiled(&mut self, t: TaskId, turn: u32, ok: bool) {
        self.push(
            Some(t),
            Event::Compiled {
                turn,
                outcome: CompileOutcome {
                    ran_on: None,
                    worker_losses: Vec::new(),
                    status: if ok {
                        CompileStatus::Ok
                    } else {
                        CompileStatus::Error
                    },
                    cached: false,
                    error_name: (!ok).then(|| "CompileError".into()),
                    error: (!ok).then(|| "nvcc failed".into()),
                    feedback: if ok {
                        String::new()
                    } else {
                        "kernel.cu:3: error: expected ';'".into()
                    },
                    log_path: None,
                    build_dir: None,
                    duration_ms: 4200,
                    findings: Vec::new(),
                    build_path: ok.then(|| "fast".into()),
                    cpu: None,
                },
            },
        );
    }

    fn executed(&mut self, t: TaskId, turn: u32, speedup: Option<f64>) {
        self.push(
            Some(t),
            Event::LeaseGranted {
                device: "cuda:0".into(),
                wait_ms: 10,
                turn,
            },
        );
        self.push(
            Some(t),
            Event::LeaseReleased {
                device: "cuda:0".into(),
                held_ms: 2000,
                busy_ms: 1500,
                turn,
            },
        );
        let mut o = ExecOutcome::failure(
            Verdict::Incorrect,
            "cuda:0",
            "Output mismatch: max abs difference 0.5".into(),
            2000,
        );
        if let Some(s) = speedup {
            o.verdict = Verdict::Correct;
            o.correctness = true;
            o.speedup = Some(s);
            o.runtime_ms = 1.0 / s;
            o.ref_runtime_ms = 1.0;
            o.ref_source = Some("measured".into());
            o.feedback = format!("Correct; candidate {:.3} ms, reference 1.000 ms", 1.0 / s);
        }
        self.push(Some(t), Event::Executed { turn, outcome: o });
    }

    fn profiled(&mut self, t: TaskId, turn: u32) {
        self.push(
            Some(t),
            Event::Profiled {
                turn,
                outcome: ProfileOutcome {
                    worker_losses: Vec::new(),
                    ok: true,
                    table: "my_kernel  92.0%\naten::copy_  8.0%".into(),
                    ncu: None,
                    error: None,
                    duration_ms: 3000,
                },
            },
        );
    }
}

fn prompt_rel(t: TaskId, turn: u32) -> String {
    krefine::store::RunDir::kernel_rel(t, turn)
        .replace("kernels/", "prompts/")
        .replace("_kernel.py", "_prompt.json")
}

/// A refine run (3 problems, 3 turns, G+E+P) caught in the middle:
/// - 1/1: compile error, correct 1.6x, correct 2.4x (profiled): done;
/// - 1/2: incorrect, no code, turn 3 asked (a 429 retry wait, then text streaming);
/// - 1/3: correct 0.8x, turn 2 compiled and holding cuda:0.
fn mid_run() -> Vec<LogRecord> {
    let (a, b, c) = (task(1), task(2), task(3));
    let mut l = LogBuilder {
        records: Vec::new(),
    };
    l.push(
        None,
        Event::RunStarted {
            run: "mid".into(),
            method: MethodKind::Refine,
            feedback: Some(FeedbackMode::GEP),
            task_ids: vec![a, b, c],
            turns: 3,
            samples: 1,
            krefine_version: "0.1.0".into(),
            resumed: false,
            simulated: false,
            problem_names: [
                (1, "1_Vector_add.py"),
                (2, "2_ReLU.py"),
                (3, "3_Softmax.py"),
            ]
            .into_iter()
            .map(|(p, n)| (task(p).problem, n.to_string()))
            .collect(),
        },
    );
    l.answered(a, 1, Some("class ModelNew: pass  # v1"));
    l.compiled(a, 1, false);
    l.answered(b, 1, Some("class ModelNew: pass  # b1"));
    l.compiled(b, 1, true);
    l.executed(b, 1, None);
    l.answered(a, 2, Some("class ModelNew: pass  # v2"));
    l.compiled(a, 2, true);
    l.executed(a, 2, Some(1.6));
    l.profiled(a, 2);
    l.answered(c, 1, Some("class ModelNew: pass  # c1"));
    l.compiled(c, 1, true);
    l.executed(c, 1, Some(0.8));
    l.profiled(c, 1);
    l.answered(b, 2, None);
    l.answered(a, 3, Some("class ModelNew: pass  # v3"));
    l.compiled(a, 3, true);
    l.executed(a, 3, Some(2.4));
    l.profiled(a, 3);
    l.push(
        Some(b),
        Event::LlmStarted {
            turn: 3,
            prompt_file: Some(prompt_rel(b, 3)),
        },
    );
    l.push(
        Some(b),
        Event::LlmRetryWait {
            turn: 3,
            attempt: 1,
            wait_ms: 30_000,
            status: Some(429),
        },
    );
    l.answered(c, 2, Some("class ModelNew: pass  # c2"));
    l.compiled(c, 2, true);
    l.push(
        Some(c),
        Event::LeaseGranted {
            device: "cuda:0".into(),
            wait_ms: 5,
            turn: 2,
        },
    );
    l.records
}

/// The time the mid-run screens are drawn at: 5 s after the last record.
fn mid_now(records: &[LogRecord]) -> u64 {
    records.last().map_or(T0, |r| r.ts_ms) + 5000
}

/// A run directory holding the mid-run log and its prompt files.
fn mid_run_dir() -> (tempfile::TempDir, Vec<LogRecord>) {
    let dir = tempfile::tempdir().unwrap();
    let records = mid_run();
    std::fs::create_dir_all(dir.path().join("prompts")).unwrap();
    for r in &records {
        if let (Some(t), Event::LlmStarted { turn, prompt_file }) = (r.task, &r.event) {
            let messages = vec![
                ChatMessage {
                    role: Role::System,
                    content: "You write fast CUDA kernels.".into(),
                },
                ChatMessage {
                    role: Role::User,
                    content: format!(
                        "Optimise problem {} (turn {turn}).\nline 2\nline 3\nline 4\nline 5",
                        t.problem
                    ),
                },
            ];
            std::fs::write(
                dir.path().join(prompt_file.as_deref().unwrap()),
                serde_json::to_vec(&messages).unwrap(),
            )
            .unwrap();
        }
    }
    let mut f = std::fs::File::create(dir.path().join("events.jsonl")).unwrap();
    for r in &records {
        writeln!(f, "{}", serde_json::to_string(r).unwrap()).unwrap();
    }
    (dir, records)
}

fn app_for(records: &[LogRecord], mode: Mode, run_dir: Option<&Path>) -> App {
    let mut app = App::new(
        mode,
        Meta {
            model: Some("gpt-test".into()),
            compile_workers: Some(2),
            llm_concurrency: Some(8),
            run_dir: run_dir.map(Path::to_path_buf),
        },
    );
    app.set_devices(vec!["cuda:0".into(), "cuda:1".into()]);
    for r in records {
        app.apply(r);
    }
    app.before_draw();
    app
}

/// The screen as text, trailing blanks cut.
fn screen(app: &App, w: u16, h: u16, now: u64) -> String {
    let mut term = Terminal::new(TestBackend::new(w, h)).unwrap();
    term.draw(|f| ui::draw(f, app, now)).unwrap();
    let buf = term.backend().buffer();
    let mut out = String::new();
    for y in 0..h {
        let mut line = String::new();
        for x in 0..w {
            line.push_str(buf[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

fn ctrl_c() -> KeyEvent {
    KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)
}

// ---------------------------------------------------------------------------------------------------
// RunView

/// (task, stage, turn, finished turns, last verdict, best speedup) of a task.
type Row = (String, Stage, u32, usize, Option<Verdict>, Option<f64>);

/// Every task's [`Row`].
fn rows(v: &RunView) -> Vec<Row> {
    v.tasks
        .values()
        .map(|t| {
            (
                t.id.to_string(),
                t.stage,
                t.turn,
                t.finished_turns(),
                t.last_verdict(),
                t.best_speedup(),
            )
        })
        .collect()
}

#[test]
fn view_folds_a_constructed_log_exactly() {
    let records = mid_run();
    let v = RunView::from_records(&records);
    assert_eq!(
        rows(&v),
        vec![
            (
                "1/1/0".into(),
                Stage::Done,
                3,
                3,
                Some(Verdict::Correct),
                Some(2.4)
            ),
            (
                "1/2/0".into(),
                Stage::Generate,
                3,
                2,
                Some(Verdict::NoCode),
                None
            ),
            (
                "1/3/0".into(),
                Stage::Execute,
                2,
                1,
                Some(Verdict::Correct),
                Some(0.8)
            ),
        ]
    );
    assert_eq!(v.spend.tokens(), 7 * 1200);
    assert!((v.spend.cost_usd - 0.07).abs() < 1e-9);
    assert_eq!(v.model.as_deref(), Some("gpt-test"));
    assert_eq!(
        v.llm_in_flight.iter().collect::<Vec<_>>(),
        vec![&(task(2), 3)]
    );
    assert_eq!((v.retry_waits, v.rate_limited), (1, 1));
    assert_eq!(v.devices["cuda:0"].holder, Some((task(3), 2)));
    assert_eq!(v.devices["cuda:0"].leases, 5);
    assert_eq!(v.device_queue(), 0);
    assert_eq!((v.finished_turns(), v.planned_turns()), (6, 9));
    assert_eq!(v.verdict_tally(), (3, 3));
    // fast_p over 3 problems: turn 1 has one correct 0.8x; turn 2 adds 1/1 at 1.6x; turn 3 makes
    // it 2.4x.
    let fast = |n: usize, p: f64| v.curve[n].fast_p.get(p).unwrap();
    assert_eq!(v.curve.len(), 3);
    assert_eq!((fast(0, 0.0), fast(0, 1.0)), (1.0 / 3.0, 0.0));
    assert_eq!(
        (fast(1, 0.0), fast(1, 1.0), fast(1, 1.5)),
        (2.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0)
    );
    assert_eq!((fast(2, 1.5), fast(2, 2.0)), (1.0 / 3.0, 1.0 / 3.0));
    assert_eq!(
        v.elapsed_ms(mid_now(&records)),
        (records.len() as u64 - 1) * 1000 + 5000
    );
    assert!(v.ended.is_none());
}

#[test]
fn view_folds_a_recorded_quickstart_log_exactly() {
    // A simulated quickstart run (4 problems, 3 turns, G+E+P, scripted answers) as krefine wrote it.
    let log = read_log(Path::new("tests/fixtures/runs/quickstart-sim/events.jsonl")).unwrap();
    assert!(log.torn_tail.is_none());
    let v = RunView::from_records(&log.records);
    let expect = |id: &str, verdict| (id.to_string(), Stage::Done, 3, 3, Some(verdict), Some(1.0));
    assert_eq!(
        rows(&v),
        vec![
            expect("1/1/0", Verdict::Correct),
            (
                "1/2/0".into(),
                Stage::Done,
                3,
                3,
                Some(Verdict::NoCode),
                Some(1.0)
            ),
            expect("1/3/0", Verdict::Correct),
            expect("1/4/0", Verdict::Correct),
        ]
    );
    assert_eq!(v.ended.as_deref(), Some("finished"));
    assert_eq!(v.spend.tokens(), 28_320);
    assert_eq!(v.verdict_tally(), (11, 1));
    assert!(v.llm_in_flight.is_empty());
    assert_eq!(v.devices["cpu"].leases, 22);
    assert_eq!(v.devices["cpu"].holder, None);
    let last = v.current().unwrap();
    assert_eq!(
        (last.n, last.fast_p.get(0.0), last.fast_p.get(1.0)),
        (3, Some(1.0), Some(0.0))
    );
    // Folding the same records again, or any prefix twice, changes nothing.
    let mut again = RunView::from_records(&log.records[..40]);
    for r in &log.records {
        again.apply(r);
    }
    assert_eq!(rows(&again), rows(&v));
    assert_eq!(again.spend, v.spend);
}

// ---------------------------------------------------------------------------------------------------
// Screens

#[test]
fn main_screen_wide() {
    let (dir, records) = mid_run_dir();
    let app = app_for(&records, Mode::Live, Some(dir.path()));
    insta::assert_snapshot!(screen(&app, 140, 30, mid_now(&records)));
}

#[test]
fn main_screen_narrow() {
    let records = mid_run();
    let app = app_for(&records, Mode::Watch, None);
    insta::assert_snapshot!(screen(&app, 80, 30, mid_now(&records)));
}

#[test]
fn too_small_terminal_gets_a_message() {
    let records = mid_run();
    let app = app_for(&records, Mode::Live, None);
    insta::assert_snapshot!(screen(&app, 40, 8, mid_now(&records)));
    // Degenerate sizes draw without panicking.
    for (w, h) in [(0, 0), (1, 1), (59, 40), (200, 14)] {
        let s = screen(&app, w, h, mid_now(&records));
        assert!(w == 0 || h < 3 || s.contains("too small"), "{w}x{h}: {s}");
    }
}

#[test]
fn huge_terminal_draws_everything() {
    let records = mid_run();
    let app = app_for(&records, Mode::Live, None);
    let s = screen(&app, 400, 120, mid_now(&records));
    for part in [
        "1/1/0",
        "1_Vector_add",
        "retry wait",
        "cuda:0   1/3/0 t2 execute",
        "p=1.5 33%",
    ] {
        assert!(s.contains(part), "missing {part:?}");
    }
}

#[test]
fn detail_screen_of_a_finished_turn() {
    let (dir, records) = mid_run_dir();
    let mut app = app_for(&records, Mode::Live, Some(dir.path()));
    app.handle_key(key(KeyCode::Enter));
    // Turn 2 of 1/1/0: correct 1.6x, profiled; its feedback went to turn 3.
    app.handle_key(key(KeyCode::Left));
    app.before_draw();
    insta::assert_snapshot!(screen(&app, 100, 50, mid_now(&records)));
}

#[test]
fn detail_screen_of_a_streaming_turn() {
    let (dir, mut records) = mid_run_dir();
    // Streamed text is broadcast (never logged) with seq 0.
    for d in ["I will fuse", " the two kernels"] {
        records.push(LogRecord {
            v: SCHEMA_VERSION,
            seq: 0,
            ts_ms: mid_now(&records),
            task: Some(task(2)),
            event: Event::LlmDelta {
                turn: 3,
                delta: d.into(),
            },
        });
    }
    let mut app = app_for(&records, Mode::Live, Some(dir.path()));
    app.handle_key(key(KeyCode::Down));
    app.handle_key(key(KeyCode::Enter));
    app.handle_key(key(KeyCode::Char('p')));
    app.before_draw();
    insta::assert_snapshot!(screen(&app, 100, 24, mid_now(&records)));
}

#[test]
fn help_and_replay_header() {
    let records = mid_run();
    let mut app = app_for(&records, Mode::Replay, None);
    let mut replay = Replay::new(records.clone(), 4.0);
    replay.paused = true;
    app.replay = Some(krefine::tui::app::ReplayStatus {
        paused: true,
        speed: 4.0,
        played: records.len(),
        total: records.len(),
    });
    app.handle_key(key(KeyCode::Char('?')));
    insta::assert_snapshot!(screen(&app, 100, 40, mid_now(&records)));
    // Any key closes the help.
    app.handle_key(key(KeyCode::Char('x')));
    assert!(!app.help);
}

// ---------------------------------------------------------------------------------------------------
// Keys

#[test]
fn table_keys_select_sort_filter_and_open() {
    let records = mid_run();
    let mut app = app_for(&records, Mode::Watch, None);
    assert_eq!(app.rows(), vec![task(1), task(2), task(3)]);
    app.handle_key(key(KeyCode::Down));
    app.handle_key(key(KeyCode::Down));
    app.handle_key(key(KeyCode::Down));
    assert_eq!(app.selected, 2);
    app.handle_key(key(KeyCode::Up));
    assert_eq!(app.selected_task(), Some(task(2)));

    // Sort: task → state → turn → verdict → speedup (fastest first).
    for _ in 0..4 {
        app.handle_key(key(KeyCode::Char('s')));
    }
    assert_eq!(app.sort, SortKey::Speedup);
    assert_eq!(app.rows(), vec![task(1), task(3), task(2)]);
    app.handle_key(key(KeyCode::Char('r')));
    assert_eq!(app.rows(), vec![task(2), task(3), task(1)]);
    app.handle_key(key(KeyCode::Char('r')));

    // Filters: failing (latest verdict not correct), running, done.
    app.handle_key(key(KeyCode::Char('f')));
    assert_eq!(app.filter.state, StateFilter::Failing);
    assert_eq!(app.rows(), vec![task(2)]);
    assert_eq!(app.selected, 0, "the selection stays inside the rows");
    app.handle_key(key(KeyCode::Char('f')));
    assert_eq!(app.rows(), vec![task(3), task(2)]);
    app.handle_key(key(KeyCode::Char('f')));
    assert_eq!(app.rows(), vec![task(1)]);
    app.handle_key(key(KeyCode::Char('f')));
    // Verdict filter cycles through the verdicts present, then off.
    app.handle_key(key(KeyCode::Char('v')));
    assert_eq!(app.filter.verdict, Some(Verdict::Correct));
    app.handle_key(key(KeyCode::Char('v')));
    assert_eq!(app.filter.verdict, Some(Verdict::NoCode));
    assert_eq!(app.rows(), vec![task(2)]);
    app.handle_key(key(KeyCode::Char('v')));
    assert_eq!(app.filter.verdict, None);
    app.handle_key(key(KeyCode::Char('L')));
    assert_eq!(app.filter.level, Some(1));
    app.handle_key(key(KeyCode::Char('L')));
    assert_eq!(app.filter.level, None);

    // Enter opens the selected task at its current turn; arrows move between turns; q goes back.
    app.sort = SortKey::Task;
    app.selected = 0;
    app.handle_key(key(KeyCode::Enter));
    let Screen::Detail(d) = &app.screen else {
        panic!("no detail screen")
    };
    assert_eq!((d.task, d.turn), (task(1), 3));
    app.handle_key(key(KeyCode::Left));
    app.handle_key(key(KeyCode::Left));
    app.handle_key(key(KeyCode::Left));
    let Screen::Detail(d) = &app.screen else {
        panic!("no detail screen")
    };
    assert_eq!(d.turn, 1);
    assert_eq!(app.handle_key(key(KeyCode::Char('q'))), None);
    assert_eq!(app.screen, Screen::Tasks);
    assert_eq!(app.handle_key(key(KeyCode::Char('q'))), Some(Action::Quit));
}

#[test]
fn live_quit_stops_the_run_first_and_forces_on_the_second_press() {
    let records = mid_run();
    let mut app = app_for(&records, Mode::Live, None);
    assert_eq!(
        app.handle_key(key(KeyCode::Char('q'))),
        Some(Action::Cancel)
    );
    assert!(app.stopping);
    assert_eq!(app.handle_key(ctrl_c()), Some(Action::ForceQuit));

    // Ctrl-C is the same cancellation, even from a detail view (where q only goes back).
    let mut app = app_for(&records, Mode::Live, None);
    app.handle_key(key(KeyCode::Enter));
    assert_eq!(app.handle_key(ctrl_c()), Some(Action::Cancel));

    // Once the run ended, q leaves with nothing to stop.
    let mut app = app_for(&records, Mode::Live, None);
    app.apply(&LogRecord {
        v: SCHEMA_VERSION,
        seq: records.len() as u64,
        ts_ms: mid_now(&records),
        task: None,
        event: Event::RunEnded {
            reason: "finished".into(),
        },
    });
    assert_eq!(app.handle_key(key(KeyCode::Char('q'))), Some(Action::Quit));
    // A closed live source (the engine is gone) counts as ended too.
    let mut app = app_for(&records, Mode::Live, None);
    app.closed = true;
    assert_eq!(app.handle_key(ctrl_c()), Some(Action::Quit));
}

#[test]
fn detail_follows_the_current_turn_until_another_is_chosen() {
    let records = mid_run();
    let split = records.len() - 4; // before task 1/3/0's turn 2 answer
    let mut app = app_for(&records[..split], Mode::Live, None);
    app.selected = 2;
    app.handle_key(key(KeyCode::Enter));
    let turn = |app: &App| match &app.screen {
        Screen::Detail(d) => d.turn,
        Screen::Tasks => 0,
    };
    assert_eq!(turn(&app), 2);
    for r in &records[split..] {
        app.apply(r);
    }
    assert_eq!(turn(&app), 2);
    app.handle_key(key(KeyCode::Left));
    assert_eq!(turn(&app), 1);
}

// ---------------------------------------------------------------------------------------------------
// Watch: following a growing file

#[test]
fn watch_follows_a_growing_file_and_waits_for_torn_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let records = mid_run();
    let lines: Vec<String> = records
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    let mut f = std::fs::File::create(&path).unwrap();
    let mut tail = Tail::new(&path);
    assert_eq!(tail.poll().unwrap().0.len(), 0);

    writeln!(f, "{}\n{}", lines[0], lines[1]).unwrap();
    let (got, warnings) = tail.poll().unwrap();
    assert_eq!(got.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![0, 1]);
    assert!(warnings.is_empty());

    // A line written in two pieces: nothing until its newline arrives.
    let (head, rest) = lines[2].split_at(20);
    write!(f, "{head}").unwrap();
    f.flush().unwrap();
    assert!(tail.poll().unwrap().0.is_empty());
    writeln!(f, "{rest}").unwrap();
    writeln!(f, "{}", lines[3]).unwrap();
    let (got, _) = tail.poll().unwrap();
    assert_eq!(got.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![2, 3]);

    // A complete line that is no record is reported with its line number and skipped.
    writeln!(f, "not json\n{}", lines[4]).unwrap();
    let (got, warnings) = tail.poll().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].contains("events.jsonl:5:"), "{}", warnings[0]);

    // Everything else, folded, gives the same view as the whole log.
    for l in &lines[5..] {
        writeln!(f, "{l}").unwrap();
    }
    let mut view = RunView::new();
    let mut tail2 = Tail::new(&path);
    for r in tail2.poll().unwrap().0 {
        view.apply(&r);
    }
    assert_eq!(rows(&view), rows(&RunView::from_records(&records)));
}

#[tokio::test]
async fn watch_forwards_lines_as_they_are_appended() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    std::fs::write(&path, "").unwrap();
    let records = mid_run();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let follower = tokio::spawn(Tail::new(&path).forward(Duration::from_millis(10), tx));
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    let mut seen = Vec::new();
    for r in records.iter().take(5) {
        writeln!(f, "{}", serde_json::to_string(r).unwrap()).unwrap();
        while seen.last() != Some(&r.seq) {
            let feed = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("the watcher forwards an appended line")
                .unwrap();
            if let krefine::tui::source::Feed::Records(rs) = feed {
                seen.extend(rs.iter().map(|r| r.seq));
            }
        }
    }
    assert_eq!(seen, vec![0, 1, 2, 3, 4]);
    follower.abort();
}

// ---------------------------------------------------------------------------------------------------
// Replay

#[test]
fn replay_keeps_order_and_a_large_speed_shows_the_end_at_once() {
    let records = mid_run();
    let mut r = Replay::new(records.clone(), 1e6);
    let out = r.advance(Duration::from_millis(100));
    assert_eq!(
        out.iter().map(|r| r.seq).collect::<Vec<_>>(),
        records.iter().map(|r| r.seq).collect::<Vec<_>>()
    );
    assert!(r.at_end());
    assert_eq!(r.now_ms(), records.last().unwrap().ts_ms);
}

#[test]
fn replay_paces_by_recorded_time() {
    let records = mid_run(); // 1 s apart
    let mut r = Replay::new(records.clone(), 2.0);
    // The first record is due at once; then one more per 500 ms of real time at 2x.
    assert_eq!(r.advance(Duration::ZERO).len(), 1);
    assert_eq!(r.advance(Duration::from_millis(400)).len(), 0);
    assert_eq!(r.advance(Duration::from_millis(100)).len(), 1);
    assert_eq!(r.advance(Duration::from_millis(1500)).len(), 3);
    assert_eq!(r.position().0, 5);
    r.paused = true;
    assert!(r.advance(Duration::from_secs(3600)).is_empty());
    r.paused = false;
    assert_eq!(r.step().map(|r| r.seq), Some(5));

    // The pause before a resumption (hours, say) plays as at most MAX_GAP_MS; a long gap inside a
    // session (a slow compile) plays as recorded.
    let mut gap = records[..3].to_vec();
    gap[1].ts_ms = gap[0].ts_ms + 600_000;
    gap[2].ts_ms = gap[1].ts_ms + 3_600_000;
    gap[2].event = match gap[0].event.clone() {
        Event::RunStarted {
            run,
            method,
            feedback,
            task_ids,
            turns,
            samples,
            krefine_version,
            simulated,
            problem_names,
            ..
        } => Event::RunStarted {
            run,
            method,
            feedback,
            task_ids,
            turns,
            samples,
            krefine_version,
            resumed: true,
            simulated,
            problem_names,
        },
        other => other,
    };
    let mut r = Replay::new(gap, 1.0);
    assert_eq!(r.advance(Duration::ZERO).len(), 1);
    assert!(r.advance(Duration::from_millis(599_999)).is_empty());
    assert_eq!(r.advance(Duration::from_millis(1)).len(), 1);
    assert!(r.advance(Duration::from_millis(MAX_GAP_MS - 1)).is_empty());
    assert_eq!(r.advance(Duration::from_millis(1)).len(), 1);
}

#[test]
fn replay_jumps_to_the_next_turn_and_to_a_task_turn() {
    let records = mid_run();
    let mut app = app_for(&[], Mode::Replay, None);
    let mut r = Replay::new(records.clone(), 1.0);
    replay_cmd(&mut app, &mut r, ReplayCmd::Step);
    assert_eq!(app.view.tasks.len(), 3);
    assert!(r.paused);
    // The first turn to end is 1/1/0's compile error (record 3).
    replay_cmd(&mut app, &mut r, ReplayCmd::NextTurn);
    assert_eq!(r.position().0, 4);
    assert_eq!(app.view.finished_turns(), 1);
    // 1/3/0's turn 1 ends after three more turns elsewhere began.
    replay_cmd(&mut app, &mut r, ReplayCmd::TaskTurnN(task(3), 1));
    assert_eq!(app.view.tasks[&task(3)].finished_turns(), 1);
    assert_eq!(app.view.tasks[&task(1)].finished_turns(), 2);
    replay_cmd(&mut app, &mut r, ReplayCmd::TaskTurn(task(1)));
    assert_eq!(app.view.tasks[&task(1)].stage, Stage::Done);
    replay_cmd(&mut app, &mut r, ReplayCmd::Faster);
    assert_eq!(r.speed, 2.0);
    replay_cmd(&mut app, &mut r, ReplayCmd::End);
    assert!(r.at_end());
    assert_eq!(rows(&app.view), rows(&RunView::from_records(&records)));
    // In replay, digits are a jump; space pauses.
    let mut app = app_for(&records, Mode::Replay, None);
    assert_eq!(
        app.handle_key(key(KeyCode::Char('2'))),
        Some(Action::Replay(ReplayCmd::TaskTurnN(task(1), 2)))
    );
    assert_eq!(
        app.handle_key(key(KeyCode::Char(' '))),
        Some(Action::Replay(ReplayCmd::TogglePause))
    );
}

// ---------------------------------------------------------------------------------------------------
// Live: a lagging display is rebuilt from the log

#[tokio::test]
async fn live_rebuilds_from_the_log_when_the_broadcast_lags() {
    use krefine::tui::source::{Feed, Live};
    use std::sync::Arc;
    let (dir, records) = mid_run_dir();
    let (tx, rx) = tokio::sync::broadcast::channel(4);
    let mut live = Live::new(rx, dir.path().join("events.jsonl"));
    // More records than the channel holds: the receiver has lagged.
    for r in &records {
        tx.send(Arc::new(r.clone())).unwrap();
    }
    let Some(Feed::Rebuilt(view)) = live.next().await else {
        panic!("expected a view rebuilt from the log")
    };
    assert_eq!(rows(&view), rows(&RunView::from_records(&records)));
    // What is still queued follows, and the view drops what the rebuild already holds.
    let Some(Feed::Records(rest)) = live.next().await else {
        panic!("expected the queued records")
    };
    let mut view = *view;
    assert!(rest.iter().all(|r| !view.apply(r)));
    drop(tx);
    assert!(live.next().await.is_none());
}
