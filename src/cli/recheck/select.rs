//! Which of a run's candidates a recheck takes, and their code.
//!
//! A candidate is a turn with a verdict that had code to judge (`no_code` and `llm_error` turns have
//! none). Its code is the one the log records (what was built and judged); the run's `kernels/` file
//! of the turn stands in where the log has none, and a file that differs from the log's code is
//! noted (the log's code is rechecked).

use std::path::Path;

use crate::machine::TaskTurns;
use crate::store::RunDir;
use crate::types::{TaskId, TurnRecord, Verdict};

/// Which candidates to recheck.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Which {
    /// The correct ones: the results that count (the correct rate, fast_p, the geomean).
    Correct,
    /// Every candidate with a verdict.
    All,
}

/// A candidate the recheck takes.
#[derive(Debug, Clone, PartialEq)]
pub struct Picked {
    pub task: TaskId,
    pub turn: u32,
    /// The code to recheck, or why there is none.
    pub code: Result<String, String>,
    /// What was noticed on the way (a kernel file that differs from the log, ...).
    pub notes: Vec<String>,
}

/// True for a turn with a verdict whose candidate had code to judge.
fn is_candidate(r: &TurnRecord) -> bool {
    r.verdict
        .is_some_and(|v| !matches!(v, Verdict::NoCode | Verdict::LlmError))
}

/// The candidates of `turns` that `which` takes, in (problem, sample, turn) order, with their code
/// (`run`: the run directory, for its `kernels/` files).
pub fn pick(run: &Path, turns: &TaskTurns, which: Which) -> Vec<Picked> {
    let mut out = Vec::new();
    for (task, records) in turns {
        for r in records.iter().filter(|r| is_candidate(r)) {
            if which == Which::Correct && r.verdict != Some(Verdict::Correct) {
                continue;
            }
            out.push(code_of(run, *task, r));
        }
    }
    out
}

fn code_of(run: &Path, task: TaskId, r: &TurnRecord) -> Picked {
    let rel = RunDir::kernel_rel(task, r.turn);
    let path = run.join(&rel);
    let file = match std::fs::read(&path) {
        Ok(bytes) => Ok(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!("{rel} is missing")),
        Err(e) => Err(format!("cannot read {rel}: {e}")),
    };
    // A log folds only with code for every turn that was built, but a log may have been stripped
    // of it (blank) to save space, the kernels kept.
    let absent = if r.code.is_some() {
        "the code the log records is blank"
    } else {
        "the log records no code"
    };
    let logged = r.code.clone().filter(|c| !c.trim().is_empty());
    let mut notes = Vec::new();
    let code = match (logged, file) {
        (Some(code), Ok(bytes)) => {
            if bytes != code.as_bytes() {
                notes.push(format!(
                    "{rel} differs from the code the log records (edited after the run?); rechecked the log's code"
                ));
            }
            Ok(code)
        }
        (Some(code), Err(why)) => {
            notes.push(format!("{why}; rechecked the code the log records"));
            Ok(code)
        }
        (None, Ok(bytes)) => match String::from_utf8(bytes) {
            Ok(text) if !text.trim().is_empty() => {
                notes.push(format!("{absent}; rechecked {rel}"));
                Ok(text)
            }
            Ok(_) => Err(format!("its code is missing: {absent} and {rel} is empty")),
            Err(_) => Err(format!(
                "its code is missing: {absent} and {rel} is not UTF-8 text"
            )),
        },
        (None, Err(why)) => Err(format!("its code is missing: {absent} and {why}")),
    };
    Picked {
        task,
        turn: r.turn,
        code,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ExecOutcome, ProblemKey};

    fn turn(n: u32, verdict: Verdict, code: Option<&str>) -> TurnRecord {
        TurnRecord {
            turn: n,
            code: code.map(str::to_string),
            verdict: Some(verdict),
            exec: Some(ExecOutcome::failure(verdict, "cpu", String::new(), 0)),
            ..TurnRecord::default()
        }
    }

    fn task(sample: u32) -> TaskId {
        TaskId {
            problem: ProblemKey {
                level: 1,
                problem_id: 3,
            },
            sample,
        }
    }

    #[test]
    fn picks_candidates_with_their_code_and_notes_what_is_off() {
        let dir = tempfile::tempdir().unwrap();
        let kernels = dir.path().join("kernels");
        std::fs::create_dir_all(&kernels).unwrap();
        let file = |t: TaskId, n: u32| dir.path().join(RunDir::kernel_rel(t, n));
        std::fs::write(file(task(0), 1), "a = 1\n").unwrap();
        std::fs::write(file(task(0), 2), "edited\n").unwrap();
        std::fs::write(file(task(1), 2), "from the file\n").unwrap();
        let mut turns = TaskTurns::new();
        turns.insert(
            task(0),
            vec![
                turn(1, Verdict::Correct, Some("a = 1\n")),
                turn(2, Verdict::Correct, Some("b = 2\n")),
                turn(3, Verdict::NoCode, None),
                turn(4, Verdict::CompileError, Some("c(\n")),
                TurnRecord {
                    turn: 5,
                    ..TurnRecord::default()
                },
            ],
        );
        turns.insert(
            task(1),
            vec![
                turn(1, Verdict::Correct, None),
                turn(2, Verdict::Correct, None),
                turn(3, Verdict::Correct, Some("   ")),
            ],
        );
        let picked = pick(dir.path(), &turns, Which::Correct);
        let summary: Vec<(u32, u32, Result<&str, &str>, usize)> = picked
            .iter()
            .map(|p| {
                (
                    p.task.sample,
                    p.turn,
                    p.code.as_deref().map_err(String::as_str),
                    p.notes.len(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (0, 1, Ok("a = 1\n"), 0),
                (0, 2, Ok("b = 2\n"), 1),
                (
                    1,
                    1,
                    Err(
                        "its code is missing: the log records no code and kernels/level_1_problem_3_sample_1_turn_1_kernel.py is missing"
                    ),
                    0
                ),
                (1, 2, Ok("from the file\n"), 1),
                (
                    1,
                    3,
                    Err(
                        "its code is missing: the code the log records is blank and kernels/level_1_problem_3_sample_1_turn_3_kernel.py is missing"
                    ),
                    0
                ),
            ]
        );
        assert!(picked[1].notes[0].contains("differs from the code the log records"));
        assert_eq!(
            picked[3].notes,
            vec![
                "the log records no code; rechecked kernels/level_1_problem_3_sample_1_turn_2_kernel.py"
            ]
        );
        // All: the compile error too; never the turn without code nor the unfinished one.
        let all = pick(dir.path(), &turns, Which::All);
        let keys: Vec<(u32, u32)> = all.iter().map(|p| (p.task.sample, p.turn)).collect();
        assert_eq!(keys, vec![(0, 1), (0, 2), (0, 4), (1, 1), (1, 2), (1, 3)]);
        assert!(all[2].notes[0].ends_with("is missing; rechecked the code the log records"));
    }
}
