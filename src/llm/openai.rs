//! The OpenAI-compatible provider: attempts through the gate, retried with backoff, each one an
//! `LlmAttempt` event, the answer priced from the table.
//!
//! Budgets are not checked here but by [`super::metered::Metered`], which wraps every provider.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::ModelSection;
use super::gate::{Gate, MINUTE};
use super::http::{AttemptError, Endpoint, EndpointError, Failure};
use super::ledger::Prices;
use super::retry::RetryPolicy;
use super::secret::{ApiKey, KeyError};
use super::wire::Reply;
use crate::launcher::config::ResourcesSection;
use crate::services::{EventSink, Llm, LlmError};
use crate::types::{ChatMessage, Event, LlmAnswer, LlmRequest};

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Endpoint(#[from] EndpointError),
}

/// An OpenAI-compatible chat endpoint, behind the run's rate limits, with retries.
pub struct OpenAiLlm {
    endpoint: Endpoint,
    /// Concurrency and the per-minute request and token limits every attempt passes.
    gate: Gate,
    /// How often a transient failure is retried, and how long to wait before each retry.
    retry: RetryPolicy,
    /// What an answer costs, for answers whose server reports no cost.
    prices: Prices,
    /// `model.name`: the model asked for, and the name an answer gets when the server names none.
    model: String,
    /// The run's cancellation: a request waiting at the gate or in flight ends with it.
    cancel: CancellationToken,
}

/// What an [`OpenAiLlm`] is built from; everything but `[model]` has a default.
pub struct OpenAiLlmBuilder {
    model: ModelSection,
    /// The concurrency and rate limits (`[resources]`).
    resources: ResourcesSection,
    /// The API key (default: read from `model.api_key_env`).
    key: Option<ApiKey>,
    cancel: CancellationToken,
    /// The span of the per-minute limits (a minute; tests shorten it).
    rate_window: Duration,
}

impl OpenAiLlm {
    pub fn builder(model: &ModelSection) -> OpenAiLlmBuilder {
        OpenAiLlmBuilder {
            model: model.clone(),
            resources: ResourcesSection::default(),
            key: None,
            cancel: CancellationToken::new(),
            rate_window: MINUTE,
        }
    }
}

impl OpenAiLlmBuilder {
    /// Concurrency and rate limits (`resources.llm_concurrency`, `requests_per_minute`,
    /// `tokens_per_minute`).
    pub fn resources(mut self, resources: &ResourcesSection) -> Self {
        self.resources = resources.clone();
        self
    }

    /// Cancelling the token ends gate waits, attempts and backoffs with `LlmError::Cancelled`.
    pub fn cancel(mut self, token: CancellationToken) -> Self {
        self.cancel = token;
        self
    }

    /// Use this key instead of reading the variable named by `model.api_key_env`.
    pub fn api_key(mut self, key: ApiKey) -> Self {
        self.key = Some(key);
        self
    }

    /// The span of the per-minute limits; one minute unless a test needs it shorter.
    pub fn rate_window(mut self, window: Duration) -> Self {
        self.rate_window = window;
        self
    }

    pub fn build(self) -> Result<OpenAiLlm, SetupError> {
        let key = match (self.key, &self.model.api_key_env) {
            (Some(k), _) => Some(k),
            (None, Some(var)) => Some(ApiKey::from_env(var)?),
            // Local servers (vLLM, SGLang, Ollama) often need no key.
            (None, None) => None,
        };
        Ok(OpenAiLlm {
            endpoint: Endpoint::new(&self.model, key)?,
            gate: Gate::from_resources(&self.resources, self.rate_window),
            retry: RetryPolicy::from_model(&self.model),
            prices: Prices::new(self.model.prices.clone()),
            model: self.model.name,
            cancel: self.cancel,
        })
    }
}

