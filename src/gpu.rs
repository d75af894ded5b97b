//! Devices: discovery through cudarc (dynamic loading, so a machine without CUDA builds and runs) and
//! leases.
//!
//! A lease is held only for execute and profile, so a device times one candidate at a time. Waiting
//! tasks are served in arrival order across all devices, each taking whichever device frees first,
//! with one exception: a device that frees serves the waiting candidates of the problem it last ran
//! first ([`AFFINITY_STREAK`] at most in a row past an older waiter), so a problem's reference data
//! is used by all its queued candidates before another problem's evicts it. Preparing reference data ahead of candidates
//! (`crate::refprep`) takes a lease only when no candidate waits for one ([`DevicePool::acquire_idle`]).
//! A device that is lost (its worker's host drained, or its worker no longer starts on it) is retired
//! through the lease that found it lost ([`Lease::retire`]): no later lease names it, waiting tasks
//! take the other devices, and once none is left every `acquire` says `None`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, oneshot};

use crate::services::DeviceId;
use crate::settings::DeviceSelection;
use crate::types::ProblemKey;

/// A device krefine can lease.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    pub id: DeviceId,
    pub name: String,
    /// Compute capability (major, minor) of a GPU.
    pub capability: Option<(u32, u32)>,
    pub total_memory_bytes: Option<u64>,
}

impl DeviceInfo {
    pub fn cpu() -> Self {
        DeviceInfo {
            id: DeviceId::Cpu,
            name: "cpu".into(),
            capability: None,
            total_memory_bytes: None,
        }
    }
}

/// What the CUDA driver reports.
#[derive(Debug, Clone, Default)]
pub struct Discovery {
    pub gpus: Vec<DeviceInfo>,
    /// Driver API version, e.g. "13.0".
    pub driver_version: Option<String>,
    /// Why there are no GPUs, when there are none.
    pub note: Option<String>,
}

/// Ask the CUDA driver for its devices. Never panics: no driver library, no device or a driver
/// error all give an empty list with a note.
pub fn discover() -> Discovery {
    match std::panic::catch_unwind(discover_unguarded) {
        Ok(Ok(d)) => d,
        Ok(Err(note)) => Discovery {
            note: Some(note),
            ..Discovery::default()
        },
        Err(_) => Discovery {
            note: Some("the CUDA driver library could not be used".into()),
            ..Discovery::default()
        },
    }
}

fn discover_unguarded() -> Result<Discovery, String> {
    use cudarc::driver::{result, sys};
    // SAFETY: only probes whether libcuda can be opened; loading it has no side effects we rely on.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda) on this machine".into());
    }
    result::init().map_err(|e| format!("CUDA driver init failed: {e:?}"))?;
    let mut version = 0i32;
    // SAFETY: the driver is initialised and `version` is a valid out-pointer.
    let driver_version = unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .ok()
        .map(|_| format!("{}.{}", version / 1000, (version % 1000) / 10));
    let count = result::device::get_count().map_err(|e| format!("cuDeviceGetCount: {e:?}"))?;
    let mut gpus = Vec::new();
    for i in 0..count {
        let dev = result::device::get(i).map_err(|e| format!("cuDeviceGet({i}): {e:?}"))?;
        let name = result::device::get_name(dev).unwrap_or_else(|_| format!("GPU {i}"));
        // SAFETY: `dev` came from cuDeviceGet above.
        let major = unsafe {
            result::device::get_attribute(
                dev,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            )
        };
        // SAFETY: as above.
        let minor = unsafe {
            result::device::get_attribute(
                dev,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            )
        };
        // SAFETY: as above.
        let mem = unsafe { result::device::total_mem(dev) }.ok();
        gpus.push(DeviceInfo {
            id: DeviceId::Gpu(i as u32),
            name,
            capability: match (major, minor) {
                (Ok(a), Ok(b)) => Some((a as u32, b as u32)),
                _ => None,
            },
            total_memory_bytes: mem.map(|m| m as u64),
        });
    }
    let note = gpus
        .is_empty()
        .then(|| "the CUDA driver reports no GPU".to_string());
    Ok(Discovery {
        gpus,
        driver_version,
        note,
    })
}

/// The devices a run uses, from the config's selection and what was found.
pub fn select(sel: &DeviceSelection, found: &Discovery) -> Result<Vec<DeviceInfo>, String> {
    match sel {
        DeviceSelection::Cpu => Ok(vec![DeviceInfo::cpu()]),
        DeviceSelection::Auto if found.gpus.is_empty() => Ok(vec![DeviceInfo::cpu()]),
        DeviceSelection::Auto => Ok(found.gpus.clone()),
        DeviceSelection::Gpus(ids) => ids
            .iter()
            .map(|i| {
                found
                    .gpus
                    .iter()
                    .find(|d| d.id == DeviceId::Gpu(*i))
                    .cloned()
                    .ok_or_else(|| {
                        format!(
                            "resources.devices names GPU {i}, but {}",
                            match &found.note {
                                Some(n) => n.clone(),
                                None => format!("only {} GPU(s) were found", found.gpus.len()),
                            }
                        )
                    })
            })
            .collect(),
    }
}

