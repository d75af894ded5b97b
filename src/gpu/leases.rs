//! Leases: one device to one candidate at a time, in arrival order (see [`super`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};

use super::{DeviceInfo, HostLocks};
use crate::lock::DeviceLock;
use crate::services::DeviceId;
use crate::types::ProblemKey;

/// How many leases in a row a device may give to candidates of the problem it last ran while an
/// older candidate of another problem waits: a problem's queued candidates run one after another
/// (its reference data stays in the device's worker instead of being evicted and made again),
/// without starving anyone.
pub const AFFINITY_STREAK: u32 = 4;

/// Leasable devices.
pub struct DevicePool {
    infos: Vec<DeviceInfo>,
    inner: Arc<Inner>,
    /// The devices' locks across processes, held with each lease (`None`: this process alone
    /// decides, as for simulated evaluations and remote workers).
    host: Option<Arc<HostLocks>>,
}

struct Inner {
    state: Mutex<PoolState>,
    /// Told whenever a lease ends, so that [`DevicePool::acquire_idle`] looks again.
    released: Notify,
}

struct PoolState {
    slots: Vec<Slot>,
    /// Candidates waiting for a device, oldest first.
    waiters: VecDeque<Waiter>,
    /// Why each retired device was retired, in the order they were.
    lost: Vec<(DeviceId, String)>,
    /// Every device retired: `acquire` says `None`.
    closed: bool,
    /// Problems whose waiting candidates go before all others, in this order ([`DevicePool::prefer`]):
    /// their entries hold the room another problem's inputs wait for.
    first: Vec<ProblemKey>,
}

struct Slot {
    info: DeviceInfo,
    busy: bool,
    retired: bool,
    /// The problem of the last candidate leased this device (its reference data is likely still in
    /// the device's worker).
    last: Option<ProblemKey>,
    /// Leases in a row given past an older waiter because of `last`.
    streak: u32,
}

struct Waiter {
    problem: Option<ProblemKey>,
    asked: Instant,
    tx: oneshot::Sender<Lease>,
}

/// An exclusive hold on one device; released on drop.
pub struct Lease {
    pub device: DeviceInfo,
    pub waited_ms: u64,
    index: usize,
    inner: Arc<Inner>,
    /// Retired (or never handed out): nothing to give back on drop.
    settled: bool,
    /// The device's lock across processes, held as long as the lease (see [`HostLocks`]).
    host: Option<DeviceLock>,
}

