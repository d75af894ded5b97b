//! `report.fast_p` through real files: a run whose config sets it is reported at those thresholds
//! (the frozen config carries them), `--fast-p` overrides them, several runs show every threshold
//! any of them set, and a bad value names the file and the key.
//!
//! Uses the real binary, the scripted LLM and the simulated executor.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn krefine(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_krefine"))
        .args(args)
        .output()
        .expect("run krefine")
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Two problems, one turn each: a correct candidate at 1.3x and one at 2.5x. The config, whose
/// `[report]` section is `report`.
fn fixture(root: &Path, report: &str) -> PathBuf {
    let probs = root.join("problems");
    std::fs::create_dir_all(&probs).unwrap();
    let mut answers = String::new();
    for (id, speedup) in [(1, 1.3), (2, 2.5)] {
        std::fs::write(
            probs.join(format!("{id}_P{id}.py")),
            "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\ndef get_inputs():\n    return [torch.rand(4)]\ndef get_init_inputs():\n    return []\n",
        )
        .unwrap();
        let content = format!(
            "```python\n# krefine-sim: verdict=correct speedup={speedup}\nclass ModelNew: pass\n```"
        );
        answers.push_str(
            &serde_json::json!({"problem": format!("1/{id}"), "sample": 0, "turn": 1, "content": content})
                .to_string(),
        );
        answers.push('\n');
    }
    std::fs::write(root.join("answers.jsonl"), answers).unwrap();
    let cfg = root.join("exp.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[dataset]
path = "{}"
[method]
kind = "refine"
turns = 1
feedback = "GE"
[model]
provider = "scripted"
answers = "{}"
[resources]
devices = "cpu"
[eval]
executor = "simulated"
[eval.simulated]
compile_s = 0.01
execute_min_s = 0.01
execute_max_s = 0.02
{report}
"#,
            probs.display(),
            root.join("answers.jsonl").display()
        ),
    )
    .unwrap();
    cfg
}

fn run(cfg: &Path, out: &Path, sets: &[&str]) -> Output {
    let mut args = vec!["run", s(cfg), "--no-tui", "--out", s(out)];
    for set in sets {
        args.extend(["--set", set]);
    }
    krefine(&args)
}

#[test]
fn a_runs_configured_thresholds_are_what_its_report_shows() {
    let d = tempfile::tempdir().unwrap();
    let cfg = fixture(d.path(), "[report]\nfast_p = [1.7, 3]");
    let a = d.path().join("a");
    ok(run(&cfg, &a, &[]));
    let mut frozen: toml::Table =
        toml::from_str(&std::fs::read_to_string(a.join("config.toml")).unwrap()).unwrap();
    assert_eq!(
        frozen["report"]["fast_p"],
        toml::Value::Array(vec![1.7.into(), 3.0.into()])
    );

    let out = ok(krefine(&["report", s(&a)]));
    assert!(out.contains("fast_2  fast_1.7  fast_3  geomean"), "{out}");
    assert!(
        out.contains("exp: fast_1.7 50.0%, fast_3 0.0% (all candidates"),
        "{out}"
    );
    assert!(!out.contains("fast_1.2"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&ok(krefine(&["report", s(&a), "--format", "json"]))).unwrap();
    assert_eq!(
        v["turns"][0]["fast_p_extra"],
        serde_json::json!({"1.7": 0.5, "3": 0.0})
    );

    // The command line wins, empty included.
    let out = ok(krefine(&["report", s(&a), "--fast-p", "1.2"]));
    assert!(
        out.contains("exp: fast_1.2 100.0% (all candidates"),
        "{out}"
    );
    assert!(!out.contains("fast_1.7"), "{out}");
    let out = ok(krefine(&["report", s(&a), "--fast-p", ""]));
    assert!(
        !out.contains("fast_1.7") && !out.contains("fast_1.2"),
        "{out}"
    );

    // A run without the key shows Fast@1.2; with another, every threshold any run set, in order.
    let b = d.path().join("b");
    let cfg_b = fixture(&d.path().join("other"), "");
    ok(run(&cfg_b, &b, &[]));
    let out = ok(krefine(&["report", s(&b)]));
    assert!(
        out.contains("exp: fast_1.2 100.0% (all candidates"),
        "{out}"
    );
    let csv = ok(krefine(&[
        "compare",
        s(&a),
        s(&b),
        "--format",
        "csv",
        "--resamples",
        "0",
    ]));
    let header = csv.lines().next().unwrap();
    assert!(header.ends_with(",fast_1.2,fast_1.7,fast_3"), "{header}");

    // A hand-edited frozen config with a bad value: the error names the file and the key, and
    // `--fast-p` still reports the run.
    frozen["report"]["fast_p"] = toml::Value::Array(vec![3.0.into(), 1.7.into()]);
    std::fs::write(a.join("config.toml"), toml::to_string(&frozen).unwrap()).unwrap();
    let o = krefine(&["report", s(&a)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains(&format!(
            "{}: key `report.fast_p`: expected thresholds in increasing order, each once; 3 then 1.7 is out of order",
            a.join("config.toml").display()
        )),
        "{err}"
    );
    ok(krefine(&["report", s(&a), "--fast-p", "1.2"]));
}

#[test]
fn a_bad_threshold_in_the_config_stops_the_run_before_it_starts() {
    let d = tempfile::tempdir().unwrap();
    let cfg = fixture(d.path(), "[report]\nfast_p = [1.2, -1]");
    let out = d.path().join("run");
    let o = run(&cfg, &out, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains(
            "key `report.fast_p`: expected speedup thresholds >= 0, like 1.2 or 3; entry 2 is -1"
        ),
        "{err}"
    );
    assert!(!out.join("events.jsonl").exists());
    let o = run(&cfg, &out, &["report.fast_p=[1.5, 1.5]"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("1.5 then 1.5 is twice"), "{err}");
}
