//! `krefine recheck` through the real binary. A run made with real CPU workers in faithful mode
//! credits a candidate that forges its time (tests/fixtures/strict/clock_forger_cpp.py) next to an
//! honest one; rechecked with `--set eval.mode=strict`, the forger is no longer credited (strict mode
//! rejects it), the honest one stays credited, the exit status is 1, and the run's directory is byte
//! for byte what it was. Runs with the simulated executor (its verdicts are what each candidate's
//! `# krefine-sim:` marker asks, so they take no workers) cover the rest: an unchanged recheck exits
//! 0, `--candidates all`, a run with nothing to recheck, a run with missing code, a torn log and
//! changed problems, and the inputs a recheck refuses. Verdicts, counts and fast_p only; no duration
//! is compared.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

mod cli_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cli_support::{cpu_refine_experiment, krefine, python, read_json, repo, s};
use serde_json::Value;

fn hostile(name: &str) -> String {
    std::fs::read_to_string(repo().join("tests/fixtures/hostile").join(name)).unwrap()
}

fn strict_fixture(name: &str) -> String {
    std::fs::read_to_string(repo().join("tests/fixtures/strict").join(name)).unwrap()
}

/// Every file under `dir` (relative path → bytes) and every folder: what must not change.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Option<Vec<u8>>>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            if p.is_dir() {
                out.insert(rel, None);
                walk(root, &p, out);
            } else {
                out.insert(rel, Some(std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn recheck(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_krefine"))
        .arg("recheck")
        .args(args)
        .output()
        .unwrap()
}

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}):\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

fn answers(list: &[(u32, u32, String)]) -> String {
    list.iter()
        .map(|(problem, turn, content)| {
            serde_json::json!({"problem": format!("1/{problem}"), "sample": 0, "turn": turn, "content": content})
                .to_string()
                + "\n"
        })
        .collect()
}

fn fenced(code: &str) -> String {
    format!("Here it is.\n```python\n{code}```\n")
}

/// The result for (problem, turn) in a recheck's JSON.
fn result<'a>(doc: &'a Value, problem: &str, turn: u64) -> &'a Value {
    doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["problem"] == problem && r["turn"] == turn)
        .unwrap_or_else(|| panic!("no result for {problem} turn {turn}: {doc:#}"))
}

