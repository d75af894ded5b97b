//! No build is paid twice (issue 36): `krefine eval` of the same candidates a second time, on the same
//! build cache, builds nothing, failures included. Real workers build real `load_inline` extensions
//! (tiny ones, through the C API, so the test stays quick); a build that fails in the candidate's own
//! code is answered from the cache the second time with the same error and feedback.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::path::Path;
use std::process::Command;

mod cli_support;

use cli_support::{python, repo, s};

/// An extension that builds in a second or so: the Python C API alone, no torch header.
fn tiny_extension(name: &str, body: &str) -> String {
    format!(
        r#"import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <Python.h>
{body}
static PyModuleDef def_ = {{PyModuleDef_HEAD_INIT, "{name}", nullptr, -1, nullptr}};
PyMODINIT_FUNC PyInit_{name}(void) {{ return PyModule_Create(&def_); }}
"""
ext = load_inline(name="{name}", cpp_sources=source, no_implicit_headers=True, verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.relu(x)
"#
    )
}

/// The `compiled` events of a run, in the order of the log.
fn compiled(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["event"]["type"] == "compiled")
        .collect()
}

fn eval(folder: &Path, out: &Path, cache: &Path) {
    let dataset = repo().join("configs/quickstart/problems");
    let sets = [
        format!("resources.python=\"{}\"", python().display()),
        "resources.devices=cpu".into(),
        "resources.compile_workers=2".into(),
        "eval.timing_trials=2".into(),
        "eval.warmup=1".into(),
        "eval.correct_trials=1".into(),
        format!("eval.build_cache=\"{}\"", cache.display()),
    ];
    let mut args = vec!["eval", s(folder), "--dataset", s(&dataset), "--out", s(out)];
    for set in &sets {
        args.extend(["--set", set.as_str()]);
    }
    let o = Command::new(env!("CARGO_BIN_EXE_krefine"))
        .args(&args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_second_run_builds_nothing_failures_included() {
    let d = tempfile::tempdir().unwrap();
    let folder = d.path().join("kb_run");
    std::fs::create_dir_all(&folder).unwrap();
    let candidates = [
        tiny_extension("krefine_replay_ok", "static int unused_ = 0;"),
        // The candidate's own code does not compile.
        tiny_extension("krefine_replay_broken", "static int broken_ = undeclared_name;"),
        // Nothing to build but the import.
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n".to_string(),
    ];
    for (i, code) in candidates.iter().enumerate() {
        std::fs::write(
            folder.join(format!("level_1_problem_2_sample_{i}_kernel.py")),
            code,
        )
        .unwrap();
    }
    let cache = d.path().join("build-cache");

    eval(&folder, &d.path().join("first"), &cache);
    let first = compiled(&d.path().join("first"));
    assert_eq!(first.len(), 3, "{first:#?}");
    let built = |e: &serde_json::Value| e["event"]["outcome"]["cached"] == false;
    assert!(
        first.iter().all(built),
        "a cold cache builds all: {first:#?}"
    );
    let failed: Vec<_> = first
        .iter()
        .filter(|e| e["event"]["outcome"]["status"] == "error")
        .collect();
    assert_eq!(failed.len(), 1, "{first:#?}");
    let feedback = failed[0]["event"]["outcome"]["feedback"].as_str().unwrap();
    assert!(feedback.contains("undeclared_name"), "{feedback}");

    eval(&folder, &d.path().join("second"), &cache);
    let second = compiled(&d.path().join("second"));
    assert_eq!(second.len(), 3, "{second:#?}");
    for e in &second {
        let o = &e["event"]["outcome"];
        assert_eq!(o["cached"], true, "built again: {e:#}");
        assert!(
            o.get("cpu").is_none(),
            "a cached outcome ran no build: {e:#}"
        );
    }
    // The failure is replayed as it was: verdict, error and feedback.
    let by_task = |events: &[serde_json::Value], status: &str| -> Vec<(String, String, String)> {
        let mut v: Vec<_> = events
            .iter()
            .filter(|e| e["event"]["outcome"]["status"] == status)
            .map(|e| {
                let o = &e["event"]["outcome"];
                (
                    e["task"].as_str().unwrap().to_string(),
                    format!("{} {}", o["error_name"], o["error"]),
                    o["feedback"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(by_task(&first, "error"), by_task(&second, "error"));
    assert_eq!(by_task(&first, "ok"), by_task(&second, "ok"));
    // Its log says where it came from, then repeats the first build's log.
    let log_of = |run: &str, e: &serde_json::Value| {
        let path = e["event"]["outcome"]["log_path"].as_str().unwrap();
        std::fs::read_to_string(d.path().join(run).join(path)).unwrap()
    };
    let log = second
        .iter()
        .find(|e| e["event"]["outcome"]["status"] == "error")
        .map(|e| log_of("second", e))
        .unwrap();
    assert!(
        log.starts_with("krefine: identical failed build found"),
        "{log}"
    );
    assert!(
        log.ends_with(&format!(
            "----- original compile log -----\n{}",
            log_of("first", failed[0])
        )),
        "{log}"
    );
    assert!(
        failed[0]["event"]["outcome"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("undeclared_name")),
        "{failed:#?}"
    );
}
