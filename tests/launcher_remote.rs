//! The slurm and ssh launchers against a real single-node Slurm cluster and a real sshd on
//! 127.0.0.1, both set up by `scripts/slurm-test-cluster up` (CI does it in `scripts/test` and sets
//! `KREFINE_TEST_SLURM=1`; then a missing cluster fails these tests instead of skipping them).
//!
//! The runs are the quickstart's dataset with scripted, pure-PyTorch answers
//! (tests/fixtures/launcher/answers.jsonl) on the CPU device: every kind of verdict, nothing to build.
//! - the slurm run gives the verdicts of the local run, records where each result ran, survives the
//!   cancellation of its evaluation worker's step in the middle of an evaluation (a retry, not a
//!   verdict), and leaves no job in `squeue`;
//! - the ssh run gives the same verdicts;
//! - a slurm run stopped with SIGTERM releases its allocation.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Python with torch for workers (`KREFINE_TEST_PYTHON`, else the repository's `.venv`).
fn python() -> PathBuf {
    let p = std::env::var_os("KREFINE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".venv/bin/python"));
    assert!(
        p.exists(),
        "no Python with torch at {}; set KREFINE_TEST_PYTHON",
        p.display()
    );
    p
}

/// True when CI set the cluster up: then everything must be there.
fn required() -> bool {
    std::env::var("KREFINE_TEST_SLURM").is_ok_and(|v| v == "1")
}

/// Is the Slurm cluster there? Fails loudly when it is required, else says why it skips.
fn slurm_available() -> bool {
    let ok = Command::new("sinfo")
        .args(["-h", "-o", "%t"])
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("idle"));
    if !ok {
        assert!(
            !required(),
            "KREFINE_TEST_SLURM=1 but no idle Slurm node answers sinfo (SLURM_CONF={:?}); did \
             scripts/slurm-test-cluster up run?",
            std::env::var("SLURM_CONF")
        );
        eprintln!(
            "skipped: no Slurm cluster (run `eval \"$(scripts/slurm-test-cluster up)\"` as root)"
        );
    }
    ok
}

/// The test sshd: (host, port, key, known_hosts), from `scripts/slurm-test-cluster env`.
fn ssh_target() -> Option<(String, String, String, String)> {
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let t = (|| {
        Some((
            get("KREFINE_TEST_SSH_HOST")?,
            get("KREFINE_TEST_SSH_PORT")?,
            get("KREFINE_TEST_SSH_KEY")?,
            get("KREFINE_TEST_SSH_KNOWN_HOSTS")?,
        ))
    })();
    if t.is_none() {
        assert!(
            !required(),
            "KREFINE_TEST_SLURM=1 but KREFINE_TEST_SSH_* are not set (scripts/slurm-test-cluster env)"
        );
        eprintln!("skipped: no test sshd (KREFINE_TEST_SSH_* unset)");
    }
    t
}

/// `krefine run` of the launcher fixture, with `extra` settings, into `out`.
fn run_args(out: &Path, extra: &[String]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "run".into(),
        repo()
            .join("configs/quickstart.toml")
            .to_string_lossy()
            .into_owned(),
        "--no-tui".into(),
        "--out".into(),
        out.to_string_lossy().into_owned(),
    ];
    let answers = repo().join("tests/fixtures/launcher/answers.jsonl");
    // Each run its own output folder, so its own build cache. Runs sharing one cache take the same
    // build directory's lock around an evaluation of the same candidate: the slurm run's turn-2
    // evaluation, leased and logged as `lease_granted`, then waited for another run's evaluation of
    // that candidate, the step was cancelled while its worker was idle, and the pool replaced the
    // dead worker without a loss (the cancellation must land in the middle of the request).
    let name = out.file_name().unwrap().to_string_lossy();
    let output_dir = out.with_file_name(format!("{name}-output"));
    for s in [
        format!("resources.python=\"{}\"", python().display()),
        "resources.devices=cpu".into(),
        "resources.compile_workers=1".into(),
        "dataset.problems=1-2".into(),
        format!("model.answers=\"{}\"", answers.display()),
        format!("output.dir=\"{}\"", output_dir.display()),
        "eval.correct_trials=2".into(),
        "eval.timing_trials=3".into(),
        "eval.warmup=1".into(),
    ]
    .into_iter()
    .chain(extra.iter().cloned())
    {
        args.push("--set".into());
        args.push(s);
    }
    args
}