fn changes(r: &Value) -> Vec<&str> {
    r["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect()
}

#[test]
fn a_strict_recheck_withdraws_a_forged_time_and_leaves_the_run_untouched() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let problems = root.join("problems");
    std::fs::create_dir_all(&problems).unwrap();
    std::fs::write(problems.join("1_Add.py"), hostile("problem_add.py")).unwrap();
    std::fs::write(
        root.join("answers.jsonl"),
        answers(&[
            (1, 1, fenced(&hostile("ok_cpp.py"))),
            (1, 2, fenced(&strict_fixture("clock_forger_cpp.py"))),
        ]),
    )
    .unwrap();
    let cfg = cpu_refine_experiment(root, &problems, &python(), 5);
    let run = root.join("runs/faithful");
    krefine(&["run", s(&cfg), "--no-tui", "--out", s(&run)]);
    // Faithful mode credits both, the forger at the tenfold speedup it wrote.
    let report = json_of(&krefine(&["report", s(&run), "--format", "json"]));
    assert_eq!(report["turns"][1]["verdicts"]["correct"], 1, "{report:#}");
    assert_eq!(report["turns"][0]["verdicts"]["correct"], 1, "{report:#}");
    let before = snapshot(&run);

    let out = root.join("runs/strict-recheck");
    let o = recheck(&[
        s(&run),
        "--set",
        "eval.mode=strict",
        "--format",
        "json",
        "--out",
        s(&out),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    let doc = json_of(&o);
    assert_eq!(doc["exit_status"], 1);
    assert_eq!(doc["candidates"], "correct");
    assert_eq!(doc["then"]["mode"], "faithful", "{doc:#}");
    assert_eq!(doc["now"]["mode"], "strict", "{doc:#}");
    let summary = &doc["summary"];
    assert_eq!(
        (
            &summary["selected"],
            &summary["rechecked"],
            &summary["no_longer_credited"],
            &summary["newly_credited"],
            &summary["not_rechecked"]
        ),
        (&2.into(), &2.into(), &1.into(), &0.into(), &0.into()),
        "{doc:#}"
    );
    let forger = result(&doc, "1/1", 2);
    assert!(
        changes(forger).contains(&"no_longer_credited"),
        "{forger:#}"
    );
    assert_eq!(forger["old"]["verdict"], "correct");
    assert!(forger["old"]["counted_speedup"].as_f64().unwrap() > 0.0);
    assert_eq!(forger["new"]["verdict"], "rejected", "{forger:#}");
    assert_eq!(forger["new"]["counted_speedup"], Value::Null);
    let found: Vec<(&str, &str)> = forger["new_findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["category"].as_str().unwrap(),
                f["severity"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(found, vec![("introspection", "error")], "{forger:#}");
    assert_eq!(forger["recheck_sample"], 1);
    // The honest candidate stands: correct then and now, timed both times.
    let honest = result(&doc, "1/1", 1);
    assert_eq!(honest["old"]["verdict"], "correct");
    assert_eq!(honest["new"]["verdict"], "correct", "{honest:#}");
    assert!(honest["new"]["counted_speedup"].as_f64().unwrap() > 0.0);
    let lost: Vec<&str> = changes(honest)
        .into_iter()
        .filter(|c| {
            matches!(
                *c,
                "no_longer_credited" | "newly_credited" | "speedup_no_longer_counted"
            )
        })
        .collect();
    assert!(lost.is_empty(), "{honest:#}");
    assert_eq!(honest["new_findings"], serde_json::json!([]));
    // The problem is still solved: fast_0 stays, one correct problem before and after.
    let fast = &doc["fast_p"];
    assert_eq!(fast["axis"], "turns");
    assert_eq!(fast["before"]["fast_p"]["0"], 1.0);
    assert_eq!(fast["after"]["fast_p"]["0"], 1.0);
    assert_eq!(
        (&fast["before"]["correct"], &fast["after"]["correct"]),
        (&1.into(), &1.into())
    );

    // Nothing in the run changed, and the recheck is a run `report` reads, with its document.
    assert!(snapshot(&run) == before, "the run directory changed");
    assert_eq!(doc["recheck_run"], s(&out));
    assert_eq!(read_json(&out.join("recheck.json")), doc);
    let report = json_of(&krefine(&["report", s(&out), "--format", "json"]));
    assert_eq!(report["method"], "sampling");
    assert_eq!(report["integrity"]["rejected"], 1, "{report:#}");
    assert_eq!(report["turns"][1]["correct"], 1, "{report:#}");
}

/// A simulated run: problem 1 has an honest x1.7 (turn 1), a forger that reads `sys.modules` at
/// x9 (turn 2) and a build that fails (turn 3); problem 2 an incorrect candidate (turn 1), an
/// honest x0.8 (turn 2) and an answer without code (turn 3). Returns the run directory.
fn simulated_run(root: &Path) -> PathBuf {
    let problems = root.join("problems");
    std::fs::create_dir_all(&problems).unwrap();
    for name in ["1_Add.py", "2_Add.py"] {
        std::fs::write(problems.join(name), hostile("problem_add.py")).unwrap();
    }
    // C++ kernels, so strict mode's static layer has nothing against the honest ones.
    let ok = hostile("ok_cpp.py");
    let sim = |marker: &str, extra: &str| fenced(&format!("# krefine-sim: {marker}\n{extra}{ok}"));
    let forger = "import sys\n_timing = sys.modules[\"kb_timing\"]\n";
    std::fs::write(
        root.join("answers.jsonl"),
        answers(&[
            (1, 1, sim("verdict=correct speedup=1.7", "")),
            (1, 2, sim("verdict=correct speedup=9", forger)),
            (1, 3, sim("compile=error", "")),
            (2, 1, sim("verdict=incorrect", "")),
            (2, 2, sim("verdict=correct speedup=0.8", "")),
            (2, 3, "I cannot improve on it.".into()),
        ]),
    )
    .unwrap();
    let cfg = root.join("sim.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[dataset]
path = "{}"
level = 1
[method]
kind = "refine"
turns = 3
feedback = "GE"
[model]
provider = "scripted"
answers = "{}"
[eval]
executor = "simulated"
"#,
            problems.display(),
            root.join("answers.jsonl").display()
        ),
    )
    .unwrap();
    let run = root.join("runs/sim");
    krefine(&["run", s(&cfg), "--no-tui", "--out", s(&run)]);
    run
}

#[test]
fn simulated_rechecks_report_changes_counts_and_fast_p() {
    let tmp = tempfile::tempdir().unwrap();
    let run = simulated_run(tmp.path());
    let before = snapshot(&run);

    // The same settings: nothing changes; exit status 0.
    let o = recheck(&[s(&run)]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        text.contains("candidates: the correct ones (3 taken)"),
        "{text}"
    );
    assert!(
        text.contains("summary: 3 rechecked, 3 unchanged, 0 no longer credited"),
        "{text}"
    );
    assert!(!text.contains("changed:"), "{text}");
    assert!(
        text.ends_with("every credited result stands (exit status 0)\n"),
        "{text}"
    );
    // The default directory sits beside the run.
    let beside: Vec<String> = std::fs::read_dir(run.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("sim-recheck-"))
        .collect();
    assert_eq!(beside.len(), 1, "{beside:?}");

    // Strict: the forger is rejected by the static layer; the honest ones stand.
    let o = recheck(&[
        s(&run),
        "--set",
        "eval.mode=strict",
        "--format",
        "json",
        "--out",
        s(&tmp.path().join("strict")),
    ]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let doc = json_of(&o);
    let forger = result(&doc, "1/1", 2);
    assert_eq!(
        changes(forger),
        vec!["no_longer_credited", "findings_changed"]
    );
    assert_eq!(
        forger["new"]["reason"].as_str().unwrap().split(':').next(),
        Some("introspection")
    );
    for (problem, turn) in [("1/1", 1), ("1/2", 2)] {
        assert_eq!(
            changes(result(&doc, problem, turn)),
            Vec::<&str>::new(),
            "{doc:#}"
        );
    }
    let (b, a) = (&doc["fast_p"]["before"], &doc["fast_p"]["after"]);
    // Problem 1's best was the forged x9 and is x1.7 now; problem 2's x0.8 is unchanged.
    assert_eq!(
        (&b["fast_p"]["2"], &a["fast_p"]["2"]),
        (&0.5.into(), &0.0.into())
    );
    assert_eq!(
        (&b["fast_p"]["1.5"], &a["fast_p"]["1.5"]),
        (&0.5.into(), &0.5.into())
    );
    assert_eq!(
        (&b["fast_p"]["1.2"], &a["fast_p"]["1.2"]),
        (&0.5.into(), &0.5.into())
    );
    assert_eq!((&b["correct"], &a["correct"]), (&2.into(), &2.into()));
    assert_eq!(doc["summary"]["credit_lost"], 1);

    // All candidates with a verdict: the failed ones too, never the answer without code.
    let o = recheck(&[
        s(&run),
        "--candidates",
        "all",
        "--format",
        "json",
        "--out",
        s(&tmp.path().join("all")),
    ]);
    assert_eq!(o.status.code(), Some(0));
    let doc = json_of(&o);
    let taken: Vec<(String, u64)> = doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["problem"].as_str().unwrap().to_string(),
                r["turn"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, u64)> = [("1/1", 1), ("1/1", 2), ("1/1", 3), ("1/2", 1), ("1/2", 2)]
        .iter()
        .map(|(p, t)| (p.to_string(), *t))
        .collect();
    assert_eq!(taken, want);
    assert_eq!(doc["summary"]["unchanged"], 5, "{doc:#}");
    assert_eq!(result(&doc, "1/1", 3)["new"]["verdict"], "compile_error");
    assert!(snapshot(&run) == before, "the run directory changed");

    // A damaged copy: one candidate's code gone from the log and its kernel file deleted, another's
    // kernel file edited, the problems edited since, and a torn last line.
    let copy = tmp.path().join("runs/damaged");
    copy_dir(&run, &copy);
    let log = std::fs::read_to_string(copy.join("events.jsonl")).unwrap();
    let mut lines: Vec<String> = Vec::new();
    for line in log.lines() {
        let mut v: Value = serde_json::from_str(line).unwrap();
        if v["task"] == "1/2/0" && v["event"]["type"] == "llm_answered" && v["event"]["turn"] == 2 {
            // A log folds only with code for a built turn; a log stripped of it has it blank.
            v["event"]["code"] = "".into();
        }
        lines.push(v.to_string());
    }
    std::fs::write(
        copy.join("events.jsonl"),
        lines.join("\n") + "\n{\"v\":2,\"seq\":99",
    )
    .unwrap();
    std::fs::remove_file(copy.join("kernels/level_1_problem_2_sample_0_turn_2_kernel.py")).unwrap();
    let edited = copy.join("kernels/level_1_problem_1_sample_0_turn_1_kernel.py");
    std::fs::write(&edited, "# edited\n").unwrap();
    let problem = tmp.path().join("problems/2_Add.py");
    std::fs::write(&problem, hostile("problem_add.py") + "\n# edited\n").unwrap();
    let damaged = snapshot(&copy);
    let o = recheck(&[s(&copy), "--out", s(&tmp.path().join("damaged-recheck"))]);
    let text = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{text}\n{stderr}");
    assert!(stderr.contains("dropped a torn last line"), "{stderr}");
    for want in [
        "level 1 problem 2 (2_Add.py), sample 0 turn 2: not rechecked: its code is missing: the code the log records is blank and kernels/level_1_problem_2_sample_0_turn_2_kernel.py is missing",
        "level 1 problem 1 (1_Add.py), sample 0 turn 1: kernels/level_1_problem_1_sample_0_turn_1_kernel.py differs from the code the log records (edited after the run?); rechecked the log's code",
        "differ from those the run used",
        "dropped a torn last line",
        "summary: 2 rechecked, 2 unchanged, 0 no longer credited",
        ", 1 not rechecked",
        "1 candidate(s) could not be rechecked (exit status 2; see notes)",
    ] {
        assert!(text.contains(want), "{want}\n{text}");
    }
    assert!(
        snapshot(&copy) == damaged,
        "the damaged run directory changed"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn recheck_refuses_what_it_cannot_recheck() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let run = simulated_run(root);
    let refused = |args: &[&str], want: &str| {
        let o = recheck(args);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(want),
            "{args:?}: wanted {want:?} in\n{stderr}"
        );
        assert!(o.stdout.is_empty(), "{args:?}");
    };
    let missing = root.join("nothing");
    refused(&[s(&missing)], "nothing: no such directory");
    refused(&[s(&root.join("sim.toml"))], "sim.toml is not a directory");
    refused(
        &[s(&root.join("problems"))],
        "is not a run directory (no events.jsonl)",
    );
    // The fixture run has a log and no frozen config.
    let bare = repo().join("tests/fixtures/runs/quickstart-sim");
    refused(&[s(&bare)], "quickstart-sim/config.toml: cannot read it");
    // A malformed line in the middle of the log.
    let bad = root.join("runs/bad");
    copy_dir(&run, &bad);
    let log = std::fs::read_to_string(bad.join("events.jsonl")).unwrap();
    let mut lines: Vec<&str> = log.lines().collect();
    lines[2] = "{\"v\": 2, \"seq\": ";
    std::fs::write(bad.join("events.jsonl"), lines.join("\n") + "\n").unwrap();
    refused(&[s(&bad)], "events.jsonl:3: not an event record");
    // A frozen config this krefine cannot read.
    let foreign = root.join("runs/foreign");
    copy_dir(&run, &foreign);
    let cfg = std::fs::read_to_string(foreign.join("config.toml")).unwrap();
    std::fs::write(foreign.join("config.toml"), cfg + "\n[unknown]\nx = 1\n").unwrap();
    refused(
        &[s(&foreign)],
        "config.toml is not a config this krefine reads",
    );
    // Options.
    refused(
        &[s(&run), "--out", s(&run.join("x"))],
        "lies inside the run directory",
    );
    refused(
        &[s(&run), "--set", "method.turns=5"],
        "--set method.turns=5: a recheck takes",
    );
    refused(
        &[s(&run), "--speedup-tolerance=-1"],
        "--speedup-tolerance -1: expected a fraction",
    );
    refused(
        &[s(&run), "--speedup-tolerance=nan"],
        "--speedup-tolerance NaN: expected a fraction",
    );
    let inside = format!("eval.build_cache=\"{}\"", run.join("cache").display());
    refused(&[s(&run), "--set", &inside], "eval.build_cache = ");
    let gone = root.join("elsewhere");
    std::fs::rename(root.join("problems"), &gone).unwrap();
    refused(&[s(&run)], "cannot find the run's problems: tried ");
    // ... and found again with --dataset; nothing half-made is left by the refusals.
    let o = recheck(&[
        s(&run),
        "--dataset",
        s(&gone),
        "--out",
        s(&root.join("found")),
    ]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let left: Vec<String> = std::fs::read_dir(run.parent().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("recheck"))
        .collect();
    assert_eq!(left, Vec::<String>::new());
}

#[test]
fn a_run_without_correct_candidates_has_nothing_to_recheck() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let problems = root.join("problems");
    std::fs::create_dir_all(&problems).unwrap();
    std::fs::write(problems.join("1_Add.py"), hostile("problem_add.py")).unwrap();
    let wrong = fenced("# krefine-sim: verdict=incorrect\nx = 1\n");
    std::fs::write(root.join("answers.jsonl"), answers(&[(1, 1, wrong)])).unwrap();
    let cfg = root.join("one.toml");
    std::fs::write(
        &cfg,
        format!(
            "[dataset]\npath = \"{}\"\n[method]\nkind = \"one_shot\"\n[model]\nprovider = \"scripted\"\nanswers = \"{}\"\n[eval]\nexecutor = \"simulated\"\n",
            problems.display(),
            root.join("answers.jsonl").display()
        ),
    )
    .unwrap();
    let run = root.join("runs/one");
    krefine(&["run", s(&cfg), "--no-tui", "--out", s(&run)]);
    let o = recheck(&[s(&run), "--format", "json"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let doc = json_of(&o);
    assert_eq!(doc["recheck_run"], Value::Null);
    assert_eq!(doc["results"], serde_json::json!([]));
    assert_eq!(
        doc["notes"],
        serde_json::json!([
            "nothing to recheck: the run has no correct candidate (--candidates all takes the others)"
        ])
    );
    assert_eq!(doc["fast_p"]["axis"], "one_shot");
    assert_eq!(doc["fast_p"]["before"], doc["fast_p"]["after"]);
    // Nothing was evaluated, so no directory was made beside the run.
    let beside: Vec<_> = std::fs::read_dir(root.join("runs"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(beside.len(), 1);
    // --candidates all takes the incorrect one.
    let o = recheck(&[s(&run), "--candidates", "all", "--format", "json"]);
    assert_eq!(o.status.code(), Some(0));
    let doc = json_of(&o);
    assert_eq!(doc["summary"]["unchanged"], 1, "{doc:#}");
    assert_eq!(result(&doc, "1/1", 1)["new"]["verdict"], "incorrect");
}
