//! The LLM gate of one provider: requests in flight, requests per minute and tokens per minute.
//!
//! Every HTTP attempt (retries included) passes the gate, since every attempt counts against a
//! provider's limits. Rates are sliding windows over the last minute (shorter in tests). Tokens are
//! not known before the answer, so a request reserves an estimate of its prompt when it starts and
//! the pass is settled with the real total once usage arrives; a request never waits for an empty
//! window, so one request larger than the whole limit still goes.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use crate::launcher::config::ResourcesSection;

/// The window the per-minute limits are measured over.
pub const MINUTE: Duration = Duration::from_secs(60);

pub struct Gate {
    /// Attempts in flight at once (`resources.llm_concurrency`).
    in_flight: Semaphore,
    /// The per-minute limits, checked and taken together under one lock.
    rates: Mutex<Rates>,
}

/// Requests and tokens taken in the last minute (`resources.requests_per_minute`,
/// `resources.tokens_per_minute`).
struct Rates {
    requests: Window,
    tokens: Window,
}

/// One attempt's right to run; the concurrency slot is given back when it is dropped.
pub struct GatePass<'a> {
    gate: &'a Gate,
    /// Held for its Drop: the concurrency slot.
    _permit: SemaphorePermit<'a>,
    /// The attempt's token estimate in the token window, replaced by what it used once known
    /// ([`GatePass::settle`]); `None` when tokens are not limited.
    token_entry: Option<u64>,
}

impl Gate {
    /// Limits of 0 mean unlimited; `window` is the span of the per-minute limits ([`MINUTE`]).
    pub fn new(concurrency: u32, requests: u32, tokens: u64, window: Duration) -> Self {
        Gate {
            in_flight: Semaphore::new(concurrency.max(1) as usize),
            rates: Mutex::new(Rates {
                requests: Window::new(u64::from(requests), window),
                tokens: Window::new(tokens, window),
            }),
        }
    }

    pub fn from_resources(r: &ResourcesSection, window: Duration) -> Self {
        Gate::new(
            r.llm_concurrency,
            r.requests_per_minute,
            r.tokens_per_minute,
            window,
        )
    }

    /// Waits for a free slot and room in both rate windows, then takes one request and
    /// `estimated_tokens`. Not cancellable by itself: callers race it against their cancellation.
    pub async fn enter(&self, estimated_tokens: u64) -> GatePass<'_> {
        let permit = self
            .in_flight
            .acquire()
            .await
            .expect("the gate owns its semaphore and never closes it");
        loop {
            let retry_at = {
                let mut r = self.lock();
                let now = Instant::now();
                match (
                    r.requests.room_at(now, 1),
                    r.tokens.room_at(now, estimated_tokens),
                ) {
                    (None, None) => {
                        r.requests.push(now, 1);
                        let token_entry = r.tokens.push(now, estimated_tokens);
                        return GatePass {
                            gate: self,
                            _permit: permit,
                            token_entry,
                        };
                    }
                    (a, b) => a.max(b).unwrap_or(now),
                }
            };
            tokio::time::sleep_until(retry_at).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Rates> {
        // The windows stay consistent even if a holder panicked (every update is one push/assign).
        self.rates.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl GatePass<'_> {
    /// Replace the token estimate with what the attempt really used.
    pub fn settle(&self, tokens: u64) {
        if let Some(id) = self.token_entry {
            self.gate.lock().tokens.set(id, tokens);
        }
    }
}

/// A sliding-window limit: weights taken in the last `span` must stay within `limit`.
struct Window {
    /// 0: unlimited.
    limit: u64,
    span: Duration,
    /// What was taken within the span, oldest first (older entries are dropped as time passes).
    entries: VecDeque<Entry>,
    /// The next entry's id, by which a pass settles its weight later.
    next_id: u64,
}

/// One weight taken from a window, and when.
struct Entry {
    id: u64,
    at: Instant,
    weight: u64,
}

impl Window {
    fn new(limit: u64, span: Duration) -> Self {
        Window {
            limit,
            span,
            entries: VecDeque::new(),
            next_id: 0,
        }
    }

    /// `None` when `weight` fits now, else the instant enough earlier weight has left the window.
    fn room_at(&mut self, now: Instant, weight: u64) -> Option<Instant> {
        if self.limit == 0 {
            return None;
        }
        while let Some(e) = self.entries.front()
            && e.at + self.span <= now
        {
            self.entries.pop_front();
        }
        let used: u64 = self.entries.iter().map(|e| e.weight).sum();
        if self.entries.is_empty() || used.saturating_add(weight) <= self.limit {
            return None;
        }
        let mut left = used;
        for e in &self.entries {
            left -= e.weight;
            if left.saturating_add(weight) <= self.limit {
                return Some(e.at + self.span);
            }
        }
        // Unreachable in practice (an empty window always has room); wait one span to be safe.
        Some(now + self.span)
    }

    fn push(&mut self, at: Instant, weight: u64) -> Option<u64> {
        if self.limit == 0 {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        self.entries.push_back(Entry { id, at, weight });
        Some(id)
    }

    fn set(&mut self, id: u64, weight: u64) {
        if let Some(e) = self.entries.iter_mut().find(|e| e.id == id) {
            e.weight = weight;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real time with a short window: tokio's paused clock needs its `test-util` feature.
    const W: Duration = Duration::from_millis(200);

    fn waited(t0: Instant) -> bool {
        let e = t0.elapsed();
        e >= W && e < W * 3
    }

    #[tokio::test]
    async fn requests_per_window() {
        let gate = Gate::new(10, 2, 0, W);
        let t0 = Instant::now();
        drop(gate.enter(0).await);
        drop(gate.enter(0).await);
        assert!(t0.elapsed() < W / 2);
        drop(gate.enter(0).await);
        assert!(waited(t0), "{:?}", t0.elapsed());
    }

    #[tokio::test]
    async fn tokens_per_window_use_settled_totals() {
        let gate = Gate::new(10, 0, 1000, W);
        let t0 = Instant::now();
        let pass = gate.enter(100).await;
        pass.settle(900);
        drop(pass);
        gate.enter(50).await.settle(50);
        assert!(t0.elapsed() < W / 2);
        // 950 used; 100 more must wait until the first 900 leave the window.
        gate.enter(100).await;
        assert!(waited(t0), "{:?}", t0.elapsed());
    }

    #[tokio::test]
    async fn a_request_larger_than_the_limit_still_goes_alone() {
        let gate = Gate::new(10, 0, 10, W);
        let t0 = Instant::now();
        gate.enter(500).await;
        assert!(t0.elapsed() < W / 2);
        gate.enter(1).await;
        assert!(waited(t0), "{:?}", t0.elapsed());
    }

    #[tokio::test]
    async fn unlimited_rates_never_wait() {
        let gate = Gate::new(10, 0, 0, W);
        let t0 = Instant::now();
        for _ in 0..100 {
            gate.enter(1_000_000).await;
        }
        assert!(t0.elapsed() < W / 2);
    }

    #[tokio::test]
    async fn concurrency_slots() {
        let gate = Gate::new(1, 0, 0, W);
        let first = gate.enter(0).await;
        let second = tokio::time::timeout(Duration::from_millis(50), gate.enter(0)).await;
        assert!(
            second.is_err(),
            "second entered while the first was in flight"
        );
        drop(first);
        tokio::time::timeout(Duration::from_millis(50), gate.enter(0))
            .await
            .expect("slot freed");
    }
}