impl Lease {
    /// Take the device out of the pool for good (its worker's host was drained, or the device is
    /// lost): no later lease names it. The last device retired closes the pool (every waiting and
    /// later `acquire` says `None`). Returns how many devices are left.
    pub fn retire(mut self, why: &str) -> usize {
        self.settled = true;
        drop(self.host.take());
        let mut st = self.inner.lock();
        let slot = &mut st.slots[self.index];
        slot.retired = true;
        slot.busy = false;
        st.lost.push((self.device.id.clone(), why.to_string()));
        let left = st.slots.iter().filter(|s| !s.retired).count();
        if left == 0 {
            st.closed = true;
            // Dropping the senders tells every waiter `None`.
            st.waiters.clear();
        }
        drop(st);
        self.inner.released.notify_waiters();
        left
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // The other processes' turn comes with ours: released before the next lease of this
        // process tries the lock, which would otherwise find it held (by us).
        drop(self.host.take());
        if self.settled {
            return;
        }
        let unsent = {
            let mut st = self.inner.lock();
            st.slots[self.index].busy = false;
            Inner::dispatch(&self.inner, &mut st)
        };
        drop(unsent);
        self.inner.released.notify_waiters();
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hand free devices to waiting candidates: each free device (in the configured order) takes
    /// the oldest waiter of the problem it last ran, else the oldest waiter of a problem no other
    /// busy device last ran, unless it already passed an older waiter [`AFFINITY_STREAK`] times in
    /// a row; otherwise the oldest waiter. The problems of [`DevicePool::prefer`] go before all.
    /// Returns the leases whose waiter had gone, already settled (their slots freed), for the caller
    /// to drop after the lock.
    fn dispatch(inner: &Arc<Inner>, st: &mut PoolState) -> Vec<Lease> {
        let mut unsent = Vec::new();
        loop {
            st.waiters.retain(|w| !w.tx.is_closed());
            if st.waiters.is_empty() {
                return unsent;
            }
            let Some(index) = st.slots.iter().position(|s| !s.busy && !s.retired) else {
                return unsent;
            };
            let slot = &st.slots[index];
            let same = slot
                .last
                .and_then(|last| st.waiters.iter().position(|w| w.problem == Some(last)));
            // The preferred problems' candidates first (the earliest preferred problem with a
            // waiter, its oldest waiter): no streak bound, since the preference ends with them.
            let preferred = st.first.iter().find_map(|p| {
                st.waiters
                    .iter()
                    .position(|w| w.problem.as_ref() == Some(p))
            });
            // Without one of its own, the oldest waiter of a problem no other busy device last ran:
            // that device's worker holds the problem's reference data, and serves its waiters when
            // it frees, rather than both devices building the same data.
            let elsewhere = |w: &Waiter| {
                w.problem.is_some()
                    && st
                        .slots
                        .iter()
                        .enumerate()
                        .any(|(j, s)| j != index && s.busy && !s.retired && s.last == w.problem)
            };
            let own = same.or_else(|| st.waiters.iter().position(|w| !elsewhere(w)));
            let pick = match (preferred, own) {
                (Some(i), _) => i,
                (None, Some(i)) if i == 0 || slot.streak < AFFINITY_STREAK => i,
                _ => 0,
            };
            let Some(w) = st.waiters.remove(pick) else {
                return unsent;
            };
            let slot = &mut st.slots[index];
            slot.busy = true;
            slot.streak = if pick == 0 { 0 } else { slot.streak + 1 };
            if w.problem.is_some() {
                slot.last = w.problem;
            }
            let lease = Lease {
                device: slot.info.clone(),
                waited_ms: w.asked.elapsed().as_millis() as u64,
                index,
                inner: inner.clone(),
                settled: false,
                host: None,
            };
            if let Err(mut back) = w.tx.send(lease) {
                // The waiter went away between the check and the send: free the slot here (its
                // drop must not take the lock again) and look for the next waiter.
                back.settled = true;
                st.slots[index].busy = false;
                unsent.push(back);
            }
        }
    }
}

/// How often an idle-only taker looks again without being told (a backstop for missed notices).
const IDLE_POLL: Duration = Duration::from_millis(100);

impl DevicePool {
    /// With the devices' locks across processes: each lease also holds its device's.
    pub fn with_host_locks(mut self, locks: HostLocks) -> Self {
        self.host = Some(Arc::new(locks));
        self
    }

    pub fn new(devices: Vec<DeviceInfo>) -> Self {
        let slots = devices
            .iter()
            .map(|info| Slot {
                info: info.clone(),
                busy: false,
                retired: false,
                last: None,
                streak: 0,
            })
            .collect();
        DevicePool {
            infos: devices,
            inner: Arc::new(Inner {
                state: Mutex::new(PoolState {
                    slots,
                    waiters: VecDeque::new(),
                    lost: Vec::new(),
                    closed: false,
                    first: Vec::new(),
                }),
                released: Notify::new(),
            }),
            host: None,
        }
    }

    /// Serve the waiting candidates of `problems` before any other, in this order (empty: arrival
    /// order with affinity again). The reference preparation sets it while a problem's inputs wait
    /// for room that these problems' entries hold: the sooner their candidates are done, the sooner
    /// those inputs are made, off the lease. Order only: every lease stays exclusive.
    pub fn prefer(&self, problems: Vec<ProblemKey>) {
        self.inner.lock().first = problems;
    }

    /// The problems [`Self::prefer`] set last.
    pub fn preferred(&self) -> Vec<ProblemKey> {
        self.inner.lock().first.clone()
    }

    /// Candidates waiting for a lease (those that gave up not counted).
    pub fn waiting(&self) -> usize {
        let mut st = self.inner.lock();
        st.waiters.retain(|w| !w.tx.is_closed());
        st.waiters.len()
    }

