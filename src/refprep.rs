//! Reference data off the critical path: a problem's reference inputs, outputs, timing inputs and
//! reference timing are built while its first answer is still being generated and compiled.
//!
//! - When a task's LLM request starts, its problem is *coming* ([`Preparer::coming`]); when the task
//!   reaches its execute (or ends its turn some other way) it has *arrived* ([`Preparer::arrived`]).
//! - Two stages, one background loop ([`run`]):
//!   - **CPU** ([`Executor::make_inputs`]): the problem's inputs are made on the CPU into the on-disk
//!     store (`worker::input_store`), in a process of their own, **holding no device lease**. Every
//!     coming problem is taken, in the order first wanted, [`cpu_ahead`] at once (each one fans out
//!     over several processes when its inputs are large): how far ahead this runs adapts to what is
//!     queued, not to a fixed count. Logged as [`Event::InputsPrepared`].
//!   - **Device** (one problem at a time on each device, the devices side by side): once its inputs
//!     are made, a problem is prepared step by step ([`Executor::prepare_reference`]: the next
//!     trial, the timing inputs, the reference timing; the inputs are read from the store). Prepared
//!     data is per (problem, device): each device's worker keeps its own (its tensors and the CUDA
//!     IPC handles it gives candidate processes live on that device), while the inputs on disk are
//!     made once for all devices. Candidates take whichever device is free, so a problem is prepared
//!     on as many devices as it has tasks coming (at most all of them), each device holding at most
//!     `ahead` problems prepared and not yet arrived (`resources.prepare_ahead`: a worker keeps the
//!     reference data of a few problems only).
//! - A candidate about to take a lease for a problem whose inputs are still being made (or queued to
//!   be) waits for them off the lease ([`Preparer::inputs_ready`], which moves that problem to the
//!   front), rather than making them again on the device.
//! - Every step holds that device's lease, taken only while no candidate waits for a device
//!   ([`DevicePool::acquire_idle`]), so preparation never overlaps a timing and never delays a
//!   candidate by more than the one step in flight. On the CPU device the reference is timed only
//!   while the builds are paused, as a candidate's timing is. Each step is logged as
//!   [`Event::ReferencePrepared`] (run-level, informational).
//! - A problem whose candidate arrives first simply builds what its check reaches, trial by trial
//!   (the harness stops at the first failing trial where KernelBench does); preparation never
//!   changes a verdict, only when the work is done.
//!
//! - A device found lost during a step (its worker no longer starts there) is retired, logged as
//!   [`Event::DeviceRetired`]; its problems go to the devices left.
//!
//! Nothing here is folded on resume: a resumed run's workers start empty, and problems are prepared
//! again as their tasks go on.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::cpu_budget::{CORE, Claim, CpuBudget, inputs_claim};
use crate::gpu::DevicePool;
use crate::services::{Compiler, DeviceId, EventSink, Executor, Unavailable};
use crate::types::{
    Event, InputsOutcome, PrepareOutcome, PrepareStatus, PrepareStep, Problem, ProblemKey,
};

/// The most problems a worker keeps reference data for, less the one being executed: more prepared
/// ahead would evict each other before their candidates arrive (`MAX_CONTEXTS` in kb_reference.py).
pub const MAX_AHEAD: u32 = 3;

/// How many problems have their inputs made on the CPU at once: a quarter of the cores (at least 1,
/// at most 4), since one problem's large inputs are made by up to six processes (one per seed).
pub fn cpu_ahead() -> usize {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    (cores / 4).clamp(1, 4)
}

