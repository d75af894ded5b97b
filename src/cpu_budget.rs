//! One budget of CPU cores (`resources.cpu_budget`) that builds, the CPU stage of reference
//! preparation and CPU-device timing all draw from, so that neither starves the other.
//!
//! - A **build** claims what builds are measured to use: the mean, over the last few builds, of each
//!   build's CPU time over its wall time as the compile worker reports it (`getrusage` of the worker
//!   and its build children), 1 core until a build was measured ([`build_claim`]).
//! - The **CPU stage** of a problem's reference inputs claims the processes its maker runs, by the
//!   maker's plan (one, its own, unless the inputs are large; at most [`inputs_claim`]; the most
//!   when there is no plan), and passes that number on, so the processes drawing inputs never exceed
//!   it.
//! - **CPU-device timing** claims quiet cores ([`Claim::Quiet`]): it waits for the input makers to end
//!   (they cannot be paused), the compiler pauses its builds, and nothing new starts from the moment
//!   it asks until it ends.
//!
//! Builds and input makers are served in arrival order ([`CpuBudget::claim`]): a large claim first in
//! line is not overtaken by a stream of small ones. Two exceptions ([`may_pass`]), each within half the
//! budget: a build passes input makers waiting in line while builds hold at most half the budget, so
//! builds start at once when a run begins with more problems' inputs to make than fit (each maker
//! claims up to half the budget, and the makers first in line would otherwise hold every build back
//! until one of them ended); and an input maker passes builds waiting in line while makers hold at
//! most half the budget, the room it waits for kept from builds meanwhile ([`build_room`]): a
//! problem's inputs hold back all its candidates, a build one, and a run's builds all queue at its
//! start (the makers of a 64-candidate batch's first inputs waited 43 s behind them). A claim larger
//! than the whole budget runs alone. Quiet cores go ahead of the line: the builds holding cores are paused by then, so a build
//! first in line could wait for them forever.
//! [`admit`] is the whole admission rule, a pure function.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::Notify;

/// One core, in the budget's unit (milli-cores).
pub const CORE: u64 = 1000;
/// Builds measured to estimate the next one's claim.
pub const MEASURED_BUILDS: usize = 8;
/// The least a build claims (a build waiting on its disk or on a lock still costs something).
pub const MIN_BUILD_CLAIM: u64 = CORE / 4;
/// The most processes one problem's inputs are made by (one per seed: KernelBench's 5 correctness
/// trials and the timing set).
pub const MAX_INPUT_PROCESSES: u64 = 6;

/// What a claim is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    Build,
    /// Processes making a problem's reference inputs on the CPU.
    Inputs,
    /// The CPU device timing a candidate or a reference: quiet cores.
    Quiet,
}

/// What is held now, in milli-cores.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    pub builds: u64,
    pub inputs: u64,
    /// A CPU-device timing runs.
    pub quiet: bool,
    /// CPU-device timings waiting for quiet cores (nothing else starts meanwhile).
    pub quiet_waiting: u32,
}

/// May a claim of `want` milli-cores for `kind`, first in line, start with `held` taken out of a
/// budget of `budget` milli-cores?
pub fn admit(budget: u64, held: Held, kind: Claim, want: u64) -> bool {
    if held.quiet || (kind != Claim::Quiet && held.quiet_waiting > 0) {
        return false;
    }
    match kind {
        // Builds are paused by the compiler (or drained by the engine); input makers cannot be.
        Claim::Quiet => held.inputs == 0,
        Claim::Build | Claim::Inputs => {
            let used = held.builds + held.inputs;
            used == 0 || used + want <= budget
        }
    }
}

/// May a claim of `want` for `kind` pass a claim of `ahead` waiting before it in line, with `held`
/// taken out of `budget`? A build past input makers while builds hold at most half the budget (the
/// makers' claims, at most half the budget each, then still fit once the other makers end), and an
/// input maker past builds while makers hold at most half the budget.
pub fn may_pass(budget: u64, held: Held, kind: Claim, want: u64, ahead: Claim) -> bool {
    match (kind, ahead) {
        (Claim::Build, Claim::Inputs) => held.builds + want <= budget / 2,
        (Claim::Inputs, Claim::Build) => held.inputs + want <= budget / 2,
        _ => false,
    }
}

