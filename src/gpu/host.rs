//! One device, one timer, across every krefine process on the machine: the lock a lease holds on
//! its device besides the in-process one, in the folder all users' krefine processes share
//! ([`crate::lock::device_lock_dir`]).
//!
//! A GPU's lock is named by its UUID, so the same physical GPU has the same lock under any
//! `CUDA_VISIBLE_DEVICES`; the CPU device's is `cpu` (timing on the CPU is disturbed by any other
//! timing on it). A lease for a candidate waits for the lock and says so once, naming the process
//! that holds it; work that must never delay anyone (reference preparation ahead of time) only
//! takes a lock that is free.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;

use super::DeviceInfo;
use crate::lock::{self, DeviceLock, DeviceLockTry};
use crate::services::DeviceId;

/// The host-wide locks of a run's devices.
#[derive(Debug)]
pub struct HostLocks {
    /// The folder of the lock files.
    dir: PathBuf,
    /// The line this process writes into a lock it holds (its pid and run directory), which a
    /// waiting process shows.
    holder: String,
    /// Each device's lock: a GPU's UUID (else `cuda-<its CUDA_VISIBLE_DEVICES entry>`), `cpu`.
    keys: HashMap<DeviceId, String>,
    /// Where "waiting for another process" is said (stderr or the terminal UI); also logged.
    notices: Option<mpsc::UnboundedSender<String>>,
    /// A lock that could not be opened is reported once, then the run goes on without it.
    broken: AtomicBool,
}

impl HostLocks {
    /// Locks in `dir` for `devices`; `holder` names this process to the others.
    pub fn new(dir: PathBuf, holder: String, devices: &[DeviceInfo]) -> HostLocks {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let keys = devices
            .iter()
            .map(|d| {
                let key = match &d.id {
                    DeviceId::Cpu => "cpu".to_string(),
                    DeviceId::Gpu(i) => super::device_uuid(*i).unwrap_or_else(|| {
                        let entry = super::worker_visible_device(*i, visible.as_deref())
                            .unwrap_or_else(|_| i.to_string());
                        format!("cuda-{entry}")
                    }),
                };
                (d.id.clone(), key)
            })
            .collect();
        HostLocks {
            dir,
            holder,
            keys,
            notices: None,
            broken: AtomicBool::new(false),
        }
    }

    /// Say waits on `tx` as well as in the log.
    pub fn with_notices(mut self, tx: mpsc::UnboundedSender<String>) -> HostLocks {
        self.notices = Some(tx);
        self
    }

    /// The lock key of `device`.
    pub fn key(&self, device: &DeviceId) -> String {
        self.keys
            .get(device)
            .cloned()
            .unwrap_or_else(|| device.to_string().replace(':', "-"))
    }

    fn say(&self, text: String) {
        tracing::warn!("{text}");
        if let Some(tx) = &self.notices {
            let _ = tx.send(text);
        }
    }

    fn failed(&self, device: &DeviceId, e: &std::io::Error) {
        if !self.broken.swap(true, Ordering::SeqCst) {
            self.say(format!(
                "cannot take {device}'s lock in {} ({e}): other krefine processes on this machine \
                 may time on it at the same time",
                self.dir.display()
            ));
        }
    }

    /// Wait for `device`'s lock; `None` when it cannot be taken at all (said once).
    pub(super) async fn lock(&self, device: &DeviceId) -> Option<DeviceLock> {
        let key = self.key(device);
        let waited = AtomicBool::new(false);
        let got = lock::lock_device(&self.dir, &key, &self.holder, |by| {
            waited.store(true, Ordering::SeqCst);
            self.say(format!(
                "{device} is in use by another krefine process on this machine ({by}); waiting \
                 for it, so that the two never time on it at once"
            ));
        })
        .await;
        match got {
            Ok(l) => {
                if waited.load(Ordering::SeqCst) {
                    self.say(format!(
                        "{device}: the other krefine process let go; going on"
                    ));
                }
                Some(l)
            }
            Err(e) => {
                self.failed(device, &e);
                None
            }
        }
    }

    /// `device`'s lock if no process holds it (`Ok(None)`: busy). `Err` when it cannot be taken
    /// at all (said once): the caller goes on without it.
    pub(super) fn try_lock(&self, device: &DeviceId) -> Result<Option<DeviceLock>, ()> {
        match lock::try_lock_device(&self.dir, &self.key(device), &self.holder) {
            Ok(DeviceLockTry::Held(l)) => Ok(Some(l)),
            Ok(DeviceLockTry::Busy(_)) => Ok(None),
            Err(e) => {
                self.failed(device, &e);
                Err(())
            }
        }
    }
}
