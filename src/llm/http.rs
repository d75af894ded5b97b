//! One attempt against an OpenAI-compatible chat-completions endpoint.
//!
//! The request body is async-openai's typed `CreateChatCompletionRequest`. The exchange itself goes
//! through reqwest directly: async-openai's client turns a failed response into an error without its
//! headers (so `Retry-After` is lost) and parses responses with types that reject what vLLM, Ollama
//! and proxies leave out (see [`super::wire`]). Here every attempt reports its HTTP status, the
//! server's requested wait, and a classification the retry loop acts on.

use std::future::Future;
use std::time::{Duration, SystemTime};

use async_openai::types::chat::{
    ChatCompletionRequestMessage, ChatCompletionStreamOptions, CreateChatCompletionRequestArgs,
};
use eventsource_stream::Eventsource;
use futures::StreamExt;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{StatusCode, Url};

use super::config::ModelSection;
use super::retry;
use super::secret::ApiKey;
use super::wire::{Completion, Reply, StreamFold};
use crate::types::{ChatMessage, Role};

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// The largest JSON answer read. Real answers are kilobytes to a few megabytes (100k tokens of
/// text is ~0.5 MB); a body past this is a broken or hostile server, not an answer.
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// The largest streamed answer read (SSE repeats JSON framing around every token).
pub const MAX_STREAM_BYTES: usize = 128 * 1024 * 1024;
/// How much of an error body is read for the message.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// Why a response body could not be read whole.
#[derive(Debug)]
enum BodyError {
    Http(reqwest::Error),
    TooLarge(usize),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Http(e) => f.write_str(&chain(e)),
            BodyError::TooLarge(limit) => write!(
                f,
                "the response body is larger than {} MiB; it was not read further",
                limit / (1024 * 1024)
            ),
        }
    }
}

impl std::error::Error for BodyError {}

/// The whole body, refusing one over `limit` bytes without reading the rest.
async fn read_body(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, BodyError> {
    let mut out = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Http)? {
        if out.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge(limit));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// The first `limit` bytes of a body (an error message), dropping the rest.
async fn read_prefix(mut response: reqwest::Response, limit: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = limit.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= limit {
            break;
        }
    }
    out
}

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("model.base_url {url:?} is not an http(s) URL: {message}")]
    BaseUrl { url: String, message: String },
    #[error("model.extra_headers: {name:?} is not a valid header name")]
    HeaderName { name: String },
    // The value is not repeated: extra headers often carry credentials.
    #[error("model.extra_headers: the value of {name:?} is not a valid header value")]
    HeaderValue { name: String },
    #[error("cannot create the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// What the retry loop does after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Try again after a backoff (429, 5xx, connection errors, timeouts, broken responses).
    Transient,
    /// The run cannot go on (401, 403, 404: bad key, no access, unknown model or URL).
    Fatal,
    /// This request will not succeed as sent (other 4xx, e.g. a prompt over the context length).
    Final,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AttemptError {
    pub status: Option<u16>,
    pub failure: Failure,
    /// Safe to log: any API key is masked.
    pub message: String,
    /// The wait the server asked for (`Retry-After`).
    pub retry_after: Option<Duration>,
}

impl AttemptError {
    fn transient(status: Option<StatusCode>, message: String) -> Self {
        AttemptError {
            status: status.map(|s| s.as_u16()),
            failure: Failure::Transient,
            message,
            retry_after: None,
        }
    }
}

/// A configured endpoint: URL, headers, model and sampling settings.
pub struct Endpoint {
    http: reqwest::Client,
    /// `model.base_url` as configured (or the default), for messages.
    base_url: String,
    /// Where requests go: the base URL's chat completions path.
    url: Url,
    /// `model.extra_headers`, checked once.
    headers: HeaderMap,
    /// Sent as a bearer token; `None` for servers that take none.
    key: Option<ApiKey>,
    /// The model and its sampling settings, sent with every request.
    model: ModelSection,
    /// OpenAI's own API takes `max_completion_tokens` (reasoning models reject `max_tokens`);
    /// other OpenAI-compatible servers know `max_tokens` best.
    completion_tokens_field: bool,
    /// `model.request_timeout_s`: one attempt's limit.
    timeout: Duration,
}

