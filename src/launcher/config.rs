//! The launcher's config: `[resources]` (devices, workers, where they start, lost workers),
//! `resources.launcher`, `[resources.slurm]`, `[resources.ssh]`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::settings::DeviceSelection;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ResourcesSection {
    /// Maximum LLM requests in flight.
    #[serde(default = "default_llm_concurrency")]
    pub llm_concurrency: u32,
    /// Requests per minute (0 = no limit).
    #[serde(default)]
    pub requests_per_minute: u32,
    /// Tokens per minute (0 = no limit).
    #[serde(default)]
    pub tokens_per_minute: u64,
    /// CPU compile worker processes; default: derived from the CPU budget
    /// ([`ResourcesSection::compile_workers`]). How many build at once is the budget's to say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile_workers: Option<u32>,
    /// Cores that builds, the CPU stage of reference preparation and CPU-device timing share
    /// (`crate::cpu_budget`); default: the cores available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_budget: Option<u32>,
    #[serde(default)]
    pub devices: DeviceSelection,
    /// Python interpreter for the workers; default: the first `python3` that imports torch.
    #[serde(default)]
    pub python: Option<PathBuf>,
    /// Where workers start: `local`, `slurm` or `ssh` (see `crate::launcher`).
    #[serde(default)]
    pub launcher: LauncherKind,
    #[serde(default)]
    pub slurm: SlurmSection,
    #[serde(default)]
    pub ssh: SshSection,
    /// A remote worker that is lost (its node, step or connection died) has its request retried on
    /// another worker, at most this many times per request.
    #[serde(default = "default_loss_retries")]
    pub loss_retries: u32,
    /// A node or SSH host that lost this many workers is drained: no worker starts there again in
    /// this run.
    #[serde(default = "default_drain_after")]
    pub drain_after: u32,
    /// Problems whose reference data (trial inputs and outputs, timing inputs, reference timing) is
    /// prepared on the device ahead of their first candidate, while its answer is generated and
    /// compiled (`crate::refprep`); 0 turns it off. At most `refprep::MAX_AHEAD` (what a worker keeps).
    /// The CPU side (making inputs into the store, no lease held) is not bound by it: it runs ahead
    /// for every problem queued, a few at once (`refprep::cpu_ahead`).
    #[serde(default = "default_prepare_ahead")]
    pub prepare_ahead: u32,
    /// Size bound of the on-disk store of reference inputs (`eval.reference_cache`), in GB (1e9
    /// bytes); least recently used entries go first. Unset: the file system's free space decides
    /// alone (the store never takes its last tenth or 5 GB, whichever is larger), so inputs kept by
    /// one run serve the next as long as the disk has room. 0 turns the store off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_cache_gb: Option<f64>,
    /// Size bound, in GB, of the in-memory tier of that store (`/dev/shm`, the run's own, removed
    /// when it ends): a problem's inputs too large for the disk store are made there, still off the
    /// lease, instead of inside a candidate's lease. Unset: 45% of the machine's memory; 0 turns it
    /// off. An entry is admitted only while a quarter of the memory stays available to the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_ram_gb: Option<f64>,
    /// Keep the in-memory tier for later runs on this machine (the default): one folder in
    /// `/dev/shm` (`krefine-inputs.kept`) shared by runs, left in place when a run ends (gone at
    /// reboot or removed by hand), so a second run reads large problems' inputs from memory instead
    /// of drawing them again; bounded by `reference_ram_gb`, and a run's admission removes the least
    /// recently used entries when it needs the room. `false`: the run's own folder, removed when it
    /// ends.
    #[serde(default = "yes", skip_serializing_if = "Clone::clone")]
    pub reference_ram_keep: bool,
}

fn yes() -> bool {
    true
}

fn default_loss_retries() -> u32 {
    3
}
fn default_drain_after() -> u32 {
    2
}

