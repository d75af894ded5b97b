//! Outages are not verdicts, and one run directory has one writer.
//!
//! - An LLM endpoint (a real HTTP server on 127.0.0.1) that answers 500 for longer than the retries
//!   leaves the tasks unfinished: the run ends "incomplete" with exit status 3, and `--resume` with
//!   the endpoint healthy evaluates every one of them.
//! - A second krefine process on a run directory that a live run holds is refused with the holder's
//!   pid; once the holder is killed (SIGKILL), its lock is gone and a resume proceeds.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_krefine")
}

#[derive(Clone)]
struct Flaky {
    calls: Arc<AtomicU32>,
    /// The first `failures` requests get a 500.
    failures: u32,
}

async fn chat(State(f): State<Flaky>, Json(_body): Json<Value>) -> Response {
    let n = f.calls.fetch_add(1, Ordering::SeqCst);
    if n < f.failures {
        return (StatusCode::INTERNAL_SERVER_ERROR, "down for maintenance").into_response();
    }
    let content =
        "```python\n# krefine-sim: verdict=correct speedup=1.5\nclass ModelNew: pass\n```";
    Json(json!({
        "id": "c", "object": "chat.completion", "created": 1, "model": "flaky",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    }))
    .into_response()
}

fn serve(failures: u32) -> (SocketAddr, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(Flaky {
            calls: calls.clone(),
            failures,
        });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    (rx.recv().unwrap(), calls)
}

fn problems(root: &Path, n: u32) -> PathBuf {
    let probs = root.join("problems");
    std::fs::create_dir_all(&probs).unwrap();
    for id in 1..=n {
        std::fs::write(
            probs.join(format!("{id}_P{id}.py")),
            "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\ndef get_inputs():\n    return [torch.rand(4)]\ndef get_init_inputs():\n    return []\n",
        )
        .unwrap();
    }
    probs
}

fn events(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("events.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn count(events: &[Value], kind: &str) -> usize {
    events.iter().filter(|e| e["event"]["type"] == kind).count()
}

#[test]
fn an_llm_outage_leaves_tasks_for_resume_not_verdicts() {
    // 4 samples, max_retries = 1: two attempts per task, so 8 failures exhaust every task's retries.
    let (addr, calls) = serve(8);
    let tmp = tempfile::tempdir().unwrap();
    let probs = problems(tmp.path(), 1);
    let cfg = tmp.path().join("outage.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[dataset]
path = "{}"
[method]
kind = "sampling"
k = 4
[model]
provider = "openai"
name = "flaky"
base_url = "http://{addr}/v1"
max_retries = 1
backoff_base_s = 0.01
backoff_max_s = 0.02
[resources]
devices = "cpu"
llm_concurrency = 4
[eval]
executor = "simulated"
"#,
            probs.display()
        ),
    )
    .unwrap();
    let out = tmp.path().join("run");
    let run = |resume: bool| {
        let mut c = Command::new(bin());
        c.arg("run")
            .arg(&cfg)
            .arg("--no-tui")
            .arg("--out")
            .arg(&out);
        if resume {
            c.arg("--resume");
        }
        c.output().unwrap()
    };

    let o = run(false);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("incomplete: 4 task(s) waiting on the LLM"),
        "{stderr}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 8);
    let ev = events(&out);
    assert_eq!(count(&ev, "deferred"), 4);
    assert_eq!(count(&ev, "llm_failed"), 0, "an outage is not a verdict");
    assert_eq!(count(&ev, "executed"), 0);
    assert!(
        ev.iter()
            .filter(|e| e["event"]["type"] == "deferred")
            .all(|e| e["event"]["waiting_on"] == "llm" && e["event"]["turn"] == 1)
    );
    let last = &ev.last().unwrap()["event"];
    assert_eq!(last["type"], "run_ended");
    assert_eq!(last["reason"], "incomplete: 4 task(s) waiting on the LLM");

    // The endpoint is healthy again: resume asks exactly once per waiting task.
    let o = run(true);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(calls.load(Ordering::SeqCst), 12);
    let ev = events(&out);
    assert_eq!(count(&ev, "llm_answered"), 4);
    assert_eq!(count(&ev, "executed"), 4, "4 of 4 samples evaluated");
    let r = Command::new(bin())
        .args(["report", "--format", "json"])
        .arg(&out)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&r.stdout).unwrap();
    let last = v["turns"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["fast_p"]["1"], 1.0, "{v}");
}

/// A slow scripted run: 3 problems x 3 turns, every build takes a while.
fn slow_fixture(root: &Path) -> PathBuf {
    let probs = problems(root, 3);
    let mut answers = String::new();
    for p in 1..=3 {
        for t in 1..=3 {
            let content =
                "```python\n# krefine-sim: verdict=correct speedup=1.2\nclass ModelNew: pass\n```";
            answers.push_str(
                &json!({"problem": format!("1/{p}"), "sample": 0, "turn": t, "content": content})
                    .to_string(),
            );
            answers.push('\n');
        }
    }
    std::fs::write(root.join("answers.jsonl"), answers).unwrap();
    let cfg = root.join("locked.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[dataset]
path = "{}"
[method]
kind = "refine"
turns = 3
feedback = "GE"
[model]
provider = "scripted"
answers = "{}"
[resources]
devices = "cpu"
compile_workers = 1
[eval]
executor = "simulated"
[eval.simulated]
compile_s = 0.5
"#,
            probs.display(),
            root.join("answers.jsonl").display()
        ),
    )
    .unwrap();
    cfg
}

#[test]
fn a_second_process_on_a_live_run_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = slow_fixture(tmp.path());
    let out = tmp.path().join("run");
    let krefine = |resume: bool| {
        let mut c = Command::new(bin());
        c.arg("run")
            .arg(&cfg)
            .arg("--no-tui")
            .arg("--out")
            .arg(&out);
        if resume {
            c.arg("--resume");
        }
        c
    };
    let mut first = krefine(false)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the first run is under way (its log has the opening record).
    let t = Instant::now();
    while !std::fs::read_to_string(out.join("events.jsonl"))
        .map(|s| s.contains("run_started"))
        .unwrap_or(false)
    {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the run never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = std::fs::read_to_string(out.join("events.jsonl")).unwrap();

    let second = krefine(true).output().unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "in use by another krefine process (pid {})",
            first.id()
        )),
        "{stderr}"
    );
    // A new run aimed at the same directory is refused the same way.
    let third = krefine(false).output().unwrap();
    assert_eq!(third.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&third.stderr).contains("in use by another krefine process"));
    let after = std::fs::read_to_string(out.join("events.jsonl")).unwrap();
    assert!(
        after.starts_with(&before),
        "the refused processes wrote nothing"
    );
    assert_eq!(after.matches("run_started").count(), 1);

    // A killed holder leaves no lock behind: the OS released it.
    first.kill().unwrap();
    first.wait().unwrap();
    let resumed = krefine(true).output().unwrap();
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert!(!out.join("krefine.pid").exists());
}
