//! The Slurm side: the allocation workers run in, and the `srun` command of one worker step.
//!
//! Inside an allocation (`SLURM_JOB_ID` set, e.g. `krefine run` in an `sbatch` script or under
//! `salloc`), steps go into it and krefine never cancels it. Otherwise krefine asks for one with
//! `salloc ... sh -c 'echo <job id>; exec sleep infinity'` and holds it through that `salloc`
//! process. Releasing it is `scancel`, then SIGHUP to `salloc` (which makes `salloc` give the
//! allocation up without waiting for its command). The ways out are all covered: the normal end,
//! Ctrl-C and SIGTERM go through [`Slurm::release`]; a crash drops the launcher, whose `Drop` sends
//! the SIGHUP; and `salloc` gets SIGHUP from the kernel when krefine dies without running any code
//! at all (SIGKILL), through `PR_SET_PDEATHSIG`.

use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;

use super::LauncherError;
use super::config::{ResourcesSection, SlurmSection};
use super::slurm_pending::{Asked, hopeless, job_id_of, parse_squeue};
use crate::settings::DeviceSelection;

/// Lines a Slurm step's stderr carries when the step (not its program) was ended: cancelled (by
/// `scancel`, preemption, the time limit) or its node failed.
const LOSS_MARKERS: [&str; 6] = [
    "CANCELLED AT",
    "NODE FAIL",
    "Node failure",
    "DUE TO NODE",
    "Job step aborted",
    "Unable to create step",
];

/// How long `release` waits for the job to leave `squeue`.
const GONE_WAIT: Duration = Duration::from_secs(30);
/// How long one `scancel`/`squeue`/`scontrol` call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a pending request's reason is read from `squeue`.
const PENDING_POLL: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(super) struct Slurm {
    /// The allocation every step goes into.
    job_id: String,
    /// The `salloc` holding an allocation krefine asked for (`None` inside the user's own).
    owned: StdMutex<Option<tokio::process::Child>>,
    /// The GPUs the run asked for, for the allocation's description.
    gpus: u32,
    /// `resources.slurm`: each step's CPUs and GPUs, and the `srun` options.
    cfg: SlurmSection,
    /// `SLURM_CONF` of the orchestrator, passed to every `srun` (whose environment is scrubbed).
    slurm_conf: Option<OsString>,
}

impl Slurm {
    pub(super) async fn start(
        r: &ResourcesSection,
        cancel: &CancellationToken,
    ) -> Result<Slurm, LauncherError> {
        let cfg = r.slurm.clone();
        let gpus = if r.devices == DeviceSelection::Cpu {
            0
        } else {
            cfg.gpus.unwrap_or(0)
        };
        let slurm_conf = std::env::var_os("SLURM_CONF");
        let (job_id, owned) = match std::env::var("SLURM_JOB_ID") {
            Ok(id) if !id.trim().is_empty() => (id.trim().to_string(), None),
            _ => {
                let (id, child) = request(&cfg, gpus, r.compile_workers(), cancel).await?;
                (id, Some(child))
            }
        };
        Ok(Slurm {
            job_id,
            owned: StdMutex::new(owned),
            gpus,
            cfg,
            slurm_conf,
        })
    }

    pub(super) fn job_id(&self) -> &str {
        &self.job_id
    }

    pub(super) fn describe(&self) -> String {
        let whose = if self.is_owned() {
            "requested by krefine, released when the run ends"
        } else {
            "the allocation krefine runs in (SLURM_JOB_ID), left as it is"
        };
        let nodes = std::process::Command::new("squeue")
            .args(["-h", "-j", &self.job_id, "-o", "%N %D %b %C"])
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
            .map(|s| format!("; nodes, node count, gres, CPUs: {s}"))
            .unwrap_or_default();
        format!(
            "slurm job {} ({whose}); {} GPU step(s) with --gres={} and {} CPU(s) each, compile \
             steps with {} CPU(s){nodes}",
            self.job_id, self.gpus, self.cfg.gres, self.cfg.gpu_cpus, self.cfg.compile_cpus
        )
    }

