//! Property tests of the parsers of text from outside: configs and `--set` values, JSONL datasets,
//! LLM answers (code extraction), submission keys and files, baseline JSON, worker protocol frames.
//! Properties: no panic on any input, and every error names where (the file, its line, the key).
//! `PROPTEST_CASES` sets the cases per target (64 by default; `scripts/fuzz` runs them at volume).
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

mod fuzz_support;

use std::path::Path;

use proptest::prelude::*;

use krefine::types::ProblemKey;

/// Text that looks like the input more often than random bytes do: fragments of the real syntax
/// mixed with arbitrary characters.
fn texty(fragments: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            3 => prop::sample::select(fragments).prop_map(str::to_string),
            1 => any::<String>(),
            1 => "[ -~\n]{0,12}",
        ],
        0..24,
    )
    .prop_map(|parts| parts.concat())
}

const TOML_BITS: &[&str] = &[
    "[method]\n",
    "kind = \"sampling\"\n",
    "k = 3\n",
    "[model]\n",
    "provider = \"scripted\"\n",
    "[dataset]\n",
    "level = 1\n",
    "problems = \"1-3\"\n",
    "[eval]\n",
    "mode = \"strict\"\n",
    "turns = ",
    "\"",
    "=",
    "\n",
    "[",
    "]",
    "{",
    "}",
    "1e999",
    "-1",
    "nan",
    "true",
    "[resources]\n",
    "compile_workers = 0\n",
    "devices = \"cpu\"\n",
    "[budget]\n",
    "usd = -3\n",
    "'''",
    "#",
];

const SET_KEYS: &[&str] = &[
    "method.kind",
    "method.k",
    "method.turns",
    "model.name",
    "model.temperature",
    "dataset.level",
    "dataset.problems",
    "eval.mode",
    "eval.timing_trials",
    "resources.devices",
    "resources.compile_workers",
    "resources.slurm.gpu_cpus",
    "budget.usd",
    "output.dir",
    "nope",
    "eval.hf.offline",
    "method.",
    ".x",
    "",
];

const SET_VALUES: &[&str] = &[
    "1",
    "0",
    "-1",
    "4294967296",
    "1.5",
    "nan",
    "inf",
    "true",
    "\"x\"",
    "\"",
    "[1,2]",
    "[",
    "{a=1}",
    "sampling",
    "\"sampling\"",
    "\"cpu\"",
    "=",
    "",
    " ",
    "\"1-3,5\"",
    "\"all\"",
    "1e400",
];

fn quickstart() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/quickstart.toml"))
        .unwrap()
}

