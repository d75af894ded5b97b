//! The chat-completions response as OpenAI-compatible servers really send it.
//!
//! async-openai's response types require fields that vLLM, SGLang, Ollama and proxies omit or send
//! differently (`id`, `object`, `created`, `choices[].index`, usage totals), and have no place for
//! `reasoning_content`. These shapes take only what krefine uses and default everything else, so a
//! server that leaves a field out still gives an answer.

use serde::Deserialize;

use crate::types::Usage;

/// A whole response, or one streamed chunk (which has `delta` where a response has `message`).
#[derive(Debug, Default, Deserialize)]
pub struct Completion {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub choices: Vec<Choice>,
    #[serde(default)]
    pub usage: Option<WireUsage>,
    /// Some servers and proxies report failures as a 200 with an error object.
    #[serde(default)]
    pub error: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Choice {
    #[serde(default)]
    pub message: Option<Message>,
    #[serde(default)]
    pub delta: Option<Message>,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Message {
    #[serde(default)]
    pub content: Option<Content>,
}

/// Message content: a string, or (some servers) a list of text parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
pub struct Part {
    #[serde(default)]
    pub text: Option<String>,
}

impl Content {
    pub fn text(&self) -> String {
        match self {
            Content::Text(s) => s.clone(),
            Content::Parts(parts) => parts.iter().filter_map(|p| p.text.as_deref()).collect(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct WireUsage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Debug, Default, Deserialize)]
pub struct CompletionDetails {
    #[serde(default)]
    pub reasoning_tokens: Option<u64>,
}

impl From<&WireUsage> for Usage {
    fn from(u: &WireUsage) -> Self {
        Usage {
            prompt_tokens: u.prompt_tokens.unwrap_or(0),
            completion_tokens: u.completion_tokens.unwrap_or(0),
            reasoning_tokens: u
                .completion_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
        }
    }
}

/// What one attempt produced.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Reply {
    pub content: String,
    pub usage: Option<Usage>,
    pub model: Option<String>,
    pub finish_reason: Option<String>,
}

impl Completion {
    /// A non-streamed response as a reply; `Err` says what is missing.
    pub fn into_reply(self) -> Result<Reply, String> {
        if let Some(e) = &self.error {
            return Err(format!("server reported an error: {}", error_text(e)));
        }
        let choice = self
            .choices
            .into_iter()
            .next()
            .ok_or("response has no choices")?;
        let content = choice
            .message
            .and_then(|m| m.content)
            .map(|c| c.text())
            .unwrap_or_default();
        Ok(Reply {
            content,
            usage: self.usage.as_ref().map(Usage::from),
            model: self.model,
            finish_reason: choice.finish_reason,
        })
    }
}

/// The text of an `error` value (`{"message": ...}` or a bare string).
pub fn error_text(e: &serde_json::Value) -> String {
    e.get("message")
        .and_then(|m| m.as_str())
        .or_else(|| e.as_str())
        .map(str::to_string)
        .unwrap_or_else(|| e.to_string())
}

/// Streamed chunks folded into a reply.
#[derive(Debug, Default)]
pub struct StreamFold {
    reply: Reply,
}

impl StreamFold {
    /// Adds one chunk; returns the new content text (for live views), `Err` on an in-stream error.
    pub fn push(&mut self, chunk: Completion) -> Result<String, String> {
        if let Some(e) = &chunk.error {
            return Err(format!(
                "server reported an error mid-stream: {}",
                error_text(e)
            ));
        }
        if chunk.model.is_some() {
            self.reply.model = chunk.model;
        }
        // With `include_usage` the last chunk carries the totals; servers that send running usage
        // on every chunk end with the totals too, so the last one seen wins.
        if let Some(u) = &chunk.usage {
            self.reply.usage = Some(u.into());
        }
        let mut delta = String::new();
        if let Some(choice) = chunk.choices.into_iter().next() {
            if let Some(text) = choice.delta.and_then(|d| d.content).map(|c| c.text()) {
                delta = text;
            }
            if choice.finish_reason.is_some() {
                self.reply.finish_reason = choice.finish_reason;
            }
        }
        self.reply.content.push_str(&delta);
        Ok(delta)
    }

    pub fn finished(&self) -> bool {
        self.reply.finish_reason.is_some()
    }

    pub fn into_reply(self) -> Reply {
        self.reply
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Completion {
        serde_json::from_str(s).expect("valid JSON")
    }

    #[test]
    fn full_openai_response() {
        let r = parse(
            r#"{"id":"x","object":"chat.completion","created":1,"model":"gpt-x-1",
            "choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],
            "usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8,
              "completion_tokens_details":{"reasoning_tokens":2}}}"#,
        )
        .into_reply()
        .unwrap();
        assert_eq!(
            r,
            Reply {
                content: "hi".into(),
                usage: Some(Usage {
                    prompt_tokens: 3,
                    completion_tokens: 5,
                    reasoning_tokens: 2
                }),
                model: Some("gpt-x-1".into()),
                finish_reason: Some("stop".into()),
            }
        );
    }

    #[test]
    fn sparse_server_response() {
        let r = parse(r#"{"choices":[{"message":{"content":null}}]}"#)
            .into_reply()
            .unwrap();
        assert_eq!(r, Reply::default());
        let r = parse(
            r#"{"choices":[{"message":{"content":[{"type":"text","text":"a"},{"text":"b"}]}}]}"#,
        )
        .into_reply()
        .unwrap();
        assert_eq!(r.content, "ab");
        let r = parse(r#"{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":4}}"#)
            .into_reply()
            .unwrap();
        assert_eq!(r.usage.map(|u| u.total()), Some(4));
    }

    #[test]
    fn no_choices_or_error_body() {
        assert_eq!(
            parse(r#"{"choices":[]}"#).into_reply().unwrap_err(),
            "response has no choices"
        );
        let e = parse(r#"{"error":{"message":"overloaded"}}"#)
            .into_reply()
            .unwrap_err();
        assert!(e.ends_with("overloaded"), "{e}");
    }

    #[test]
    fn stream_chunks_fold() {
        let mut f = StreamFold::default();
        let d = f
            .push(parse(r#"{"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}"#))
            .unwrap();
        assert_eq!(d, "Hel");
        f.push(parse(
            r#"{"choices":[{"delta":{"content":"lo"},"finish_reason":null}],"usage":null}"#,
        ))
        .unwrap();
        assert!(!f.finished());
        f.push(parse(
            r#"{"choices":[{"delta":{},"finish_reason":"stop"}]}"#,
        ))
        .unwrap();
        f.push(parse(
            r#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#,
        ))
        .unwrap();
        assert!(f.finished());
        assert_eq!(
            f.into_reply(),
            Reply {
                content: "Hello".into(),
                usage: Some(Usage {
                    prompt_tokens: 1,
                    completion_tokens: 2,
                    reasoning_tokens: 0
                }),
                model: Some("m".into()),
                finish_reason: Some("stop".into()),
            }
        );
        let mut f = StreamFold::default();
        assert!(f.push(parse(r#"{"error":"boom"}"#)).is_err());
    }
}
