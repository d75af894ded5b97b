//! The OpenAI-compatible provider against a scripted chat-completions server on 127.0.0.1.
//!
//! Each test scripts the server's replies (JSON or SSE, status codes, headers, delays), sends
//! requests through the provider wrapped in its ledger, and checks the answers, the attempt events,
//! the requests the server saw, the totals, and that the API key appears in no event.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use krefine::config::{BudgetSection, ModelSection, Price, ResourcesSection};
use krefine::llm::extract::extract_code;
use krefine::llm::metered::Metered;
use krefine::llm::openai::OpenAiLlm;
use krefine::llm::secret::ApiKey;
use krefine::llm::{Ledger, LedgerTotals};
use krefine::services::{EventSink, Llm, LlmError};
use krefine::types::{ChatMessage, Event, LlmAnswer, LlmRequest, Role, TaskId, Usage};

// ---------------------------------------------------------------------------------------------
// The scripted server

/// One reply of the fake server.
#[derive(Clone)]
enum Step {
    Json {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
        delay: Duration,
    },
    /// Server-sent events, each `data` payload sent `gap` after the previous one.
    Sse { data: Vec<String>, gap: Duration },
}

fn ok(content: &str, usage: Option<(u64, u64)>) -> Step {
    let mut body = json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "test-model-2026",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
    });
    if let Some((p, c)) = usage {
        body["usage"] = json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c});
    }
    Step::Json {
        status: 200,
        headers: vec![],
        body: body.to_string(),
        delay: Duration::ZERO,
    }
}

fn status(code: u16, body: &str) -> Step {
    Step::Json {
        status: code,
        headers: vec![],
        body: body.to_string(),
        delay: Duration::ZERO,
    }
}

fn delayed(step: Step, by: Duration) -> Step {
    match step {
        Step::Json {
            status,
            headers,
            body,
            ..
        } => Step::Json {
            status,
            headers,
            body,
            delay: by,
        },
        sse => sse,
    }
}

fn with_header(step: Step, name: &'static str, value: &str) -> Step {
    match step {
        Step::Json {
            status,
            mut headers,
            body,
            delay,
        } => {
            headers.push((name, value.to_string()));
            Step::Json {
                status,
                headers,
                body,
                delay,
            }
        }
        sse => sse,
    }
}

