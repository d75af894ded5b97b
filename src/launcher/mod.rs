//! Where worker processes start: on this machine (`local`), as job steps of a Slurm allocation
//! (`slurm`), or on other hosts over SSH (`ssh`). The orchestrator stays one process with one event
//! log; only the worker processes move.
//!
//! The worker protocol is JSON lines over stdin/stdout (docs/worker-protocol.md), and both `srun`
//! and `ssh` carry a remote process's stdin and stdout, so a remote worker is the same harness
//! started through one of them: the local child is `srun ... python -u krefine_harness.py serve` or
//! `ssh host 'exec env -i ... python -u krefine_harness.py serve'`, and everything in
//! `worker::process` (deadlines, kill, log capture) applies to that local child.
//!
//! - [`config`]: `resources.launcher`, `[resources.slurm]`, `[resources.ssh]`.
//! - `slurm`: the allocation (the one krefine runs in when `SLURM_JOB_ID` is set, else one it asks
//!   for with `salloc` and releases on every way out) and the `srun` command of a worker step.
//! - `ssh`: the `ssh` command of a worker, the reachability probe and the remote kill.
//!
//! What the launcher adds to the pool's fault handling: a worker whose node, step or connection
//! died is *lost* ([`Launcher::loss`]), which is not the candidate's fault: the request is retried on
//! another worker and the host is charged with the loss; a host that lost `resources.drain_after`
//! workers is drained (no worker starts there again; recorded with the result, shown in the report).
//!
//! A floor below `worker`: the pool calls in here, and what the launcher reads of a worker (the
//! placement and pid of its `ready` line, a [`RequestError`]) comes from `crate::types`.

pub mod config;
#[cfg(test)]
mod fuzz;
mod slurm;
mod slurm_pending;
mod ssh;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::sync::Mutex as StdMutex;

pub use config::{LauncherKind, ResourcesSection, SlurmSection, SshDevices, SshHost, SshSection};

use crate::gpu::DeviceInfo;
use crate::services::DeviceId;
use crate::settings::DeviceSelection;
use crate::types::{RanOn, RequestError, WorkerPlacement};

/// Why the launcher could not get going (no allocation, no `srun`, ...).
#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    #[error("slurm launcher: {0}")]
    Slurm(String),
    #[error("ssh launcher: {0}")]
    Ssh(String),
}

/// Where one worker position starts its process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// A child process of krefine.
    Local,
    /// A job step of the allocation; `gpu`: with one GPU (`--gres`), else a CPU step.
    Slurm { gpu: bool },
    /// A process on `host` (an index into the launcher's hosts) with `CUDA_VISIBLE_DEVICES`
    /// set to `gpu` (`None`: every GPU hidden).
    Ssh { host: usize, gpu: Option<u32> },
}

/// The launcher of a run: how to start a worker at each [`Placement`], what counts as a lost
/// worker, and which hosts are drained.
#[derive(Debug)]
pub struct Launcher {
    kind: LauncherKind,
    slurm: Option<slurm::Slurm>,
    ssh: Option<ssh::Ssh>,
    /// Losses per host, and the hosts drained (losses reached `drain_after`).
    health: StdMutex<Health>,
    drain_after: u32,
    loss_retries: u32,
}

#[derive(Debug, Default)]
struct Health {
    losses: BTreeMap<String, u32>,
    drained: Vec<String>,
}

impl Launcher {
    /// The local launcher (every worker a child process).
    pub fn local() -> Launcher {
        Launcher {
            kind: LauncherKind::Local,
            slurm: None,
            ssh: None,
            health: StdMutex::new(Health::default()),
            drain_after: 2,
            loss_retries: 3,
        }
    }