/// Which problems to prepare, and in which order (pure bookkeeping; [`Preparer`] shares it).
#[derive(Debug, Default)]
pub struct PrepQueue {
    ahead: usize,
    /// CPU stage: problems whose inputs are made at once.
    cpu_parallel: usize,
    /// CPU stage: problems whose inputs are to be made, in the order they were first wanted (one
    /// that a candidate waits for goes first).
    cpu_order: VecDeque<ProblemKey>,
    /// CPU stage: inputs being made now.
    making: HashSet<ProblemKey>,
    /// CPU stage done (made, found stored, or not storable): the device stage may take them, and
    /// their candidates do not wait.
    made: HashSet<ProblemKey>,
    /// Coming problems, in the order they were first wanted (until all their tasks arrived).
    order: VecDeque<ProblemKey>,
    /// Tasks of each problem between the start of their LLM request and their execute.
    coming: HashMap<ProblemKey, u32>,
    /// Per device, the problems it took for preparation whose tasks have not all arrived (they count
    /// against `ahead` on that device).
    active: HashMap<DeviceId, HashSet<ProblemKey>>,
    /// Problems whose preparation failed: left to their candidates from then on.
    failed: HashSet<ProblemKey>,
}

impl PrepQueue {
    /// `ahead` problems prepared on the device ahead of their candidates, `cpu_parallel` having
    /// their inputs made at once.
    pub fn new(ahead: usize, cpu_parallel: usize) -> PrepQueue {
        PrepQueue {
            ahead,
            cpu_parallel: cpu_parallel.max(1),
            ..PrepQueue::default()
        }
    }

    /// A task of `problem` started generating an answer.
    pub fn coming(&mut self, problem: ProblemKey) {
        *self.coming.entry(problem).or_default() += 1;
        if !self.order.contains(&problem) && !self.failed.contains(&problem) {
            self.order.push_back(problem);
        }
        self.queue_inputs(problem, false);
    }

    fn queue_inputs(&mut self, problem: ProblemKey, first: bool) {
        if self.made.contains(&problem) || self.making.contains(&problem) {
            return;
        }
        if first {
            self.cpu_order.retain(|p| *p != problem);
            self.cpu_order.push_front(problem);
        } else if !self.cpu_order.contains(&problem) {
            self.cpu_order.push_back(problem);
        }
    }

    /// The next problem whose inputs to make, if fewer than `cpu_parallel` are being made.
    pub fn take_inputs(&mut self) -> Option<ProblemKey> {
        if self.making.len() >= self.cpu_parallel {
            return None;
        }
        let problem = self.cpu_order.pop_front()?;
        self.making.insert(problem);
        Some(problem)
    }

    /// The CPU stage of `problem` ended (however it ended: a failure leaves the inputs to the
    /// device, as before there was a CPU stage).
    pub fn inputs_done(&mut self, problem: ProblemKey) {
        self.making.remove(&problem);
        self.made.insert(problem);
    }

    /// Must a candidate of `problem` wait for its inputs? When they are neither made nor being
    /// made, they are queued first.
    pub fn wait_for_inputs(&mut self, problem: ProblemKey) -> bool {
        if self.made.contains(&problem) {
            return false;
        }
        self.queue_inputs(problem, true);
        true
    }

