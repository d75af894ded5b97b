//! Reference data off the critical path: a problem's reference inputs, outputs, timing inputs and
//! reference timing are built while its first answer is still being generated and compiled.
//!
//! - When a task's LLM request starts, its problem is *coming* ([`Preparer::coming`]); when the task
//!   reaches its execute (or ends its turn some other way) it has *arrived* ([`Preparer::arrived`]).
//! - One background loop ([`run`]) takes coming problems in the order they were first wanted, at most
//!   `ahead` of them prepared and not yet arrived (a worker keeps the reference data of a few problems
//!   only), and prepares each one step at a time ([`Executor::prepare_reference`]: the next trial,
//!   the timing inputs, the reference timing), on the device that took its first step.
//! - Every step holds that device's lease, taken only while no candidate waits for a device
//!   ([`DevicePool::acquire_idle`]), so preparation never overlaps a timing and never delays a
//!   candidate by more than the one step in flight. On the CPU device the reference is timed only
//!   while the builds are paused, as a candidate's timing is. Each step is logged as
//!   [`Event::ReferencePrepared`] (run-level, informational).
//! - A problem whose candidate arrives first simply builds what its check reaches, trial by trial
//!   (the harness stops at the first failing trial where KernelBench does); preparation never
//!   changes a verdict, only when the work is done.
//!
//! Nothing here is folded on resume: a resumed run's workers start empty, and problems are prepared
//! again as their tasks go on.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::gpu::DevicePool;
use crate::services::{Compiler, DeviceId, EventSink, Executor, Unavailable};
use crate::types::{Event, PrepareOutcome, PrepareStatus, PrepareStep, Problem, ProblemKey};

/// The most problems a worker keeps reference data for, less the one being executed: more prepared
/// ahead would evict each other before their candidates arrive (`MAX_CONTEXTS` in kb_reference.py).
pub const MAX_AHEAD: u32 = 3;

/// Which problems to prepare, and in which order (pure bookkeeping; [`Preparer`] shares it).
#[derive(Debug, Default)]
pub struct PrepQueue {
    ahead: usize,
    /// Coming problems not prepared yet, in the order they were first wanted.
    order: VecDeque<ProblemKey>,
    /// Tasks of each problem between the start of their LLM request and their execute.
    coming: HashMap<ProblemKey, u32>,
    /// Problems taken for preparation whose tasks have not all arrived (they count against `ahead`).
    active: HashSet<ProblemKey>,
    /// Problems whose preparation failed: left to their candidates from then on.
    failed: HashSet<ProblemKey>,
}

impl PrepQueue {
    pub fn new(ahead: usize) -> PrepQueue {
        PrepQueue {
            ahead,
            ..PrepQueue::default()
        }
    }

    /// A task of `problem` started generating an answer.
    pub fn coming(&mut self, problem: ProblemKey) {
        *self.coming.entry(problem).or_default() += 1;
        let known = self.active.contains(&problem) || self.order.contains(&problem);
        if !known && !self.failed.contains(&problem) {
            self.order.push_back(problem);
        }
    }

    /// A task of `problem` reached its execute, or ended its turn without one.
    pub fn arrived(&mut self, problem: ProblemKey) {
        let Some(n) = self.coming.get_mut(&problem) else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.coming.remove(&problem);
            self.active.remove(&problem);
            self.order.retain(|p| *p != problem);
        }
    }

    /// The next problem to prepare, if one is coming and fewer than `ahead` are prepared and waiting.
    pub fn take(&mut self) -> Option<ProblemKey> {
        if self.active.len() >= self.ahead {
            return None;
        }
        let problem = self.order.pop_front()?;
        self.active.insert(problem);
        Some(problem)
    }

    /// Are tasks of `problem` still on their way (is preparing it still worth anything)?
    pub fn wanted(&self, problem: ProblemKey) -> bool {
        self.coming.contains_key(&problem)
    }

    /// Preparing `problem` failed: it is not tried again in the background.
    pub fn failed(&mut self, problem: ProblemKey) {
        self.active.remove(&problem);
        self.failed.insert(problem);
    }
}

/// [`PrepQueue`] shared between the task drivers and the background loop.
#[derive(Debug)]
pub struct Preparer {
    queue: Mutex<PrepQueue>,
    wake: Notify,
}

impl Preparer {
    pub fn new(ahead: usize) -> Preparer {
        Preparer {
            queue: Mutex::new(PrepQueue::new(ahead)),
            wake: Notify::new(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut PrepQueue) -> T) -> T {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut queue)
    }

    pub fn coming(&self, problem: ProblemKey) {
        self.with(|q| q.coming(problem));
        self.wake.notify_one();
    }

    pub fn arrived(&self, problem: ProblemKey) {
        self.with(|q| q.arrived(problem));
        self.wake.notify_one();
    }

    pub fn wanted(&self, problem: ProblemKey) -> bool {
        self.with(|q| q.wanted(problem))
    }

    /// Wait for the next problem to prepare.
    pub async fn next(&self) -> ProblemKey {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(problem) = self.with(PrepQueue::take) {
                return problem;
            }
            notified.await;
        }
    }
}