proptest! {
    #![proptest_config(fuzz_support::config())]

    /// Any config text: parsed or refused with the file named.
    #[test]
    fn config_text(text in texty(TOML_BITS)) {
        let path = Path::new("/fuzz/cfg.toml");
        if let Err(e) = krefine::config::parse(&text, path, &[]) {
            let msg = format!("{e:#}");
            prop_assert!(msg.contains("cfg.toml"), "{msg}");
        }
    }

    /// `--set KEY=VALUE` on a valid config: applied or refused naming the key (or the file).
    #[test]
    fn config_sets(
        sets in prop::collection::vec(
            (prop::sample::select(SET_KEYS), prop::sample::select(SET_VALUES), any::<bool>()),
            0..4,
        )
    ) {
        let sets: Vec<String> = sets
            .iter()
            .map(|(k, v, eq)| if *eq { format!("{k}={v}") } else { format!("{k}{v}") })
            .collect();
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/quickstart.toml");
        if let Err(e) = krefine::config::parse(&quickstart(), &path, &sets) {
            let msg = format!("{e:#}");
            let named = sets.iter().any(|s| {
                let key = s.split('=').next().unwrap_or(s);
                !key.is_empty() && msg.contains(key)
            });
            prop_assert!(named || msg.contains("--set") || msg.contains("quickstart.toml"), "{msg} {sets:?}");
        }
    }

    /// Problem selections (`dataset.problems`): parsed or refused, never a panic.
    #[test]
    fn problem_selection(s in texty(&["1", "-", ",", "all", " ", "0", "4294967296", "3-1", "x"])) {
        let _ = krefine::dataset::parse_selection(&s);
    }

    /// A JSONL dataset of arbitrary lines: loaded, or refused naming the file and a line it has.
    #[test]
    fn dataset_jsonl(lines in prop::collection::vec(
        prop_oneof![
            2 => (0u32..6, 0u32..40, "[a-z_]{0,8}", any::<String>()).prop_map(|(l, p, n, c)| {
                serde_json::json!({"level": l, "problem_id": p, "name": n, "code": c}).to_string()
            }),
            1 => texty(&["{", "}", "\"level\":", "1", ",", "\"problem_id\":", "\"code\":", "\"name\":", "\"x\"", "null"]),
        ],
        0..8,
    )) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("set.jsonl");
        let text = lines.join("\n");
        std::fs::write(&path, &text).unwrap();
        if let Err(e) = krefine::dataset::load(&path, 1, "all") {
            let msg = e.to_string();
            if let krefine::dataset::DatasetError::BadLine { line, .. } = &e {
                prop_assert!(*line >= 1 && *line <= text.lines().count().max(1), "{msg}");
                prop_assert!(msg.contains(&format!("set.jsonl:{line}:")), "{msg}");
            }
        }
    }

    /// LLM answers: code extraction never panics, and a single fenced block gives its code.
    #[test]
    fn extract_code(
        answer in texty(&["```", "```python\n", "```py\n", "\n", "<think>", "</think>", "class ModelNew", "~~~", "`", " "]),
        code in "[a-zA-Z0-9_ =()+.\n]{1,60}",
    ) {
        let _ = krefine::llm::extract::extract_code(&answer);
        let code = code.trim().to_string();
        prop_assume!(!code.is_empty());
        let single = format!("Here it is:\n```python\n{code}\n```\nDone.");
        prop_assert_eq!(krefine::llm::extract::extract_code(&single), Some(code));
    }

    /// Submission keys: arbitrary ones are parsed or refused; the keys krefine writes round-trip.
    #[test]
    fn sample_keys(key in texty(&["level_", "problem_", "sample_", "1", "_", "0", "99999999999", "-"]),
                   level in 1u32..5, problem_id in 0u32..1000, sample in 0u32..100) {
        let _ = krefine::interchange::parse_sample_key(&key);
        let p = ProblemKey { level, problem_id };
        let k = krefine::interchange::sample_key(p, sample);
        prop_assert_eq!(krefine::interchange::parse_sample_key(&k), Ok((p, sample)));
    }

    /// Submission files: any text parses into generations and problems, never a panic.
    #[test]
    fn submission_text(text in texty(&["{", "}", "\"metadata\":", "\"kernels\":", "{\"display_name\": \"x\"}", "\"level_1_problem_2_sample_0\":", "\"code\"", ",", "null", "[]", "1"])) {
        let _ = krefine::interchange::submission::parse(&text, Path::new("/fuzz/sub.json"));
    }

    /// Baseline JSON: loaded or refused with the file named.
    #[test]
    fn baseline_json(text in texty(&["{", "}", "\"level1\":", "\"1_x.py\":", "{\"mean\": 1.5, \"std\": 0.1, \"min\": 1, \"max\": 2, \"num_trials\": 3}", "\"mean\":", "-1", "1e999", ",", "null", "\"hardware\": \"H100\""])) {
        if let Err(e) = krefine::worker::BaselineTable::parse(Path::new("/fuzz/baseline.json"), &text) {
            let msg = e.to_string();
            prop_assert!(msg.contains("baseline.json"), "{msg}");
        }
    }

    /// Worker protocol frames: any line is a response or a reason, never a panic.
    #[test]
    fn protocol_frames(line in texty(&["{", "}", "\"id\":", "1", "\"ok\":", "true", "false", "\"result\":", "\"error\":", "{\"kind\": \"compile\"}", "\"status\": \"ok\"", ",", "null", "-1", "18446744073709551616"])) {
        let _ = krefine::worker::protocol::parse_response(&line);
    }
}
