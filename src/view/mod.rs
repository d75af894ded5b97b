//! `RunView`: the run's one fold ([`RunState`]) and its fast_p curve, for every display of it.
//!
//! The terminal UI (live, `watch`, `replay`) and the `--no-tui` progress bar apply the same
//! [`LogRecord`]s to a `RunView`; everything but the curve is the [`RunState`] it wraps (read through
//! `Deref`), the reducer reports, the ledger and the Python package use too, so a display can never
//! disagree with them. The curve is [`crate::metrics::run_metrics`] of the same state, recomputed
//! when a turn ended. [`source`] is where a display's records come from.

pub mod source;

use crate::metrics::{FastP, RunInput, run_metrics};
use crate::types::LogRecord;

pub use crate::state::{Applied, DeviceView, RunInfo, RunState, Stage, TaskView};

/// A run's state and its fast_p curve.
#[derive(Debug, Default)]
pub struct RunView {
    state: RunState,
    /// fast_p and correct rate at each step `1..=axis`, as of the last [`RunView::refresh`].
    pub curve: Vec<CurvePoint>,
    /// A turn ended since the curve was computed.
    curve_stale: bool,
}

impl std::ops::Deref for RunView {
    type Target = RunState;
    fn deref(&self) -> &RunState {
        &self.state
    }
}

impl std::ops::DerefMut for RunView {
    fn deref_mut(&mut self) -> &mut RunState {
        &mut self.state
    }
}

/// One step of the fast_p curve.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CurvePoint {
    /// The step: a turn (refinement) or a sample count (sampling), from 1.
    pub n: u32,
    pub fast_p: FastP,
    /// Share of problems with a correct candidate by this step.
    pub correct_rate: f64,
    /// Geometric mean of the best correct speedups (`None`: no correct candidate timed yet).
    pub geomean: Option<f64>,
}

impl RunView {
    pub fn new() -> Self {
        RunView::default()
    }