/// What the background loop uses.
pub struct PrepServices<'a> {
    pub devices: &'a DevicePool,
    pub executor: &'a dyn Executor,
    pub compiler: &'a dyn Compiler,
    pub problems: &'a HashMap<ProblemKey, Arc<Problem>>,
    pub sink: &'a EventSink,
}

/// The background loop: prepare coming problems until `cancel` (the run's drivers are done).
pub async fn run(prep: &Preparer, services: PrepServices<'_>, cancel: &CancellationToken) {
    loop {
        let problem = tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            p = prep.next() => p,
        };
        let Some(spec) = services.problems.get(&problem).cloned() else {
            prep.with(|q| q.failed(problem));
            continue;
        };
        match prepare_problem(&services, spec, || prep.wanted(problem), cancel).await {
            Ended::Cancelled => return,
            Ended::Failed => prep.with(|q| q.failed(problem)),
            Ended::Done | Ended::Stopped => {}
        }
    }
}

/// How preparing one problem ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Everything is built (or nothing more can be built in the background).
    Done,
    /// Its tasks arrived first; they build the rest themselves.
    Stopped,
    /// A step failed (the reference itself, or the worker); logged.
    Failed,
    Cancelled,
}

/// Prepare one problem step by step while `wanted` says its tasks are still on their way. Each step
/// leases a device only while no candidate waits, and is logged through the sink.
pub async fn prepare_problem(
    services: &PrepServices<'_>,
    problem: Arc<Problem>,
    wanted: impl Fn() -> bool,
    cancel: &CancellationToken,
) -> Ended {
    let mut device: Option<DeviceId> = None;
    let mut next: Option<PrepareStep> = None;
    loop {
        if !wanted() {
            return Ended::Stopped;
        }
        let lease = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Ended::Cancelled,
            l = services.devices.acquire_idle(device.as_ref()) => match l {
                Some(l) => l,
                // Every device was retired (its host drained): nothing left to prepare on.
                None => return Ended::Stopped,
            },
        };
        if !wanted() {
            return Ended::Stopped;
        }
        let id = lease.device.id.clone();
        // The CPU device times the reference only on quiet cores, as it times candidates.
        let pause = match (&id, next) {
            (DeviceId::Cpu, Some(PrepareStep::ReferenceTiming)) => {
                services.compiler.pause_builds().await
            }
            _ => None,
        };
        let quiet = id != DeviceId::Cpu || pause.is_some();
        let started = Instant::now();
        let result = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Ended::Cancelled,
            r = services.executor.prepare_reference(problem.clone(), &id, quiet) => r,
        };
        let held_ms = started.elapsed().as_millis() as u64;
        drop(pause);
        drop(lease);
        let outcome = result.unwrap_or_else(|Unavailable(error)| PrepareOutcome {
            status: PrepareStatus::Failed,
            built: Vec::new(),
            trials_ready: 0,
            done: true,
            next: None,
            duration_ms: held_ms,
            error: Some(error),
        });
        let event = Event::ReferencePrepared {
            problem: problem.key,
            device: id.to_string(),
            held_ms,
            outcome: outcome.clone(),
        };
        services.sink.record(None, event).await;
        if outcome.status != PrepareStatus::Ready {
            return Ended::Failed;
        }
        // Done, or no progress possible here (the reference cannot be timed on busy cores): the
        // first candidate does the rest.
        if outcome.done || outcome.built.is_empty() {
            return Ended::Done;
        }
        next = outcome.next;
        device = Some(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(id: u32) -> ProblemKey {
        ProblemKey {
            level: 1,
            problem_id: id,
        }
    }

    #[test]
    fn problems_are_prepared_in_order_at_most_ahead_at_once() {
        let mut q = PrepQueue::new(2);
        for id in [3, 1, 3, 2] {
            q.coming(p(id));
        }
        assert_eq!(q.take(), Some(p(3)));
        assert_eq!(q.take(), Some(p(1)));
        assert_eq!(
            q.take(),
            None,
            "two prepared and not arrived: the third waits"
        );
        // Problem 3 has two tasks coming: one arriving keeps it prepared and counted.
        q.arrived(p(3));
        assert!(q.wanted(p(3)));
        assert_eq!(q.take(), None);
        q.arrived(p(3));
        assert!(!q.wanted(p(3)));
        assert_eq!(q.take(), Some(p(2)));
        // A later turn of problem 3 wants it again (cheap when still cached on the worker).
        q.coming(p(3));
        q.arrived(p(1));
        assert_eq!(q.take(), Some(p(3)));
    }

    #[test]
    fn a_failed_problem_is_not_tried_again_and_frees_its_place() {
        let mut q = PrepQueue::new(1);
        q.coming(p(1));
        q.coming(p(2));
        assert_eq!(q.take(), Some(p(1)));
        q.failed(p(1));
        assert_eq!(q.take(), Some(p(2)));
        q.arrived(p(1));
        q.coming(p(1));
        q.arrived(p(2));
        assert_eq!(q.take(), None);
    }

    #[test]
    fn arrivals_of_unknown_problems_change_nothing() {
        let mut q = PrepQueue::new(1);
        q.arrived(p(9));
        q.coming(p(1));
        q.arrived(p(1));
        assert_eq!(q.take(), None, "its only task arrived before it was taken");
    }
}