    /// A task of `problem` reached its execute, or ended its turn without one.
    pub fn arrived(&mut self, problem: ProblemKey) {
        let Some(n) = self.coming.get_mut(&problem) else {
            return;
        };
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.coming.remove(&problem);
            for on in self.active.values_mut() {
                on.remove(&problem);
            }
            self.order.retain(|p| *p != problem);
        }
    }

    /// How many devices took `problem`.
    fn devices_on(&self, problem: &ProblemKey) -> u32 {
        self.active
            .values()
            .filter(|on| on.contains(problem))
            .count() as u32
    }

    /// The next problem to prepare on `device`: the first coming one whose inputs are made, that
    /// this device has not taken and fewer devices took than it has tasks coming, if fewer than
    /// `ahead` are prepared and waiting on this device.
    pub fn take(&mut self, device: &DeviceId) -> Option<ProblemKey> {
        let mine = self.active.get(device);
        if mine.map_or(0, HashSet::len) >= self.ahead {
            return None;
        }
        let problem = *self.order.iter().find(|p| {
            self.made.contains(p)
                && !mine.is_some_and(|on| on.contains(p))
                && self.devices_on(p) < self.coming.get(p).copied().unwrap_or(0)
        })?;
        self.active
            .entry(device.clone())
            .or_default()
            .insert(problem);
        Some(problem)
    }

    /// `device` is lost: the problems it took may go to the others.
    pub fn device_lost(&mut self, device: &DeviceId) {
        self.active.remove(device);
    }

    /// Are tasks of `problem` still on their way (is preparing it still worth anything)?
    pub fn wanted(&self, problem: ProblemKey) -> bool {
        self.coming.contains_key(&problem)
    }

    /// Preparing `problem` failed: it is not tried again in the background, on any device.
    pub fn failed(&mut self, problem: ProblemKey) {
        for on in self.active.values_mut() {
            on.remove(&problem);
        }
        self.order.retain(|p| *p != problem);
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
        Preparer::with_cpu(ahead, cpu_ahead())
    }

    /// With `cpu_parallel` problems' inputs made at once (see [`cpu_ahead`]).
    pub fn with_cpu(ahead: usize, cpu_parallel: usize) -> Preparer {
        Preparer {
            queue: Mutex::new(PrepQueue::new(ahead, cpu_parallel)),
            wake: Notify::new(),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut PrepQueue) -> T) -> T {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut queue)
    }

    // Several waiters share `wake` (both stages of the loop, candidates waiting for inputs): every
    // change wakes them all, and each checks the queue for its own condition.
    pub fn coming(&self, problem: ProblemKey) {
        self.with(|q| q.coming(problem));
        self.wake.notify_waiters();
    }

    pub fn arrived(&self, problem: ProblemKey) {
        self.with(|q| q.arrived(problem));
        self.wake.notify_waiters();
    }

    fn inputs_done(&self, problem: ProblemKey) {
        self.with(|q| q.inputs_done(problem));
        self.wake.notify_waiters();
    }

    /// Wait (holding no lease) until `problem`'s inputs are made, when they are being made or queued
    /// to be; queues them first when they are not. Returns at once once they are made.
    pub async fn inputs_ready(&self, problem: ProblemKey) {
        if !self.with(|q| q.wait_for_inputs(problem)) {
            return;
        }
        // The CPU stage may take it now. Told before this waiter listens: a waiter that woke
        // itself would spin without ever yielding to the runtime.
        self.wake.notify_waiters();
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.with(|q| q.made.contains(&problem)) {
                return;
            }
            notified.await;
        }
    }

    /// Wait for the next problem whose inputs to make.
    async fn next_inputs(&self) -> ProblemKey {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(problem) = self.with(PrepQueue::take_inputs) {
                return problem;
            }
            notified.await;
        }
    }

    pub fn wanted(&self, problem: ProblemKey) -> bool {
        self.with(|q| q.wanted(problem))
    }

    /// Wait for the next problem to prepare on `device`.
    pub async fn next(&self, device: &DeviceId) -> ProblemKey {
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(problem) = self.with(|q| q.take(device)) {
                return problem;
            }
            notified.await;
        }
    }

    /// Change the queue and tell every waiter (the other devices may take what this one let go).
    fn change(&self, f: impl FnOnce(&mut PrepQueue)) {
        self.with(f);
        self.wake.notify_waiters();
    }
}

/// What the background loop uses.
pub struct PrepServices<'a> {
    pub devices: &'a DevicePool,
    pub executor: &'a dyn Executor,
    pub compiler: &'a dyn Compiler,
    pub problems: &'a HashMap<ProblemKey, Arc<Problem>>,
    pub sink: &'a EventSink,
    /// The CPU budget the CPU stage draws from (`None`: not shared out).
    pub cpu: Option<&'a CpuBudget>,
}

/// The background loop: make coming problems' inputs (several at once, no lease) and prepare them
/// on every device (one at a time on each) until `cancel` (the run's drivers are done).
pub async fn run(prep: &Preparer, services: PrepServices<'_>, cancel: &CancellationToken) {
    let devices = services.devices.live_devices();
    let on_devices = futures::future::join_all(
        devices
            .iter()
            .map(|device| device_stage(prep, &services, device, cancel)),
    );
    tokio::join!(cpu_stage(prep, &services, cancel), on_devices);
}