    /// A lease on a free device (`want`, or any) if no candidate is waiting; never waits (nor for
    /// another process: a device whose lock another process holds is not free).
    pub fn try_acquire_idle(&self, want: Option<&DeviceId>) -> Option<Lease> {
        let mut lease = {
            let mut st = self.inner.lock();
            st.waiters.retain(|w| !w.tx.is_closed());
            if st.closed || !st.waiters.is_empty() {
                return None;
            }
            let index = st
                .slots
                .iter()
                .position(|s| !s.busy && !s.retired && want.is_none_or(|w| *w == s.info.id))?;
            let slot = &mut st.slots[index];
            slot.busy = true;
            Lease {
                device: slot.info.clone(),
                waited_ms: 0,
                index,
                inner: self.inner.clone(),
                settled: false,
                host: None,
            }
        };
        if let Some(host) = &self.host {
            match host.try_lock(&lease.device.id) {
                Ok(Some(l)) => lease.host = Some(l),
                // Cannot be taken at all (said once): go on without it.
                Err(()) => {}
                Ok(None) => {
                    // Another process times on it. Given back to a candidate that came meanwhile,
                    // but without the notice to idle takers: it would only wake this one to find
                    // the lock held again.
                    lease.settled = true;
                    let unsent = {
                        let mut st = self.inner.lock();
                        st.slots[lease.index].busy = false;
                        Inner::dispatch(&self.inner, &mut st)
                    };
                    drop(unsent);
                    return None;
                }
            }
        }
        Some(lease)
    }

    /// Is `device` retired (or not in the pool)?
    pub fn is_retired(&self, device: &DeviceId) -> bool {
        let st = self.inner.lock();
        st.slots
            .iter()
            .find(|s| s.info.id == *device)
            .is_none_or(|s| s.retired)
    }

    /// The devices not retired.
    pub fn live_devices(&self) -> Vec<DeviceId> {
        let st = self.inner.lock();
        st.slots
            .iter()
            .filter(|s| !s.retired)
            .map(|s| s.info.id.clone())
            .collect()
    }

