//! Devices: discovery through cudarc (dynamic loading, so a machine without CUDA builds and runs) and
//! FIFO leases, one semaphore per device.
//!
//! A lease is held only for execute and profile, so a device times one candidate at a time. Waiting
//! tasks are served in arrival order across all devices: a global fair semaphore admits them, then
//! each takes whichever device is free. Preparing reference data ahead of candidates
//! (`crate::refprep`) takes a lease only when no candidate waits for one ([`DevicePool::acquire_idle`]).
//! A device that is lost (its worker's host drained, or its worker no longer starts on it) is retired
//! through the lease that found it lost ([`Lease::retire`]): no later lease names it, waiting tasks
//! take the other devices, and once none is left every `acquire` says `None`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::services::DeviceId;
use crate::settings::DeviceSelection;

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

/// Leasable devices.
pub struct DevicePool {
    admission: Arc<Semaphore>,
    devices: Vec<(DeviceInfo, Arc<Semaphore>, Arc<AtomicBool>)>,
    /// Why each retired device was retired, in the order they were.
    lost: Arc<Mutex<Vec<(DeviceId, String)>>>,
    /// Devices not retired; at 0 the admission gate closes and `acquire` says `None`.
    live: Arc<AtomicUsize>,
    /// Leases asked for with [`DevicePool::acquire`] and not granted yet.
    waiting: Arc<AtomicUsize>,
    /// Told whenever a lease ends, so that [`DevicePool::acquire_idle`] looks again.
    released: Arc<Notify>,
}

/// An exclusive hold on one device; released on drop.
pub struct Lease {
    pub device: DeviceInfo,
    pub waited_ms: u64,
    device_permit: OwnedSemaphorePermit,
    admission_permit: OwnedSemaphorePermit,
    admission: Arc<Semaphore>,
    live: Arc<AtomicUsize>,
    retired: Arc<AtomicBool>,
    lost: Arc<Mutex<Vec<(DeviceId, String)>>>,
    // Last, so it is dropped (and tells idle-only takers) after the permits are back.
    _released: ReleaseNotice,
}

impl Lease {
    /// Take the device out of the pool for good (its worker's host was drained, or the device is
    /// lost): its permits are never returned, so no later lease names it. The last device retired
    /// closes the pool. Returns how many devices are left.
    pub fn retire(self, why: &str) -> usize {
        self.retired.store(true, Ordering::SeqCst);
        if let Ok(mut lost) = self.lost.lock() {
            lost.push((self.device.id.clone(), why.to_string()));
        }
        self.device_permit.forget();
        self.admission_permit.forget();
        let left = self.live.fetch_sub(1, Ordering::SeqCst).saturating_sub(1);
        if left == 0 {
            self.admission.close();
        }
        left
    }
}

/// Tells idle-only takers that a lease ended (dropped after the permits, being the last field).
struct ReleaseNotice(Arc<Notify>);

impl Drop for ReleaseNotice {
    fn drop(&mut self) {
        self.0.notify_waiters();
    }
}

/// Counts a waiting [`DevicePool::acquire`] (also when its future is dropped while it waits).
struct Waiting(Arc<AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How often an idle-only taker looks again without being told (a backstop for missed notices).
const IDLE_POLL: Duration = Duration::from_millis(100);

impl DevicePool {
    pub fn new(devices: Vec<DeviceInfo>) -> Self {
        DevicePool {
            admission: Arc::new(Semaphore::new(devices.len())),
            live: Arc::new(AtomicUsize::new(devices.len())),
            devices: devices
                .into_iter()
                .map(|d| {
                    let free = Arc::new(Semaphore::new(1));
                    (d, free, Arc::new(AtomicBool::new(false)))
                })
                .collect(),
            lost: Arc::new(Mutex::new(Vec::new())),
            waiting: Arc::new(AtomicUsize::new(0)),
            released: Arc::new(Notify::new()),
        }
    }

    fn lease(
        &self,
        info: &DeviceInfo,
        retired: &Arc<AtomicBool>,
        waited_ms: u64,
        device_permit: OwnedSemaphorePermit,
        admission_permit: OwnedSemaphorePermit,
    ) -> Lease {
        Lease {
            device: info.clone(),
            waited_ms,
            device_permit,
            admission_permit,
            admission: self.admission.clone(),
            live: self.live.clone(),
            retired: retired.clone(),
            lost: self.lost.clone(),
            _released: ReleaseNotice(self.released.clone()),
        }
    }

    /// A lease on a free device (`want`, or any) if no [`DevicePool::acquire`] is waiting; never
    /// waits.
    pub fn try_acquire_idle(&self, want: Option<&DeviceId>) -> Option<Lease> {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            return None;
        }
        // A fair semaphore hands released permits to its waiters first, so this never jumps a queue.
        let admission = self.admission.clone().try_acquire_owned().ok()?;
        for (info, sem, retired) in &self.devices {
            if want.is_some_and(|w| *w != info.id) {
                continue;
            }
            if let Ok(p) = sem.clone().try_acquire_owned() {
                return Some(self.lease(info, retired, 0, p, admission));
            }
        }
        None
    }

    /// Is `device` retired (or not in the pool)?
    pub fn is_retired(&self, device: &DeviceId) -> bool {
        self.devices
            .iter()
            .find(|(d, _, _)| d.id == *device)
            .is_none_or(|(_, _, r)| r.load(Ordering::SeqCst))
    }

    /// The devices not retired.
    pub fn live_devices(&self) -> Vec<DeviceId> {
        self.devices
            .iter()
            .filter(|(_, _, r)| !r.load(Ordering::SeqCst))
            .map(|(d, _, _)| d.id.clone())
            .collect()
    }

    /// The retired devices and why each was retired (`cuda:0: <why>; cuda:1: <why>`), empty when
    /// none was.
    pub fn lost_summary(&self) -> String {
        let lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        lost.iter()
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
            if self.admission.is_closed() || want.is_some_and(|w| self.is_retired(w)) {
                return None;
            }
            let notified = self.released.notified();
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
        self.devices.iter().map(|(d, _, _)| d)
    }

    /// Wait (FIFO) for any free device; `None` once every device was retired.
    pub async fn acquire(&self) -> Option<Lease> {
        let start = Instant::now();
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let waiting = Waiting(self.waiting.clone());
        let admission = self.admission.clone().acquire_owned().await.ok()?;
        // Holding an admission permit guarantees one device semaphore is free: the first free one
        // in the configured order is taken.
        for (info, sem, retired) in &self.devices {
            if let Ok(p) = sem.clone().try_acquire_owned() {
                drop(waiting);
                let waited = start.elapsed().as_millis() as u64;
                return Some(self.lease(info, retired, waited, p, admission));
            }
        }
        // Only reachable if permits were miscounted; say "no device" rather than panic.
        None
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
            tokio::spawn(async move { pool.acquire().await.expect("a device").device.id })
        };
        while pool.waiting.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        drop(second);
        assert_eq!(waiter.await.unwrap(), DeviceId::Gpu(1));
        assert_eq!(pool.waiting.load(Ordering::SeqCst), 0);
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
            tokio::spawn(async move { pool.acquire_idle(None).await.expect("a device").device.id })
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
            while pool.waiting.load(Ordering::SeqCst) < i + 1 {
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
