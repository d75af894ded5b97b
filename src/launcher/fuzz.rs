//! Property tests of what the launchers read from Slurm and SSH (`squeue` lines, `salloc` and step
//! stderr, ssh's messages, `resources.ssh.hosts` entries): no panic on any text, and the decisions
//! taken on it are the documented ones. `PROPTEST_CASES` sets the cases (64 by default;
//! `scripts/fuzz` runs them at volume).

use proptest::prelude::*;

use super::config::SshHost;
use super::slurm_pending::{Asked, hopeless, job_id_of, parse_squeue};

fn config() -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64),
        failure_persistence: None,
        ..Default::default()
    }
}

fn texty(fragments: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            3 => prop::sample::select(fragments).prop_map(str::to_string),
            1 => any::<String>(),
        ],
        0..12,
    )
    .prop_map(|p| p.concat())
}

const SLURM_BITS: &[&str] = &[
    "salloc: ",
    "Pending job allocation ",
    "Granted job allocation ",
    "job ",
    " queued and waiting for resources",
    "PENDING",
    "RUNNING",
    "|",
    "(",
    ")",
    "PartitionConfig",
    "Resources",
    "ReqNodeNotAvail",
    ", UnavailableNodes:n1",
    "QOSMaxCpuPerJobLimit",
    "QOSMaxJobsPerUserLimit",
    "AssocGrpCpuLimit",
    "17",
    "99999999999999999999",
    "\n",
    " ",
    "CANCELLED AT",
    "NODE FAIL",
    "ssh: ",
    "Timeout, server ",
    "not responding",
];

fn asked() -> impl Strategy<Value = Asked> {
    (
        0u32..1000,
        0u32..9,
        0u32..64,
        0u32..16,
        0u32..8,
        0u32..9,
        prop::option::of(0u32..8),
    )
        .prop_map(
            |(cpus, eval_steps, gpu_cpus, compile_workers, compile_cpus, gpus, nodes)| Asked {
                cpus,
                eval_steps,
                gpu_cpus,
                compile_workers,
                compile_cpus,
                gpus,
                nodes,
            },
        )
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn salloc_lines(line in texty(SLURM_BITS), id in 1u64..u64::MAX) {
        if let Some(found) = job_id_of(&line) {
            prop_assert!(!found.is_empty() && found.bytes().all(|b| b.is_ascii_digit()));
        }
        let pending = format!("salloc: Pending job allocation {id}");
        prop_assert_eq!(job_id_of(&pending), Some(id.to_string()));
    }

    #[test]
    fn squeue_reasons(out in texty(SLURM_BITS), a in asked()) {
        if let Some((state, reason)) = parse_squeue(&out) {
            let _ = hopeless(&reason, &a);
            prop_assert!(!state.contains('\n') && !reason.contains('\n'));
        }
        let _ = hopeless(&out, &a);
    }

    /// Reasons that resolve by waiting never end the wait, whatever details follow them.
    #[test]
    fn waiting_reasons_keep_waiting(
        code in prop::sample::select(&["Resources", "Priority", "JobHeldUser", "BeginTime", "Dependency", "QOSMaxJobsPerUserLimit", "AssocGrpCpuLimit", "None"][..]),
        tail in "[ ,:a-z0-9]{0,20}",
        a in asked(),
    ) {
        let reason = format!("{code}{}", if tail.starts_with([',', ' ']) { tail.clone() } else { String::new() });
        prop_assert_eq!(hopeless(&reason, &a), None);
    }

    #[test]
    fn step_and_ssh_output(tail in texty(SLURM_BITS)) {
        if let Some(l) = super::slurm::loss_line(&tail) {
            prop_assert!(tail.contains(&l));
        }
        if let Some(l) = super::ssh::loss_line(&tail) {
            prop_assert!(tail.contains(&l));
        }
    }

    /// `resources.ssh.hosts` entries: parsed or refused quoting the entry.
    #[test]
    fn ssh_hosts(entry in texty(&["gpu1", "user@host", ":", "cpu", "0", ",", "1", "-x", " ", "99999999999"])) {
        if let Err(e) = SshHost::parse(&entry) {
            prop_assert!(e.contains(&format!("{:?}", entry.trim())), "{}", e);
        }
    }
}