/// The part of `budget` builds may hold with `held` taken and input makers wanting `waiting` (each
/// claim's milli-cores, in line order): the room of the makers entitled to pass builds (makers within
/// half the budget, see [`may_pass`]) is kept for them, or the builds ahead of a maker would take
/// every core that frees, one at a time, and the maker would wait for all of them.
pub fn build_room(budget: u64, held: Held, waiting: impl IntoIterator<Item = u64>) -> u64 {
    let mut inputs = held.inputs;
    let mut kept = 0u64;
    for want in waiting {
        if inputs + want > budget / 2 {
            break;
        }
        inputs += want;
        kept += want;
    }
    budget - kept
}

/// The claim of the next build: the mean of `measured` (milli-cores each build used), 1 core when
/// none was measured, at least [`MIN_BUILD_CLAIM`] and at most the budget.
pub fn build_claim(measured: &[u64], budget: u64) -> u64 {
    let mean = if measured.is_empty() {
        CORE
    } else {
        measured.iter().sum::<u64>() / measured.len() as u64
    };
    mean.max(MIN_BUILD_CLAIM).min(budget.max(MIN_BUILD_CLAIM))
}

/// Milli-cores a build used: its CPU time over its wall time (`None` for a build too short to say).
pub fn cores_used(cpu_ms: u64, wall_ms: u64) -> Option<u64> {
    (wall_ms >= 10).then(|| cpu_ms.saturating_mul(CORE) / wall_ms)
}

/// The most processes (whole cores) a problem's CPU stage claims: half the budget, at least 1 and at
/// most [`MAX_INPUT_PROCESSES`], so builds keep the other half while inputs are made. A maker whose
/// plan runs fewer claims fewer (`crate::refprep`).
pub fn inputs_claim(budget: u64) -> u64 {
    (budget / CORE / 2).clamp(1, MAX_INPUT_PROCESSES)
}

/// The cores there are (the default budget).
pub fn available_cores() -> u32 {
    std::thread::available_parallelism().map_or(2, |n| n.get() as u32)
}

/// The budget's state, changed under one lock (never held across an await).
#[derive(Debug, Default)]
struct State {
    /// What the grants hold now, and the quiet claims waiting.
    held: Held,
    /// Tickets of the claims waiting, what each is for and its milli-cores, first in line first.
    line: VecDeque<(u64, Claim, u64)>,
    /// The next claim's ticket: its place in line.
    next_ticket: u64,
    /// Milli-cores the last builds used, newest last.
    measured: VecDeque<u64>,
}

/// The budget shared by the engine's stages and the background preparation.
#[derive(Debug)]
pub struct CpuBudget {
    /// The cores shared out, in milli-cores.
    budget: u64,
    state: Mutex<State>,
    /// Woken whenever cores are given back or a claim leaves the line: every waiting claim looks
    /// again whether it is first and fits.
    wake: Notify,
}

impl CpuBudget {
    /// A budget of `cores` cores (at least 1).
    pub fn new(cores: u32) -> CpuBudget {
        CpuBudget {
            budget: u64::from(cores.max(1)) * CORE,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
        }
    }

