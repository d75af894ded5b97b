//! [`Spend`]: tokens and USD of a set of LLM answers, the one type for what a run spent on its model.
//! A leaf: the run's reducer tallies it per turn and task ([`crate::state`]), the report shows it
//! ([`crate::metrics::Ledger`]), and the budget caps it while the run goes ([`crate::llm::Ledger`]).

use serde::{Deserialize, Serialize};

use crate::types::LlmAnswer;

/// LLM spending of a set of answers.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Spend {
    /// Answers counted (`LlmAnswered` events).
    pub answers: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Reasoning tokens as the provider reports them; most providers include them in
    /// `completion_tokens` already, so they are not added to [`Spend::tokens`].
    pub reasoning_tokens: u64,
    /// Sum of the costs that were known.
    pub cost_usd: f64,
    /// Answers without `usage`: their tokens are missing from the sums.
    pub answers_without_usage: u64,
    /// Answers without a cost: their USD is missing from `cost_usd`. (Under the budget's count,
    /// [`Spend::add_budgeted`], only answers with usage and no price.)
    pub answers_without_cost: u64,
}

impl Spend {
    /// Prompt plus completion tokens (what `budget.tokens` caps).
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }

    /// True when at least one answer carried a cost (so `cost_usd` means something).
    pub fn priced(&self) -> bool {
        self.answers > self.answers_without_cost
    }

    /// The cost as reports show it: `None` when no answer carried a cost, so "free" and "unknown"
    /// are not confused.
    pub fn usd(&self) -> Option<f64> {
        self.priced().then_some(self.cost_usd)
    }

    /// The spending of one answer, as reports count it.
    pub fn of(answer: &LlmAnswer) -> Spend {
        let usage = answer.usage.unwrap_or_default();
        Spend {
            answers: 1,
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            reasoning_tokens: usage.reasoning_tokens,
            cost_usd: answer.cost_usd.unwrap_or(0.0),
            answers_without_usage: u64::from(answer.usage.is_none()),
            answers_without_cost: u64::from(answer.cost_usd.is_none()),
        }
    }

    pub fn add(&mut self, other: &Spend) {
        self.answers += other.answers;
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
        self.cost_usd += other.cost_usd;
        self.answers_without_usage += other.answers_without_usage;
        self.answers_without_cost += other.answers_without_cost;
    }

    /// Count one answer as the budget does: an answer without usage adds nothing but itself (its
    /// cost, if any, is not trusted without the tokens it was priced from), and only an answer with
    /// usage can lack a price.
    pub fn add_budgeted(&mut self, answer: &LlmAnswer) {
        self.answers += 1;
        match &answer.usage {
            Some(u) => {
                self.prompt_tokens = self.prompt_tokens.saturating_add(u.prompt_tokens);
                self.completion_tokens = self.completion_tokens.saturating_add(u.completion_tokens);
                self.reasoning_tokens = self.reasoning_tokens.saturating_add(u.reasoning_tokens);
                match answer.cost_usd {
                    Some(c) => self.cost_usd += c,
                    None => self.answers_without_cost += 1,
                }
            }
            None => self.answers_without_usage += 1,
        }
    }
}