fn delta(content: &str) -> String {
    json!({"object": "chat.completion.chunk", "model": "test-model", "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]}).to_string()
}

fn finish() -> String {
    json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).to_string()
}

fn usage_chunk(p: u64, c: u64) -> String {
    json!({"choices": [], "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c, "completion_tokens_details": {"reasoning_tokens": 3}}}).to_string()
}

/// What the server saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    authorization: Option<String>,
    extra: Option<String>,
    body: Value,
    at: Instant,
}

#[derive(Default)]
struct Fake {
    script: Mutex<VecDeque<Step>>,
    /// Served when the script is used up.
    fallback: Mutex<Option<Step>>,
    seen: Mutex<Vec<Seen>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

impl Fake {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn chat(State(fake): State<Arc<Fake>>, headers: HeaderMap, body: Bytes) -> Response {
    let header = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    fake.seen.lock().unwrap().push(Seen {
        authorization: header("authorization"),
        extra: header("x-extra"),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        at: Instant::now(),
    });
    let now = fake.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    fake.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let step = fake.script.lock().unwrap().pop_front();
    let step = step
        .or_else(|| fake.fallback.lock().unwrap().clone())
        .unwrap_or_else(|| status(418, "script used up"));
    let response = match step {
        Step::Json {
            status,
            headers,
            body,
            delay,
        } => {
            tokio::time::sleep(delay).await;
            let mut r = Response::builder()
                .status(StatusCode::from_u16(status).unwrap())
                .header("content-type", "application/json");
            for (n, v) in headers {
                r = r.header(n, v);
            }
            r.body(Body::from(body)).unwrap()
        }
        Step::Sse { data, gap } => {
            let events = futures::stream::iter(data).then(move |d| async move {
                tokio::time::sleep(gap).await;
                Ok::<_, Infallible>(Bytes::from(format!("data: {d}\n\n")))
            });
            Response::builder()
                .status(200)
                .header("content-type", "text/event-stream")
                .body(Body::from_stream(events))
                .unwrap()
        }
    };
    fake.in_flight.fetch_sub(1, Ordering::SeqCst);
    response
}

async fn serve(script: Vec<Step>, fallback: Option<Step>) -> (Arc<Fake>, String) {
    let fake = Arc::new(Fake::default());
    *fake.script.lock().unwrap() = script.into();
    *fake.fallback.lock().unwrap() = fallback;
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (fake, format!("http://{addr}/v1"))
}

// ---------------------------------------------------------------------------------------------
// The client side

const MODEL: &str = "test-model";
/// USD per million tokens for `test-model`.
const PROMPT_PRICE: f64 = 2.0;
const COMPLETION_PRICE: f64 = 8.0;

fn model(base_url: &str) -> ModelSection {
    let mut m = ModelSection {
        name: MODEL.into(),
        base_url: Some(base_url.into()),
        api_key_env: Some("KREFINE_TEST_KEY_NEVER_SET".into()),
        temperature: Some(0.2),
        top_p: Some(0.9),
        max_tokens: Some(4096),
        seed: Some(42),
        request_timeout_s: 5.0,
        max_retries: 3,
        backoff_base_s: 0.01,
        backoff_max_s: 0.05,
        ..ModelSection::default()
    };
    m.prices.insert(
        MODEL.into(),
        Price {
            prompt: PROMPT_PRICE,
            completion: COMPLETION_PRICE,
        },
    );
    m.extra_headers.insert("X-Extra".into(), "hello".into());
    m
}

struct Client {
    llm: Arc<Metered>,
    ledger: Arc<Ledger>,
    sink: EventSink,
    events: mpsc::Receiver<(Option<TaskId>, Event)>,
    key: String,
    cancel: CancellationToken,
}

struct Setup {
    model: ModelSection,
    resources: ResourcesSection,
    budget: BudgetSection,
    window: Duration,
}

impl Setup {
    fn new(base_url: &str) -> Self {
        Setup {
            model: model(base_url),
            resources: ResourcesSection::default(),
            budget: BudgetSection::default(),
            window: Duration::from_secs(60),
        }
    }

    /// `test` makes the key unique per test, so that a leak names its test.
    fn client(self, test: &str) -> Client {
        let key = format!("sk-krefine-{test}-{:08x}", rand_suffix());
        let cancel = CancellationToken::new();
        let inner = OpenAiLlm::builder(&self.model)
            .resources(&self.resources)
            .api_key(ApiKey::new(key.clone(), "KREFINE_TEST_KEY").unwrap())
            .cancel(cancel.clone())
            .rate_window(self.window)
            .build()
            .unwrap();
        let ledger = Arc::new(Ledger::new(&self.budget));
        let (tx, events) = mpsc::channel(krefine::services::SINK_CAPACITY);
        Client {
            llm: Arc::new(Metered::new(Arc::new(inner), ledger.clone())),
            ledger,
            sink: EventSink::new(tx),
            events,
            key,
            cancel,
        }
    }
}

fn rand_suffix() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    t.subsec_nanos() ^ std::process::id()
}

fn request(turn: u32) -> LlmRequest {
    LlmRequest {
        task: "1/19/0".parse().unwrap(),
        turn,
        messages: vec![
            ChatMessage {
                role: Role::System,
                content: "You write CUDA kernels.".into(),
            },
            ChatMessage {
                role: Role::User,
                content: "Make ReLU faster.".into(),
            },
        ],
    }
}

impl Client {
    async fn ask(&self, turn: u32) -> Result<LlmAnswer, LlmError> {
        self.llm.complete(request(turn), &self.sink).await
    }

    /// Every event so far; also checks that none of them contains the key.
    fn events(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while let Ok((_, e)) = self.events.try_recv() {
            out.push(e);
        }
        for e in &out {
            let text = serde_json::to_string(e).unwrap();
            assert!(!text.contains(&self.key), "API key leaked into {text}");
        }
        out
    }

    fn assert_key_not_in(&self, text: &str) {
        assert!(!text.contains(&self.key), "API key leaked into {text}");
    }
}

/// (status, error) of each attempt event.
fn attempts(events: &[Event]) -> Vec<(Option<u16>, Option<String>)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::LlmAttempt { status, error, .. } => Some((*status, error.clone())),
            _ => None,
        })
        .collect()
}

