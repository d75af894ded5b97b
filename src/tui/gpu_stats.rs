//! GPU utilisation and memory through NVML (`nvml-wrapper`, which loads `libnvidia-ml` at run time):
//! a machine without a GPU or driver simply shows none.
//!
//! Lease events name devices as CUDA does (`cuda:N`). NVML numbers GPUs in PCI bus order; CUDA does
//! too when `CUDA_DEVICE_ORDER=PCI_BUS_ID`, and its default order agrees on machines with one kind of
//! GPU. `CUDA_VISIBLE_DEVICES` (indices or `GPU-` UUIDs) is followed.

use std::sync::Arc;

use nvml_wrapper::Nvml;

use super::app::GpuStat;

/// An initialised NVML, shared with the blocking threads that query it.
pub struct Probe {
    nvml: Arc<Nvml>,
}

impl Probe {
    /// `None` when NVML cannot be loaded or initialised (no driver, no GPU, a container without it).
    pub async fn start() -> Option<Probe> {
        let nvml = tokio::task::spawn_blocking(|| {
            // A broken driver library must not take the UI down.
            std::panic::catch_unwind(Nvml::init).ok()?.ok()
        })
        .await
        .ok()
        .flatten()?;
        Some(Probe {
            nvml: Arc::new(nvml),
        })
    }

    /// Utilisation and memory of the named devices that are GPUs NVML knows.
    pub async fn sample(&self, devices: Vec<String>) -> Vec<GpuStat> {
        let nvml = self.nvml.clone();
        tokio::task::spawn_blocking(move || {
            let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
            devices
                .into_iter()
                .filter_map(|name| {
                    let index: usize = name.strip_prefix("cuda:")?.parse().ok()?;
                    let device = match nvml_target(visible.as_deref(), index)? {
                        Target::Index(i) => nvml.device_by_index(i).ok()?,
                        Target::Uuid(u) => nvml.device_by_uuid(u).ok()?,
                    };
                    let util = device.utilization_rates().ok()?;
                    let mem = device.memory_info().ok()?;
                    Some(GpuStat {
                        device: name,
                        util_pct: util.gpu,
                        mem_used: mem.used,
                        mem_total: mem.total,
                    })
                })
                .collect()
        })
        .await
        .unwrap_or_default()
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Target {
    Index(u32),
    Uuid(String),
}

/// The NVML device behind CUDA device `index` under `CUDA_VISIBLE_DEVICES`.
fn nvml_target(visible: Option<&str>, index: usize) -> Option<Target> {
    let Some(list) = visible.filter(|v| !v.trim().is_empty()) else {
        return Some(Target::Index(index as u32));
    };
    let entry = list.split(',').map(str::trim).nth(index)?;
    if entry.starts_with("GPU-") {
        return Some(Target::Uuid(entry.to_string()));
    }
    entry.parse().ok().map(Target::Index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_devices_map_cuda_indices() {
        assert_eq!(nvml_target(None, 1), Some(Target::Index(1)));
        assert_eq!(nvml_target(Some("3,1"), 1), Some(Target::Index(1)));
        assert_eq!(nvml_target(Some("3,1"), 0), Some(Target::Index(3)));
        assert_eq!(nvml_target(Some("3"), 1), None);
        assert_eq!(
            nvml_target(Some("GPU-abc"), 0),
            Some(Target::Uuid("GPU-abc".into()))
        );
        assert_eq!(nvml_target(Some("MIG-x"), 0), None);
    }
}
