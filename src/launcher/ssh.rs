//! The SSH side: the `ssh` command of a worker on a listed host, the reachability probe, and the
//! remote kill.
//!
//! The remote command is `exec env -i K=V ... python -u <harness> serve ...`: the worker gets
//! exactly the scrubbed environment a local worker gets (nothing of the remote login's), and the
//! Python becomes the session leader sshd made, so `kill -- -<pid>` ends it and everything it
//! started. ssh runs with `BatchMode` (never a password prompt) and keep-alives, so a host that
//! stops answering ends the connection after `resources.ssh.alive_timeout_s`, which the pool sees
//! as a lost worker.

use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use super::config::{SshDevices, SshHost, SshSection};
use super::sh_quote;
use crate::services::DeviceId;

/// What ssh prints about its own failures (as opposed to the remote program's output).
const LOSS_MARKERS: [&str; 12] = [
    "closed by remote host",
    "not responding",
    "client_loop:",
    "Connection reset",
    "Connection refused",
    "Connection timed out",
    "Broken pipe",
    "No route to host",
    "kex_exchange_identification",
    "Could not resolve hostname",
    "Permission denied (",
    "connect to host",
];
/// Keep-alive period; the count is `alive_timeout_s / ALIVE_EVERY`.
const ALIVE_EVERY: u32 = 5;

#[derive(Debug)]
pub(super) struct Ssh {
    hosts: Vec<SshHost>,
    /// Arguments before the destination: batch mode, timeouts, port, key, the user's options.
    base: Vec<String>,
}

impl Ssh {
    pub(super) fn new(cfg: &SshSection) -> Result<Ssh, String> {
        let hosts = cfg
            .hosts
            .iter()
            .map(|h| SshHost::parse(h))
            .collect::<Result<Vec<_>, _>>()?;
        let mut base = vec![
            "-T".to_string(),
            "-o".into(),
            "BatchMode=yes".into(),
            "-o".into(),
            format!("ConnectTimeout={}", cfg.connect_timeout_s),
            "-o".into(),
            format!("ServerAliveInterval={ALIVE_EVERY}"),
            "-o".into(),
            format!(
                "ServerAliveCountMax={}",
                (cfg.alive_timeout_s / ALIVE_EVERY).max(1)
            ),
        ];
        if let Some(p) = cfg.port {
            base.extend(["-p".into(), p.to_string()]);
        }
        if let Some(i) = &cfg.identity {
            base.extend(["-i".into(), i.to_string_lossy().into_owned()]);
        }
        base.extend(cfg.options.iter().cloned());
        Ok(Ssh { hosts, base })
    }

    pub(super) fn hosts(&self) -> &[SshHost] {
        &self.hosts
    }

    pub(super) fn describe(&self) -> String {
        let hosts: Vec<String> = self
            .hosts
            .iter()
            .map(|h| match &h.devices {
                SshDevices::Cpu => format!("{} (cpu)", h.destination),
                SshDevices::Gpus(g) => format!(
                    "{} (GPU {})",
                    h.destination,
                    g.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
                ),
            })
            .collect();
        format!("ssh to {}", hosts.join(", "))
    }

    /// The host and GPU that serve `device` (GPU slots are numbered across the hosts in order).
    pub(super) fn eval_placement(&self, device: &DeviceId) -> super::Placement {
        let mut next = 0u32;
        for (i, h) in self.hosts.iter().enumerate() {
            match (&h.devices, device) {
                (SshDevices::Cpu, DeviceId::Cpu) => {
                    return super::Placement::Ssh { host: i, gpu: None };
                }
                (SshDevices::Gpus(g), DeviceId::Gpu(want)) => {
                    for gpu in g {
                        if next == *want {
                            return super::Placement::Ssh {
                                host: i,
                                gpu: Some(*gpu),
                            };
                        }
                        next += 1;
                    }
                }
                _ => {}
            }
        }
        // Devices come from `Launcher::devices`, so every one has a host; keep the first.
        super::Placement::Ssh { host: 0, gpu: None }
    }