fn krefine(out: &Path, extra: &[String]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_krefine"))
        .args(run_args(out, extra))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start krefine")
}

fn finished(child: Child, what: &str) -> Output {
    let o = child.wait_with_output().expect("wait for krefine");
    assert!(
        o.status.success(),
        "{what} failed ({}):\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn events(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// (task, turn, step) -> verdict or compile status, for every compile and execution.
fn verdicts(dir: &Path) -> BTreeMap<(String, u64, String), String> {
    let mut out = BTreeMap::new();
    for r in events(dir) {
        let e = &r["event"];
        let kind = e["type"].as_str().unwrap_or_default();
        let value = match kind {
            "compiled" => &e["outcome"]["status"],
            "executed" => &e["outcome"]["verdict"],
            _ => continue,
        };
        let key = (
            r["task"].as_str().unwrap_or_default().to_string(),
            e["turn"].as_u64().unwrap_or(0),
            kind.to_string(),
        );
        let previous = out.insert(key.clone(), value.as_str().unwrap_or("?").to_string());
        assert!(previous.is_none(), "{key:?} has two results in {dir:?}");
    }
    out
}

fn outcomes<'a>(evs: &'a [Value], kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    evs.iter()
        .filter(move |r| r["event"]["type"] == kind)
        .map(|r| &r["event"]["outcome"])
}

fn squeue() -> String {
    let o = Command::new("squeue")
        .args(["-h", "-o", "%i %j %T"])
        .output()
        .expect("squeue");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn steps() -> String {
    let o = Command::new("squeue")
        .args(["-h", "-s", "-o", "%i %j"])
        .output()
        .expect("squeue -s");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Wait until the evaluation of task 1/1/0's turn 2 (the slow candidate) holds the device, then
/// cancel the step of the evaluation worker; returns the step id. The request reaches the worker
/// right after `lease_granted` is logged (nothing else waits in between: the run has the build
/// cache to itself, see [`run_args`]) and takes seconds (the candidate sleeps in every call).
fn cancel_eval_step_mid_evaluation(dir: &Path, deadline: Instant) -> String {
    loop {
        assert!(
            Instant::now() < deadline,
            "turn 2 of 1/1/0 never started evaluating"
        );
        let evs = events(dir);
        let on_device = |kind: &str| {
            evs.iter().any(|r| {
                r["task"] == "1/1/0" && r["event"]["type"] == kind && r["event"]["turn"] == 2
            })
        };
        if on_device("lease_granted") && !on_device("executed") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let steps = steps();
    let step = steps
        .lines()
        .find(|l| l.ends_with(" krefine-cpu-0"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no krefine-cpu-0 step in:\n{steps}"))
        .to_string();
    let ok = Command::new("scancel")
        .arg(&step)
        .status()
        .expect("scancel");
    assert!(ok.success(), "scancel {step}");
    step
}

fn slurm_run(out: &Path) -> Child {
    krefine(
        out,
        &[
            "resources.launcher=\"slurm\"".into(),
            "resources.slurm.gpu_cpus=1".into(),
            "resources.slurm.time=\"00:10:00\"".into(),
            "resources.drain_after=5".into(),
        ],
    )
}

fn ssh_run(out: &Path, (host, port, key, known): &(String, String, String, String)) -> Child {
    krefine(
        out,
        &[
            "resources.launcher=\"ssh\"".into(),
            format!("resources.ssh.hosts=[\"{host}:cpu\"]"),
            format!("resources.ssh.port={port}"),
            format!("resources.ssh.identity=\"{key}\""),
            format!(
                "resources.ssh.options=[\"-o\", \"UserKnownHostsFile={known}\", \"-o\", \"StrictHostKeyChecking=yes\"]"
            ),
        ],
    )
}

/// One local, one slurm and one ssh run of the same answers, side by side (verdicts do not depend
/// on timing): the same verdicts everywhere, a cancelled step retried, no job left behind.
#[test]
fn remote_launchers_give_the_local_verdicts() {
    if !slurm_available() {
        return;
    }
    let Some(target) = ssh_target() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let dir = |n: &str| tmp.path().join(n);
    let (local_dir, slurm_dir, ssh_dir) = (dir("local"), dir("slurm"), dir("ssh"));
    let slurm = slurm_run(&slurm_dir);
    let local = krefine(&local_dir, &[]);
    let ssh = ssh_run(&ssh_dir, &target);
    let step =
        cancel_eval_step_mid_evaluation(&slurm_dir, Instant::now() + Duration::from_secs(300));
    finished(slurm, "the slurm run");
    assert_eq!(squeue(), "", "jobs left behind after the run");
    finished(local, "the local run");
    finished(ssh, "the ssh run");

    let want = verdicts(&local_dir);
    let kinds: std::collections::BTreeSet<&str> = want.values().map(String::as_str).collect();
    for k in ["correct", "incorrect", "runtime_error", "error"] {
        assert!(kinds.contains(k), "the fixture should give {k}: {kinds:?}");
    }
    assert_eq!(
        verdicts(&slurm_dir),
        want,
        "slurm and local verdicts differ"
    );
    assert_eq!(verdicts(&ssh_dir), want, "ssh and local verdicts differ");

    // The cancelled step is a lost worker on the slot's result, retried; never a verdict.
    let evs = events(&slurm_dir);
    let lost: Vec<&Value> = outcomes(&evs, "executed")
        .chain(outcomes(&evs, "profiled"))
        .flat_map(|o| o["worker_losses"].as_array().into_iter().flatten())
        .collect();
    let trace = std::fs::read_to_string(slurm_dir.join("krefine.log")).unwrap_or_default();
    assert_eq!(
        lost.len(),
        1,
        "one loss for the one cancelled step: {lost:?}{}",
        if trace.contains("ended while idle") {
            " (the step was cancelled while its worker was idle, not mid-request)"
        } else {
            ""
        }
    );
    assert_eq!(lost[0]["worker"], "cpu-0");
    let detail = lost[0]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("CANCELLED") && detail.contains(&step),
        "{detail}"
    );
    // Where each result ran: the job, the step, the host.
    let job = step.split('.').next().unwrap();
    for o in outcomes(&evs, "executed") {
        let r = &o["env"]["ran_on"];
        assert_eq!(r["launcher"], "slurm", "{o}");
        assert_eq!(r["slurm_job"], job, "{o}");
        assert!(
            r["slurm_step"].as_str().is_some_and(|s| !s.is_empty()),
            "{o}"
        );
        assert!(r["host"].as_str().is_some_and(|h| !h.is_empty()), "{o}");
    }
    for o in outcomes(&evs, "compiled").filter(|o| o["cached"] == false) {
        assert_eq!(o["ran_on"]["launcher"], "slurm", "{o}");
    }
    // The retried evaluation ran in a later step than the cancelled one.
    let retried = outcomes(&evs, "executed")
        .find(|o| o["worker_losses"].is_array())
        .expect("the retried evaluation");
    assert_ne!(
        format!(
            "{job}.{}",
            retried["env"]["ran_on"]["slurm_step"].as_str().unwrap()
        ),
        step
    );
    // The report shows the loss.
    let report = Command::new(env!("CARGO_BIN_EXE_krefine"))
        .args(["report", slurm_dir.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(text.contains("workers  1 lost"), "{text}");

    let evs = events(&ssh_dir);
    for o in outcomes(&evs, "executed") {
        assert_eq!(o["env"]["ran_on"]["launcher"], "ssh", "{o}");
        assert_eq!(o["env"]["sandbox"], "none", "{o}");
    }

    // doctor shows the allocation and starts a worker at each place.
    let cfg = tmp.path().join("doctor.toml");
    std::fs::write(
        &cfg,
        format!(
            "[dataset]\npath = \"{}\"\nlevel = 1\nproblems = \"1-2\"\n[method]\nkind = \"refine\"\nturns = 3\n\
             [model]\nprovider = \"scripted\"\nanswers = \"{}\"\n\
             [resources]\npython = \"{}\"\ndevices = \"cpu\"\ncompile_workers = 1\nlauncher = \"slurm\"\n\
             [resources.slurm]\ngpu_cpus = 1\n[output]\ndir = \"{}\"\n",
            repo().join("configs/quickstart/problems").display(),
            repo().join("tests/fixtures/launcher/answers.jsonl").display(),
            python().display(),
            tmp.path().join("output").display()
        ),
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_krefine"))
        .arg("doctor")
        .arg(&cfg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(text.contains("slurm job "), "{text}");
    for place in ["eval cpu: ready", "compile 0: ready"] {
        assert!(text.contains(place), "{place}: {text}");
    }
    assert_eq!(squeue(), "", "doctor left its allocation behind");

    // SIGTERM in the middle of a run: the allocation krefine asked for is released.
    let term_dir = dir("term");
    let child = slurm_run(&term_dir);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !steps().contains("krefine-cpu-0") {
        assert!(
            Instant::now() < deadline,
            "the workers' steps never started"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let o = child.wait_with_output().unwrap();
    assert_ne!(o.status.code(), Some(0), "a terminated run does not finish");
    assert_eq!(squeue(), "", "jobs left behind after SIGTERM");
}

/// A network partition to an SSH host: every sshd process of a private sshd is stopped while a
/// remote command runs. ssh's keep-alives end the connection (exit 255, "Timeout, server ... not
/// responding"), the launcher calls that a lost worker, and the host no longer answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ssh_partition_is_a_lost_worker() {
    use krefine::config::ResourcesSection;
    use krefine::launcher::{Launcher, LauncherKind, Placement, SshSection};
    use krefine::worker::process::{ExitInfo, RequestError};
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    let Some((_, _, key, _)) = ssh_target() else {
        return;
    };
    let ssh_dir = Path::new(&key).parent().unwrap().to_path_buf();
    // A private sshd (its own port, in the foreground), so only its processes are stopped.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut sshd = Command::new("/usr/sbin/sshd")
        .args(["-D", "-f"])
        .arg(ssh_dir.join("sshd_config"))
        .args(["-o", &format!("Port={port}"), "-o", "PidFile=none"])
        .spawn()
        .expect("start sshd");
    let r = ResourcesSection {
        launcher: LauncherKind::Ssh,
        ssh: SshSection {
            hosts: vec!["127.0.0.1:cpu".into()],
            port: Some(port),
            identity: Some(key.clone().into()),
            options: [
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
            ]
            .map(String::from)
            .to_vec(),
            alive_timeout_s: 5,
            connect_timeout_s: 3,
        },
        ..ResourcesSection::default()
    };
    let launcher = Launcher::start(&r, &tokio_util::sync::CancellationToken::new())
        .await
        .unwrap();
    let at = Placement::Ssh { host: 0, gpu: None };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !launcher.host_answers(&at, "127.0.0.1").await {
        assert!(Instant::now() < deadline, "the private sshd never answered");
    }
    let mut cmd = launcher
        .command(
            &at,
            "partition",
            Path::new("/bin/sh"),
            &["-c".into(), "echo ready; exec sleep 120".into()],
            &[("PATH".into(), "/usr/bin:/bin".into())],
        )
        .unwrap();
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line)
        .await
        .unwrap();
    assert_eq!(line.trim(), "ready");

    // The partition: every process of that sshd (the listener and the session's) stops.
    let tree = descendants(sshd.id());
    for pid in &tree {
        let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGSTOP);
    }
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("ssh noticed the partition within a minute")
        .unwrap();
    let mut err = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut child.stderr.take().unwrap(), &mut err)
        .await
        .unwrap();
    let answers = launcher.host_answers(&at, "127.0.0.1").await;
    for pid in tree.iter().rev() {
        let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGCONT);
    }
    let _ = sshd.wait();

    assert_eq!(status.code(), Some(255), "ssh's own failure: {err}");
    let e = RequestError::Exited {
        exit: ExitInfo {
            code: Some(255),
            signal: None,
        },
        log_tail: err.clone(),
    };
    let loss = launcher.loss(&at, &e).expect("a lost worker");
    assert!(loss.contains("not responding"), "{loss}");
    assert!(!answers, "a partitioned host does not answer");
    // A candidate's own exit status 255 without ssh's words is not a loss.
    let own = RequestError::Exited {
        exit: ExitInfo {
            code: Some(255),
            signal: None,
        },
        log_tail: "Traceback (most recent call last):\nSystemExit: 255".into(),
    };
    assert_eq!(launcher.loss(&at, &own), None);
}

/// `pid` and every process below it, parents first (from /proc).
fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let Some(rest) = stat.rsplit_once(')').map(|x| x.1) else {
            continue;
        };
        if let Some(pp) = rest.split_whitespace().nth(1).and_then(|x| x.parse().ok()) {
            parent_of.push((p, pp));
        }
    }
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        let cur = out[i];
        out.extend(
            parent_of
                .iter()
                .filter(|(_, pp)| *pp == cur)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    out
}