    /// The budget, in milli-cores.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut state)
    }

    /// What is held now.
    pub fn held(&self) -> Held {
        self.with(|s| s.held)
    }

    /// What the next build claims (see [`build_claim`]).
    pub fn next_build_claim(&self) -> u64 {
        self.with(|s| build_claim(s.measured.make_contiguous(), self.budget))
    }

    /// A build used `cpu_ms` of CPU time in `wall_ms`: later builds claim the recent mean.
    pub fn measured_build(&self, cpu_ms: u64, wall_ms: u64) {
        let Some(used) = cores_used(cpu_ms, wall_ms) else {
            return;
        };
        self.with(|s| {
            s.measured.push_back(used);
            while s.measured.len() > MEASURED_BUILDS {
                s.measured.pop_front();
            }
        });
    }

    /// Claim for one build (the measured estimate).
    pub async fn build(&self) -> Grant<'_> {
        let want = self.next_build_claim();
        self.claim(Claim::Build, want).await
    }

    /// Claim `want` milli-cores for `kind` (nothing for [`Claim::Quiet`], which holds the cores
    /// still), in arrival order; held until the grant is dropped. Dropping the future gives up its
    /// place in line.
    pub async fn claim(&self, kind: Claim, want: u64) -> Grant<'_> {
        let quiet = kind == Claim::Quiet;
        let want = if quiet { 0 } else { want };
        let ticket = self.with(|s| {
            let t = s.next_ticket;
            s.next_ticket += 1;
            if quiet {
                s.held.quiet_waiting += 1;
            } else {
                s.line.push_back((t, kind, want));
            }
            t
        });
        let mut place = InLine {
            budget: self,
            ticket,
            quiet,
            waiting: true,
        };
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let granted = self.with(|s| {
                if quiet {
                    // Not in line: it would not count itself as waiting.
                    let mut others = s.held;
                    others.quiet_waiting -= 1;
                    if !admit(self.budget, others, kind, 0) {
                        return false;
                    }
                    s.held.quiet_waiting -= 1;
                    s.held.quiet = true;
                    return true;
                }
                let (budget, held) = (self.budget, s.held);
                let first = s
                    .line
                    .iter()
                    .take_while(|(t, _, _)| *t != ticket)
                    .all(|(_, ahead, _)| may_pass(budget, held, kind, want, *ahead));
                let room = match kind {
                    Claim::Build => build_room(
                        budget,
                        held,
                        s.line
                            .iter()
                            .filter(|(_, k, _)| *k == Claim::Inputs)
                            .map(|(_, _, w)| *w),
                    ),
                    Claim::Inputs | Claim::Quiet => budget,
                };
                if !(first && admit(room, held, kind, want)) {
                    return false;
                }
                s.line.retain(|(t, _, _)| *t != ticket);
                match kind {
                    Claim::Build => s.held.builds += want,
                    Claim::Inputs | Claim::Quiet => s.held.inputs += want,
                }
                true
            });
            if granted {
                place.waiting = false;
                // The next in line may fit too.
                self.wake.notify_waiters();
                return Grant {
                    budget: self,
                    kind,
                    milli: want,
                };
            }
            notified.await;
        }
    }
}

/// A claim's place in line, given up when its future is dropped before it is granted.
struct InLine<'a> {
    budget: &'a CpuBudget,
    ticket: u64,
    /// A quiet claim waits outside the line (it is counted in `Held::quiet_waiting` instead).
    quiet: bool,
    /// Still waiting: once granted, there is no place to give up.
    waiting: bool,
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        if self.waiting {
            let (ticket, quiet) = (self.ticket, self.quiet);
            self.budget.with(|s| {
                if quiet {
                    s.held.quiet_waiting -= 1;
                } else {
                    s.line.retain(|(t, _, _)| *t != ticket);
                }
            });
            self.budget.wake.notify_waiters();
        }
    }
}

/// Cores held until dropped.
#[derive(Debug)]
pub struct Grant<'a> {
    budget: &'a CpuBudget,
    /// What the cores were claimed for: which tally they go back to.
    kind: Claim,
    milli: u64,
}

