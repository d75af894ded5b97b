//! Export to KernelBench's `eval_results.json` shape, so its analysis scripts and leaderboards can read
//! a krefine run: `{"<problem_id>": [{"sample_id", "compiled", "correctness", "metadata", "runtime",
//! "runtime_stats"}, ...]}` (protocol notes §7.1).

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::metrics::counted_speedup;
use crate::types::{CompileStatus, TaskId, TurnRecord, Verdict};

/// Which turn of a task stands for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pick {
    /// The fastest correct turn; a correct turn without timing beats any incorrect one; with no
    /// correct turn, the last finished one.
    #[default]
    Best,
    /// The last finished turn (what a refinement run ended with).
    Last,
}

/// The turn of a task that stands for it, chosen by `how`; `None` when no turn finished.
pub fn pick(records: &[TurnRecord], how: Pick) -> Option<&TurnRecord> {
    let finished = || records.iter().filter(|r| r.verdict.is_some());
    let last = finished().max_by_key(|r| r.turn);
    match how {
        Pick::Last => last,
        Pick::Best => {
            // Rank: timed correct (by speedup) > untimed correct > anything else; the earliest turn
            // wins ties, as a user stopping at the first such turn would have.
            // A strict-mode speedup that re-timing did not confirm ranks as untimed.
            let rank = |r: &TurnRecord| match (r.verdict, counted_speedup(r)) {
                (Some(Verdict::Correct), Some(s)) if s.is_finite() => (2, s),
                (Some(Verdict::Correct), _) => (1, 0.0),
                _ => (0, 0.0),
            };
            let mut best: Option<(&TurnRecord, (u8, f64))> = None;
            for r in finished() {
                let k = rank(r);
                if best.is_none_or(|(_, b)| k.0 > b.0 || (k.0 == b.0 && k.1 > b.1)) {
                    best = Some((r, k));
                }
            }
            match best {
                Some((r, (rank, _))) if rank > 0 => Some(r),
                _ => last,
            }
        }
    }
}

fn entry(sample: u32, r: &TurnRecord) -> Value {
    if let Some(e) = &r.exec {
        let mut metadata = e.metadata.clone();
        // KernelBench always records where it ran; workers normally fill these already.
        if !e.env.device_name.is_empty() {
            metadata
                .entry("hardware")
                .or_insert_with(|| Value::from(e.env.device_name.clone()));
        }
        if !e.device.is_empty() {
            metadata
                .entry("device")
                .or_insert_with(|| Value::from(e.device.clone()));
        }
        let runtime_stats = match &e.runtime_stats {
            Some(s) => json!({
                "mean": s.mean, "std": s.std, "min": s.min, "max": s.max,
                "num_trials": s.num_trials, "hardware": e.env.device_name, "device": e.device,
            }),
            None => json!({}),
        };
        return json!({
            "sample_id": sample,
            "compiled": e.compiled,
            "correctness": e.correctness,
            "metadata": metadata,
            "runtime": e.runtime_ms,
            "runtime_stats": runtime_stats,
        });
    }
    // No execution: the turn ended before the GPU. Say why in KernelBench's metadata keys.
    let mut metadata = Map::new();
    match (&r.compile, r.verdict) {
        (Some(c), _) if c.status != CompileStatus::Ok => {
            let name = c.error_name.clone().unwrap_or_else(|| {
                match c.status {
                    CompileStatus::Timeout => "TimeoutError",
                    CompileStatus::Crashed => "CompilerCrashed",
                    _ => "CompilationError",
                }
                .to_string()
            });
            let text = c.error.clone().unwrap_or_else(|| c.feedback.clone());
            metadata.insert("compilation_error_name".into(), name.into());
            metadata.insert("compilation_error".into(), text.into());
        }
        (_, Some(Verdict::NoCode)) => {
            metadata.insert(
                "other_error".into(),
                "no code block with ModelNew in the model's answer".into(),
            );
        }
        (_, Some(Verdict::LlmError)) => {
            let err = r.llm_error.clone().unwrap_or_default();
            metadata.insert(
                "other_error".into(),
                format!("LLM request failed: {err}").into(),
            );
        }
        (_, v) => {
            let name = v.map_or("unknown", |v| v.as_str());
            metadata.insert("other_error".into(), name.into());
        }
    }
    json!({
        "sample_id": sample,
        "compiled": false,
        "correctness": false,
        "metadata": metadata,
        "runtime": -1.0,
        "runtime_stats": {},
    })
}

/// `eval_results.json` for the tasks of `level`: one entry per task (sample) that finished a turn,
/// chosen by `how`. Tasks with no finished turn are left out; KernelBench's analysis counts missing
/// problems as failed. Keys are problem ids as strings, lists sorted by sample id.
pub fn kernelbench_eval_results(
    level: u32,
    turns: &BTreeMap<TaskId, Vec<TurnRecord>>,
    how: Pick,
) -> Value {
    let mut out = Map::new();
    // TaskId orders by problem, then sample, so each list comes out sorted by sample id.
    for (task, records) in turns {
        if task.problem.level != level {
            continue;
        }
        let Some(r) = pick(records, how) else {
            continue;
        };
        let list = out
            .entry(task.problem.problem_id.to_string())
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(list) = list {
            list.push(entry(task.sample, r));
        }
    }
    Value::Object(out)
}