    /// Get the launcher of `resources` going: for `slurm`, find or request the allocation (waits
    /// until it is granted, `cancel` is cancelled, or Slurm says it can never be); for `ssh`, parse
    /// the hosts. `srun`, `salloc` and `ssh` are found on `PATH`.
    pub async fn start(
        r: &ResourcesSection,
        cancel: &tokio_util::sync::CancellationToken,
    ) -> Result<Launcher, LauncherError> {
        let mut l = Launcher::local();
        l.kind = r.launcher;
        l.drain_after = r.drain_after.max(1);
        l.loss_retries = r.loss_retries;
        match r.launcher {
            LauncherKind::Local => {}
            LauncherKind::Slurm => {
                l.slurm = Some(slurm::Slurm::start(r, cancel).await?);
            }
            LauncherKind::Ssh => {
                l.ssh = Some(ssh::Ssh::new(&r.ssh).map_err(LauncherError::Ssh)?);
            }
        }
        Ok(l)
    }

    pub fn kind(&self) -> LauncherKind {
        self.kind
    }

    /// Workers start somewhere else than this process's machine (no local sandbox, no local
    /// pause of builds).
    pub fn is_remote(&self) -> bool {
        self.kind != LauncherKind::Local
    }

    /// How many times one request is retried after lost workers.
    pub fn loss_retries(&self) -> u32 {
        self.loss_retries
    }

    /// Losses that drain a host; also the starts in a row a local device's worker may fail before
    /// the device is called lost (`resources.drain_after`, at least 1).
    pub fn drain_after(&self) -> u32 {
        self.drain_after.max(1)
    }

    /// One line for the console and `doctor`: the allocation or the hosts.
    pub fn describe(&self) -> String {
        match (&self.slurm, &self.ssh) {
            (Some(s), _) => s.describe(),
            (_, Some(h)) => h.describe(),
            _ => "local (child processes of krefine)".into(),
        }
    }

    /// The Slurm job the workers run in (slurm launcher only).
    pub fn slurm_job(&self) -> Option<&str> {
        self.slurm.as_ref().map(|s| s.job_id())
    }

    /// The SSH destinations (ssh launcher only).
    pub fn ssh_hosts(&self) -> Vec<String> {
        self.ssh
            .as_ref()
            .map(|s| s.hosts().iter().map(|h| h.destination.clone()).collect())
            .unwrap_or_default()
    }

    /// Where the evaluation worker of `device` starts.
    pub fn eval_placement(&self, device: &DeviceId) -> Placement {
        match (&self.slurm, &self.ssh) {
            (Some(_), _) => Placement::Slurm {
                gpu: matches!(device, DeviceId::Gpu(_)),
            },
            (_, Some(h)) => h.eval_placement(device),
            _ => Placement::Local,
        }
    }

    /// Where compile worker `index` starts: a CPU step, or the hosts in turn.
    pub fn compile_placement(&self, index: usize) -> Placement {
        match (&self.slurm, &self.ssh) {
            (Some(_), _) => Placement::Slurm { gpu: false },
            (_, Some(h)) => Placement::Ssh {
                host: index % h.hosts().len().max(1),
                gpu: None,
            },
            _ => Placement::Local,
        }
    }

    /// The host a placement is bound to before its worker reports one (SSH hosts; Slurm steps go
    /// wherever Slurm puts them).
    pub fn placement_host(&self, placement: &Placement) -> Option<String> {
        match (placement, &self.ssh) {
            (Placement::Ssh { host, .. }, Some(h)) => {
                h.hosts().get(*host).map(|x| x.destination.clone())
            }
            _ => None,
        }
    }