/// Sends three requests one after the other: the first two go at once, the third one window after
/// the first. Measured here, not at the server: the gate lets the third request go one window after
/// the first one entered, which was after `t0`.
async fn third_request_waits_one_window(c: &mut Client, window: Duration) {
    let t0 = Instant::now();
    c.ask(1).await.unwrap();
    c.ask(2).await.unwrap();
    let two = t0.elapsed();
    assert!(two < window * 5 / 6, "{two:?}");
    c.ask(3).await.unwrap();
    let three = t0.elapsed();
    assert!(three >= window, "{three:?}");
    c.events();
}

/// How many `BudgetExhausted` events there are.
fn budget_stops(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Event::BudgetExhausted { .. }))
        .count()
}

fn cost(prompt: u64, completion: u64) -> f64 {
    (prompt as f64 * PROMPT_PRICE + completion as f64 * COMPLETION_PRICE) / 1e6
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

const CODE_ANSWER: &str =
    "Here:\n```python\nimport torch\n\nclass ModelNew(torch.nn.Module):\n    pass\n```\n";

// ---------------------------------------------------------------------------------------------
// Tests

#[tokio::test]
async fn answers_with_usage_cost_and_one_attempt_event() {
    let (fake, url) = serve(vec![ok(CODE_ANSWER, Some((1200, 300)))], None).await;
    let mut c = Setup::new(&url).client("plain");
    let a = c.ask(1).await.unwrap();

    assert_eq!(a.content, CODE_ANSWER);
    assert_eq!(
        extract_code(&a.content).as_deref(),
        Some("import torch\n\nclass ModelNew(torch.nn.Module):\n    pass")
    );
    assert_eq!(
        a.usage,
        Some(Usage {
            prompt_tokens: 1200,
            completion_tokens: 300,
            reasoning_tokens: 0
        })
    );
    // 1200 * 2 / 1e6 + 300 * 8 / 1e6
    assert!(close(a.cost_usd.unwrap(), 0.0048), "{:?}", a.cost_usd);
    assert_eq!(a.model, "test-model-2026");
    assert_eq!(a.finish_reason.as_deref(), Some("stop"));
    assert_eq!(a.attempts, 1);

    let events = c.events();
    assert_eq!(attempts(&events), vec![(Some(200), None)]);
    match &events[0] {
        Event::LlmAttempt {
            turn,
            attempt,
            usage,
            cost_usd,
            note,
            ..
        } => {
            assert_eq!((*turn, *attempt), (1, 1));
            assert_eq!(*usage, a.usage);
            assert_eq!(*cost_usd, a.cost_usd);
            assert_eq!(*note, None);
        }
        e => panic!("unexpected {e:?}"),
    }

    let seen = fake.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some(format!("Bearer {}", c.key).as_str())
    );
    assert_eq!(seen[0].extra.as_deref(), Some("hello"));
    let b = &seen[0].body;
    assert_eq!(b["model"], MODEL);
    assert_eq!(
        b["messages"][1],
        json!({"role": "user", "content": "Make ReLU faster."})
    );
    assert_eq!(
        (b["seed"].clone(), b["max_tokens"].clone()),
        (json!(42), json!(4096))
    );
    assert!((b["temperature"].as_f64().unwrap() - 0.2).abs() < 1e-6);
    assert!(b.get("stream").is_none());

    let t = c.ledger.totals();
    assert_eq!(
        (t.answers, t.prompt_tokens, t.completion_tokens),
        (1, 1200, 300)
    );
    assert!(close(t.cost_usd, 0.0048));
}