impl Endpoint {
    pub fn new(model: &ModelSection, key: Option<ApiKey>) -> Result<Self, EndpointError> {
        let base_url = model
            .base_url
            .clone()
            .unwrap_or_else(|| DEFAULT_BASE_URL.to_string());
        let url = chat_url(&base_url)?;
        let mut headers = HeaderMap::new();
        if let Some(k) = &key {
            headers.insert(AUTHORIZATION, k.bearer());
        }
        for (name, value) in &model.extra_headers {
            let n = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| EndpointError::HeaderName { name: name.clone() })?;
            let mut v = HeaderValue::from_str(value)
                .map_err(|_| EndpointError::HeaderValue { name: name.clone() })?;
            v.set_sensitive(true);
            headers.insert(n, v);
        }
        let timeout = Duration::try_from_secs_f64(model.request_timeout_s)
            .unwrap_or(Duration::from_secs(600));
        let http = reqwest::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(30)))
            .build()
            .map_err(EndpointError::Client)?;
        Ok(Endpoint {
            http,
            completion_tokens_field: url.host_str() == Some("api.openai.com"),
            base_url,
            url,
            headers,
            key,
            model: model.clone(),
            timeout,
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The JSON body for a conversation, built once per request and sent by every attempt.
    pub fn body(&self, messages: &[ChatMessage]) -> Result<Vec<u8>, String> {
        let m = &self.model;
        let mut args = CreateChatCompletionRequestArgs::default();
        args.model(m.name.clone()).messages(
            messages
                .iter()
                .map(|msg| match msg.role {
                    Role::System => {
                        ChatCompletionRequestMessage::System(msg.content.clone().into())
                    }
                    Role::User => ChatCompletionRequestMessage::User(msg.content.clone().into()),
                    Role::Assistant => {
                        ChatCompletionRequestMessage::Assistant(msg.content.clone().into())
                    }
                })
                .collect::<Vec<_>>(),
        );
        if let Some(t) = m.temperature {
            args.temperature(t);
        }
        if let Some(p) = m.top_p {
            args.top_p(p);
        }
        if let Some(n) = m.max_tokens {
            if self.completion_tokens_field {
                args.max_completion_tokens(n);
            } else {
                #[allow(
                    deprecated,
                    reason = "deprecated by OpenAI, still what most other servers read"
                )]
                args.max_tokens(n);
            }
        }
        if let Some(s) = m.seed {
            args.seed(s);
        }
        if m.stream {
            args.stream(true)
                .stream_options(ChatCompletionStreamOptions {
                    include_usage: Some(true),
                    include_obfuscation: None,
                });
        }
        let request = args
            .build()
            .map_err(|e| format!("cannot build the chat request: {e}"))?;
        serde_json::to_vec(&request).map_err(|e| format!("cannot serialise the chat request: {e}"))
    }

    /// Sends `body` once; streamed content is passed to `on_delta` as it arrives.
    ///
    /// `model.request_timeout_s` bounds a whole non-streamed attempt. A streamed answer may take
    /// longer than that in total (long reasoning at a few dozen tokens a second); what marks a
    /// stuck server there is silence, so the timeout bounds the wait for the response and every
    /// gap between events instead.
    pub async fn attempt(
        &self,
        body: Vec<u8>,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<(u16, Reply), AttemptError> {
        if self.model.stream {
            return self.exchange(body, on_delta).await;
        }
        tokio::time::timeout(self.timeout, self.exchange(body, on_delta))
            .await
            .unwrap_or_else(|_| {
                Err(AttemptError::transient(
                    None,
                    format!(
                        "no complete answer within model.request_timeout_s = {}",
                        self.model.request_timeout_s
                    ),
                ))
            })
    }

    /// When streaming, `fut` or a timeout error once the server has been silent for
    /// `model.request_timeout_s`. Otherwise just `fut`: the whole attempt is bounded instead.
    async fn unless_silent<T>(
        &self,
        status: Option<StatusCode>,
        fut: impl Future<Output = Result<T, AttemptError>>,
    ) -> Result<T, AttemptError> {
        if !self.model.stream {
            return fut.await;
        }
        tokio::time::timeout(self.timeout, fut)
            .await
            .unwrap_or_else(|_| {
                Err(AttemptError::transient(
                    status,
                    format!(
                        "the server was silent for model.request_timeout_s = {}",
                        self.model.request_timeout_s
                    ),
                ))
            })
    }

    async fn exchange(
        &self,
        body: Vec<u8>,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<(u16, Reply), AttemptError> {
        let send = self
            .http
            .post(self.url.clone())
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(body)
            .send();
        let response = self
            .unless_silent(None, async {
                send.await.map_err(|e| {
                    AttemptError::transient(
                        None,
                        self.redact(&format!("request failed: {}", chain(&e))),
                    )
                })
            })
            .await?;
        let status = response.status();
        if !status.is_success() {
            let retry_after = retry::retry_after(response.headers(), SystemTime::now());
            // An unreadable error body still leaves the status to act on.
            let text = self
                .unless_silent(Some(status), async {
                    let bytes = read_prefix(response, MAX_ERROR_BODY_BYTES).await;
                    Ok(String::from_utf8_lossy(&bytes).into_owned())
                })
                .await
                .unwrap_or_default();
            return Err(self.status_error(status, retry_after, &text));
        }
        let is_sse = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        // A server that ignores `stream: true` and answers with JSON is read as JSON.
        let reply = if is_sse {
            self.read_stream(status, response, on_delta).await?
        } else {
            let bytes = self
                .unless_silent(Some(status), async {
                    read_body(response, MAX_BODY_BYTES).await.map_err(|e| {
                        let what = match e {
                            BodyError::TooLarge(_) => e.to_string(),
                            BodyError::Http(_) => format!("response body broke off: {e}"),
                        };
                        AttemptError::transient(Some(status), self.redact(&what))
                    })
                })
                .await?;
            serde_json::from_slice::<Completion>(&bytes)
                .map_err(|e| format!("malformed response ({e}): {}", snippet(&bytes)))
                .and_then(Completion::into_reply)
                .map_err(|m| AttemptError::transient(Some(status), self.redact(&m)))?
        };
        Ok((status.as_u16(), reply))
    }

    async fn read_stream(
        &self,
        status: StatusCode,
        response: reqwest::Response,
        on_delta: &mut (dyn FnMut(&str) + Send),
    ) -> Result<Reply, AttemptError> {
        let fail = |m: String| AttemptError::transient(Some(status), self.redact(&m));
        // Counted as it arrives: a stream that never ends (or one endless event, which the SSE
        // parser would buffer whole) stops at MAX_STREAM_BYTES.
        let mut seen = 0usize;
        let mut events = response
            .bytes_stream()
            .map(move |chunk| {
                let chunk = chunk.map_err(BodyError::Http)?;
                seen += chunk.len();
                if seen > MAX_STREAM_BYTES {
                    return Err(BodyError::TooLarge(MAX_STREAM_BYTES));
                }
                Ok(chunk)
            })
            .eventsource();
        let mut fold = StreamFold::default();
        let mut done = false;
        while let Some(event) = self
            .unless_silent(Some(status), async { Ok(events.next().await) })
            .await?
        {
            let event = event.map_err(|e| fail(format!("stream broke off: {e}")))?;
            let data = event.data.trim();
            if data == "[DONE]" {
                done = true;
                break;
            }
            if data.is_empty() {
                continue;
            }
            let chunk: Completion = serde_json::from_str(data).map_err(|e| {
                fail(format!(
                    "malformed stream chunk ({e}): {}",
                    snippet(data.as_bytes())
                ))
            })?;
            let delta = fold.push(chunk).map_err(fail)?;
            if !delta.is_empty() {
                on_delta(&delta);
            }
        }
        if !done && !fold.finished() {
            return Err(fail("stream ended before the answer was complete".into()));
        }
        Ok(fold.into_reply())
    }

    fn status_error(
        &self,
        status: StatusCode,
        retry_after: Option<Duration>,
        body: &str,
    ) -> AttemptError {
        let detail = serde_json::from_str::<async_openai::error::WrappedError>(body)
            .map(|w| w.error.to_string())
            .unwrap_or_else(|_| snippet(body.as_bytes()));
        let hint = match status.as_u16() {
            401 | 403 => match &self.key {
                Some(k) => format!(" (check the key in ${})", k.source()),
                None => " (the server wants a key: set model.api_key_env)".into(),
            },
            404 => format!(
                " (check model.name {:?} and model.base_url {:?})",
                self.model.name, self.base_url
            ),
            _ => String::new(),
        };
        let failure = match status.as_u16() {
            401 | 403 | 404 => Failure::Fatal,
            408 | 409 | 425 | 429 | 500..=599 => Failure::Transient,
            _ => Failure::Final,
        };
        AttemptError {
            status: Some(status.as_u16()),
            failure,
            message: self.redact(&format!("HTTP {status}: {detail}{hint}")),
            retry_after,
        }
    }

    fn redact(&self, text: &str) -> String {
        match &self.key {
            Some(k) => k.redact(text),
            None => text.to_string(),
        }
    }
}

/// `<base>/chat/completions`, unless the base already is that endpoint.
fn chat_url(base: &str) -> Result<Url, EndpointError> {
    let bad = |message: String| EndpointError::BaseUrl {
        url: base.to_string(),
        message,
    };
    let trimmed = base.trim().trim_end_matches('/');
    let full = if trimmed.ends_with("/chat/completions") {
        trimmed.to_string()
    } else {
        format!("{trimmed}/chat/completions")
    };
    let url = Url::parse(&full).map_err(|e| bad(e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad(format!("scheme {:?}", url.scheme())));
    }
    Ok(url)
}

/// An error with its causes (`request failed: ...: connection refused`).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

/// The start of a body, for messages.
fn snippet(bytes: &[u8]) -> String {
    const MAX: usize = 300;
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None if text.is_empty() => "(empty body)".into(),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_urls() {
        let u = |b: &str| chat_url(b).map(|u| u.to_string());
        assert_eq!(
            u("http://127.0.0.1:8000/v1").unwrap(),
            "http://127.0.0.1:8000/v1/chat/completions"
        );
        assert_eq!(u("http://h/v1/").unwrap(), "http://h/v1/chat/completions");
        assert_eq!(
            u("https://h/v1/chat/completions").unwrap(),
            "https://h/v1/chat/completions"
        );
        assert!(u("127.0.0.1:8000").is_err());
        assert!(
            u("ftp://h/v1")
                .unwrap_err()
                .to_string()
                .contains("model.base_url")
        );
    }

    fn endpoint(m: ModelSection) -> Endpoint {
        Endpoint::new(&m, None).unwrap()
    }

    #[test]
    fn body_has_settings_and_the_right_token_field() {
        let m = ModelSection {
            name: "m1".into(),
            base_url: Some("http://127.0.0.1:1/v1".into()),
            temperature: Some(0.5),
            top_p: Some(0.25),
            max_tokens: Some(100),
            seed: Some(7),
            stream: true,
            ..ModelSection::default()
        };
        let msgs = vec![
            ChatMessage {
                role: Role::System,
                content: "sys".into(),
            },
            ChatMessage {
                role: Role::User,
                content: "hi".into(),
            },
            ChatMessage {
                role: Role::Assistant,
                content: "ok".into(),
            },
        ];
        let body = endpoint(m.clone()).body(&msgs).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "model": "m1",
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "ok"},
                ],
                "temperature": 0.5,
                "top_p": 0.25,
                "max_tokens": 100,
                "seed": 7,
                "stream": true,
                "stream_options": {"include_usage": true},
            })
        );
        let openai = ModelSection {
            base_url: None,
            stream: false,
            ..m
        };
        let v: serde_json::Value =
            serde_json::from_slice(&endpoint(openai).body(&msgs).unwrap()).unwrap();
        assert_eq!(v["max_completion_tokens"], 100);
        assert!(v.get("max_tokens").is_none() && v.get("stream").is_none());
    }

    #[test]
    fn bad_extra_header_is_named_without_its_value() {
        let mut m = ModelSection::default();
        m.extra_headers
            .insert("X-Token".into(), "secret\nvalue".into());
        let e = Endpoint::new(&m, None).err().unwrap().to_string();
        assert!(e.contains("X-Token") && !e.contains("secret"), "{e}");
    }

    #[test]
    fn snippets_are_short_and_char_safe() {
        assert_eq!(snippet(b"  "), "(empty body)");
        let long = "é".repeat(400);
        let s = snippet(long.as_bytes());
        assert_eq!(s.chars().count(), 303);
    }
}