fn default_llm_concurrency() -> u32 {
    16
}
fn default_prepare_ahead() -> u32 {
    2
}
/// The most compile workers a run starts unless `resources.compile_workers` says otherwise: one per
/// core up to here. A 4-GPU host has 64 cores; at 16 workers its builds used at most 16 of them, and
/// its GPUs waited for builds (docs/benchmarks.md, two GPUs at 1.29x one). A worker is one Python
/// process with torch imported (a few hundred MB).
pub const MAX_DEFAULT_COMPILE_WORKERS: u32 = 64;

impl ResourcesSection {
    /// `cpu_budget`, or the cores available.
    pub fn cpu_cores(&self) -> u32 {
        self.cpu_budget
            .unwrap_or_else(crate::cpu_budget::available_cores)
            .max(1)
    }

    /// `compile_workers`, or one per core of the budget (at most [`MAX_DEFAULT_COMPILE_WORKERS`]):
    /// the budget, not the worker count, bounds how many build at once, by what builds are measured
    /// to use.
    pub fn compile_workers(&self) -> u32 {
        self.compile_workers
            .unwrap_or_else(|| self.cpu_cores().clamp(1, MAX_DEFAULT_COMPILE_WORKERS))
    }
}

impl Default for ResourcesSection {
    fn default() -> Self {
        ResourcesSection {
            llm_concurrency: default_llm_concurrency(),
            requests_per_minute: 0,
            tokens_per_minute: 0,
            compile_workers: None,
            cpu_budget: None,
            devices: DeviceSelection::Auto,
            python: None,
            launcher: LauncherKind::default(),
            slurm: SlurmSection::default(),
            ssh: SshSection::default(),
            loss_retries: default_loss_retries(),
            drain_after: default_drain_after(),
            prepare_ahead: default_prepare_ahead(),
            reference_cache_gb: None,
            reference_ram_gb: None,
            reference_ram_keep: true,
        }
    }
}

/// Where worker processes start (`resources.launcher`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LauncherKind {
    /// Child processes of krefine on this machine.
    #[default]
    Local,
    /// Job steps of a Slurm allocation (`srun`), one GPU per evaluation worker.
    Slurm,
    /// Processes on other hosts started over `ssh`.
    Ssh,
}

impl LauncherKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LauncherKind::Local => "local",
            LauncherKind::Slurm => "slurm",
            LauncherKind::Ssh => "ssh",
        }
    }
}

/// `[resources.slurm]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlurmSection {
    /// GPU evaluation workers (job steps with one GPU each). Not needed with `resources.devices =
    /// "cpu"` (one CPU evaluation step, as the tests use).
    #[serde(default)]
    pub gpus: Option<u32>,
    /// Nodes to ask for when krefine requests the allocation itself (default: Slurm's choice).
    #[serde(default)]
    pub nodes: Option<u32>,
    /// `--partition` of the allocation krefine requests.
    #[serde(default)]
    pub partition: Option<String>,
    /// `--account` of the allocation krefine requests.
    #[serde(default)]
    pub account: Option<String>,
    /// `--time` of the allocation krefine requests (`"04:00:00"`, `"2-00:00:00"`).
    #[serde(default)]
    pub time: Option<String>,
    /// The generic resource each evaluation step asks for (`--gres=<this>`); empty: none (put
    /// `--gpus=1` in `srun_args` instead, on clusters that want that form).
    #[serde(default = "default_gres")]
    pub gres: String,
    /// CPUs of each evaluation step (`--cpus-per-task`).
    #[serde(default = "default_gpu_cpus")]
    pub gpu_cpus: u32,
    /// CPUs of each compile step (`--cpus-per-task`).
    #[serde(default = "one")]
    pub compile_cpus: u32,
    /// Extra `srun` arguments for every worker step (`["--mem=16G"]`).
    #[serde(default)]
    pub srun_args: Vec<String>,
    /// Extra `salloc` arguments for the allocation krefine requests (`["--qos=short"]`).
    #[serde(default)]
    pub salloc_args: Vec<String>,
    /// Seconds to wait for a requested allocation to be granted before giving up.
    #[serde(default = "default_grant_s")]
    pub grant_timeout_s: f64,
}