#[tokio::test]
async fn streaming_emits_deltas_and_takes_usage_from_the_last_chunk() {
    let data = vec![
        delta("```python\n"),
        delta("class ModelNew:\n"),
        delta("    pass\n```"),
        finish(),
        usage_chunk(50, 20),
        "[DONE]".to_string(),
    ];
    let (fake, url) = serve(
        vec![Step::Sse {
            data,
            gap: Duration::from_millis(5),
        }],
        None,
    )
    .await;
    let mut setup = Setup::new(&url);
    setup.model.stream = true;
    let mut c = setup.client("stream");
    let a = c.ask(2).await.unwrap();
    assert_eq!(a.content, "```python\nclass ModelNew:\n    pass\n```");
    assert_eq!(
        a.usage,
        Some(Usage {
            prompt_tokens: 50,
            completion_tokens: 20,
            reasoning_tokens: 3
        })
    );
    assert!(close(a.cost_usd.unwrap(), cost(50, 20)));
    assert_eq!(a.finish_reason.as_deref(), Some("stop"));

    let events = c.events();
    let deltas: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::LlmDelta { turn: 2, delta } => Some(delta.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        deltas,
        vec!["```python\n", "class ModelNew:\n", "    pass\n```"]
    );
    assert_eq!(attempts(&events), vec![(Some(200), None)]);
    let b = &fake.seen()[0].body;
    assert_eq!(b["stream"], true);
    assert_eq!(b["stream_options"], json!({"include_usage": true}));
}

#[tokio::test]
async fn stream_cut_off_before_the_end_is_retried() {
    let cut = Step::Sse {
        data: vec![delta("partial")],
        gap: Duration::ZERO,
    };
    let whole = Step::Sse {
        data: vec![delta("whole"), finish(), "[DONE]".into()],
        gap: Duration::ZERO,
    };
    let (fake, url) = serve(vec![cut, whole], None).await;
    let mut setup = Setup::new(&url);
    setup.model.stream = true;
    let mut c = setup.client("cut");
    let a = c.ask(1).await.unwrap();
    assert_eq!(a.content, "whole");
    assert_eq!(a.attempts, 2);
    // This server sent no usage: the answer says so rather than inventing numbers.
    assert_eq!((a.usage, a.cost_usd), (None, None));
    let events = c.events();
    let att = attempts(&events);
    assert_eq!(att.len(), 2);
    assert!(
        att[0].1.as_deref().unwrap().contains("stream ended before"),
        "{att:?}"
    );
    assert_eq!(fake.seen().len(), 2);
}

#[tokio::test]
async fn rate_limited_request_waits_for_retry_after() {
    let limited = with_header(
        status(
            429,
            r#"{"error":{"message":"Rate limit reached","type":"requests"}}"#,
        ),
        "retry-after",
        "1",
    );
    let (fake, url) = serve(vec![limited, ok("fine", Some((10, 10)))], None).await;
    let mut c = Setup::new(&url).client("429");
    let a = c.ask(1).await.unwrap();
    assert_eq!((a.content.as_str(), a.attempts), ("fine", 2));
    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    // backoff_max_s is 0.05: only the server's Retry-After explains a wait of a second.
    let gap = seen[1].at - seen[0].at;
    assert!(gap >= Duration::from_secs(1), "{gap:?}");
    assert!(gap < Duration::from_secs(3), "{gap:?}");
    let att = attempts(&c.events());
    assert_eq!(att[0].0, Some(429));
    assert!(att[0].1.as_deref().unwrap().contains("Rate limit reached"));
    assert_eq!(att[1], (Some(200), None));
}

