//! What the tests that drive the `krefine` binary on CPU share: the repository, the workers' Python,
//! running the binary (a failure panics with its output), and small file helpers.
#![allow(dead_code, reason = "each test binary uses its own part")]
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

pub mod tmux;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Python with torch for workers (`KREFINE_TEST_PYTHON`, else the repository's `.venv`). A
/// missing one fails loudly: a silently skipped worker test proves nothing.
pub fn python() -> PathBuf {
    let p = std::env::var_os("KREFINE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".venv/bin/python"));
    assert!(
        p.exists(),
        "no Python with torch at {}; set KREFINE_TEST_PYTHON",
        p.display()
    );
    p
}

pub fn krefine(args: &[&str]) -> Output {
    let o = Command::new(env!("CARGO_BIN_EXE_krefine"))
        .args(args)
        .output()
        .expect("run krefine");
    if !o.status.success() {
        panic!(
            "krefine {args:?} failed ({}):\n{}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    o
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

pub fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// A small simulated experiment under `root/exp/` whose config names its inputs by relative paths
/// (`problems`, `answers.jsonl`): `problems` problems (`1_P1.py`, ...) x `turns` turns of G+E+P
/// refinement, scripted answers that are all correct, the simulated executor on the CPU. Returns
/// the config file.
pub fn sim_experiment(root: &Path, problems: u32, turns: u32) -> PathBuf {
    let exp = root.join("exp");
    let probs = exp.join("problems");
    std::fs::create_dir_all(&probs).unwrap();
    let mut answers = String::new();
    for id in 1..=problems {
        std::fs::write(
            probs.join(format!("{id}_P{id}.py")),
            format!(
                "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + {id}\ndef get_inputs():\n    return [torch.rand(4)]\ndef get_init_inputs():\n    return []\n"
            ),
        )
        .unwrap();
        for turn in 1..=turns {
            let content = format!(
                "```python\n# krefine-sim: verdict=correct speedup=1.{turn}\nclass ModelNew: pass\n```"
            );
            answers.push_str(
                &serde_json::json!({"problem": format!("1/{id}"), "sample": 0, "turn": turn, "content": content})
                    .to_string(),
            );
            answers.push('\n');
        }
    }
    std::fs::write(exp.join("answers.jsonl"), answers).unwrap();
    let cfg = exp.join("sim.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[dataset]
path = "problems"
level = 1
[method]
kind = "refine"
turns = {turns}
feedback = "GEP"
[model]
provider = "scripted"
answers = "answers.jsonl"
[resources]
devices = "cpu"
compile_workers = 2
[eval]
executor = "simulated"
[eval.simulated]
compile_s = 0.01
execute_min_s = 0.01
execute_max_s = 0.02
profile_s = 0.01
"#
        ),
    )
    .unwrap();
    cfg
}

/// `krefine ARGS` run in `cwd`, whatever its exit status.
pub fn krefine_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_krefine"))
        .current_dir(cwd)
        .args(args)
        .output()
        .expect("run krefine")
}

/// The log's lines, as written.
pub fn log_lines(run: &Path) -> Vec<String> {
    std::fs::read_to_string(run.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A two-turn refine experiment on the CPU: the problems in `problems` (a folder), the scripted
/// answers in `<root>/answers.jsonl`, the workers' `python`, and the worker tests' build cache
/// (builds are content-addressed: it holds ok_cpp.py already when they ran first). Written to
/// `<root>/exp.toml`, whose path is returned.
pub fn cpu_refine_experiment(
    root: &Path,
    problems: &Path,
    python: &Path,
    timing_trials: u32,
) -> PathBuf {
    let cache = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("worker-hostile/build-cache");
    let cfg = root.join("exp.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[dataset]
path = "{}"
level = 1
[method]
kind = "refine"
turns = 2
feedback = "GE"
[model]
provider = "scripted"
answers = "{}"
[resources]
devices = "cpu"
compile_workers = 1
python = "{}"
[eval]
correct_trials = 2
timing_trials = {timing_trials}
warmup = 1
build_cache = "{}"
"#,
            problems.display(),
            root.join("answers.jsonl").display(),
            python.display(),
            cache.display()
        ),
    )
    .unwrap();
    cfg
}