/// The CPU stage: coming problems' inputs made, [`cpu_ahead`] at once, no lease held.
async fn cpu_stage(prep: &Preparer, services: &PrepServices<'_>, cancel: &CancellationToken) {
    let mut cpu = FuturesUnordered::new();
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            Some(problem) = cpu.next() => prep.inputs_done(problem),
            problem = prep.next_inputs() => {
                let spec = services.problems.get(&problem).cloned();
                cpu.push(async move {
                    if let Some(spec) = spec {
                        make_inputs(services, spec).await;
                    }
                    problem
                });
            }
        }
    }
}

/// One device's stage: the problems it takes, prepared one after another, until `cancel` or the
/// device is lost.
async fn device_stage(
    prep: &Preparer,
    services: &PrepServices<'_>,
    device: &DeviceId,
    cancel: &CancellationToken,
) {
    loop {
        let problem = tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            problem = prep.next(device) => problem,
        };
        let Some(spec) = services.problems.get(&problem).cloned() else {
            prep.change(|q| q.failed(problem));
            continue;
        };
        let wanted = || prep.wanted(problem);
        match prepare_problem(services, spec, device, wanted, cancel).await {
            Ended::Cancelled => return,
            Ended::Failed => prep.change(|q| q.failed(problem)),
            Ended::Lost => {
                prep.change(|q| q.device_lost(device));
                return;
            }
            Ended::Done | Ended::Stopped => {}
        }
    }
}

/// The CPU stage of one problem: its inputs made into the store, no lease held. Logged when the
/// executor has a store; a failure is logged and leaves the inputs to the device stage.
pub async fn make_inputs(services: &PrepServices<'_>, problem: Arc<Problem>) {
    // The processes drawing inputs are the budget's: claimed first, and the maker kept to them.
    let grant = match services.cpu {
        Some(cpu) => {
            let processes = inputs_claim(cpu.budget());
            Some(cpu.claim(Claim::Inputs, processes * CORE).await)
        }
        None => None,
    };
    let processes = grant.as_ref().map(|g| (g.milli() / CORE) as u32);
    let started = Instant::now();
    let outcome = match services
        .executor
        .make_inputs(problem.clone(), processes)
        .await
    {
        Ok(None) => return,
        Ok(Some(outcome)) => outcome,
        Err(Unavailable(error)) => InputsOutcome {
            status: "failed".into(),
            bytes: 0,
            duration_ms: started.elapsed().as_millis() as u64,
            parallel: 0,
            detail: Some(error),
        },
    };
    let event = Event::InputsPrepared {
        problem: problem.key,
        outcome,
    };
    services.sink.record(None, event).await;
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
    /// The device is lost (retired, by this preparation or by a candidate's step).
    Lost,
    Cancelled,
}

