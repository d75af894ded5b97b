//! Which problems to prepare, on which device and in which order ([`PrepQueue`], pure bookkeeping),
//! how many at once, and the [`Preparer`] that shares it between the task drivers and the background
//! loop (a floor of [`super`], below [`super::stages`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::services::DeviceId;
use crate::types::ProblemKey;

/// The most problems prepared on a device ahead of their candidates: a worker keeps up to
/// `MAX_CONTEXTS` (8, kb_reference.py) within its memory budgets, and problems prepared further ahead
/// would push out those whose candidates are queued now.
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
    /// Problems a device holds prepared and not yet arrived, at most (`resources.prepare_ahead`).
    ahead: usize,
    /// CPU stage: problems whose inputs are made at once.
    cpu_parallel: usize,
    /// CPU stage: problems whose inputs are to be made, in the order they were first wanted; the
    /// largest of them (`sizes`) is taken first.
    cpu_order: VecDeque<ProblemKey>,
    /// CPU stage: problems a candidate waits for, taken before `cpu_order`, the latest first.
    cpu_urgent: VecDeque<ProblemKey>,
    /// Each problem's input bytes where its plan is known (`Executor::plan_inputs`): the largest
    /// inputs take longest to make, so they start first and the rest fit around them.
    sizes: HashMap<ProblemKey, u64>,
    /// CPU stage: inputs being made now.
    making: HashSet<ProblemKey>,
    /// CPU stage: inputs no store tier had room for yet, to be tried again (their candidates wait).
    deferred: HashSet<ProblemKey>,
    /// Problems waiting for room from their first deferral until their inputs are done (retries
    /// included), with the only tier they wait for (`None`: either).
    waiting_room: HashMap<ProblemKey, Option<String>>,
    /// The tier holding each made problem's entry, where the CPU stage said.
    tier_of: HashMap<ProblemKey, String>,
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
        if self.made.contains(&problem)
            || self.making.contains(&problem)
            || self.deferred.contains(&problem)
        {
            return;
        }
        if first {
            self.cpu_order.retain(|p| *p != problem);
            self.cpu_urgent.retain(|p| *p != problem);
            self.cpu_urgent.push_front(problem);
        } else if !self.cpu_order.contains(&problem) && !self.cpu_urgent.contains(&problem) {
            self.cpu_order.push_back(problem);
        }
    }

    /// The input bytes of problems whose plan is known: the largest queued is made first.
    pub fn set_sizes(&mut self, sizes: HashMap<ProblemKey, u64>) {
        self.sizes = sizes;
    }

    /// The next problem whose inputs to make, if fewer than `cpu_parallel` are being made: one a
    /// candidate waits for, else the largest queued (the first wanted among equals; an unknown size
    /// counts as none).
    pub fn take_inputs(&mut self) -> Option<ProblemKey> {
        if self.making.len() >= self.cpu_parallel {
            return None;
        }
        let problem = match self.cpu_urgent.pop_front() {
            Some(p) => p,
            None => {
                let size = |p: &ProblemKey| self.sizes.get(p).copied().unwrap_or(0);
                let (index, _) = self
                    .cpu_order
                    .iter()
                    .enumerate()
                    .max_by(|(i, a), (j, b)| size(a).cmp(&size(b)).then(j.cmp(i)))?;
                self.cpu_order.remove(index)?
            }
        };
        self.making.insert(problem);
        Some(problem)
    }

    /// The CPU stage of `problem` ended (however it ended: a failure leaves the inputs to the
    /// device, as before there was a CPU stage), its entry in `tier` when it is stored.
    pub fn inputs_done(&mut self, problem: ProblemKey, tier: Option<String>) {
        self.making.remove(&problem);
        self.waiting_room.remove(&problem);
        self.made.insert(problem);
        if let Some(tier) = tier {
            self.tier_of.insert(problem, tier);
        }
    }

    /// No store tier had room for `problem`'s inputs yet (`tier`: the only one that will): they
    /// wait for [`Self::retry_inputs`], and so do its candidates (off the lease), while other
    /// problems go on.
    pub fn inputs_deferred(&mut self, problem: ProblemKey, tier: Option<String>) {
        self.making.remove(&problem);
        self.deferred.insert(problem);
        self.waiting_room.insert(problem, tier);
    }

    /// Try a deferred problem's inputs again, before the other queued ones (its candidates wait).
    pub fn retry_inputs(&mut self, problem: ProblemKey) {
        if self.deferred.remove(&problem) {
            self.queue_inputs(problem, true);
        }
    }

    /// While some problem's inputs wait for room ([`Self::inputs_deferred`], until they are made:
    /// a retry in flight still waits), the problems whose inputs are made in a tier they wait for,
    /// largest first (ties by key): their candidates are the ones to run first, as their entries
    /// hold the most of that room (the store keeps an entry from a candidate's build to the end of
    /// its evaluation). Empty when nothing waits for room.
    pub fn room_holders(&self) -> Vec<ProblemKey> {
        if self.waiting_room.is_empty() {
            return Vec::new();
        }
        // The tiers waited for; `None` when some problem would take room in either.
        let wanted: Option<HashSet<&str>> =
            self.waiting_room.values().map(|t| t.as_deref()).collect();
        let in_wanted = |p: &ProblemKey| match (&wanted, self.tier_of.get(p)) {
            (Some(tiers), Some(tier)) => tiers.contains(tier.as_str()),
            _ => true,
        };
        let mut holders: Vec<(u64, ProblemKey)> = self
            .made
            .iter()
            .filter(|p| in_wanted(p))
            .filter_map(|p| self.sizes.get(p).map(|&b| (b, *p)))
            .filter(|&(b, _)| b > 0)
            .collect();
        holders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        holders.into_iter().map(|(_, p)| p).collect()
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

    pub(super) fn inputs_done(&self, problem: ProblemKey, tier: Option<String>) {
        self.with(|q| q.inputs_done(problem, tier));
        self.wake.notify_waiters();
    }

    pub(super) fn inputs_deferred(&self, problem: ProblemKey, tier: Option<String>) {
        self.with(|q| q.inputs_deferred(problem, tier));
        self.wake.notify_waiters();
    }

    pub(super) fn set_sizes(&self, sizes: HashMap<ProblemKey, u64>) {
        self.with(|q| q.set_sizes(sizes));
        self.wake.notify_waiters();
    }

    pub(super) fn room_holders(&self) -> Vec<ProblemKey> {
        self.with(|q| q.room_holders())
    }

    pub(super) fn retry_inputs(&self, problem: ProblemKey) {
        self.with(|q| q.retry_inputs(problem));
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
    pub(super) async fn next_inputs(&self) -> ProblemKey {
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
    pub(super) fn change(&self, f: impl FnOnce(&mut PrepQueue)) {
        self.with(f);
        self.wake.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::types::{INPUTS_TIER_DISK, INPUTS_TIER_MEMORY};

    fn p(id: u32) -> ProblemKey {
        ProblemKey {
            level: 1,
            problem_id: id,
        }
    }

    /// A queue (1 ahead, 4 makers) with these problems coming and their input sizes planned.
    fn sized(sizes: &[(u32, u64)]) -> PrepQueue {
        let mut q = PrepQueue::new(1, 4);
        for (id, _) in sizes {
            q.coming(p(*id));
        }
        q.set_sizes(sizes.iter().map(|(id, b)| (p(*id), *b)).collect());
        q
    }

    /// The CPU stage of `ids`, done.
    fn made(q: &mut PrepQueue, ids: &[u32]) {
        for id in ids {
            q.inputs_done(p(*id), None);
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
        q.inputs_done(p(2), None);
        assert_eq!(
            q.take(&DeviceId::Cpu),
            Some(p(2)),
            "the first made goes to the device"
        );
        assert_eq!(q.take_inputs(), Some(p(3)));
        // A candidate of problem 4 waits for its inputs: problem 4 goes first.
        assert!(q.wait_for_inputs(p(4)));
        q.inputs_done(p(1), None);
        assert_eq!(q.take_inputs(), Some(p(4)));
        assert!(!q.wait_for_inputs(p(1)), "made: its candidates do not wait");
        // A problem nobody queued is queued first by its candidate.
        assert!(q.wait_for_inputs(p(9)));
        q.inputs_done(p(3), None);
        assert_eq!(q.take_inputs(), Some(p(9)));
        // Made inputs are not made again when a later turn wants the problem.
        q.inputs_done(p(4), None);
        q.coming(p(1));
        assert_eq!(q.take_inputs(), None);
    }

    #[test]
    fn the_largest_inputs_start_first_and_a_waiting_candidates_before_them() {
        let mut q = PrepQueue::new(1, 1);
        for id in [1, 2, 3, 4] {
            q.coming(p(id));
        }
        // Problem 4's size is unknown (counts as none); 2 and 3 are equal: the first wanted first.
        q.set_sizes(HashMap::from([(p(1), 10), (p(2), 500), (p(3), 500)]));
        assert_eq!(q.take_inputs(), Some(p(2)));
        q.inputs_done(p(2), None);
        // A candidate of problem 4 waits: it goes before the larger ones.
        assert!(q.wait_for_inputs(p(4)));
        assert_eq!(q.take_inputs(), Some(p(4)));
        q.inputs_done(p(4), None);
        assert_eq!(q.take_inputs(), Some(p(3)));
        q.inputs_done(p(3), None);
        assert_eq!(q.take_inputs(), Some(p(1)));
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
        prep.inputs_done(p(2), None);
        waiter.await.unwrap();
        prep.inputs_ready(p(2)).await; // made: returns at once
        assert_eq!(prep.next_inputs().await, p(1));
    }

    #[test]
    fn deferred_inputs_free_their_place_and_come_back_first() {
        let mut q = PrepQueue::new(1, 1);
        for id in [1, 2, 3] {
            q.coming(p(id));
        }
        assert_eq!(q.take_inputs(), Some(p(1)));
        q.inputs_deferred(p(1), None);
        // Its place goes to the next problem; its candidates still wait, and a waiting candidate
        // does not queue it again before its retry.
        assert_eq!(q.take_inputs(), Some(p(2)));
        assert!(q.wait_for_inputs(p(1)));
        assert_eq!(q.take(&DeviceId::Cpu), None, "nothing made yet");
        q.inputs_done(p(2), None);
        q.retry_inputs(p(1));
        assert_eq!(q.take_inputs(), Some(p(1)), "retried before 3");
        q.inputs_done(p(1), None);
        assert!(!q.wait_for_inputs(p(1)));
        assert_eq!(q.take_inputs(), Some(p(3)));
        // A retry of a problem that is not deferred changes nothing.
        q.inputs_done(p(3), None);
        q.retry_inputs(p(2));
        assert_eq!(q.take_inputs(), None);
    }

    #[test]
    fn while_inputs_wait_for_room_the_largest_made_problems_hold_it() {
        let mut q = sized(&[(8, 1), (43, 25), (49, 51), (64, 12), (93, 32)]);
        made(&mut q, &[8, 64, 93]);
        assert!(q.room_holders().is_empty(), "nothing waits for room");
        assert_eq!(q.take_inputs(), Some(p(49)), "the largest first");
        q.inputs_deferred(p(49), None);
        // Made problems only (43's inputs are not made: they hold no entry yet), largest first.
        assert_eq!(q.room_holders(), vec![p(93), p(64), p(8)]);
        q.retry_inputs(p(49));
        assert_eq!(q.take_inputs(), Some(p(49)));
        assert_eq!(
            q.room_holders(),
            vec![p(93), p(64), p(8)],
            "a retry in flight still waits for room (the preference held only between retries)"
        );
        q.inputs_done(p(49), None);
        assert!(q.room_holders().is_empty(), "made: the preference ends");
    }

    #[test]
    fn inputs_waiting_for_memory_prefer_the_problems_holding_memory() {
        let mut q = sized(&[(8, 1), (43, 25), (49, 51), (64, 12), (70, 8), (93, 32)]);
        let memory = || Some(INPUTS_TIER_MEMORY.to_string());
        let disk = || Some(INPUTS_TIER_DISK.to_string());
        for (id, tier) in [(43, disk()), (93, memory()), (70, memory()), (8, None)] {
            q.inputs_done(p(id), tier);
        }
        // 49 fits only the in-memory tier: the disk store's 43, larger than 70, frees none of it
        // (8's tier is not known: it may).
        q.inputs_deferred(p(49), memory());
        assert_eq!(q.room_holders(), vec![p(93), p(70), p(8)]);
        // Another problem that would take room in either tier: every holder counts again.
        q.inputs_deferred(p(64), None);
        assert_eq!(q.room_holders(), vec![p(93), p(43), p(70), p(8)]);
        q.inputs_done(p(64), memory());
        assert_eq!(q.room_holders(), vec![p(93), p(64), p(70), p(8)]);
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
