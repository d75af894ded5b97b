//! Cost accounting: the price table, and the run's running totals of tokens and USD with its budget.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::config::{BudgetSection, Price};
use crate::spend::Spend;
use crate::types::{LlmAnswer, Usage};

/// USD per million prompt and completion tokens, by model name (`model.prices`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prices(BTreeMap<String, Price>);

impl Prices {
    pub fn new(table: BTreeMap<String, Price>) -> Self {
        Prices(table)
    }

    /// The cost of `usage`, priced under the configured model name, else under the name the server
    /// answered with (providers often answer with a dated variant). `Err` is a note saying why there
    /// is no cost.
    pub fn cost(
        &self,
        configured: &str,
        answered: Option<&str>,
        usage: &Usage,
    ) -> Result<f64, String> {
        let price = self
            .0
            .get(configured)
            .or_else(|| answered.and_then(|a| self.0.get(a)))
            .ok_or_else(|| match answered {
                Some(a) if a != configured => {
                    format!("no price for model {configured:?} (answered as {a:?}) in model.prices")
                }
                _ => format!("no price for model {configured:?} in model.prices"),
            })?;
        Ok(cost_usd(price, usage))
    }
}

/// Reasoning tokens are part of the completion tokens (OpenAI's accounting), so they are not added
/// again.
pub fn cost_usd(price: &Price, usage: &Usage) -> f64 {
    (usage.prompt_tokens as f64 * price.prompt + usage.completion_tokens as f64 * price.completion)
        / 1_000_000.0
}

/// Running totals over the answers of a run: the one spending type, counted as the budget counts
/// ([`Spend::add_budgeted`]).
pub type LedgerTotals = Spend;

/// The run's shared ledger: every answer is recorded, and the budget caps are checked against it.
#[derive(Debug, Default)]
pub struct Ledger {
    /// `budget.usd` and `budget.tokens`; `None`: no cap.
    usd_cap: Option<f64>,
    token_cap: Option<u64>,
    /// Every answer so far, this process's and (on resume) the log's ([`Ledger::restore`]).
    totals: Mutex<LedgerTotals>,
    /// A cap was reached and said so: it is said once.
    announced: AtomicBool,
}

impl Ledger {
    pub fn new(budget: &BudgetSection) -> Self {
        Ledger {
            usd_cap: budget.usd,
            token_cap: budget.tokens,
            ..Ledger::default()
        }
    }

    /// Totals so far (for progress displays).
    pub fn totals(&self) -> LedgerTotals {
        *self.lock()
    }

    pub fn record(&self, answer: &LlmAnswer) {
        self.lock().add_budgeted(answer);
    }

    /// Count what was spent before this process (a resumed run's log, as the reducer counted it
    /// with [`Spend::add_budgeted`]): budgets cover the whole run.
    pub fn restore(&self, spent: &Spend) {
        self.lock().add(spent);
    }

    /// Which cap is reached, in words (`None` while within budget).
    pub fn exhausted(&self) -> Option<String> {
        let t = self.totals();
        if let Some(cap) = self.token_cap
            && t.tokens() >= cap
        {
            return Some(format!("{} tokens used, budget.tokens = {cap}", t.tokens()));
        }
        if let Some(cap) = self.usd_cap
            && t.cost_usd >= cap
        {
            return Some(format!("${:.6} spent, budget.usd = {cap}", t.cost_usd));
        }
        None
    }

    /// The exhausted cap the first time it is asked after a cap is reached, so that a run announces
    /// its budget stop once however many tasks notice it.
    pub fn announce(&self) -> Option<String> {
        let what = self.exhausted()?;
        (!self.announced.swap(true, Ordering::SeqCst)).then_some(what)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LedgerTotals> {
        // Totals are plain counters; a panic elsewhere cannot leave them half-updated in a way that
        // matters more than losing them.
        self.totals.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(p: u64, c: u64, r: u64) -> Usage {
        Usage {
            prompt_tokens: p,
            completion_tokens: c,
            reasoning_tokens: r,
        }
    }

    fn answer(usage: Option<Usage>, cost_usd: Option<f64>) -> LlmAnswer {
        LlmAnswer {
            content: String::new(),
            usage,
            cost_usd,
            model: "m".into(),
            finish_reason: None,
            latency_ms: 0,
            attempts: 1,
        }
    }

    #[test]
    fn cost_from_price_table() {
        let mut table = BTreeMap::new();
        table.insert(
            "gpt-x".to_string(),
            Price {
                prompt: 2.0,
                completion: 8.0,
            },
        );
        let p = Prices::new(table);
        let u = usage(1_000_000, 500_000, 100_000);
        assert_eq!(p.cost("gpt-x", Some("gpt-x-2026"), &u), Ok(6.0));
        assert_eq!(p.cost("alias", Some("gpt-x"), &u), Ok(6.0));
        let e = p.cost("other", Some("other-1"), &u).unwrap_err();
        assert!(e.contains("\"other\"") && e.contains("other-1"), "{e}");
    }

    #[test]
    fn totals_accumulate_and_count_unknowns() {
        let l = Ledger::new(&BudgetSection::default());
        l.record(&answer(Some(usage(10, 20, 5)), Some(0.5)));
        l.record(&answer(Some(usage(1, 2, 0)), None));
        l.record(&answer(None, None));
        let t = l.totals();
        assert_eq!(
            t,
            LedgerTotals {
                answers: 3,
                prompt_tokens: 11,
                completion_tokens: 22,
                reasoning_tokens: 5,
                cost_usd: 0.5,
                answers_without_usage: 1,
                answers_without_cost: 1,
            }
        );
        assert_eq!(t.tokens(), 33);
        assert_eq!(l.exhausted(), None);
    }

    #[test]
    fn caps_are_reached_and_announced_once() {
        let l = Ledger::new(&BudgetSection {
            usd: None,
            tokens: Some(30),
        });
        l.record(&answer(Some(usage(10, 10, 0)), Some(0.0)));
        assert_eq!(l.announce(), None);
        l.record(&answer(Some(usage(10, 0, 0)), Some(0.0)));
        let what = l.announce().expect("tokens cap reached");
        assert_eq!(what, "30 tokens used, budget.tokens = 30");
        assert_eq!(l.announce(), None);
        assert!(l.exhausted().is_some());

        let l = Ledger::new(&BudgetSection {
            usd: Some(1.0),
            tokens: None,
        });
        l.record(&answer(Some(usage(1, 1, 0)), Some(0.75)));
        assert_eq!(l.exhausted(), None);
        l.record(&answer(Some(usage(1, 1, 0)), Some(0.25)));
        assert_eq!(
            l.exhausted().as_deref(),
            Some("$1.000000 spent, budget.usd = 1")
        );
    }
}
