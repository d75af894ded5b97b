//! Devices: discovery through cudarc (dynamic loading, so a machine without CUDA builds and runs),
//! selection, and leases.
//!
//! A lease is held only for execute and profile, so a device times one candidate at a time
//! (`leases`: [`DevicePool`]). Waiting tasks are served in arrival order across all devices, each
//! taking whichever device frees first, with these exceptions: a device that frees serves the
//! waiting candidates of the problem it last ran first ([`AFFINITY_STREAK`] at most in a row past an
//! older waiter), so a problem's reference data is used by all its queued candidates before another
//! problem's evicts it, and else a problem no other busy device last ran (that device holds its
//! data); and while a problem's inputs wait for room in the input store, the
//! candidates of the problems whose entries hold that room go before all
//! ([`DevicePool::prefer`]). Preparing reference data ahead of candidates (`crate::refprep`) takes a
//! lease only when no candidate waits for one ([`DevicePool::acquire_idle`]). A device that is lost
//! (its worker's host drained, or its worker no longer starts on it) is retired through the lease
//! that found it lost ([`Lease::retire`]): no later lease names it, waiting tasks take the other
//! devices, and once none is left every `acquire` says `None`.
//!
//! Timing needs the device to itself across processes too: with [`HostLocks`] (`host`), a lease
//! also holds the device's lock shared by every krefine process on the machine, so two runs never
//! time on one device at once, and the one that waits says so.

mod host;
mod leases;

pub use host::HostLocks;
pub use leases::{AFFINITY_STREAK, DevicePool, Lease};

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

/// The UUID of the GPU this process calls `cuda:index` (`GPU-8932f937-d72c-...`, as `nvidia-smi -L`
/// writes it), from the CUDA driver: the same physical GPU has the same UUID in every process,
/// whatever its `CUDA_VISIBLE_DEVICES`. `None` without a driver or that device.
pub fn device_uuid(index: u32) -> Option<String> {
    std::panic::catch_unwind(|| {
        use cudarc::driver::{result, sys};
        // SAFETY: only probes whether libcuda can be opened.
        if !unsafe { sys::is_culib_present() } {
            return None;
        }
        result::init().ok()?;
        let dev = result::device::get(index as i32).ok()?;
        let uuid = result::device::get_uuid(dev).ok()?;
        let b: Vec<u8> = uuid.bytes.iter().map(|&c| c as u8).collect();
        let hex = |r: std::ops::Range<usize>| -> String {
            b[r].iter().map(|x| format!("{x:02x}")).collect()
        };
        Some(format!(
            "GPU-{}-{}-{}-{}-{}",
            hex(0..4),
            hex(4..6),
            hex(6..8),
            hex(8..10),
            hex(10..16)
        ))
    })
    .ok()
    .flatten()
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
}
