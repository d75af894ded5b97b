//! Timing you can trust on a shared machine (issue 37, item 1): one device, one timer, across
//! krefine processes (a run whose device another process holds waits for it and says so; two real
//! `krefine run` processes on one machine never run candidates on the CPU device at once), and a
//! candidate whose timing is wild is evaluated again and flagged when it stays wild.
//!
//! Real workers on the CPU (the Python of `KREFINE_TEST_PYTHON`), pure-PyTorch candidates (nothing
//! to build), and a lock folder of the test's own (`KREFINE_LOCK_DIR`), shared by the processes of
//! one test only.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

mod cli_support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cli_support::{log_lines, python, s};

/// A one-problem experiment (vector add) whose candidate prints `krefine-trace enter NS PID` and
/// `krefine-trace leave NS PID` (the system clock in ns) around each forward; what a candidate
/// prints lands in its worker's log, so the runs' logs show whether two candidates ever ran at once.
/// `name` makes each experiment's candidate its own code (its own build) and tells its processes
/// apart (each run's sandbox numbers its processes from 1).
fn experiment(root: &Path, name: &str) -> PathBuf {
    let forward = format!(
        "print(f\"krefine-trace enter {{time.time_ns()}} {name}-{{os.getpid()}}\", flush=True)\n        \
         time.sleep(0.02)\n        out = a + b\n        \
         print(f\"krefine-trace leave {{time.time_ns()}} {name}-{{os.getpid()}}\", flush=True)\n        \
         return out\n"
    );
    experiment_with(root, name, &forward)
}

/// The experiment of [`experiment`] with `forward` as the candidate's forward body (indented by 8,
/// `os`, `time` and `torch` imported, `self.calls` counting the calls before this one).
fn experiment_with(root: &Path, name: &str, forward: &str) -> PathBuf {
    let probs = root.join(format!("{name}-problems"));
    std::fs::create_dir_all(&probs).unwrap();
    std::fs::write(
        probs.join("1_Add.py"),
        "import torch\nclass Model(torch.nn.Module):\n    def forward(self, a, b):\n        return a + b\n\
         def get_inputs():\n    return [torch.rand(4096), torch.rand(4096)]\n\
         def get_init_inputs():\n    return []\n",
    )
    .unwrap();
    let code = format!(
        "# {name}\nimport os\nimport time\nimport torch\n\n\nclass ModelNew(torch.nn.Module):\n    \
         def __init__(self):\n        super().__init__()\n        self.calls = 0\n\n    \
         def forward(self, a, b):\n        self.calls += 1\n        {forward}"
    );
    let mut answers = String::new();
    for turn in 1..=3 {
        let content = format!("```python\n{code}```");
        answers.push_str(
            &serde_json::json!({"problem": "1/1", "sample": 0, "turn": turn, "content": content})
                .to_string(),
        );
        answers.push('\n');
    }
    std::fs::write(root.join(format!("{name}-answers.jsonl")), answers).unwrap();
    let cfg = root.join(format!("{name}.toml"));
    std::fs::write(
        &cfg,
        format!(
            r#"[dataset]
path = "{probs}"
level = 1
[method]
kind = "refine"
turns = 3
feedback = "GE"
[model]
provider = "scripted"
answers = "{answers}"
[output]
dir = "{outdir}"
[resources]
devices = "cpu"
compile_workers = 1
python = "{python}"
[eval]
timing_trials = 100
warmup = 1
correct_trials = 3
"#,
            probs = probs.display(),
            answers = root.join(format!("{name}-answers.jsonl")).display(),
            python = python().display(),
            outdir = root.join("out").display(),
        ),
    )
    .unwrap();
    cfg
}

/// `krefine run` with the locks in `locks`; its stderr collected line by line as it comes.
fn start(cfg: &Path, out: &Path, locks: &Path) -> (Child, Arc<Mutex<String>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_krefine"))
        .args(["run", s(cfg), "--no-tui", "--out", s(out)])
        .env("KREFINE_LOCK_DIR", locks)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = Arc::new(Mutex::new(String::new()));
    let pipe = child.stderr.take().unwrap();
    let sink = err.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let mut e = sink.lock().unwrap();
            e.push_str(&line);
            e.push('\n');
        }
    });
    (child, err)
}

fn wait_ok(mut child: Child, err: &Mutex<String>) {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            // Let the reader take the last lines.
            std::thread::sleep(Duration::from_millis(100));
            assert!(status.success(), "{}", err.lock().unwrap());
            return;
        }
        assert!(Instant::now() < deadline, "the run did not end");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `(ns, enter?, pid)` of every forward's start and end in the run's worker logs.
fn traces(run: &Path) -> Vec<(u128, bool, String)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(run.join("logs/workers")) else {
        return out;
    };
    for e in dir.flatten() {
        let text = String::from_utf8_lossy(&std::fs::read(e.path()).unwrap()).into_owned();
        for line in text.lines() {
            let Some(rest) = line.split("krefine-trace ").nth(1) else {
                continue;
            };
            let parts: Vec<&str> = rest.split_whitespace().collect();
            if let [what, ns, pid] = parts[..] {
                out.push((ns.parse().unwrap(), what == "enter", pid.to_string()));
            }
        }
    }
    out
}

