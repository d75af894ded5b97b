//! Why a requested Slurm allocation waits, and whether it can ever be granted: `salloc`'s stderr
//! names the pending job, `squeue` its state and reason, and a reason that no amount of waiting
//! resolves (the request exceeds what the partition, the QOS or the association allows, or names
//! something that does not exist) ends the wait at once with what to change.

/// The job id in `salloc`'s "Pending job allocation N" or "Granted job allocation N" line (also
/// "job N queued and waiting for resources").
pub(super) fn job_id_of(line: &str) -> Option<String> {
    let line = line.trim();
    let rest = line
        .split_once("job allocation ")
        .map(|(_, r)| r)
        .or_else(|| line.split_once("salloc: job ").map(|(_, r)| r))?;
    let id: String = rest.chars().take_while(char::is_ascii_digit).collect();
    (!id.is_empty()).then_some(id)
}

/// A job's state and reason from `squeue -h -j ID -o "%T|%r"` (the reason may be parenthesised,
/// as in squeue's default NODELIST(REASON) column, and may carry details after a comma:
/// `ReqNodeNotAvail, UnavailableNodes:n1`). `None` when the job is not listed.
pub(super) fn parse_squeue(out: &str) -> Option<(String, String)> {
    let line = out.lines().map(str::trim).find(|l| !l.is_empty())?;
    let (state, reason) = line.split_once('|').unwrap_or((line, ""));
    let reason = reason.trim();
    let reason = reason
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or(reason);
    Some((state.trim().to_string(), reason.trim().to_string()))
}

/// What the request asked for, to say what to change.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Asked {
    /// One-CPU tasks in all: `eval_steps x gpu_cpus + compile_workers x compile_cpus`.
    pub cpus: u32,
    pub eval_steps: u32,
    pub gpu_cpus: u32,
    pub compile_workers: u32,
    pub compile_cpus: u32,
    /// GPUs asked for (0 without `resources.slurm.gres`).
    pub gpus: u32,
    pub nodes: Option<u32>,
}

/// For a pending reason that can never resolve by waiting, what to change; `None` for reasons
/// that resolve by themselves (Resources, Priority, a held job, a group limit other jobs free).
pub(super) fn hopeless(reason: &str, asked: &Asked) -> Option<String> {
    let code = reason.split([',', ' ', '(']).next().unwrap_or("").trim();
    let cpus = format!(
        "krefine asked for {} CPUs ({} evaluation step(s) x resources.slurm.gpu_cpus = {} + {} \
         compile worker(s) x resources.slurm.compile_cpus = {}){}{}",
        asked.cpus,
        asked.eval_steps,
        asked.gpu_cpus,
        asked.compile_workers,
        asked.compile_cpus,
        if asked.gpus > 0 {
            format!(" and {} GPU(s)", asked.gpus)
        } else {
            String::new()
        },
        match asked.nodes {
            Some(n) => format!(" on {n} node(s)"),
            None => String::new(),
        }
    );
    let size = format!(
        "{cpus}: lower resources.slurm.gpu_cpus, resources.slurm.compile_cpus or \
         resources.compile_workers, raise resources.slurm.nodes, or pick another \
         resources.slurm.partition"
    );
    let per_job = |what: &str| {
        format!(
            "the request exceeds a per-job limit of its {what}; {size}, or another QOS in resources.slurm.salloc_args"
        )
    };
    let advice = match code {
        "PartitionConfig" | "PartitionNodeLimit" | "BadConstraints" => {
            format!("the partition cannot hold the request; {size}")
        }
        "ReqNodeNotAvail" | "NodeDown" => {
            format!("the nodes the request needs are not available; {size}")
        }
        "PartitionTimeLimit" => {
            "resources.slurm.time exceeds the partition's time limit: lower it, or pick another \
             resources.slurm.partition"
                .to_string()
        }
        "InvalidAccount" | "AccountNotAllowed" => {
            "the account cannot use this partition: set resources.slurm.account (or \
             resources.slurm.partition)"
                .to_string()
        }
        "InvalidQOS" | "QOSNotAllowed" | "PartitionDown" | "PartitionInactive" => {
            "the partition or QOS does not accept the job: pick another resources.slurm.partition \
             (or QOS in resources.slurm.salloc_args)"
                .to_string()
        }
        c if (c.starts_with("QOSMax") || c.starts_with("AssocMax"))
            && (c.contains("PerJob") || c.contains("PerNode")) =>
        {
            per_job(if c.starts_with("QOS") {
                "QOS"
            } else {
                "association"
            })
        }
        c if c.starts_with("QOSMin") => {
            format!("the request is below its QOS's minimum; {cpus}")
        }
        _ => return None,
    };
    Some(advice)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked() -> Asked {
        Asked {
            cpus: 6,
            eval_steps: 1,
            gpu_cpus: 4,
            compile_workers: 2,
            compile_cpus: 1,
            gpus: 0,
            nodes: None,
        }
    }

    #[test]
    fn job_ids_come_from_salloc_lines() {
        assert_eq!(
            job_id_of("salloc: Pending job allocation 17").as_deref(),
            Some("17")
        );
        assert_eq!(
            job_id_of("salloc: Granted job allocation 4021").as_deref(),
            Some("4021")
        );
        assert_eq!(
            job_id_of("salloc: job 17 queued and waiting for resources").as_deref(),
            Some("17")
        );
        assert_eq!(
            job_id_of("salloc: Required node not available (down, drained or reserved)"),
            None
        );
        assert_eq!(job_id_of(""), None);
    }

    #[test]
    fn squeue_lines_give_state_and_reason() {
        assert_eq!(
            parse_squeue("PENDING|PartitionConfig\n"),
            Some(("PENDING".into(), "PartitionConfig".into()))
        );
        assert_eq!(
            parse_squeue("PENDING|(ReqNodeNotAvail, UnavailableNodes:n1)\n"),
            Some((
                "PENDING".into(),
                "ReqNodeNotAvail, UnavailableNodes:n1".into()
            ))
        );
        assert_eq!(
            parse_squeue("RUNNING|None"),
            Some(("RUNNING".into(), "None".into()))
        );
        assert_eq!(parse_squeue("\n  \n"), None);
    }

    #[test]
    fn reasons_that_never_resolve_say_what_to_change() {
        let a = asked();
        for reason in [
            "PartitionConfig",
            "PartitionNodeLimit",
            "ReqNodeNotAvail, UnavailableNodes:n1",
            "QOSMaxCpuPerJobLimit",
            "QOSMaxGRESPerJob",
            "AssocMaxNodesPerJobLimit",
            "QOSMaxCpuPerNode",
            "PartitionTimeLimit",
            "InvalidAccount",
            "BadConstraints",
        ] {
            assert!(hopeless(reason, &a).is_some(), "{reason}");
        }
        let msg = hopeless("PartitionConfig", &a).unwrap();
        assert!(msg.contains("6 CPUs"), "{msg}");
        assert!(msg.contains("resources.slurm.gpu_cpus = 4"), "{msg}");
        assert!(msg.contains("resources.compile_workers"), "{msg}");
        assert!(msg.contains("resources.slurm.nodes"), "{msg}");
        assert!(
            hopeless("PartitionTimeLimit", &a)
                .unwrap()
                .contains("resources.slurm.time")
        );
        for reason in [
            "Resources",
            "Priority",
            "None",
            "JobHeldUser",
            "BeginTime",
            "Dependency",
            "QOSMaxJobsPerUserLimit",
            "AssocGrpCpuLimit",
            "",
        ] {
            assert_eq!(hopeless(reason, &a), None, "{reason}");
        }
    }
}