    fn ssh(&self, host: usize) -> Result<tokio::process::Command, String> {
        let h = self
            .hosts
            .get(host)
            .ok_or_else(|| format!("no SSH host number {host}"))?;
        let mut cmd = tokio::process::Command::new("ssh");
        cmd.args(&self.base).arg(&h.destination).arg("--");
        Ok(cmd)
    }

    /// `ssh host 'exec env -i ENV python ARGS'`. The local ssh keeps the orchestrator's
    /// environment (it needs HOME, SSH_AUTH_SOCK); nothing of it reaches the remote side.
    pub(super) fn command(
        &self,
        host: usize,
        gpu: Option<u32>,
        program: &Path,
        args: &[OsString],
        env: &[(String, OsString)],
    ) -> Result<tokio::process::Command, String> {
        let mut remote = String::from("exec env -i");
        for (k, v) in env {
            if k == "CUDA_VISIBLE_DEVICES" {
                continue;
            }
            remote.push(' ');
            remote.push_str(&sh_quote(&format!("{k}={}", v.to_string_lossy())));
        }
        let cvd = gpu.map(|g| g.to_string()).unwrap_or_default();
        remote.push(' ');
        remote.push_str(&sh_quote(&format!("CUDA_VISIBLE_DEVICES={cvd}")));
        remote.push(' ');
        remote.push_str(&sh_quote(&program.to_string_lossy()));
        for a in args {
            remote.push(' ');
            remote.push_str(&sh_quote(&a.to_string_lossy()));
        }
        let mut cmd = self.ssh(host)?;
        cmd.arg(remote);
        Ok(cmd)
    }

    /// A fresh connection to the host runs `true` within the connect timeout.
    pub(super) async fn answers(&self, host: usize) -> bool {
        let Ok(mut cmd) = self.ssh(host) else {
            return false;
        };
        cmd.arg("true")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        matches!(
            tokio::time::timeout(Duration::from_secs(30), cmd.status()).await,
            Ok(Ok(s)) if s.success()
        )
    }

    /// Kill the remote worker's process group (its pid is the group id), in the background.
    pub(super) fn kill_group(&self, host: usize, pid: u32) {
        if pid <= 1 {
            return;
        }
        let Ok(mut cmd) = self.ssh(host) else { return };
        cmd.arg(format!("kill -KILL -- -{pid} {pid} 2>/dev/null; true"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(30), cmd.status()).await;
            });
        }
    }
}

/// The line where ssh says the connection failed, if any.
pub(super) fn loss_line(tail: &str) -> Option<String> {
    tail.lines()
        .find(|l| l.starts_with("ssh:") || LOSS_MARKERS.iter().any(|m| l.contains(m)))
        .map(|l| l.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_failures_are_recognised() {
        assert!(loss_line("Timeout, server 10.0.0.2 not responding.").is_some());
        assert!(loss_line("ssh: connect to host gpu1 port 22: Connection refused").is_some());
        assert_eq!(loss_line("Traceback\nValueError: bad"), None);
    }

    #[test]
    fn gpu_slots_number_across_hosts() {
        let s = Ssh::new(&SshSection {
            hosts: vec!["a:0,1".into(), "b".into(), "c:cpu".into()],
            ..SshSection::default()
        })
        .unwrap();
        assert_eq!(
            s.eval_placement(&DeviceId::Gpu(1)),
            super::super::Placement::Ssh {
                host: 0,
                gpu: Some(1)
            }
        );
        assert_eq!(
            s.eval_placement(&DeviceId::Gpu(2)),
            super::super::Placement::Ssh {
                host: 1,
                gpu: Some(0)
            }
        );
        assert_eq!(
            s.eval_placement(&DeviceId::Cpu),
            super::super::Placement::Ssh { host: 2, gpu: None }
        );
    }
}