#[test]
fn a_run_waits_for_the_device_another_process_holds_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let locks = tmp.path().join("locks");
    let cfg = experiment(tmp.path(), "solo");
    // This test holds the CPU device's lock, as another krefine process timing on it would.
    let held =
        match krefine::lock::try_lock_device(&locks, "cpu", "pid 4242, run /elsewhere").unwrap() {
            krefine::lock::DeviceLockTry::Held(l) => l,
            krefine::lock::DeviceLockTry::Busy(by) => panic!("held by {by}"),
        };
    // `doctor` says who holds it.
    let doctor = Command::new(env!("CARGO_BIN_EXE_krefine"))
        .arg("doctor")
        .env("KREFINE_LOCK_DIR", &locks)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        said.contains("  cpu (cpu): in use by pid 4242, run /elsewhere"),
        "{said}"
    );
    let out = tmp.path().join("run");
    let (child, err) = start(&cfg, &out, &locks);
    let deadline = Instant::now() + Duration::from_secs(300);
    let said = "cpu is in use by another krefine process on this machine (pid 4242, run /elsewhere); waiting";
    while !err.lock().unwrap().contains(said) {
        assert!(
            Instant::now() < deadline,
            "never said it waits:\n{}",
            err.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // While the lock is held, no candidate runs.
    std::thread::sleep(Duration::from_millis(500));
    let log = log_lines(&out).join("\n");
    assert!(!log.contains("\"type\":\"lease_granted\""), "{log}");
    assert!(traces(&out).is_empty());
    let released = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    drop(held);
    wait_ok(child, &err);
    assert!(
        err.lock()
            .unwrap()
            .contains("cpu: the other krefine process let go; going on")
    );
    let log = log_lines(&out).join("\n");
    assert!(log.contains("\"reason\":\"finished\""), "{log}");
    assert!(log.contains("\"verdict\":\"correct\""), "{log}");
    // Every forward ran after the lock was let go.
    let t = traces(&out);
    assert!(!t.is_empty());
    assert!(t.iter().all(|(ns, _, _)| *ns > released), "{t:?}");
}

#[test]
fn two_krefine_processes_never_run_candidates_on_one_device_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let locks = tmp.path().join("locks");
    let (a_cfg, b_cfg) = (experiment(tmp.path(), "a"), experiment(tmp.path(), "b"));
    let (run_a, run_b) = (tmp.path().join("run-a"), tmp.path().join("run-b"));
    let (a, a_err) = start(&a_cfg, &run_a, &locks);
    let (b, b_err) = start(&b_cfg, &run_b, &locks);
    wait_ok(a, &a_err);
    wait_ok(b, &b_err);
    for (run, err) in [(&run_a, &a_err), (&run_b, &b_err)] {
        let log = log_lines(run).join("\n");
        assert!(
            log.contains("\"reason\":\"finished\""),
            "{}",
            err.lock().unwrap()
        );
        assert!(log.contains("\"verdict\":\"correct\""), "{log}");
    }
    // Every forward of both runs' candidates, in the order of the one system clock: each `enter`
    // is closed by its own process's `leave` before any other process enters.
    let mut all = traces(&run_a);
    let from_a = all.len();
    all.extend(traces(&run_b));
    assert!(
        from_a > 0 && all.len() > from_a,
        "both runs traced their candidates"
    );
    all.sort();
    let mut inside: Option<&str> = None;
    for (i, (ns, enter, pid)) in all.iter().enumerate() {
        match (enter, inside) {
            (true, None) => inside = Some(pid),
            (false, Some(p)) if p == pid => inside = None,
            _ => panic!(
                "forward {i} (pid {pid}, {} at {ns}) while pid {inside:?} was inside one: two \
                 candidates ran on the CPU at once",
                if *enter { "enter" } else { "leave" }
            ),
        }
    }
}

#[test]
fn a_wild_timing_is_evaluated_again_and_flagged_when_it_stays_wild() {
    let tmp = tempfile::tempdir().unwrap();
    let locks = tmp.path().join("locks");
    // Two calls of every three sleep: the median call is ~500x the fastest, every time.
    let cfg = experiment_with(
        tmp.path(),
        "wild",
        "if self.calls % 3:\n            time.sleep(0.005)\n        return a + b\n",
    );
    let out = tmp.path().join("run");
    let (child, err) = start(&cfg, &out, &locks);
    wait_ok(child, &err);
    let executed: Vec<serde_json::Value> = log_lines(&out)
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["event"]["type"] == "executed")
        .collect();
    assert_eq!(executed.len(), 3, "one evaluation recorded per turn");
    for r in &executed {
        let o = &r["event"]["outcome"];
        assert_eq!(o["verdict"], "correct", "{o}");
        // Evaluated twice more, then flagged.
        assert_eq!(o["metadata"]["timing_retimed"], 2, "{o}");
        let said = o["metadata"]["timing_unsteady"].as_str().unwrap();
        assert!(
            said.contains("the candidate's timing is unsteady"),
            "{said}"
        );
        assert!(
            o["feedback"].as_str().unwrap().contains("(Timing note: "),
            "{o}"
        );
    }
    // The report counts them.
    let report = std::process::Command::new(env!("CARGO_BIN_EXE_krefine"))
        .args(["report", s(&out)])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(
        text.contains("3 of 3 timed result(s) had an unsteady timing"),
        "{text}"
    );
}