impl Grant<'_> {
    /// The milli-cores held (0 for quiet cores).
    pub fn milli(&self) -> u64 {
        self.milli
    }
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        let (kind, milli) = (self.kind, self.milli);
        self.budget.with(|s| match kind {
            Claim::Build => s.held.builds = s.held.builds.saturating_sub(milli),
            Claim::Inputs => s.held.inputs = s.held.inputs.saturating_sub(milli),
            Claim::Quiet => s.held.quiet = false,
        });
        self.budget.wake.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(builds: u64, inputs: u64, quiet: bool) -> Held {
        Held {
            builds,
            inputs,
            quiet,
            quiet_waiting: 0,
        }
    }

    #[test]
    fn admission_fits_claims_into_the_budget_and_lets_an_oversized_one_run_alone() {
        let b = 4 * CORE;
        assert!(admit(b, held(0, 0, false), Claim::Build, 1500));
        assert!(
            admit(b, held(2500, 0, false), Claim::Build, 1500),
            "4.0 of 4.0"
        );
        assert!(
            !admit(b, held(2600, 0, false), Claim::Build, 1500),
            "4.1 of 4.0"
        );
        assert!(!admit(b, held(1000, 2000, false), Claim::Inputs, 2000));
        assert!(admit(b, held(1000, 1000, false), Claim::Inputs, 2000));
        // Larger than the budget: only on idle cores.
        assert!(admit(b, held(0, 0, false), Claim::Inputs, 6000));
        assert!(!admit(b, held(250, 0, false), Claim::Inputs, 6000));
    }

    #[test]
    fn quiet_cores_wait_for_input_makers_not_for_builds_and_hold_everything_back() {
        let b = 4 * CORE;
        assert!(
            admit(b, held(3000, 0, false), Claim::Quiet, 0),
            "builds pause"
        );
        assert!(
            !admit(b, held(0, 1000, false), Claim::Quiet, 0),
            "inputs cannot"
        );
        assert!(!admit(b, held(0, 0, true), Claim::Build, 250));
        assert!(!admit(b, held(0, 0, true), Claim::Inputs, 1000));
        assert!(!admit(b, held(0, 0, true), Claim::Quiet, 0));
        // While a timing waits for quiet cores, nothing else starts.
        let waiting = Held {
            quiet_waiting: 1,
            ..held(1000, 0, false)
        };
        assert!(!admit(b, waiting, Claim::Build, 250));
        assert!(!admit(b, waiting, Claim::Inputs, 1000));
        assert!(admit(b, waiting, Claim::Quiet, 0));
    }

    #[test]
    fn a_build_claims_the_measured_mean_within_bounds() {
        assert_eq!(build_claim(&[], 16 * CORE), CORE, "unmeasured: one core");
        assert_eq!(build_claim(&[1800, 2200, 2600], 16 * CORE), 2200);
        assert_eq!(build_claim(&[100, 200], 16 * CORE), MIN_BUILD_CLAIM);
        assert_eq!(
            build_claim(&[9000], 4 * CORE),
            4 * CORE,
            "at most the budget"
        );
        assert_eq!(cores_used(3000, 1500), Some(2000));
        assert_eq!(cores_used(450, 1000), Some(450));
        assert_eq!(cores_used(5, 9), None, "too short to say");
    }

    #[test]
    fn input_makers_claim_half_the_budget_in_whole_processes() {
        assert_eq!(inputs_claim(CORE), 1);
        assert_eq!(inputs_claim(2 * CORE), 1);
        assert_eq!(inputs_claim(5 * CORE), 2);
        assert_eq!(inputs_claim(8 * CORE), 4);
        assert_eq!(inputs_claim(16 * CORE), 6);
        assert_eq!(inputs_claim(128 * CORE), MAX_INPUT_PROCESSES);
    }

    #[test]
    fn measured_builds_move_the_next_claim_and_only_the_last_ones_count() {
        let budget = CpuBudget::new(16);
        assert_eq!(budget.next_build_claim(), CORE);
        budget.measured_build(6000, 2000);
        assert_eq!(budget.next_build_claim(), 3000);
        for _ in 0..MEASURED_BUILDS {
            budget.measured_build(1000, 2000);
        }
        assert_eq!(budget.next_build_claim(), 500, "the 3-core build fell out");
        budget.measured_build(1, 2);
        assert_eq!(budget.next_build_claim(), 500, "too short to count");
    }

    #[tokio::test]
    async fn claims_are_served_in_arrival_order_and_a_dropped_waiter_leaves_the_line() {
        let budget = CpuBudget::new(4);
        let b1 = budget.claim(Claim::Build, 3000).await;
        // Inputs (2 cores) do not fit next to 3; a later 1-core build would fit but must not pass.
        let mut inputs = Box::pin(budget.claim(Claim::Inputs, 2000));
        assert!(futures::poll!(inputs.as_mut()).is_pending());
        let mut b2 = Box::pin(budget.claim(Claim::Build, 1000));
        assert!(
            futures::poll!(b2.as_mut()).is_pending(),
            "behind the inputs"
        );
        drop(b1);
        let g_inputs = inputs.await;
        let g2 = b2.await;
        assert_eq!(
            budget.held(),
            held(1000, 2000, false),
            "both fit once the build ended"
        );
        // A waiter that gives up does not block those behind it.
        let mut big = Box::pin(budget.claim(Claim::Inputs, 3000));
        assert!(futures::poll!(big.as_mut()).is_pending());
        let mut small = Box::pin(budget.claim(Claim::Inputs, 1000));
        assert!(futures::poll!(small.as_mut()).is_pending());
        drop(big);
        let g3 = small.await;
        assert_eq!(budget.held(), held(1000, 3000, false));
        drop((g_inputs, g2, g3));
        assert_eq!(budget.held(), Held::default());
    }

    #[tokio::test]
    async fn builds_start_while_input_makers_wait_but_not_past_half_the_budget() {
        // A run's start: two makers hold 12 of 16 cores, a third waits for one of them to end.
        let budget = CpuBudget::new(16);
        let a = budget.claim(Claim::Inputs, 6000).await;
        let b = budget.claim(Claim::Inputs, 6000).await;
        let mut c = Box::pin(budget.claim(Claim::Inputs, 6000));
        assert!(futures::poll!(c.as_mut()).is_pending());
        // Builds do not wait for it: the cores left are theirs at once.
        let mut builds = Vec::new();
        for _ in 0..4 {
            builds.push(budget.claim(Claim::Build, 1000).await);
        }
        assert_eq!(budget.held(), held(4000, 12000, false));
        drop(a);
        let c = c.await;
        assert_eq!(
            budget.held(),
            held(4000, 12000, false),
            "the maker got its cores"
        );
        drop((b, c, builds));

        // Past half the budget, builds wait behind a maker in line again.
        let budget = CpuBudget::new(8);
        let running = budget.claim(Claim::Build, 2000).await;
        let maker = budget.claim(Claim::Inputs, 4000).await;
        let mut waiting = Box::pin(budget.claim(Claim::Inputs, 4000));
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        let passed = (
            budget.claim(Claim::Build, 1000).await,
            budget.claim(Claim::Build, 1000).await,
        );
        assert_eq!(budget.held(), held(4000, 4000, false), "builds up to half");
        let mut behind = Box::pin(budget.claim(Claim::Build, 1000));
        assert!(
            futures::poll!(behind.as_mut()).is_pending(),
            "past half: in line"
        );
        drop(maker);
        let second = waiting.await;
        assert!(futures::poll!(behind.as_mut()).is_pending(), "no room left");
        assert_eq!(budget.held(), held(4000, 4000, false));
        drop((running, passed, second));
        drop(behind.await);
        assert_eq!(budget.held(), Held::default());
    }

    #[test]
    fn builds_pass_makers_and_makers_pass_builds_each_within_half_the_budget() {
        let b = 16 * CORE;
        let h = held(7000, 12000, false);
        assert!(may_pass(b, h, Claim::Build, 1000, Claim::Inputs));
        assert!(
            !may_pass(b, h, Claim::Build, 1001, Claim::Inputs),
            "8.001 of 8"
        );
        assert!(!may_pass(b, h, Claim::Build, 1000, Claim::Build));
        assert!(!may_pass(b, h, Claim::Inputs, 1000, Claim::Inputs));
        assert!(!may_pass(b, h, Claim::Inputs, 1000, Claim::Build));
        // Makers pass builds within half the budget too.
        let h = held(12000, 2000, false);
        assert!(may_pass(b, h, Claim::Inputs, 6000, Claim::Build));
        assert!(!may_pass(b, h, Claim::Inputs, 6001, Claim::Build));
        // The room kept for them: the makers in line that fit within half, in order.
        assert_eq!(build_room(b, h, [6000, 6000]), 10_000);
        assert_eq!(build_room(b, held(0, 0, false), [6000, 2000, 1000]), 8000);
        assert_eq!(build_room(b, held(0, 9000, false), [1000]), b);
    }

    #[tokio::test]
    async fn an_input_maker_gets_its_cores_before_the_builds_queued_ahead_of_it() {
        // A run's start: the builds took every core and more wait; then a problem's inputs are asked.
        let budget = CpuBudget::new(16);
        let mut running: Vec<_> = Vec::new();
        for _ in 0..16 {
            running.push(budget.claim(Claim::Build, 1000).await);
        }
        let mut queued: Vec<_> = (0..4)
            .map(|_| Box::pin(budget.claim(Claim::Build, 1000)))
            .collect();
        for q in &mut queued {
            assert!(futures::poll!(q.as_mut()).is_pending());
        }
        let mut maker = Box::pin(budget.claim(Claim::Inputs, 6000));
        assert!(futures::poll!(maker.as_mut()).is_pending());
        // Builds end one by one: the cores they give back wait for the maker, not for the builds
        // queued before it.
        for ended in 1..=6 {
            drop(running.pop());
            for q in &mut queued {
                assert!(futures::poll!(q.as_mut()).is_pending(), "{ended} ended");
            }
            if ended < 6 {
                assert!(futures::poll!(maker.as_mut()).is_pending());
            }
        }
        let maker = maker.await;
        assert_eq!(budget.held(), held(10_000, 6000, false));
        // Then the queued builds, as cores free.
        drop(running.pop());
        let first = queued.remove(0).await;
        assert_eq!(budget.held(), held(10_000, 6000, false));
        drop((maker, first, running));
        for q in queued {
            drop(q.await);
        }
        assert_eq!(budget.held(), Held::default());
    }

    #[tokio::test]
    async fn quiet_cores_go_ahead_of_a_build_waiting_for_paused_builds() {
        let budget = CpuBudget::new(2);
        // Builds hold the whole budget (the compiler pauses them for the timing); another waits.
        let paused = budget.claim(Claim::Build, 2000).await;
        let mut waiting = Box::pin(budget.claim(Claim::Build, 1000));
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        // In line behind that build, the timing would wait for the paused builds forever.
        let quiet = budget.claim(Claim::Quiet, 0).await;
        assert!(futures::poll!(waiting.as_mut()).is_pending(), "held back");
        drop(quiet);
        drop(paused);
        let build = waiting.await;
        assert_eq!(budget.held(), held(1000, 0, false));
        drop(build);
    }

    #[tokio::test]
    async fn quiet_cores_wait_for_input_makers_and_nothing_starts_meanwhile() {
        let budget = CpuBudget::new(4);
        let inputs = budget.claim(Claim::Inputs, 1000).await;
        let mut quiet = Box::pin(budget.claim(Claim::Quiet, 0));
        assert!(futures::poll!(quiet.as_mut()).is_pending(), "inputs run");
        assert_eq!(budget.held().quiet_waiting, 1);
        let mut late = Box::pin(budget.claim(Claim::Build, 250));
        assert!(futures::poll!(late.as_mut()).is_pending(), "held back");
        drop(inputs);
        let quiet = quiet.await;
        assert_eq!(
            budget.held(),
            Held {
                quiet: true,
                ..Held::default()
            }
        );
        drop(quiet);
        let late = late.await;
        drop(late);
        // A timing that gives up waiting holds nothing back.
        let inputs = budget.claim(Claim::Inputs, 1000).await;
        let mut quiet = Box::pin(budget.claim(Claim::Quiet, 0));
        assert!(futures::poll!(quiet.as_mut()).is_pending());
        drop(quiet);
        assert_eq!(budget.held(), held(0, 1000, false));
        drop(inputs);
    }

    #[tokio::test]
    async fn quiet_cores_hold_new_claims_back_until_they_end() {
        let budget = CpuBudget::new(2);
        let build = budget.claim(Claim::Build, 1000).await;
        let quiet = budget.claim(Claim::Quiet, 0).await;
        let mut next = Box::pin(budget.claim(Claim::Build, 1000));
        assert!(futures::poll!(next.as_mut()).is_pending());
        drop(quiet);
        let _next = next.await;
        assert_eq!(budget.held(), held(2000, 0, false));
        drop(build);
    }
}
