//! A request's time budget: its own deadline, and the separate allowance for reference work the worker
//! announces, each on its own clock.

use std::time::Duration;

use super::protocol::ReferencePhase;

/// How long a request may take. `own` is the request's timeout; `reference`, when given, is a separate
/// allowance for reference work the worker announces with `progress` notices (building trial data a
/// candidate asked for, timing the reference): while such work runs, `own` stands still and
/// `reference` runs down instead, so a candidate is never charged for the reference. Without it,
/// notices change nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub own: Duration,
    pub reference: Option<Duration>,
}

impl Budget {
    pub fn plain(own: Duration) -> Budget {
        Budget {
            own,
            reference: None,
        }
    }
}

/// The two clocks of a request under a [`Budget`]: the request's own, which runs except while the
/// worker says it is doing reference work, and the reference allowance, which runs only then.
pub(super) struct Clock {
    own_left: Duration,
    reference_left: Option<Duration>,
    /// When the running clock last started.
    since: tokio::time::Instant,
    /// The reference clock is the running one.
    in_reference: bool,
}

impl Clock {
    pub(super) fn new(own_left: Duration, reference_left: Option<Duration>) -> Clock {
        Clock {
            own_left,
            reference_left,
            since: tokio::time::Instant::now(),
            in_reference: false,
        }
    }

    /// Time left on the running clock, and whether that is the reference's.
    pub(super) fn remaining(&self) -> (Duration, bool) {
        let ran = self.since.elapsed();
        match (self.in_reference, self.reference_left) {
            (true, Some(left)) => (left.saturating_sub(ran), true),
            _ => (self.own_left.saturating_sub(ran), false),
        }
    }

    /// A notice arrived: charge the running clock what it ran and start the other. A repeated notice
    /// changes nothing; without an allowance for reference work, notices are ignored.
    pub(super) fn switch(&mut self, phase: ReferencePhase) {
        let Some(reference_left) = self.reference_left else {
            return;
        };
        let start = phase == ReferencePhase::Start;
        if start == self.in_reference {
            return;
        }
        let now = tokio::time::Instant::now();
        let ran = now - self.since;
        if self.in_reference {
            self.reference_left = Some(reference_left.saturating_sub(ran));
        } else {
            self.own_left = self.own_left.saturating_sub(ran);
        }
        self.in_reference = start;
        self.since = now;
    }

    /// Reference time used so far (zero without an allowance).
    pub(super) fn spent(&self, budget: Budget) -> Duration {
        match (budget.reference, self.reference_left) {
            (Some(total), Some(left)) => {
                let running = if self.in_reference {
                    self.since.elapsed()
                } else {
                    Duration::ZERO
                };
                total.saturating_sub(left).saturating_add(running)
            }
            _ => Duration::ZERO,
        }
    }
}