    /// The local command that starts a worker at `placement`: `program args` with exactly `env`
    /// (the worker's scrubbed environment) on the far side.
    pub fn command(
        &self,
        placement: &Placement,
        name: &str,
        program: &Path,
        args: &[OsString],
        env: &[(String, OsString)],
    ) -> Result<tokio::process::Command, String> {
        match (placement, &self.slurm, &self.ssh) {
            (Placement::Slurm { gpu }, Some(s), _) => {
                Ok(s.srun(*gpu, name, program, args, env, &self.drained()))
            }
            (Placement::Ssh { host, gpu }, _, Some(h)) => {
                if let Some(dest) = h.hosts().get(*host)
                    && self.is_drained(&dest.destination)
                {
                    return Err(format!(
                        "host {} is drained (it lost {} worker(s))",
                        dest.destination, self.drain_after
                    ));
                }
                h.command(*host, *gpu, program, args, env)
            }
            (Placement::Local, _, _) => {
                let mut cmd = tokio::process::Command::new(program);
                cmd.args(args)
                    .env_clear()
                    .envs(env.iter().map(|(k, v)| (k, v)));
                Ok(cmd)
            }
            _ => Err(format!(
                "placement {placement:?} does not fit the {} launcher",
                self.kind.as_str()
            )),
        }
    }

    /// Where a worker runs, from the placement its `ready` line reported (`None`: a worker older
    /// than that field).
    pub fn ran_on(&self, reported: Option<&WorkerPlacement>) -> RanOn {
        let p = reported.cloned().unwrap_or_default();
        RanOn {
            launcher: self.kind.as_str().into(),
            host: p.host,
            slurm_job: p.slurm_job_id.filter(|_| self.kind == LauncherKind::Slurm),
            slurm_step: p.slurm_step_id.filter(|_| self.kind == LauncherKind::Slurm),
            gpu_uuid: p.gpu_uuid,
        }
    }

    /// Is this failure of a worker at `placement` a lost worker (its node, step or connection
    /// died) rather than something its candidate did? `Some(what was seen)` when it is.
    ///
    /// Slurm: the step's stderr says it was cancelled or its node failed (`*** STEP 12.3 ON n1
    /// CANCELLED AT ...`, `NODE FAIL`). SSH: ssh itself failed (exit status 255 with ssh's own
    /// message: connection closed, timeout, refused). A deadline that passed counts as a loss when
    /// the host no longer answers ([`Launcher::host_answers`]). A candidate that prints those lines
    /// itself gets its request retried and, after `resources.loss_retries`, no verdict at all.
    pub fn loss(&self, placement: &Placement, err: &RequestError) -> Option<String> {
        let tail = match err {
            RequestError::Exited { log_tail, .. }
            | RequestError::StreamClosed { log_tail }
            | RequestError::Protocol { log_tail, .. } => log_tail,
            RequestError::Timeout { .. }
            | RequestError::ReferenceTimeout { .. }
            | RequestError::Harness { .. } => return None,
        };
        match placement {
            Placement::Slurm { .. } => slurm::loss_line(tail),
            Placement::Ssh { .. } => match err {
                RequestError::Exited { exit, log_tail } if exit.code == Some(255) => {
                    ssh::loss_line(log_tail)
                }
                RequestError::StreamClosed { log_tail } => ssh::loss_line(log_tail),
                _ => None,
            },
            Placement::Local => None,
        }
    }

    /// Does `host` still answer? (ssh: a fresh connection runs `true`; Slurm: the node is not
    /// DOWN, FAIL or NOT_RESPONDING.) Used after a deadline passed, to tell a hung candidate from a
    /// partitioned host.
    pub async fn host_answers(&self, placement: &Placement, host: &str) -> bool {
        match (placement, &self.slurm, &self.ssh) {
            (Placement::Slurm { .. }, Some(_), _) => slurm::node_answers(host).await,
            (Placement::Ssh { host: i, .. }, _, Some(h)) => h.answers(*i).await,
            _ => true,
        }
    }