    /// Fold a whole log.
    pub fn from_records<'a>(records: impl IntoIterator<Item = &'a LogRecord>) -> Self {
        let mut v = RunView::new();
        for r in records {
            v.apply(r);
        }
        v.refresh();
        v
    }

    /// The fold itself.
    pub fn state(&self) -> &RunState {
        &self.state
    }

    /// Apply one record. Returns false when it was ignored (already applied).
    pub fn apply(&mut self, rec: &LogRecord) -> bool {
        match self.state.apply(rec) {
            Applied::Ignored => false,
            Applied::Folded { turn_ended } => {
                self.curve_stale |= turn_ended;
                true
            }
        }
    }

    /// Recompute the derived numbers (the fast_p curve) after records were applied. Displays call
    /// it once a frame rather than once a record: it looks at every problem's every step.
    pub fn refresh(&mut self) {
        if self.curve_stale {
            self.curve = self.compute_curve();
            self.curve_stale = false;
        }
    }

    /// The report's curve of the state so far: each step's fast_p, correct rate and geomean.
    fn compute_curve(&self) -> Vec<CurvePoint> {
        let Some(info) = &self.state.info else {
            return Vec::new();
        };
        let metrics = run_metrics(&RunInput {
            method: info.method,
            axis: info.axis(),
            problems: &info.problems,
            turns: &self.state,
        });
        metrics
            .steps
            .into_iter()
            .map(|s| CurvePoint {
                n: s.n,
                fast_p: s.summary.fast_p,
                correct_rate: s.summary.correct_rate,
                geomean: s.summary.geomean_speedup,
            })
            .collect()
    }

    /// fast_p at the last step (the run's current standing), as of the last refresh.
    pub fn current(&self) -> Option<CurvePoint> {
        self.curve.last().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    use crate::types::{
        CompileOutcome, CompileStatus, Event, ExecOutcome, FeedbackMode, LlmAnswer, MethodKind,
        ProblemKey, SCHEMA_VERSION, TaskId, Usage, Verdict,
    };

    fn task(p: u32) -> TaskId {
        TaskId {
            problem: ProblemKey {
                level: 1,
                problem_id: p,
            },
            sample: 0,
        }
    }

    fn rec(seq: u64, task: Option<TaskId>, event: Event) -> LogRecord {
        LogRecord {
            v: SCHEMA_VERSION,
            seq,
            ts_ms: 1000 + seq * 10,
            task,
            event,
        }
    }

    fn started() -> Event {
        Event::RunStarted {
            run: "r".into(),
            method: MethodKind::Refine,
            feedback: Some(FeedbackMode::GE),
            task_ids: vec![task(1), task(2)],
            turns: 2,
            samples: 1,
            krefine_version: "0".into(),
            resumed: false,
            simulated: true,
            problem_names: BTreeMap::new(),
        }
    }

    fn answered(turn: u32) -> Event {
        Event::LlmAnswered {
            turn,
            answer: LlmAnswer {
                content: "x".into(),
                usage: Some(Usage {
                    prompt_tokens: 10,
                    completion_tokens: 5,
                    reasoning_tokens: 0,
                }),
                cost_usd: Some(0.5),
                model: "m".into(),
                finish_reason: None,
                latency_ms: 1,
                attempts: 1,
            },
            code: Some("code".into()),
            code_file: None,
        }
    }

    fn compiled(turn: u32) -> Event {
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
                duration_ms: 1,
                findings: Vec::new(),
                build_path: None,
                cpu: None,
            },
        }
    }

    fn executed(turn: u32, speedup: Option<f64>) -> Event {
        let mut o = ExecOutcome::failure(Verdict::Incorrect, "cpu", "wrong".into(), 1);
        if let Some(s) = speedup {
            o.verdict = Verdict::Correct;
            o.correctness = true;
            o.speedup = Some(s);
        }
        Event::Executed { turn, outcome: o }
    }

    #[test]
    fn duplicate_and_older_records_are_ignored() {
        let mut v = RunView::new();
        assert!(v.apply(&rec(0, None, started())));
        assert!(v.apply(&rec(1, Some(task(1)), answered(1))));
        assert!(!v.apply(&rec(1, Some(task(1)), answered(1))));
        assert!(!v.apply(&rec(0, None, started())));
        assert_eq!(v.spend.tokens(), 15);
        assert_eq!(v.tasks[&task(1)].stage, Stage::Compile);
    }

    #[test]
    fn in_flight_devices_and_curve() {
        let t1 = Some(task(1));
        let mut v = RunView::new();
        let started_llm = Event::LlmStarted {
            turn: 1,
            prompt_file: Some("prompts/p.json".into()),
        };
        for (i, (t, e)) in [
            (None, started()),
            (t1, started_llm),
            (
                t1,
                Event::LlmRetryWait {
                    turn: 1,
                    attempt: 1,
                    wait_ms: 500,
                    status: Some(429),
                },
            ),
        ]
        .into_iter()
        .enumerate()
        {
            v.apply(&rec(i as u64, t, e));
        }
        assert_eq!(v.llm_in_flight.len(), 1);
        assert_eq!(v.waiting_at(1020), 1);
        assert_eq!(v.waiting_at(1020 + 500), 0);
        assert_eq!(v.rate_limited, 1);
        v.apply(&rec(3, t1, answered(1)));
        v.apply(&rec(4, t1, compiled(1)));
        assert!(v.llm_in_flight.is_empty());
        assert_eq!(v.device_queue(), 1);
        v.apply(&rec(
            5,
            t1,
            Event::LeaseGranted {
                device: "cpu".into(),
                wait_ms: 0,
                turn: 1,
            },
        ));
        assert_eq!(v.devices["cpu"].holder, Some((task(1), 1)));
        assert_eq!(v.device_queue(), 0);
        v.apply(&rec(
            6,
            t1,
            Event::LeaseReleased {
                device: "cpu".into(),
                held_ms: 9,
                busy_ms: 7,
                turn: 1,
            },
        ));
        v.apply(&rec(7, t1, executed(1, Some(1.25))));
        v.refresh();
        let t = &v.tasks[&task(1)];
        assert_eq!((t.stage, t.turn), (Stage::Generate, 2));
        assert_eq!(t.best_speedup(), Some(1.25));
        assert_eq!(t.prompt_files[&1], "prompts/p.json");
        let c = v.current().unwrap();
        assert_eq!(c.n, 2);
        // One of two problems is faster than the reference.
        assert_eq!(c.fast_p.get(1.0), Some(0.5));
        assert_eq!(c.fast_p.get(1.5), Some(0.0));
        assert_eq!(v.curve[0].fast_p.get(0.0), Some(0.5));
        assert_eq!(v.finished_turns(), 1);
        assert_eq!(v.planned_turns(), 4);
        assert_eq!(v.verdict_tally(), (1, 0));
    }

    #[test]
    fn streamed_text_lasts_until_the_answer() {
        let t1 = Some(task(1));
        let mut v = RunView::new();
        v.apply(&rec(0, None, started()));
        let delta = |d: &str| LogRecord {
            v: SCHEMA_VERSION,
            seq: 0,
            ts_ms: 1005,
            task: t1,
            event: Event::LlmDelta {
                turn: 1,
                delta: d.into(),
            },
        };
        v.apply(&delta("ab"));
        v.apply(&delta("c"));
        assert_eq!(v.tasks[&task(1)].streaming[&1], "abc");
        v.apply(&rec(1, t1, answered(1)));
        assert!(v.tasks[&task(1)].streaming.is_empty());
        v.apply(&delta("late"));
        assert!(v.tasks[&task(1)].streaming.is_empty());
    }

    #[test]
    fn a_foreign_event_marks_the_task_not_the_run() {
        let mut v = RunView::new();
        v.apply(&rec(0, None, started()));
        v.apply(&rec(1, Some(task(1)), compiled(1)));
        assert!(
            v.tasks[&task(1)]
                .error
                .as_deref()
                .unwrap()
                .contains("compiled")
        );
        v.apply(&rec(2, Some(task(2)), answered(1)));
        assert_eq!(v.tasks[&task(2)].stage, Stage::Compile);
    }
}
