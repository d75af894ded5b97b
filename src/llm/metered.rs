//! Any provider with the run's ledger and budget around it.
//!
//! Every answer is recorded in the shared [`Ledger`]. Once a cap (`budget.usd`, `budget.tokens`) is
//! reached, new requests fail at once with a fatal error, while requests already in flight finish
//! and are recorded; the run gets one `BudgetExhausted` event, from whichever task notices first.

use std::sync::Arc;

use async_trait::async_trait;

use super::ledger::Ledger;
use crate::services::{EventSink, Llm, LlmError};
use crate::types::{Event, LlmAnswer, LlmRequest};

pub struct Metered {
    inner: Arc<dyn Llm>,
    ledger: Arc<Ledger>,
}

impl Metered {
    pub fn new(inner: Arc<dyn Llm>, ledger: Arc<Ledger>) -> Self {
        Metered { inner, ledger }
    }

    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    async fn announce(&self, sink: &EventSink) {
        if let Some(what) = self.ledger.announce() {
            sink.record(None, Event::BudgetExhausted { what }).await;
        }
    }
}

#[async_trait]
impl Llm for Metered {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    async fn complete(&self, req: LlmRequest, sink: &EventSink) -> Result<LlmAnswer, LlmError> {
        if let Some(what) = self.ledger.exhausted() {
            self.announce(sink).await;
            return Err(LlmError::Fatal(format!("budget exhausted: {what}")));
        }
        let answer = self.inner.complete(req, sink).await?;
        self.ledger.record(&answer);
        self.announce(sink).await;
        Ok(answer)
    }
}