    /// Make sure a remote worker is gone after its local `srun`/`ssh` was killed: cancel the step,
    /// or kill the remote process group. Fire and forget. `reported` and `pid`: the placement and
    /// process id the worker's `ready` line gave.
    pub fn kill_remote(&self, placement: &Placement, reported: Option<&WorkerPlacement>, pid: u32) {
        let Some(p) = reported else { return };
        match (placement, &self.slurm, &self.ssh) {
            (Placement::Slurm { .. }, Some(_), _) => {
                if let (Some(job), Some(step)) = (&p.slurm_job_id, &p.slurm_step_id) {
                    slurm::cancel_step(job, step);
                }
            }
            (Placement::Ssh { host, .. }, _, Some(h)) => h.kill_group(*host, pid),
            _ => {}
        }
    }

    /// Charge `host` with a lost worker; true when this drains it.
    pub fn note_loss(&self, host: &str) -> bool {
        let mut h = match self.health.lock() {
            Ok(h) => h,
            Err(p) => p.into_inner(),
        };
        let n = {
            let n = h.losses.entry(host.to_string()).or_default();
            *n += 1;
            *n
        };
        if n >= self.drain_after && !h.drained.iter().any(|d| d == host) {
            h.drained.push(host.to_string());
            tracing::warn!("host {host} lost {n} worker(s) and is drained");
            return true;
        }
        false
    }

    pub fn is_drained(&self, host: &str) -> bool {
        self.drained().iter().any(|d| d == host)
    }

    /// The drained hosts, in the order they were drained.
    pub fn drained(&self) -> Vec<String> {
        match self.health.lock() {
            Ok(h) => h.drained.clone(),
            Err(p) => p.into_inner().drained.clone(),
        }
    }

    /// Release what the launcher holds: the allocation krefine asked for (never one it was started
    /// in). Waits until Slurm no longer lists the job. Safe to call twice.
    pub async fn release(&self) {
        if let Some(s) = &self.slurm {
            s.release().await;
        }
    }
}

/// The devices the engine leases when workers are remote, from the config alone: GPU slots
/// `cuda:0..N` (each served by its own worker wherever the launcher puts it), or the CPU device.
/// `None` for the local launcher, whose devices are this machine's GPUs.
pub fn planned_devices(r: &ResourcesSection) -> Result<Option<Vec<DeviceInfo>>, String> {
    match r.launcher {
        LauncherKind::Local => Ok(None),
        LauncherKind::Slurm => Ok(Some(if r.devices == DeviceSelection::Cpu {
            vec![DeviceInfo::cpu()]
        } else {
            (0..r.slurm.gpus.unwrap_or(0))
                .map(|i| remote_gpu(i, "Slurm step"))
                .collect()
        })),
        LauncherKind::Ssh => {
            let mut out = Vec::new();
            let mut next = 0;
            for entry in &r.ssh.hosts {
                let host = SshHost::parse(entry)?;
                match &host.devices {
                    SshDevices::Cpu => out.push(DeviceInfo::cpu()),
                    SshDevices::Gpus(g) => {
                        for _ in g {
                            out.push(remote_gpu(next, &host.destination));
                            next += 1;
                        }
                    }
                }
            }
            Ok(Some(out))
        }
    }
}

fn remote_gpu(i: u32, where_: &str) -> DeviceInfo {
    DeviceInfo {
        id: DeviceId::Gpu(i),
        name: format!("remote GPU {i} ({where_})"),
        capability: None,
        total_memory_bytes: None,
    }
}

/// `s` quoted for a POSIX shell.
pub(crate) fn sh_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_the_shell() {
        assert_eq!(sh_quote("/usr/bin/python3"), "/usr/bin/python3");
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(sh_quote("$HOME"), "'$HOME'");
    }

    #[test]
    fn hosts_drain_after_their_losses() {
        let l = Launcher::local();
        assert!(!l.note_loss("n1"));
        assert!(!l.is_drained("n1"));
        assert!(l.note_loss("n1"));
        assert!(l.is_drained("n1"));
        // Once drained, further losses do not drain it again.
        assert!(!l.note_loss("n1"));
        assert_eq!(l.drained(), vec!["n1".to_string()]);
    }
}