fn default_gres() -> String {
    "gpu:1".into()
}
fn default_gpu_cpus() -> u32 {
    4
}
fn one() -> u32 {
    1
}
fn default_grant_s() -> f64 {
    600.0
}

impl Default for SlurmSection {
    fn default() -> Self {
        SlurmSection {
            gpus: None,
            nodes: None,
            partition: None,
            account: None,
            time: None,
            gres: default_gres(),
            gpu_cpus: default_gpu_cpus(),
            compile_cpus: 1,
            srun_args: Vec::new(),
            salloc_args: Vec::new(),
            grant_timeout_s: default_grant_s(),
        }
    }
}

/// `[resources.ssh]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SshSection {
    /// `"host"` (its GPU 0), `"host:0,1"` (those GPUs), `"host:cpu"` (a CPU evaluation worker, at
    /// most one in a run); `user@host` works as with ssh.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// `-p` for every host (default: ssh's, usually 22 or what ~/.ssh/config says).
    #[serde(default)]
    pub port: Option<u16>,
    /// `-i` private key.
    #[serde(default)]
    pub identity: Option<PathBuf>,
    /// Extra ssh arguments (`["-o", "UserKnownHostsFile=/path"]`).
    #[serde(default)]
    pub options: Vec<String>,
    /// A connection that does not answer for this long is a lost worker (ssh's
    /// `ServerAliveInterval` × `ServerAliveCountMax`, checked every 5 s).
    #[serde(default = "default_alive_s")]
    pub alive_timeout_s: u32,
    /// `ConnectTimeout` of every ssh connection.
    #[serde(default = "default_connect_s")]
    pub connect_timeout_s: u32,
}

impl Default for SshSection {
    fn default() -> Self {
        SshSection {
            hosts: Vec::new(),
            port: None,
            identity: None,
            options: Vec::new(),
            alive_timeout_s: default_alive_s(),
            connect_timeout_s: default_connect_s(),
        }
    }
}

fn default_alive_s() -> u32 {
    15
}
fn default_connect_s() -> u32 {
    10
}

/// One entry of `ssh.hosts`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshHost {
    /// What ssh gets as the destination (`gpu1`, `user@gpu1`).
    pub destination: String,
    pub devices: SshDevices,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SshDevices {
    Gpus(Vec<u32>),
    Cpu,
}

impl SshHost {
    /// `host`, `host:0,1`, `host:cpu`.
    pub fn parse(entry: &str) -> Result<SshHost, String> {
        let entry = entry.trim();
        let (dest, devices) = match entry.rsplit_once(':') {
            None => (entry, SshDevices::Gpus(vec![0])),
            Some((d, "cpu")) => (d, SshDevices::Cpu),
            Some((d, list)) => {
                let gpus: Result<Vec<u32>, _> =
                    list.split(',').map(|p| p.trim().parse::<u32>()).collect();
                match gpus {
                    Ok(g) if !g.is_empty() => (d, SshDevices::Gpus(g)),
                    _ => {
                        return Err(format!(
                            "{entry:?}: expected \"host\", \"host:0,1\" or \"host:cpu\""
                        ));
                    }
                }
            }
        };
        if dest.is_empty() || dest.starts_with('-') || dest.contains(char::is_whitespace) {
            return Err(format!("{entry:?}: expected a host name before the ':'"));
        }
        if let SshDevices::Gpus(g) = &devices {
            for (i, x) in g.iter().enumerate() {
                if g[..i].contains(x) {
                    return Err(format!("{entry:?}: GPU {x} is listed twice"));
                }
            }
        }
        Ok(SshHost {
            destination: dest.to_string(),
            devices,
        })
    }
}