    fn is_owned(&self) -> bool {
        match self.owned.lock() {
            Ok(o) => o.is_some(),
            Err(p) => p.into_inner().is_some(),
        }
    }

    /// `srun` for one worker step: one task on one node, exactly the CPUs (and GPU) it asks for,
    /// the drained nodes excluded.
    pub(super) fn srun(
        &self,
        gpu: bool,
        name: &str,
        program: &Path,
        args: &[OsString],
        env: &[(String, OsString)],
        drained: &[String],
    ) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("srun");
        let cpus = if gpu {
            self.cfg.gpu_cpus
        } else {
            self.cfg.compile_cpus
        };
        cmd.arg(format!("--jobid={}", self.job_id))
            .arg(format!("--job-name=krefine-{name}"))
            .args(["--exact", "--nodes=1", "--ntasks=1"])
            .arg(format!("--cpus-per-task={cpus}"))
            .args(["--kill-on-bad-exit=1", "--quiet", "--chdir=/tmp"]);
        if gpu && !self.cfg.gres.is_empty() {
            cmd.arg(format!("--gres={}", self.cfg.gres));
        }
        if !drained.is_empty() {
            cmd.arg(format!("--exclude={}", drained.join(",")));
        }
        cmd.args(&self.cfg.srun_args).arg(program).args(args);
        // srun hands its own environment to the step (--export=ALL): exactly the worker's.
        cmd.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
        if let Some(c) = &self.slurm_conf {
            cmd.env("SLURM_CONF", c);
        }
        cmd
    }

    /// Give up the allocation krefine asked for; wait (bounded) until `squeue` no longer lists it.
    pub(super) async fn release(&self) {
        let child = match self.owned.lock() {
            Ok(mut o) => o.take(),
            Err(p) => p.into_inner().take(),
        };
        let Some(mut child) = child else { return };
        let _ = run(&["scancel", "--quiet", &self.job_id]).await;
        if let Some(pid) = child.id() {
            hangup(pid);
        }
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        let started = tokio::time::Instant::now();
        while started.elapsed() < GONE_WAIT {
            match run(&["squeue", "-h", "-j", &self.job_id, "-o", "%i"]).await {
                Ok(out) if out.trim().is_empty() => return,
                // squeue refuses an id it no longer knows.
                Err(_) => return,
                Ok(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
        tracing::warn!(
            "slurm job {} is still listed by squeue {} s after it was cancelled",
            self.job_id,
            GONE_WAIT.as_secs()
        );
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // Not released (an error path): SIGHUP makes salloc give the allocation up on its own.
        let child = match self.owned.lock() {
            Ok(mut o) => o.take(),
            Err(p) => p.into_inner().take(),
        };
        if let Some(pid) = child.as_ref().and_then(|c| c.id()) {
            hangup(pid);
        }
    }
}

fn hangup(pid: u32) {
    if let Ok(pid) = i32::try_from(pid)
        && pid > 1
    {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGHUP,
        );
    }
}

/// Ask for an allocation with `salloc` and wait until it is granted; returns the job id and the
/// `salloc` process that holds it. While it waits, `squeue`'s pending reason is read every second:
/// a reason that waiting can never resolve (see [`hopeless`]) ends the wait with Slurm's reason and
/// what to change, and so does `cancel` (Ctrl-C, SIGTERM), both withdrawing the request.
async fn request(
    cfg: &SlurmSection,
    gpus: u32,
    compile_workers: u32,
    cancel: &CancellationToken,
) -> Result<(String, tokio::process::Child), LauncherError> {
    let eval_steps = gpus.max(1);
    let cpus = eval_steps * cfg.gpu_cpus + compile_workers * cfg.compile_cpus;
    let asked = Asked {
        cpus,
        eval_steps,
        gpu_cpus: cfg.gpu_cpus,
        compile_workers,
        compile_cpus: cfg.compile_cpus,
        gpus: if gpus > 0 && !cfg.gres.is_empty() {
            gpus
        } else {
            0
        },
        nodes: cfg.nodes,
    };
    let child = salloc(cfg, cpus, gpus).spawn().map_err(|e| {
        LauncherError::Slurm(format!(
            "cannot run salloc (is Slurm installed and on PATH?): {e}"
        ))
    })?;
    let mut waiting = Pending::watch(child)?;
    match waiting.granted(cfg, &asked, cancel).await {
        Ok(id) => {
            tracing::info!("slurm allocation {id} granted");
            Ok((id, waiting.hold()))
        }
        Err(why) => Err(waiting.withdraw(why).await),
    }
}

/// The `salloc` command of an allocation of `cpus` one-CPU tasks and `gpus` GPUs, whose command
/// prints the job id and then holds the allocation.
#[allow(
    unsafe_code,
    reason = "pre_exec runs in the forked child: its own session, and SIGHUP when krefine dies"
)]
fn salloc(cfg: &SlurmSection, cpus: u32, gpus: u32) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("salloc");
    cmd.arg("--job-name=krefine")
        .arg(format!("--ntasks={cpus}"))
        .arg("--cpus-per-task=1");
    if gpus > 0 && !cfg.gres.is_empty() {
        cmd.arg(format!("--gpus={gpus}"));
    }
    if let Some(n) = cfg.nodes {
        cmd.arg(format!("--nodes={n}"));
    }
    for (flag, v) in [
        ("--partition", &cfg.partition),
        ("--account", &cfg.account),
        ("--time", &cfg.time),
    ] {
        if let Some(v) = v {
            cmd.arg(format!("{flag}={v}"));
        }
    }
    cmd.args(&cfg.salloc_args)
        .args([
            "sh",
            "-c",
            "echo \"krefine-job $SLURM_JOB_ID\"; exec sleep infinity",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Its own session (a terminal's Ctrl-C is ours to handle), and SIGHUP when krefine dies.
    // SAFETY: only async-signal-safe calls (setsid, prctl) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGHUP, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// A `salloc` whose allocation is not granted yet, and what it has said so far.
struct Pending {
    child: tokio::process::Child,
    /// Its stdout, where its command prints the job id once the allocation is granted.
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    /// Its stderr, where it says the job id it waits on, and why it failed.
    errs: tokio::io::Lines<BufReader<tokio::process::ChildStderr>>,
    /// `errs` has not ended yet.
    errs_open: bool,
    /// Every line of `errs` so far, for the error when no allocation comes.
    said: Vec<String>,
    /// The job id of the pending request, once `salloc` named it (what `squeue` and `scancel` are
    /// asked about).
    job: Option<String>,
}

impl Pending {
    fn watch(mut child: tokio::process::Child) -> Result<Pending, LauncherError> {
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(LauncherError::Slurm(
                "salloc's pipes were not created".into(),
            ));
        };
        Ok(Pending {
            child,
            lines: BufReader::new(stdout).lines(),
            errs: BufReader::new(stderr).lines(),
            errs_open: true,
            said: Vec::new(),
            job: None,
        })
    }

    /// Wait for the job id of the granted allocation; `Err` says why none will come.
    async fn granted(
        &mut self,
        cfg: &SlurmSection,
        asked: &Asked,
        cancel: &CancellationToken,
    ) -> Result<String, String> {
        let wait =
            Duration::try_from_secs_f64(cfg.grant_timeout_s).unwrap_or(Duration::from_secs(600));
        let deadline = tokio::time::Instant::now() + wait;
        let mut poll = tokio::time::interval(PENDING_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                line = self.lines.next_line() => match line {
                    Ok(Some(line)) => {
                        if let Some(id) = line.trim().strip_prefix("krefine-job ")
                            && !id.trim().is_empty()
                        {
                            return Ok(id.trim().to_string());
                        }
                    }
                    _ => return Err("salloc ended without an allocation".to_string()),
                },
                line = self.errs.next_line(), if self.errs_open => match line {
                    Ok(Some(line)) => {
                        if self.job.is_none() {
                            self.job = job_id_of(&line);
                        }
                        self.said.push(line);
                    }
                    _ => self.errs_open = false,
                },
                _ = poll.tick(), if self.job.is_some() => {
                    let id = self.job.as_deref().unwrap_or_default();
                    if let Ok(out) = run(&["squeue", "-h", "-j", id, "-o", "%T|%r"]).await
                        && let Some((state, reason)) = parse_squeue(&out)
                        && state == "PENDING"
                        && let Some(advice) = hopeless(&reason, asked)
                    {
                        return Err(format!(
                            "slurm job {id} can never be granted: pending with reason {reason}; {advice}"
                        ));
                    }
                },
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(format!(
                        "the allocation was not granted within resources.slurm.grant_timeout_s = {} s",
                        cfg.grant_timeout_s
                    ));
                },
                _ = cancel.cancelled() => {
                    return Err("interrupted while waiting for the allocation; the request was withdrawn".to_string());
                },
            }
        }
    }

    /// The granted allocation's `salloc`. It keeps writing to stderr (e.g. "Job allocation N has
    /// been revoked"): drained from now on.
    fn hold(self) -> tokio::process::Child {
        let Pending {
            child, mut errs, ..
        } = self;
        tokio::spawn(async move { while let Ok(Some(_)) = errs.next_line().await {} });
        child
    }

    /// Withdraw the request (pending or failed) and say `why`, with what `salloc` said: SIGHUP
    /// withdraws a pending request; scancel makes sure.
    async fn withdraw(mut self, why: String) -> LauncherError {
        if let Some(pid) = self.child.id() {
            hangup(pid);
        }
        if let Some(id) = &self.job {
            let _ = run(&["scancel", "--quiet", id]).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while self.errs_open {
                match self.errs.next_line().await {
                    Ok(Some(line)) => self.said.push(line),
                    _ => self.errs_open = false,
                }
            }
        })
        .await;
        LauncherError::Slurm(format!(
            "{why}; salloc said: {}",
            self.said.join("\n").trim()
        ))
    }
}