impl OpenAiLlm {
    /// Runs `fut` unless the run is cancelled first.
    async fn unless_cancelled<T>(&self, fut: impl Future<Output = T>) -> Result<T, LlmError> {
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(LlmError::Cancelled),
            v = fut => Ok(v),
        }
    }

    /// Cost of a reply, or a note saying why there is none.
    fn price(&self, reply: &Reply) -> (Option<f64>, Option<String>) {
        match &reply.usage {
            None => (
                None,
                Some("the provider sent no usage: tokens and cost unknown".into()),
            ),
            Some(u) => match self.prices.cost(&self.model, reply.model.as_deref(), u) {
                Ok(c) => (Some(c), None),
                Err(note) => (None, Some(note)),
            },
        }
    }
}

#[async_trait]
impl Llm for OpenAiLlm {
    fn describe(&self) -> String {
        format!(
            "openai-compatible model {:?} at {}",
            self.model,
            self.endpoint.base_url()
        )
    }

    async fn complete(&self, req: LlmRequest, sink: &EventSink) -> Result<LlmAnswer, LlmError> {
        let body = self
            .endpoint
            .body(&req.messages)
            .map_err(LlmError::Failed)?;
        let estimate = estimate_tokens(&req.messages);
        let (task, turn) = (Some(req.task), req.turn);
        let mut on_delta = |delta: &str| {
            sink.emit(
                task,
                Event::LlmDelta {
                    turn,
                    delta: delta.to_string(),
                },
            )
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let pass = self.unless_cancelled(self.gate.enter(estimate)).await?;
            let started = Instant::now();
            let outcome = self
                .unless_cancelled(self.endpoint.attempt(body.clone(), &mut on_delta))
                .await?;
            let latency_ms = started.elapsed().as_millis() as u64;
            let error = match outcome {
                Ok((status, reply)) => {
                    if let Some(u) = &reply.usage {
                        pass.settle(u.total());
                    }
                    drop(pass);
                    let (cost_usd, note) = self.price(&reply);
                    sink.record(
                        task,
                        Event::LlmAttempt {
                            turn,
                            attempt,
                            status: Some(status),
                            latency_ms,
                            error: None,
                            usage: reply.usage,
                            cost_usd,
                            note,
                        },
                    )
                    .await;
                    return Ok(LlmAnswer {
                        content: reply.content,
                        usage: reply.usage,
                        cost_usd,
                        model: reply.model.unwrap_or_else(|| self.model.clone()),
                        finish_reason: reply.finish_reason,
                        latency_ms,
                        attempts: attempt,
                    });
                }
                Err(e) => e,
            };
            drop(pass);
            let status = error.status;
            sink.record(
                task,
                Event::LlmAttempt {
                    turn,
                    attempt,
                    status: error.status,
                    latency_ms,
                    error: Some(error.message.clone()),
                    usage: None,
                    cost_usd: None,
                    note: None,
                },
            )
            .await;
            let AttemptError {
                failure,
                message,
                retry_after,
                ..
            } = error;
            match failure {
                Failure::Fatal => return Err(LlmError::Fatal(message)),
                Failure::Final => return Err(LlmError::Failed(message)),
                // An outage, not the turn's fault: the engine leaves the turn for a resume.
                Failure::Transient if attempt > self.retry.max_retries => {
                    return Err(LlmError::Unavailable(format!(
                        "no answer after {attempt} attempts; last: {message}"
                    )));
                }
                Failure::Transient => {
                    let wait = self.retry.delay(attempt, retry_after);
                    sink.record(
                        task,
                        Event::LlmRetryWait {
                            turn,
                            attempt,
                            wait_ms: wait.as_millis() as u64,
                            status,
                        },
                    )
                    .await;
                    self.unless_cancelled(tokio::time::sleep(wait)).await?;
                }
            }
        }
    }
}

/// Prompt tokens before the server counts them (four characters a token), for the tokens/minute
/// reservation.
fn estimate_tokens(messages: &[ChatMessage]) -> u64 {
    messages
        .iter()
        .map(|m| (m.content.len() as u64).div_ceil(4))
        .sum()
}