/// Prepare one problem on `device` step by step while `wanted` says its tasks are still on their
/// way. Each step leases the device only while no candidate waits, and is logged through the sink.
pub async fn prepare_problem(
    services: &PrepServices<'_>,
    problem: Arc<Problem>,
    device: &DeviceId,
    wanted: impl Fn() -> bool,
    cancel: &CancellationToken,
) -> Ended {
    let mut next: Option<PrepareStep> = None;
    loop {
        if !wanted() {
            return Ended::Stopped;
        }
        let lease = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Ended::Cancelled,
            l = services.devices.acquire_idle(Some(device)) => match l {
                Some(l) => l,
                // The device was retired (lost, or its host drained).
                None => return Ended::Lost,
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
        // Quiet cores of the budget too: no input maker runs, nothing new starts.
        let cores = match (&pause, services.cpu) {
            (Some(_), Some(cpu)) => Some(cpu.claim(Claim::Quiet, 0).await),
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
        drop(cores);
        drop(pause);
        let lost = services.executor.retired(&id);
        let remaining = if lost {
            let why = match &result {
                Ok(o) => o.error.clone().unwrap_or_default(),
                Err(Unavailable(e)) => e.clone(),
            };
            tracing::warn!("device {id} is lost and retired: {why}");
            Some((lease.retire(&why), why))
        } else {
            drop(lease);
            None
        };
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
        if let Some((remaining, error)) = remaining {
            let event = Event::DeviceRetired {
                device: id.to_string(),
                error,
                remaining: remaining as u32,
            };
            services.sink.record(None, event).await;
            return Ended::Lost;
        }
        if outcome.status != PrepareStatus::Ready {
            return Ended::Failed;
        }
        // Done, or no progress possible here (the reference cannot be timed on busy cores): the
        // first candidate does the rest.
        if outcome.done || outcome.built.is_empty() {
            return Ended::Done;
        }
        next = outcome.next;
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

    /// The CPU stage of `ids`, done.
    fn made(q: &mut PrepQueue, ids: &[u32]) {
        for id in ids {
            q.inputs_done(p(*id));
        }
    }

    #[test]
    fn inputs_are_made_for_every_queued_problem_and_the_device_takes_only_made_ones() {
        let mut q = PrepQueue::new(1, 2);
        for id in [1, 2, 3, 4] {
            q.coming(p(id));
        }
        assert_eq!(q.take(&DeviceId::Cpu), None, "no inputs made yet");
        // Not bound by `ahead` (1): two at once, every queued problem in turn.
        assert_eq!(q.take_inputs(), Some(p(1)));
        assert_eq!(q.take_inputs(), Some(p(2)));
        assert_eq!(q.take_inputs(), None, "two being made");
        q.inputs_done(p(2));
        assert_eq!(
            q.take(&DeviceId::Cpu),
            Some(p(2)),
            "the first made goes to the device"
        );
        assert_eq!(q.take_inputs(), Some(p(3)));
        // A candidate of problem 4 waits for its inputs: problem 4 goes first.
        assert!(q.wait_for_inputs(p(4)));
        q.inputs_done(p(1));
        assert_eq!(q.take_inputs(), Some(p(4)));
        assert!(!q.wait_for_inputs(p(1)), "made: its candidates do not wait");
        // A problem nobody queued is queued first by its candidate.
        assert!(q.wait_for_inputs(p(9)));
        q.inputs_done(p(3));
        assert_eq!(q.take_inputs(), Some(p(9)));
        // Made inputs are not made again when a later turn wants the problem.
        q.inputs_done(p(4));
        q.coming(p(1));
        assert_eq!(q.take_inputs(), None);
    }

    /// A candidate waiting for its problem's inputs wakes when they are made, and lets the CPU
    /// stage run meanwhile (on one thread: a waiter that woke itself would starve it; this test hung
    /// before).
    #[tokio::test]
    async fn a_candidate_waits_for_its_inputs_without_starving_the_cpu_stage() {
        let prep = Arc::new(Preparer::with_cpu(1, 1));
        prep.coming(p(1));
        prep.coming(p(2));
        let waiter = {
            let prep = prep.clone();
            tokio::spawn(async move { prep.inputs_ready(p(2)).await })
        };
        tokio::task::yield_now().await; // the waiter runs (one thread) and queues problem 2 first
        assert_eq!(prep.next_inputs().await, p(2));
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        prep.inputs_done(p(2));
        waiter.await.unwrap();
        prep.inputs_ready(p(2)).await; // made: returns at once
        assert_eq!(prep.next_inputs().await, p(1));
    }

    /// An executor that records what it is asked, in order: problem 1's inputs must be made with
    /// the device free, and problem 2's while problem 1 holds the device (each waits for the other
    /// to have started, so the test ends only if both overlap).
    struct Overlap {
        devices: Arc<DevicePool>,
        log: Mutex<Vec<String>>,
        one_on_device: tokio::sync::watch::Sender<bool>,
        two_making: tokio::sync::watch::Sender<bool>,
    }

    impl Overlap {
        fn note(&self, line: String) {
            self.log.lock().unwrap().push(line);
        }
    }

    #[async_trait::async_trait]
    impl Executor for Overlap {
        async fn execute(
            &self,
            _job: crate::services::ExecJob,
            _device: &DeviceId,
        ) -> Result<crate::types::ExecOutcome, Unavailable> {
            Err(Unavailable("not in this test".into()))
        }

        async fn profile(
            &self,
            _job: crate::services::ExecJob,
            _device: &DeviceId,
        ) -> Result<crate::types::ProfileOutcome, Unavailable> {
            Err(Unavailable("not in this test".into()))
        }

        fn prepares_reference(&self) -> bool {
            true
        }

        async fn make_inputs(
            &self,
            problem: Arc<Problem>,
            _processes: Option<u32>,
        ) -> Result<Option<InputsOutcome>, Unavailable> {
            let id = problem.key.problem_id;
            if id == 1 {
                let free = self.devices.try_acquire_idle(None).is_some();
                self.note(format!("inputs 1: device free {free}"));
            }
            if id == 2 {
                self.two_making.send_replace(true);
                let mut on = self.one_on_device.subscribe();
                let _ = on.wait_for(|on| *on).await;
                self.note("inputs 2 made while 1 holds the device".into());
            }
            Ok(Some(InputsOutcome {
                status: "generated".into(),
                bytes: 8,
                duration_ms: 0,
                parallel: 0,
                detail: None,
            }))
        }

        async fn prepare_reference(
            &self,
            problem: Arc<Problem>,
            device: &DeviceId,
            _quiet: bool,
        ) -> Result<PrepareOutcome, Unavailable> {
            let id = problem.key.problem_id;
            self.note(format!("device {id} on {device}"));
            if id == 1 {
                self.one_on_device.send_replace(true);
                let mut making = self.two_making.subscribe();
                let _ = making.wait_for(|m| *m).await;
            }
            Ok(PrepareOutcome {
                status: PrepareStatus::Ready,
                built: vec!["trial 1".into()],
                trials_ready: 1,
                done: true,
                next: None,
                duration_ms: 0,
                error: None,
            })
        }
    }

    #[tokio::test]
    async fn inputs_are_made_without_a_lease_while_another_problem_holds_the_device() {
        let devices = Arc::new(DevicePool::new(vec![crate::gpu::DeviceInfo::cpu()]));
        let exec = Overlap {
            devices: devices.clone(),
            log: Mutex::new(Vec::new()),
            one_on_device: tokio::sync::watch::channel(false).0,
            two_making: tokio::sync::watch::channel(false).0,
        };
        let compiler = crate::sim::SimServices::new(Default::default());
        let problems: HashMap<ProblemKey, Arc<Problem>> = [1, 2]
            .into_iter()
            .map(|id| {
                let problem = Problem {
                    key: p(id),
                    name: format!("{id}_p.py"),
                    code: String::new(),
                };
                (p(id), Arc::new(problem))
            })
            .collect();
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let sink = EventSink::new(tx);
        let prep = Preparer::with_cpu(2, 1);
        prep.coming(p(1));
        prep.coming(p(2));
        let cancel = CancellationToken::new();
        let services = PrepServices {
            devices: &devices,
            executor: &exec,
            compiler: &compiler,
            problems: &problems,
            sink: &sink,
            cpu: None,
        };
        let mut events = Vec::new();
        let watch = async {
            while events.len() < 4 {
                let Some((_, event)) = rx.recv().await else {
                    break;
                };
                events.push(event);
            }
            cancel.cancel();
        };
        let both = async { tokio::join!(run(&prep, services, &cancel), watch) };
        tokio::time::timeout(std::time::Duration::from_secs(60), both)
            .await
            .expect("the two stages overlapped");
        assert_eq!(
            *exec.log.lock().unwrap(),
            [
                "inputs 1: device free true",
                "device 1 on cpu",
                "inputs 2 made while 1 holds the device",
                "device 2 on cpu",
            ]
        );
        let kinds: Vec<(&str, u32)> = events
            .iter()
            .map(|e| match e {
                Event::InputsPrepared { problem, .. } => ("inputs", problem.problem_id),
                Event::ReferencePrepared { problem, .. } => ("device", problem.problem_id),
                _ => ("other", 0),
            })
            .collect();
        // Each problem's inputs are logged before its device stage; the two problems' events
        // interleave in whichever order their stages ended.
        let at = |k: (&str, u32)| kinds.iter().position(|x| *x == k).unwrap();
        assert_eq!(kinds.len(), 4, "{kinds:?}");
        assert!(at(("inputs", 1)) < at(("device", 1)), "{kinds:?}");
        assert!(at(("inputs", 2)) < at(("device", 2)), "{kinds:?}");
    }

    #[test]
    fn problems_are_prepared_in_order_at_most_ahead_at_once() {
        let mut q = PrepQueue::new(2, 1);
        for id in [3, 1, 3, 2] {
            q.coming(p(id));
        }
        made(&mut q, &[3, 1, 2]);
        assert_eq!(q.take(&DeviceId::Cpu), Some(p(3)));
        assert_eq!(q.take(&DeviceId::Cpu), Some(p(1)));
        assert_eq!(
            q.take(&DeviceId::Cpu),
            None,
            "two prepared and not arrived: the third waits"
        );
        // Problem 3 has two tasks coming: one arriving keeps it prepared and counted.
        q.arrived(p(3));
        assert!(q.wanted(p(3)));
        assert_eq!(q.take(&DeviceId::Cpu), None);
        q.arrived(p(3));
        assert!(!q.wanted(p(3)));
        assert_eq!(q.take(&DeviceId::Cpu), Some(p(2)));
        // A later turn of problem 3 wants it again (cheap when still cached on the worker).
        q.coming(p(3));
        q.arrived(p(1));
        assert_eq!(q.take(&DeviceId::Cpu), Some(p(3)));
    }

    #[test]
    fn a_failed_problem_is_not_tried_again_and_frees_its_place() {
        let mut q = PrepQueue::new(1, 1);
        q.coming(p(1));
        q.coming(p(2));
        made(&mut q, &[1, 2]);
        assert_eq!(q.take(&DeviceId::Cpu), Some(p(1)));
        q.failed(p(1));
        assert_eq!(q.take(&DeviceId::Cpu), Some(p(2)));
        q.arrived(p(1));
        q.coming(p(1));
        q.arrived(p(2));
        assert_eq!(q.take(&DeviceId::Cpu), None);
    }

    /// Prepared data is per (problem, device): a problem goes to as many devices as it has tasks
    /// coming, each device holds at most `ahead`, and a lost device's problems go to the others.
    #[test]
    fn problems_are_prepared_per_device_as_many_times_as_tasks_come() {
        let (g0, g1, g2) = (DeviceId::Gpu(0), DeviceId::Gpu(1), DeviceId::Gpu(2));
        let mut q = PrepQueue::new(2, 1);
        // Problem 1 has two tasks coming, problem 2 one, problem 3 three.
        for id in [1, 1, 2, 3, 3, 3] {
            q.coming(p(id));
        }
        made(&mut q, &[1, 2, 3]);
        assert_eq!(q.take(&g0), Some(p(1)));
        assert_eq!(q.take(&g1), Some(p(1)), "two tasks: a second device");
        assert_eq!(q.take(&g2), Some(p(2)), "no third device for two tasks");
        assert_eq!(
            q.take(&g1),
            Some(p(3)),
            "problem 2's one task has its device"
        );
        assert_eq!(q.take(&g1), None, "ahead (2) reached on GPU 1");
        assert_eq!(q.take(&g0), Some(p(3)));
        assert_eq!(q.take(&g2), Some(p(3)), "three tasks: three devices");
        assert_eq!(q.take(&g2), None, "ahead (2) reached on GPU 2");
        // GPU 1 is lost: its problems may go to another device once one has room.
        q.device_lost(&g1);
        q.arrived(p(2));
        assert_eq!(q.take(&g2), Some(p(1)));
        // A failed problem leaves every device.
        q.failed(p(3));
        assert_eq!(q.take(&g0), None, "problem 1 is on GPU 0 already");
        for _ in 0..2 {
            q.arrived(p(1));
        }
        q.coming(p(4));
        made(&mut q, &[4]);
        assert_eq!(q.take(&g0), Some(p(4)), "places freed by arrivals");
        assert_eq!(q.take(&g2), None, "one task, one device");
    }

    #[test]
    fn arrivals_of_unknown_problems_change_nothing() {
        let mut q = PrepQueue::new(1, 1);
        q.arrived(p(9));
        q.coming(p(1));
        made(&mut q, &[1]);
        q.arrived(p(1));
        assert_eq!(
            q.take(&DeviceId::Cpu),
            None,
            "its only task arrived before it was taken"
        );
    }
}
