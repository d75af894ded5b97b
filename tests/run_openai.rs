//! A whole refinement run against a real HTTP server on 127.0.0.1 that speaks the OpenAI protocol:
//! the run completes, token and cost totals are exact, a 500 is retried, and the API key is nowhere in
//! the run directory.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

const KEY: &str = "sk-test-e2e-4f1c9a7b2d";

#[derive(Clone)]
struct Fake {
    calls: Arc<AtomicU32>,
}

async fn chat(State(f): State<Fake>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    let n = f.calls.fetch_add(1, Ordering::SeqCst);
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {KEY}"))
    {
        return (StatusCode::UNAUTHORIZED, "bad key").into_response();
    }
    // The very first request fails once, to exercise a retry inside a real run.
    if n == 0 {
        return (StatusCode::INTERNAL_SERVER_ERROR, "try again").into_response();
    }
    let turn = body["messages"].as_array().map(|m| m.len()).unwrap_or(0);
    let content = format!(
        "Here is a faster version.\n```python\n# krefine-sim: verdict=correct speedup=1.{turn}\nclass ModelNew: pass\n```"
    );
    Json(json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "fake-model",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200}
    }))
    .into_response()
}

fn serve() -> (SocketAddr, Arc<AtomicU32>) {
    let calls = Arc::new(AtomicU32::new(0));
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(Fake {
            calls: calls.clone(),
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

fn write_fixture(root: &Path, addr: SocketAddr) -> std::path::PathBuf {
    let probs = root.join("problems");
    std::fs::create_dir_all(&probs).unwrap();
    for (id, name) in [(1, "Add"), (2, "Mul")] {
        std::fs::write(
            probs.join(format!("{id}_{name}.py")),
            "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\ndef get_inputs():\n    return [torch.rand(4)]\ndef get_init_inputs():\n    return []\n",
        )
        .unwrap();
    }
    let cfg = root.join("openai-e2e.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"[dataset]
path = "{}"
level = 1
[method]
kind = "refine"
turns = 3
feedback = "GEP"
history = "full"
[model]
provider = "openai"
name = "fake-model"
base_url = "http://{addr}/v1"
api_key_env = "KREFINE_E2E_KEY"
max_retries = 2
backoff_base_s = 0.05
backoff_max_s = 0.1
[model.prices."fake-model"]
prompt = 2.0
completion = 8.0
[resources]
devices = "cpu"
[eval]
executor = "simulated"
"#,
            probs.display()
        ),
    )
    .unwrap();
    cfg
}

fn files_containing(dir: &Path, needle: &str) -> Vec<String> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read(&p)
                .map(|b| String::from_utf8_lossy(&b).contains(needle))
                .unwrap_or(false)
            {
                hits.push(p.display().to_string());
            }
        }
    }
    hits
}

/// `krefine run CFG --no-tui --out OUT [extra...]` with the API key variable set to `key`.
fn krefine_run(cfg: &Path, out: &Path, key: &str, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_krefine"))
        .arg("run")
        .arg(cfg)
        .args(["--no-tui"])
        .args(extra)
        .arg("--out")
        .arg(out)
        .env("KREFINE_E2E_KEY", key)
        .output()
        .unwrap()
}

#[test]
fn refinement_run_against_an_openai_compatible_server() {
    let (addr, calls) = serve();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_fixture(tmp.path(), addr);
    let out = tmp.path().join("run");
    let o = krefine_run(&cfg, &out, KEY, &[]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    // 2 problems x 3 turns answered, plus the one failed first attempt.
    assert_eq!(calls.load(Ordering::SeqCst), 7);

    let r = Command::new(env!("CARGO_BIN_EXE_krefine"))
        .args(["report", "--format", "json"])
        .arg(&out)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&r.stdout).unwrap();
    let ledger = &v["ledger"];
    assert_eq!(ledger["tokens"]["prompt"], 6000, "{ledger}");
    assert_eq!(ledger["tokens"]["completion"], 1200, "{ledger}");
    // 6 answers x (1000 x $2 + 200 x $8) per million tokens = 6 x $0.0036.
    let cost = ledger["cost_usd"].as_f64().unwrap();
    assert!((cost - 0.0216).abs() < 1e-12, "{cost}");
    assert_eq!(ledger["llm_retries"], 1, "{ledger}");
    assert_eq!(v["turns"].as_array().unwrap().len(), 3);
    assert_eq!(v["turns"][2]["fast_p"]["1"], 1.0, "{v}");

    // Every attempt is logged, before the closing record.
    let log = std::fs::read_to_string(out.join("events.jsonl")).unwrap();
    let types: Vec<String> = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["event"]["type"].to_string())
        .collect();
    assert_eq!(types.iter().filter(|t| *t == "\"llm_attempt\"").count(), 7);
    assert_eq!(types.last().map(String::as_str), Some("\"run_ended\""));

    assert_eq!(files_containing(&out, KEY), Vec::<String>::new());
    assert!(!stderr.contains(KEY));
}

#[test]
fn a_refused_key_stops_the_run_early() {
    let (addr, calls) = serve();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_fixture(tmp.path(), addr);
    let out = tmp.path().join("run");
    let o = krefine_run(&cfg, &out, "sk-wrong-key-000", &[]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("KREFINE_E2E_KEY"), "{stderr}");
    // The first request per task may be in flight when the 401 arrives; none retries after it.
    assert!(
        calls.load(Ordering::SeqCst) <= 3,
        "{}",
        calls.load(Ordering::SeqCst)
    );
    assert!(files_containing(&out, "sk-wrong-key-000").is_empty());
}

#[test]
fn a_token_budget_stops_the_run_and_counts_across_resumes() {
    let (addr, calls) = serve();
    let tmp = tempfile::tempdir().unwrap();
    let cfg = write_fixture(tmp.path(), addr);
    let out = tmp.path().join("run");
    let run = |resume: bool, budget: u64| {
        let set = format!("budget.tokens={budget}");
        let mut extra = vec!["--set", set.as_str()];
        if resume {
            extra.push("--resume");
        }
        krefine_run(&cfg, &out, KEY, &extra)
    };
    let answers = || {
        std::fs::read_to_string(out.join("events.jsonl"))
            .unwrap()
            .lines()
            .filter(|l| l.contains("\"type\":\"llm_answered\""))
            .count()
    };
    // Each answer is 1,200 tokens: the cap is reached after the second or third answer.
    let o = run(false, 2500);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let first = answers();
    assert!((2..=4).contains(&first), "{first} answers");
    let log = std::fs::read_to_string(out.join("events.jsonl")).unwrap();
    assert_eq!(log.matches("\"type\":\"budget_exhausted\"").count(), 1);
    assert!(
        log.contains("budget exhausted"),
        "the run's end names the budget"
    );

    // Resuming under the same cap spends nothing: earlier answers count against it.
    let before = calls.load(Ordering::SeqCst);
    let o = run(true, 2500);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        before,
        "no request may be sent"
    );
    assert_eq!(answers(), first);

    // A larger budget lets the run finish; no answer is requested twice.
    let o = run(true, 100_000);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(answers(), 6);
}