#[tokio::test]
async fn server_errors_are_retried_until_success() {
    let script = vec![
        status(500, "internal error"),
        status(503, r#"{"error":{"message":"overloaded"}}"#),
        ok("third time", Some((1, 1))),
    ];
    let (fake, url) = serve(script, None).await;
    let mut c = Setup::new(&url).client("5xx");
    let a = c.ask(1).await.unwrap();
    assert_eq!((a.content.as_str(), a.attempts), ("third time", 3));
    let att = attempts(&c.events());
    let statuses: Vec<Option<u16>> = att.iter().map(|a| a.0).collect();
    assert_eq!(statuses, vec![Some(500), Some(503), Some(200)]);
    assert_eq!(
        att[0].1.as_deref(),
        Some("HTTP 500 Internal Server Error: internal error")
    );
    assert_eq!(
        att[1].1.as_deref(),
        Some("HTTP 503 Service Unavailable: overloaded")
    );
    assert_eq!(fake.seen().len(), 3);
}

#[tokio::test]
async fn retries_stop_at_max_retries() {
    let (fake, url) = serve(vec![], Some(status(502, "bad gateway"))).await;
    let mut setup = Setup::new(&url);
    setup.model.max_retries = 2;
    let mut c = setup.client("cap");
    let e = c.ask(1).await.unwrap_err();
    // An outage, not a verdict: the engine leaves the turn for a resume.
    assert!(matches!(e, LlmError::Unavailable(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "no answer after 3 attempts; last: HTTP 502 Bad Gateway: bad gateway"
    );
    assert_eq!(fake.seen().len(), 3);
    assert_eq!(attempts(&c.events()).len(), 3);
    assert_eq!(c.ledger.totals(), LedgerTotals::default());
}

#[tokio::test]
async fn answer_slower_than_the_timeout_is_retried() {
    let slow = delayed(ok("late", Some((1, 1))), Duration::from_secs(3));
    let (fake, url) = serve(vec![slow, ok("on time", Some((1, 1)))], None).await;
    let mut setup = Setup::new(&url);
    setup.model.request_timeout_s = 0.3;
    let mut c = setup.client("timeout");
    let t0 = Instant::now();
    let a = c.ask(1).await.unwrap();
    assert_eq!((a.content.as_str(), a.attempts), ("on time", 2));
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let att = attempts(&c.events());
    assert_eq!(att[0].0, None);
    assert_eq!(
        att[0].1.as_deref(),
        Some("no complete answer within model.request_timeout_s = 0.3")
    );
    assert_eq!(fake.seen().len(), 2);
}

#[tokio::test]
async fn malformed_json_is_retried_then_reported() {
    let (fake, url) = serve(vec![], Some(status(200, "{\"choices\": [oops"))).await;
    let mut setup = Setup::new(&url);
    setup.model.max_retries = 1;
    let mut c = setup.client("malformed");
    let e = c.ask(1).await.unwrap_err().to_string();
    assert!(
        e.starts_with("no answer after 2 attempts; last: malformed response"),
        "{e}"
    );
    assert!(e.ends_with("{\"choices\": [oops"), "{e}");
    assert_eq!(fake.seen().len(), 2);
    let att = attempts(&c.events());
    assert_eq!(att.len(), 2);
    assert_eq!(att[0].0, Some(200));
}

#[tokio::test]
async fn answer_without_code_is_still_an_answer() {
    let (_fake, url) = serve(vec![ok("I would rather not.", Some((5, 4)))], None).await;
    let mut c = Setup::new(&url).client("nocode");
    let a = c.ask(1).await.unwrap();
    assert_eq!(a.content, "I would rather not.");
    assert_eq!(extract_code(&a.content), None);
    assert_eq!(attempts(&c.events()), vec![(Some(200), None)]);
}

#[tokio::test]
async fn missing_usage_means_no_cost_and_a_note() {
    let (_fake, url) = serve(vec![ok("x", None), ok("y", Some((100, 50)))], None).await;
    let mut c = Setup::new(&url).client("nousage");
    let a = c.ask(1).await.unwrap();
    assert_eq!((a.usage, a.cost_usd), (None, None));
    let events = c.events();
    match &events[0] {
        Event::LlmAttempt {
            usage,
            cost_usd,
            note,
            error,
            ..
        } => {
            assert_eq!((*usage, *cost_usd, error.clone()), (None, None, None));
            assert_eq!(
                note.as_deref(),
                Some("the provider sent no usage: tokens and cost unknown")
            );
        }
        e => panic!("unexpected {e:?}"),
    }
    c.ask(2).await.unwrap();
    let t = c.ledger.totals();
    assert_eq!(
        (t.answers, t.answers_without_usage, t.tokens()),
        (2, 1, 150)
    );
    assert!(close(t.cost_usd, cost(100, 50)));
}

#[tokio::test]
async fn unpriced_model_has_usage_but_no_cost() {
    let (_fake, url) = serve(vec![ok("x", Some((10, 10)))], None).await;
    let mut setup = Setup::new(&url);
    setup.model.prices.clear();
    let mut c = setup.client("unpriced");
    let a = c.ask(1).await.unwrap();
    assert_eq!((a.usage.map(|u| u.total()), a.cost_usd), (Some(20), None));
    match &c.events()[0] {
        Event::LlmAttempt { note, .. } => assert_eq!(
            note.as_deref(),
            Some(
                "no price for model \"test-model\" (answered as \"test-model-2026\") in model.prices"
            )
        ),
        e => panic!("unexpected {e:?}"),
    }
    assert_eq!(c.ledger.totals().answers_without_cost, 1);
}

#[tokio::test]
async fn unauthorized_is_fatal_at_once_and_the_key_stays_secret() {
    let (fake, url) = serve(vec![], None).await;
    let mut c = Setup::new(&url).client("401");
    // Servers echo the key they were given; the provider must not pass it on.
    let body = json!({"error": {"message": format!("Incorrect API key provided: {}", c.key), "type": "invalid_request_error"}});
    *fake.fallback.lock().unwrap() = Some(status(401, &body.to_string()));
    let e = c.ask(1).await.unwrap_err();
    assert!(matches!(e, LlmError::Fatal(_)), "{e:?}");
    let msg = e.to_string();
    c.assert_key_not_in(&msg);
    assert_eq!(
        msg,
        "HTTP 401 Unauthorized: invalid_request_error: Incorrect API key provided: *** (check the key in $KREFINE_TEST_KEY)"
    );
    assert_eq!(fake.seen().len(), 1, "a 401 must not be retried");
    let events = c.events();
    assert_eq!(attempts(&events).len(), 1);
}

#[tokio::test]
async fn unknown_model_is_fatal_at_once() {
    let body =
        r#"{"error":{"message":"The model `test-model` does not exist","code":"model_not_found"}}"#;
    let (fake, url) = serve(vec![], Some(status(404, body))).await;
    let mut c = Setup::new(&url).client("404");
    let e = c.ask(1).await.unwrap_err();
    assert!(matches!(e, LlmError::Fatal(_)), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.starts_with("HTTP 404 Not Found: The model `test-model` does not exist"),
        "{msg}"
    );
    assert!(msg.contains("check model.name \"test-model\""), "{msg}");
    assert_eq!(fake.seen().len(), 1, "a 404 must not be retried");
    assert_eq!(attempts(&c.events()), vec![(Some(404), Some(msg))]);
}

#[tokio::test]
async fn forbidden_is_fatal_and_bad_request_fails_the_turn_only() {
    let (fake, url) = serve(
        vec![
            status(403, "no access"),
            status(400, r#"{"error":{"message":"context too long"}}"#),
        ],
        None,
    )
    .await;
    let mut c = Setup::new(&url).client("4xx");
    assert!(matches!(c.ask(1).await, Err(LlmError::Fatal(_))));
    let e = c.ask(2).await.unwrap_err();
    assert!(matches!(e, LlmError::Failed(_)), "{e:?}");
    assert_eq!(e.to_string(), "HTTP 400 Bad Request: context too long");
    assert_eq!(fake.seen().len(), 2);
    c.events();
}

#[tokio::test]
async fn token_budget_stops_new_requests_once() {
    let (fake, url) = serve(vec![], Some(ok("a", Some((60, 40))))).await;
    let mut setup = Setup::new(&url);
    setup.budget.tokens = Some(150);
    let mut c = setup.client("tokbudget");
    c.ask(1).await.unwrap();
    assert!(c.ledger.exhausted().is_none());
    // 200 tokens after the second answer: it is recorded, and the budget is then spent.
    c.ask(2).await.unwrap();
    for turn in 3..5 {
        let e = c.ask(turn).await.unwrap_err();
        assert!(matches!(e, LlmError::Fatal(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "budget exhausted: 200 tokens used, budget.tokens = 150"
        );
    }
    assert_eq!(fake.seen().len(), 2);
    let events = c.events();
    let stops: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e, Event::BudgetExhausted { .. }))
        .collect();
    assert_eq!(
        stops,
        vec![&Event::BudgetExhausted {
            what: "200 tokens used, budget.tokens = 150".into()
        }]
    );
    assert_eq!(c.ledger.totals().tokens(), 200);
}

#[tokio::test]
async fn usd_budget_stops_new_requests() {
    // Each answer costs 1000 * 2 / 1e6 + 500 * 8 / 1e6 = $0.006.
    let (fake, url) = serve(vec![], Some(ok("a", Some((1000, 500))))).await;
    let mut setup = Setup::new(&url);
    setup.budget.usd = Some(0.01);
    let mut c = setup.client("usdbudget");
    c.ask(1).await.unwrap();
    c.ask(2).await.unwrap();
    let e = c.ask(3).await.unwrap_err().to_string();
    assert_eq!(e, "budget exhausted: $0.012000 spent, budget.usd = 0.01");
    assert_eq!(fake.seen().len(), 2);
    assert!(close(c.ledger.totals().cost_usd, 2.0 * cost(1000, 500)));
    assert_eq!(budget_stops(&c.events()), 1);
}

#[tokio::test]
async fn in_flight_requests_finish_and_count_when_the_budget_runs_out() {
    let answer = delayed(ok("a", Some((100, 0))), Duration::from_millis(200));
    let (fake, url) = serve(vec![], Some(answer)).await;
    let mut setup = Setup::new(&url);
    setup.budget.tokens = Some(100);
    let mut c = setup.client("inflight");
    let (a, b) = tokio::join!(c.ask(1), c.ask(2));
    assert!(a.is_ok() && b.is_ok());
    assert_eq!(c.ledger.totals().tokens(), 200);
    assert!(matches!(c.ask(3).await, Err(LlmError::Fatal(_))));
    assert_eq!(fake.seen().len(), 2);
    assert_eq!(budget_stops(&c.events()), 1);
}

#[tokio::test]
async fn requests_per_minute_are_spaced_over_the_window() {
    let (fake, url) = serve(vec![], Some(ok("a", Some((1, 1))))).await;
    let mut setup = Setup::new(&url);
    setup.resources.requests_per_minute = 2;
    setup.window = Duration::from_millis(300);
    let mut c = setup.client("rpm");
    third_request_waits_one_window(&mut c, Duration::from_millis(300)).await;
    assert_eq!(fake.seen().len(), 3);
}

#[tokio::test]
async fn tokens_per_minute_wait_for_used_tokens_to_leave_the_window() {
    let (fake, url) = serve(vec![], Some(ok("a", Some((400, 200))))).await;
    let mut setup = Setup::new(&url);
    setup.resources.tokens_per_minute = 1000;
    setup.window = Duration::from_millis(300);
    let mut c = setup.client("tpm");
    // 600 tokens in the window after the first answer: the second request (estimated at ~10) still
    // fits, the third does not.
    third_request_waits_one_window(&mut c, Duration::from_millis(300)).await;
    assert_eq!(fake.seen().len(), 3);
}

#[tokio::test]
async fn in_flight_requests_are_capped_by_llm_concurrency() {
    let answer = delayed(ok("a", Some((1, 1))), Duration::from_millis(100));
    let (fake, url) = serve(vec![], Some(answer)).await;
    let mut setup = Setup::new(&url);
    setup.resources.llm_concurrency = 2;
    let mut c = setup.client("conc");
    let results = futures::future::join_all((1..=6).map(|t| c.ask(t))).await;
    assert!(results.iter().all(|r| r.is_ok()));
    assert_eq!(fake.max_in_flight.load(Ordering::SeqCst), 2);
    assert_eq!(fake.seen().len(), 6);
    c.events();
}

#[tokio::test]
async fn cancellation_ends_a_backoff_promptly() {
    let limited = with_header(status(429, "slow down"), "retry-after", "30");
    let (fake, url) = serve(vec![limited], None).await;
    let mut c = Setup::new(&url).client("cancel-backoff");
    let cancel = c.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancel.cancel();
    });
    let t0 = Instant::now();
    let e = c.ask(1).await.unwrap_err();
    assert!(matches!(e, LlmError::Cancelled), "{e:?}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(fake.seen().len(), 1);
    assert_eq!(attempts(&c.events()).len(), 1);
}

#[tokio::test]
async fn cancellation_ends_a_request_in_flight() {
    let slow = delayed(ok("late", Some((1, 1))), Duration::from_secs(10));
    let (_fake, url) = serve(vec![slow], None).await;
    let mut c = Setup::new(&url).client("cancel-flight");
    let cancel = c.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancel.cancel();
    });
    let t0 = Instant::now();
    assert!(matches!(c.ask(1).await, Err(LlmError::Cancelled)));
    assert!(t0.elapsed() < Duration::from_secs(2));
    // A cancelled attempt is not recorded.
    assert!(attempts(&c.events()).is_empty());
    assert_eq!(c.ledger.totals(), LedgerTotals::default());
}

#[tokio::test]
async fn connection_refused_is_retried_then_reported() {
    // A port nothing listens on: bind, note the port, close.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut setup = Setup::new(&format!("http://127.0.0.1:{port}/v1"));
    setup.model.max_retries = 1;
    let mut c = setup.client("refused");
    let e = c.ask(1).await.unwrap_err().to_string();
    assert!(
        e.starts_with("no answer after 2 attempts; last: request failed"),
        "{e}"
    );
    let att = attempts(&c.events());
    assert_eq!(att.len(), 2);
    assert_eq!(att[0].0, None);
}

#[tokio::test]
async fn long_stream_outlasts_the_timeout_while_chunks_keep_coming() {
    let mut data: Vec<String> = (0..6).map(|i| delta(&i.to_string())).collect();
    data.extend([finish(), usage_chunk(7, 6), "[DONE]".into()]);
    let steady = Step::Sse {
        data,
        gap: Duration::from_millis(80),
    };
    let (fake, url) = serve(vec![steady], None).await;
    let mut setup = Setup::new(&url);
    setup.model.stream = true;
    setup.model.request_timeout_s = 0.3;
    let mut c = setup.client("steady");
    let t0 = Instant::now();
    let a = c.ask(1).await.unwrap();
    assert!(
        t0.elapsed() > Duration::from_millis(600),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!((a.content.as_str(), a.attempts), ("012345", 1));
    assert_eq!(fake.seen().len(), 1);
    c.events();
}

#[tokio::test]
async fn silent_stream_is_retried() {
    let silent = Step::Sse {
        data: vec![delta("late"), finish(), "[DONE]".into()],
        gap: Duration::from_secs(3),
    };
    let quick = Step::Sse {
        data: vec![delta("quick"), finish(), "[DONE]".into()],
        gap: Duration::ZERO,
    };
    let (fake, url) = serve(vec![silent, quick], None).await;
    let mut setup = Setup::new(&url);
    setup.model.stream = true;
    setup.model.request_timeout_s = 0.3;
    let mut c = setup.client("silent");
    let t0 = Instant::now();
    let a = c.ask(1).await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!((a.content.as_str(), a.attempts), ("quick", 2));
    let att = attempts(&c.events());
    assert_eq!(
        att[0],
        (
            Some(200),
            Some("the server was silent for model.request_timeout_s = 0.3".into())
        )
    );
    assert_eq!(fake.seen().len(), 2);
}

#[tokio::test]
async fn an_oversized_body_is_refused_not_read_whole() {
    // A 40 MiB "answer": more than any real one, so the server is broken; the attempt stops reading.
    let huge = format!(
        r#"{{"choices": [{{"index": 0, "message": {{"role": "assistant", "content": "{}"}}}}]}}"#,
        "x".repeat(40 * 1024 * 1024)
    );
    let (fake, url) = serve(vec![status(200, &huge)], None).await;
    let mut setup = Setup::new(&url);
    setup.model.max_retries = 0;
    let c = setup.client("huge");
    let e = c.ask(1).await.unwrap_err();
    assert!(matches!(e, LlmError::Unavailable(_)), "{e:?}");
    assert!(
        e.to_string().contains("larger than 32 MiB"),
        "{}",
        e.to_string().chars().take(300).collect::<String>()
    );
    assert_eq!(fake.seen().len(), 1);
}