/// The `CUDA_VISIBLE_DEVICES` a worker needs to see, as its only GPU, the device this process calls
/// `cuda:index`. The CUDA driver numbers only the devices visible to this process, so when the user
/// or a scheduler (Slurm) set `CUDA_VISIBLE_DEVICES` (`parent`), index i is the i-th entry of that
/// list (an index, a `GPU-<uuid>` or a `MIG-<uuid>`), not physical GPU i; workers start with a
/// scrubbed environment, so they must be given that entry. Unset: every device is visible and the
/// index is the device's own.
pub fn worker_visible_device(index: u32, parent: Option<&str>) -> Result<String, String> {
    let Some(list) = parent else {
        return Ok(index.to_string());
    };
    // The driver stops at the first invalid entry; the ones before it are what it enumerates.
    list.split(',')
        .map(str::trim)
        .nth(index as usize)
        .filter(|entry| !entry.is_empty())
        .map(str::to_string)
        .ok_or_else(|| {
            format!(
                "GPU {index} is not among the visible devices (CUDA_VISIBLE_DEVICES={list:?}); \
                 resources.devices counts from 0 among them"
            )
        })
}

/// `TORCH_CUDA_ARCH_LIST` for the devices' compute capabilities (e.g. "9.0"); `None` on CPU.
pub fn arch_list(devices: &[DeviceInfo]) -> Option<String> {
    let mut caps: Vec<(u32, u32)> = devices.iter().filter_map(|d| d.capability).collect();
    caps.sort_unstable();
    caps.dedup();
    if caps.is_empty() {
        return None;
    }
    Some(
        caps.iter()
            .map(|(a, b)| format!("{a}.{b}"))
            .collect::<Vec<_>>()
            .join(";"),
    )
}

/// How many leases in a row a device may give to candidates of the problem it last ran while an
/// older candidate of another problem waits: a problem's queued candidates run one after another
/// (its reference data stays in the device's worker instead of being evicted and made again),
/// without starving anyone.
pub const AFFINITY_STREAK: u32 = 4;

/// Leasable devices.
pub struct DevicePool {
    infos: Vec<DeviceInfo>,
    inner: Arc<Inner>,
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
}

impl Lease {
    /// Take the device out of the pool for good (its worker's host was drained, or the device is
    /// lost): no later lease names it. The last device retired closes the pool (every waiting and
    /// later `acquire` says `None`). Returns how many devices are left.
    pub fn retire(mut self, why: &str) -> usize {
        self.settled = true;
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
    /// the oldest waiter of the problem it last ran, unless it already passed an older waiter
    /// [`AFFINITY_STREAK`] times in a row; otherwise the oldest waiter. Returns the leases whose
    /// waiter had gone, already settled (their slots freed), for the caller to drop after the lock.
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
            let pick = match same {
                Some(i) if i == 0 || slot.streak < AFFINITY_STREAK => i,
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
                }),
                released: Notify::new(),
            }),
        }
    }

    /// Candidates waiting for a lease (those that gave up not counted).
    pub fn waiting(&self) -> usize {
        let mut st = self.inner.lock();
        st.waiters.retain(|w| !w.tx.is_closed());
        st.waiters.len()
    }

    /// A lease on a free device (`want`, or any) if no candidate is waiting; never waits.
    pub fn try_acquire_idle(&self, want: Option<&DeviceId>) -> Option<Lease> {
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
        Some(Lease {
            device: slot.info.clone(),
            waited_ms: 0,
            index,
            inner: self.inner.clone(),
            settled: false,
        })
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
        rx.await.ok()
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

    #[test]
    fn discovery_never_panics() {
        let d = discover();
        // On CI there is no GPU; on a GPU box there is at least one. Either way a clean answer.
        assert!(d.note.is_some() || !d.gpus.is_empty());
    }

    #[test]
    fn selection() {
        let none = Discovery {
            note: Some("no GPU".into()),
            ..Default::default()
        };
        assert_eq!(
            select(&DeviceSelection::Auto, &none).unwrap(),
            vec![DeviceInfo::cpu()]
        );
        let e = select(&DeviceSelection::Gpus(vec![0]), &none).unwrap_err();
        assert!(e.contains("GPU 0") && e.contains("no GPU"), "{e}");
        let two = Discovery {
            gpus: vec![gpu(0, (9, 0)), gpu(1, (8, 0))],
            ..Default::default()
        };
        assert_eq!(select(&DeviceSelection::Auto, &two).unwrap().len(), 2);
        assert_eq!(
            select(&DeviceSelection::Gpus(vec![1]), &two).unwrap()[0].id,
            DeviceId::Gpu(1)
        );
        assert_eq!(arch_list(&two.gpus).as_deref(), Some("8.0;9.0"));
        assert_eq!(arch_list(&[DeviceInfo::cpu()]), None);
    }

    #[test]
    fn worker_devices_follow_the_visible_list() {
        // No restriction: index i is GPU i.
        assert_eq!(worker_visible_device(0, None).unwrap(), "0");
        assert_eq!(worker_visible_device(3, None).unwrap(), "3");
        // A scheduler gave this job GPUs 2 and 3: our cuda:0 and cuda:1 are those.
        assert_eq!(worker_visible_device(0, Some("2,3")).unwrap(), "2");
        assert_eq!(worker_visible_device(1, Some("2, 3")).unwrap(), "3");
        // UUIDs and MIG instances are passed on as written.
        let uuids = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6,MIG-1a2b";
        assert_eq!(worker_visible_device(1, Some(uuids)).unwrap(), "MIG-1a2b");
        // `CUDA_VISIBLE_DEVICES=0` on the H100 box: one device, index 0.
        assert_eq!(worker_visible_device(0, Some("0")).unwrap(), "0");
        let e = worker_visible_device(2, Some("5,6")).unwrap_err();
        assert!(e.contains("GPU 2") && e.contains("\"5,6\""), "{e}");
        assert!(worker_visible_device(0, Some("")).is_err());
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
}