/// Checks the config loader runs: `(key, what was expected)` on the first problem.
pub fn validate(
    kind: LauncherKind,
    slurm: &SlurmSection,
    ssh: &SshSection,
    devices_cpu: bool,
) -> Result<(), (String, String)> {
    let bad = |k: &str, m: String| Err((k.to_string(), m));
    match kind {
        LauncherKind::Local => Ok(()),
        LauncherKind::Slurm => {
            if !devices_cpu && slurm.gpus.unwrap_or(0) == 0 {
                return bad(
                    "resources.slurm.gpus",
                    "expected the number of GPU workers (at least 1), or resources.devices = \"cpu\""
                        .into(),
                );
            }
            if slurm.nodes == Some(0) {
                return bad("resources.slurm.nodes", "expected at least 1".into());
            }
            if slurm.gpu_cpus == 0 {
                return bad("resources.slurm.gpu_cpus", "expected at least 1".into());
            }
            if slurm.compile_cpus == 0 {
                return bad("resources.slurm.compile_cpus", "expected at least 1".into());
            }
            if !(slurm.grant_timeout_s.is_finite() && slurm.grant_timeout_s > 0.0) {
                return bad(
                    "resources.slurm.grant_timeout_s",
                    "expected a positive number of seconds".into(),
                );
            }
            for (k, v) in [
                ("resources.slurm.partition", &slurm.partition),
                ("resources.slurm.account", &slurm.account),
                ("resources.slurm.time", &slurm.time),
            ] {
                if let Some(v) = v
                    && (v.is_empty() || v.contains(char::is_whitespace))
                {
                    return bad(k, format!("expected a word without spaces, got {v:?}"));
                }
            }
            Ok(())
        }
        LauncherKind::Ssh => {
            if ssh.hosts.is_empty() {
                return bad(
                    "resources.ssh.hosts",
                    "expected at least one host (\"gpu1\", \"gpu2:0,1\", \"cpu1:cpu\")".into(),
                );
            }
            let mut cpu = 0;
            for h in &ssh.hosts {
                match SshHost::parse(h) {
                    Ok(p) if p.devices == SshDevices::Cpu => cpu += 1,
                    Ok(_) => {}
                    Err(e) => return bad("resources.ssh.hosts", e),
                }
            }
            if cpu > 1 {
                return bad(
                    "resources.ssh.hosts",
                    "at most one host may give the CPU evaluation device (\"host:cpu\")".into(),
                );
            }
            if ssh.alive_timeout_s < 5 {
                return bad(
                    "resources.ssh.alive_timeout_s",
                    "expected at least 5".into(),
                );
            }
            if ssh.connect_timeout_s == 0 {
                return bad(
                    "resources.ssh.connect_timeout_s",
                    "expected at least 1".into(),
                );
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_entries_parse() {
        assert_eq!(
            SshHost::parse("gpu1").unwrap(),
            SshHost {
                destination: "gpu1".into(),
                devices: SshDevices::Gpus(vec![0])
            }
        );
        assert_eq!(
            SshHost::parse("me@gpu2:0,1").unwrap().devices,
            SshDevices::Gpus(vec![0, 1])
        );
        assert_eq!(SshHost::parse("h:cpu").unwrap().devices, SshDevices::Cpu);
        for bad in ["", ":0", "h:", "h:x", "h:0,0", "-oProxyCommand=x", "a b"] {
            assert!(SshHost::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn validation_names_the_key() {
        let s = SlurmSection::default();
        let h = SshSection::default();
        assert!(validate(LauncherKind::Local, &s, &h, false).is_ok());
        assert_eq!(
            validate(LauncherKind::Slurm, &s, &h, false).unwrap_err().0,
            "resources.slurm.gpus"
        );
        assert!(validate(LauncherKind::Slurm, &s, &h, true).is_ok());
        assert_eq!(
            validate(LauncherKind::Ssh, &s, &h, false).unwrap_err().0,
            "resources.ssh.hosts"
        );
        let two_cpu = SshSection {
            hosts: vec!["a:cpu".into(), "b:cpu".into()],
            ..SshSection::default()
        };
        assert!(validate(LauncherKind::Ssh, &s, &two_cpu, false).is_err());
    }
}