    /// The retired devices and why each was retired (`cuda:0: <why>; cuda:1: <why>`), empty when
    /// none was.
    pub fn lost_summary(&self) -> String {
        let st = self.inner.lock();
        st.lost
            .iter()
            .map(|(d, why)| format!("{d}: {why}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Wait until a device (`want`, or any) is free while no candidate waits for one, and lease it:
    /// work that must never delay a candidate (preparing reference data ahead of time). `None`
    /// once every device (or `want`) was retired.
    pub async fn acquire_idle(&self, want: Option<&DeviceId>) -> Option<Lease> {
        let start = Instant::now();
        loop {
            if self.inner.lock().closed || want.is_some_and(|w| self.is_retired(w)) {
                return None;
            }
            let notified = self.inner.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(mut lease) = self.try_acquire_idle(want) {
                lease.waited_ms = start.elapsed().as_millis() as u64;
                return Some(lease);
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep(IDLE_POLL) => {}
            }
        }
    }

    pub fn devices(&self) -> impl Iterator<Item = &DeviceInfo> {
        self.infos.iter()
    }

    /// Wait (FIFO) for any free device; `None` once every device was retired.
    pub async fn acquire(&self) -> Option<Lease> {
        self.acquire_for(None).await
    }

    /// Wait for a device for a candidate of `problem`: in arrival order, except that a device
    /// serves the waiting candidates of the problem it last ran first (at most
    /// [`AFFINITY_STREAK`] in a row past an older waiter). `None` once every device was retired.
    pub async fn acquire_for(&self, problem: Option<ProblemKey>) -> Option<Lease> {
        let rx = {
            let mut st = self.inner.lock();
            if st.closed {
                return None;
            }
            let (tx, rx) = oneshot::channel();
            st.waiters.push_back(Waiter {
                problem,
                asked: Instant::now(),
                tx,
            });
            let unsent = Inner::dispatch(&self.inner, &mut st);
            drop(st);
            drop(unsent);
            rx
        };
        // A dropped sender: the pool closed (every device retired) while this waited.
        let mut lease = rx.await.ok()?;
        if let Some(host) = &self.host {
            // Held in this process meanwhile: this process's other candidates queue behind it.
            let asked = Instant::now();
            lease.host = host.lock(&lease.device.id).await;
            lease.waited_ms += asked.elapsed().as_millis() as u64;
        }
        Some(lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(i: u32, cap: (u32, u32)) -> DeviceInfo {
        DeviceInfo {
            id: DeviceId::Gpu(i),
            name: format!("G{i}"),
            capability: Some(cap),
            total_memory_bytes: None,
        }
    }

    #[tokio::test]
    async fn leases_are_exclusive_and_fifo() {
        let pool = Arc::new(DevicePool::new(vec![gpu(0, (9, 0))]));
        let first = pool.acquire().await.unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut handles = Vec::new();
        for i in 0..3 {
            let (pool, order) = (pool.clone(), order.clone());
            handles.push(tokio::spawn(async move {
                let l = pool.acquire().await.unwrap();
                order.lock().unwrap().push(i);
                drop(l);
            }));
            // Let each waiter queue up before the next one.
            tokio::task::yield_now().await;
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        drop(first);
        for h in handles {
            h.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
    }

    #[tokio::test]
    async fn idle_leases_never_jump_a_waiting_candidate() {
        let pool = Arc::new(DevicePool::new(vec![gpu(0, (9, 0)), gpu(1, (9, 0))]));
        let idle = pool.try_acquire_idle(None).expect("both devices are free");
        assert_eq!(idle.device.id, DeviceId::Gpu(0));
        // A specific device: GPU 0 is taken, GPU 1 is free.
        assert!(pool.try_acquire_idle(Some(&DeviceId::Gpu(0))).is_none());
        let second = pool
            .try_acquire_idle(Some(&DeviceId::Gpu(1)))
            .expect("GPU 1 is free");
        // A candidate now waits for a device: idle takers stand back even once one is free.
        let waiter = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.acquire().await.expect("a device").device.id.clone() })
        };
        while pool.waiting() == 0 {
            tokio::task::yield_now().await;
        }
        drop(second);
        assert_eq!(waiter.await.unwrap(), DeviceId::Gpu(1));
        assert_eq!(pool.waiting(), 0);
        drop(idle);
        let again = tokio::time::timeout(Duration::from_secs(5), pool.acquire_idle(None))
            .await
            .expect("a free device is leased to an idle taker");
        assert_eq!(again.expect("a device").device.id, DeviceId::Gpu(0));
    }

    #[tokio::test]
    async fn an_idle_taker_waits_for_the_lease_to_end() {
        let pool = Arc::new(DevicePool::new(vec![gpu(0, (9, 0))]));
        let held = pool.acquire().await;
        let taker = {
            let pool = pool.clone();
            tokio::spawn(async move {
                pool.acquire_idle(None)
                    .await
                    .expect("a device")
                    .device
                    .id
                    .clone()
            })
        };
        tokio::task::yield_now().await;
        assert!(!taker.is_finished());
        drop(held);
        assert_eq!(taker.await.unwrap(), DeviceId::Gpu(0));
    }

    /// Waiters are served in arrival order across devices, each taking whichever device frees
    /// first; with several free, the first in the configured order.
    #[tokio::test]
    async fn waiters_are_served_in_order_by_whichever_device_frees_first() {
        let pool = Arc::new(DevicePool::new(vec![gpu(0, (9, 0)), gpu(1, (9, 0))]));
        let (a, b) = (pool.acquire().await.unwrap(), pool.acquire().await.unwrap());
        assert_eq!(
            (a.device.id.clone(), b.device.id.clone()),
            (DeviceId::Gpu(0), DeviceId::Gpu(1))
        );
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut waiters = Vec::new();
        for i in 0..3 {
            let (taker, tx) = (pool.clone(), tx.clone());
            waiters.push(tokio::spawn(async move {
                let l = taker.acquire().await.unwrap();
                tx.send((i, l.device.id.clone())).unwrap();
                l
            }));
            while pool.waiting() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        drop(b);
        assert_eq!(rx.recv().await, Some((0, DeviceId::Gpu(1))));
        drop(a);
        assert_eq!(rx.recv().await, Some((1, DeviceId::Gpu(0))));
        let first = waiters.remove(0).await.unwrap();
        drop(first);
        assert_eq!(rx.recv().await, Some((2, DeviceId::Gpu(1))));
    }

    fn problem(id: u32) -> Option<ProblemKey> {
        Some(ProblemKey {
            level: 1,
            problem_id: id,
        })
    }

    /// Queue `problems` behind a held lease, one waiter each (in that order), and return the order
    /// in which they were served once `held` ends.
    async fn served_order(
        pool: Arc<DevicePool>,
        held: Lease,
        problems: &[u32],
    ) -> Vec<(usize, u32)> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for (i, &p) in problems.iter().enumerate() {
            let (taker, tx) = (pool.clone(), tx.clone());
            tokio::spawn(async move {
                let l = taker.acquire_for(problem(p)).await.unwrap();
                tx.send((i, p)).unwrap();
                drop(l);
            });
            while pool.waiting() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        drop(tx);
        drop(held);
        let mut order = Vec::new();
        while let Some(x) = rx.recv().await {
            order.push(x);
        }
        order
    }

    #[tokio::test]
    async fn a_device_serves_the_queued_candidates_of_its_last_problem_first() {
        let pool = Arc::new(DevicePool::new(vec![gpu(0, (9, 0))]));
        let held = pool.acquire_for(problem(43)).await.unwrap();
        let order = served_order(pool, held, &[8, 43, 15, 43, 8]).await;
        // 43's two waiters go first (the device just ran 43), then the rest in arrival order;
        // 8's second candidate follows its first.
        assert_eq!(order, vec![(1, 43), (3, 43), (0, 8), (4, 8), (2, 15)]);
    }

    #[tokio::test]
    async fn affinity_never_passes_an_older_waiter_more_than_the_streak() {
        let pool = Arc::new(DevicePool::new(vec![gpu(0, (9, 0))]));
        let held = pool.acquire_for(problem(49)).await.unwrap();
        let order = served_order(pool, held, &[8, 49, 49, 49, 49, 49, 49]).await;
        let problems: Vec<u32> = order.iter().map(|&(_, p)| p).collect();
        assert_eq!(problems, vec![49, 49, 49, 49, 8, 49, 49]);
        assert_eq!(AFFINITY_STREAK, 4);
    }

    #[tokio::test]
    async fn a_free_device_leaves_a_problem_to_the_busy_device_that_holds_its_data() {
        let pool = Arc::new(DevicePool::new(vec![gpu(0, (9, 0)), gpu(1, (9, 0))]));
        let on0 = pool.acquire_for(problem(93)).await.unwrap();
        let on1 = pool.acquire_for(problem(8)).await.unwrap();
        assert_eq!(
            (on0.device.id.clone(), on1.device.id.clone()),
            (DeviceId::Gpu(0), DeviceId::Gpu(1))
        );
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for (i, p) in [93, 93, 15].into_iter().enumerate() {
            let (taker, tx) = (pool.clone(), tx.clone());
            tokio::spawn(async move {
                let l = taker.acquire_for(problem(p)).await.unwrap();
                tx.send((p, l.device.id.clone())).unwrap();
                // Held until the test ends: each waiter's device is what is asserted.
                std::future::pending::<()>().await;
                drop(l);
            });
            while pool.waiting() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        // GPU 1 frees while GPU 0 still runs 93: it takes 15, not 93's older waiters.
        drop(on1);
        assert_eq!(rx.recv().await, Some((15, DeviceId::Gpu(1))));
        // GPU 0 frees: 93's first waiter goes to it.
        drop(on0);
        assert_eq!(rx.recv().await, Some((93, DeviceId::Gpu(0))));
        assert_eq!(pool.waiting(), 1);
    }

    #[tokio::test]
    async fn preferred_problems_go_first_then_arrival_order_again() {
        let pool = Arc::new(DevicePool::new(vec![gpu(0, (9, 0))]));
        let held = pool.acquire_for(problem(8)).await.unwrap();
        // 93's and 64's entries hold the room 49's inputs wait for: their candidates go first,
        // 93's (the larger) before 64's, past the device's affinity for 8 and older waiters.
        pool.prefer(vec![problem(93).unwrap(), problem(64).unwrap()]);
        let order = served_order(pool.clone(), held, &[8, 15, 64, 93, 8, 64, 93]).await;
        let problems: Vec<u32> = order.iter().map(|&(_, p)| p).collect();
        assert_eq!(problems, vec![93, 93, 64, 64, 8, 8, 15]);
        // Cleared: arrival order (with affinity) again.
        pool.prefer(Vec::new());
        let held = pool.acquire_for(problem(1)).await.unwrap();
        let order = served_order(pool, held, &[15, 93, 8]).await;
        assert_eq!(order, vec![(0, 15), (1, 93), (2, 8)]);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_is_skipped() {
        let pool = Arc::new(DevicePool::new(vec![gpu(0, (9, 0))]));
        let held = pool.acquire_for(problem(1)).await.unwrap();
        let gone = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.acquire_for(problem(1)).await.map(|_| ()) })
        };
        while pool.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        gone.abort();
        let _ = gone.await;
        assert_eq!(pool.waiting(), 0);
        let next = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.acquire_for(problem(2)).await.is_some() })
        };
        while pool.waiting() < 1 {
            tokio::task::yield_now().await;
        }
        drop(held);
        assert!(next.await.unwrap());
        // Nothing is left leased: an idle taker gets the device at once.
        assert!(pool.try_acquire_idle(None).is_some());
    }

    #[tokio::test]
    async fn two_devices_serve_two_at_once() {
        let pool = DevicePool::new(vec![gpu(0, (9, 0)), gpu(1, (9, 0))]);
        let a = pool.acquire().await.unwrap();
        let b = pool.acquire().await.unwrap();
        assert_ne!(a.device.id, b.device.id);
    }

    #[tokio::test]
    async fn retired_devices_are_never_leased_again() {
        let pool = DevicePool::new(vec![gpu(0, (9, 0)), gpu(1, (9, 0))]);
        let a = pool.acquire().await.unwrap();
        let retired = a.device.id.clone();
        assert_eq!(a.retire("its worker no longer starts"), 1);
        assert!(pool.is_retired(&retired));
        assert_eq!(pool.live_devices(), vec![DeviceId::Gpu(1)]);
        for _ in 0..3 {
            let l = pool.acquire().await.unwrap();
            assert_ne!(l.device.id, retired);
        }
        // An idle taker asking for the retired device is told at once, not left waiting.
        let want = tokio::time::timeout(Duration::from_secs(5), pool.acquire_idle(Some(&retired)));
        assert!(want.await.expect("answered at once").is_none());
        assert_eq!(pool.acquire().await.unwrap().retire("stuck"), 0);
        assert!(pool.acquire().await.is_none());
        assert!(pool.acquire_idle(None).await.is_none());
        assert_eq!(
            pool.lost_summary(),
            "cuda:0: its worker no longer starts; cuda:1: stuck"
        );
    }

    /// Two pools on one lock folder stand for two krefine processes (flock locks belong to the
    /// open file, so two opens conflict as two processes do): a lease of one waits for the other's,
    /// says so once, and an idle taker never waits for it.
    #[tokio::test]
    async fn a_lease_waits_for_another_process_holding_the_device() {
        let tmp = tempfile::tempdir().unwrap();
        let pool = |holder: &str, tx| {
            let locks = HostLocks::new(
                tmp.path().to_path_buf(),
                holder.to_string(),
                &[DeviceInfo::cpu()],
            )
            .with_notices(tx);
            Arc::new(DevicePool::new(vec![DeviceInfo::cpu()]).with_host_locks(locks))
        };
        let (tx_a, _rx_a) = tokio::sync::mpsc::unbounded_channel();
        let (tx_b, mut rx_b) = tokio::sync::mpsc::unbounded_channel();
        let (a, b) = (pool("pid 1, run A", tx_a), pool("pid 2, run B", tx_b));
        let held = a.acquire().await.unwrap();
        // Free in B's own pool, held by A: no idle lease, and the slot is B's again at once.
        assert!(b.try_acquire_idle(None).is_none());
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move { b.acquire().await.map(|l| l.device.id.clone()) })
        };
        let said = rx_b.recv().await.unwrap();
        assert!(
            said.starts_with(
                "cpu is in use by another krefine process on this machine (pid 1, run A)"
            ),
            "{said}"
        );
        assert!(!waiter.is_finished());
        drop(held);
        assert_eq!(waiter.await.unwrap(), Some(DeviceId::Cpu));
        assert!(rx_b.recv().await.unwrap().contains("let go"));
        // Nothing is left held: either pool leases it.
        drop(b.try_acquire_idle(None).expect("free again"));
        assert!(a.try_acquire_idle(None).is_some());
    }
}