/// The line of a step's stderr that says the step or its node died, if any.
pub(super) fn loss_line(tail: &str) -> Option<String> {
    tail.lines()
        .find(|l| LOSS_MARKERS.iter().any(|m| l.contains(m)))
        .map(|l| l.trim().to_string())
}

/// Cancel one step (`scancel job.step`), in the background.
pub(super) fn cancel_step(job: &str, step: &str) {
    let id = format!("{job}.{step}");
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(async move {
                let _ = run(&["scancel", "--quiet", &id]).await;
            });
        }
        Err(_) => {
            let _ = std::process::Command::new("scancel")
                .args(["--quiet", &id])
                .status();
        }
    }
}

/// Is the node usable? `scontrol show node` must not say DOWN, FAIL or NOT_RESPONDING.
pub(super) async fn node_answers(node: &str) -> bool {
    match run(&["sinfo", "-h", "-n", node, "-o", "%T"]).await {
        Ok(state) => {
            let s = state.to_ascii_uppercase();
            !(s.contains("DOWN") || s.contains("FAIL") || s.contains("NOT_RESPONDING"))
        }
        // Cannot ask: do not call a timeout a loss.
        Err(_) => true,
    }
}

/// Run a Slurm client command; its stdout, or why it failed.
async fn run(args: &[&str]) -> Result<String, String> {
    let Some((program, rest)) = args.split_first() else {
        return Err("empty command".into());
    };
    let out = tokio::time::timeout(
        CALL_TIMEOUT,
        tokio::process::Command::new(program)
            .args(rest)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| {
        format!(
            "{program} did not answer within {} s",
            CALL_TIMEOUT.as_secs()
        )
    })?
    .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_deaths_are_recognised() {
        let tail = "some output\nslurmstepd-n1: error: *** STEP 4.0 ON n1 CANCELLED AT 2026-11-23T22:30:24 ***\nsrun: error: n1: task 0: Killed";
        assert_eq!(
            loss_line(tail).as_deref(),
            Some("slurmstepd-n1: error: *** STEP 4.0 ON n1 CANCELLED AT 2026-11-23T22:30:24 ***")
        );
        assert_eq!(loss_line("Traceback ...\nSegmentation fault"), None);
    }

    #[test]
    fn salloc_asks_for_one_cpu_tasks_and_the_gpus_and_holds_the_allocation() {
        let cfg = SlurmSection {
            partition: Some("gpu".into()),
            time: Some("01:00:00".into()),
            nodes: Some(2),
            salloc_args: vec!["--exclusive".into()],
            ..SlurmSection::default()
        };
        let cmd = salloc(&cfg, 12, 2);
        let args: Vec<String> = cmd
            .as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let mut expected = vec![
            "--job-name=krefine",
            "--ntasks=12",
            "--cpus-per-task=1",
            "--gpus=2",
            "--nodes=2",
            "--partition=gpu",
            "--time=01:00:00",
            "--exclusive",
            "sh",
            "-c",
            "echo \"krefine-job $SLURM_JOB_ID\"; exec sleep infinity",
        ];
        assert_eq!(args, expected);
        // No GPUs asked for: no --gpus.
        let args: Vec<String> = salloc(&cfg, 12, 0)
            .as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        expected.remove(3);
        assert_eq!(args, expected);
    }

    /// A stand-in for `salloc`: a shell that says what `script` says, on the same pipes.
    fn pending(script: &str) -> Pending {
        let child = tokio::process::Command::new("sh")
            .args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Pending::watch(child).unwrap()
    }

    fn asked() -> Asked {
        Asked {
            cpus: 4,
            eval_steps: 1,
            gpu_cpus: 4,
            compile_workers: 0,
            compile_cpus: 1,
            gpus: 1,
            nodes: None,
        }
    }

    #[tokio::test]
    async fn the_job_id_the_command_prints_is_the_grant() {
        let mut p = pending(
            "echo 'salloc: Granted job allocation 999999991' >&2; \
             echo 'krefine-job 999999991'; exec sleep 60",
        );
        let cfg = SlurmSection::default();
        let id = p.granted(&cfg, &asked(), &CancellationToken::new()).await;
        assert_eq!(id.as_deref(), Ok("999999991"));
        let mut child = p.hold();
        child.start_kill().unwrap();
        child.wait().await.unwrap();
    }

    #[tokio::test]
    async fn a_request_that_fails_says_why_with_what_salloc_said() {
        let mut p = pending("echo 'salloc: error: invalid partition name specified' >&2; exit 1");
        let cfg = SlurmSection::default();
        let why = p
            .granted(&cfg, &asked(), &CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(why, "salloc ended without an allocation");
        assert_eq!(
            p.withdraw(why).await.to_string(),
            "slurm launcher: salloc ended without an allocation; salloc said: salloc: error: \
             invalid partition name specified"
        );
    }

    #[tokio::test]
    async fn a_cancelled_wait_withdraws_the_request() {
        let mut p = pending("exec sleep 60");
        let cancel = CancellationToken::new();
        cancel.cancel();
        let why = p
            .granted(&SlurmSection::default(), &asked(), &cancel)
            .await
            .unwrap_err();
        assert!(why.starts_with("interrupted while waiting"), "{why}");
        let e = p.withdraw(why).await.to_string();
        assert!(
            e.ends_with("the request was withdrawn; salloc said: "),
            "{e}"
        );
    }
}
