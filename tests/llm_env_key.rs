//! The factory path end to end: a config names the key's environment variable, the key reaches the
//! server, and it reaches nothing else.
//!
//! Alone in its own test binary because it sets an environment variable, which is only sound while
//! no other thread reads the environment.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::HeaderMap;
use axum::routing::post;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use krefine::config;
use krefine::llm;
use krefine::services::EventSink;
use krefine::types::{ChatMessage, LlmRequest, Role};

#[test]
#[allow(
    unsafe_code,
    reason = "std::env::set_var is unsafe: it runs before any other thread"
)]
fn key_from_the_named_variable_reaches_only_the_server() {
    let var = format!("KREFINE_TEST_ENV_KEY_{}", std::process::id());
    let key = format!("sk-env-{}-secret", std::process::id());
    // SAFETY: this binary has this one test, and it sets the variable before starting any thread
    // of its own.
    unsafe { std::env::set_var(&var, &key) };

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let log = seen.clone();
        let app = Router::new().route(
            "/v1/chat/completions",
            post(move |headers: HeaderMap| async move {
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                log.lock().unwrap().push(auth);
                axum::Json(serde_json::json!({
                    "choices": [{"message": {"content": "```python\nclass ModelNew: pass\n```"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1000, "completion_tokens": 2000}
                }))
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });

        let text = format!(
            r#"
[dataset]
path = "problems"
[model]
provider = "openai"
name = "m"
base_url = "http://{addr}/v1"
api_key_env = "{var}"
backoff_base_s = 0.01
[model.prices.m]
prompt = 1.0
completion = 3.0
[budget]
usd = 0.007
"#
        );
        let cfg = config::parse(&text, std::path::Path::new("exp.toml"), &[]).unwrap();
        let described = llm::describe_endpoint(&cfg.llm_parts());
        assert_eq!(
            described,
            format!("openai: model \"m\" at http://{addr}/v1; API key from ${var} (set)")
        );

        let (llm, ledger) = llm::build_with_ledger(&cfg.llm_parts(), None, CancellationToken::new()).unwrap();
        let (tx, mut rx) = mpsc::channel(krefine::services::SINK_CAPACITY);
        let sink = EventSink::new(tx);
        let req = LlmRequest {
            task: "1/1/0".parse().unwrap(),
            turn: 1,
            messages: vec![ChatMessage {
                role: Role::User,
                content: "go".into(),
            }],
        };
        let a = llm.complete(req.clone(), &sink).await.unwrap();
        // 1000 * 1 / 1e6 + 2000 * 3 / 1e6
        assert!((a.cost_usd.unwrap() - 0.007).abs() < 1e-12);
        assert_eq!(ledger.totals().tokens(), 3000);
        let e = llm.complete(req, &sink).await.unwrap_err().to_string();
        assert!(e.starts_with("budget exhausted: $0.007000 spent"), "{e}");

        assert_eq!(*seen.lock().unwrap(), vec![format!("Bearer {key}")]);
        let mut texts = vec![described, e, format!("{:?}", a)];
        while let Ok((_, event)) = rx.try_recv() {
            texts.push(serde_json::to_string(&event).unwrap());
        }
        assert!(texts.len() >= 5, "{texts:?}");
        for t in texts {
            assert!(!t.contains(&key), "API key leaked into {t}");
        }
    });
}
