//! The background loop of reference preparation ([`run`]): the CPU stage (coming problems' inputs
//! made into the store, no lease held), each device's stage, and one problem's preparation step by
//! step ([`prepare_problem`], which `krefine bench reference` drives too).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio_util::sync::CancellationToken;

use super::queue::Preparer;
use crate::cpu_budget::{CORE, Claim, CpuBudget, inputs_claim};
use crate::gpu::DevicePool;
use crate::services::{Compiler, DeviceId, EventSink, Executor, InputsPlan, Unavailable};
use crate::types::{
    Event, InputsOutcome, PrepareOutcome, PrepareStatus, PrepareStep, Problem, ProblemKey,
};

/// What the background loop uses.
pub struct PrepServices<'a> {
    pub devices: &'a DevicePool,
    pub executor: &'a dyn Executor,
    pub compiler: &'a dyn Compiler,
    pub problems: &'a HashMap<ProblemKey, Arc<Problem>>,
    pub sink: &'a EventSink,
    /// The CPU budget the CPU stage draws from (`None`: not shared out).
    pub cpu: Option<&'a CpuBudget>,
}

/// The background loop: make coming problems' inputs (several at once, no lease) and prepare them
/// on every device (one at a time on each) until `cancel` (the run's drivers are done).
pub async fn run(prep: &Preparer, services: PrepServices<'_>, cancel: &CancellationToken) {
    let devices = services.devices.live_devices();
    let on_devices = futures::future::join_all(
        devices
            .iter()
            .map(|device| device_stage(prep, &services, device, cancel)),
    );
    tokio::join!(cpu_stage(prep, &services, cancel), on_devices);
}

/// A problem whose inputs no store tier has room for yet is tried again after this long (a retry
/// that would be refused again starts no generator: see `worker::input_store`).
const RETRY_DEFERRED: Duration = Duration::from_secs(2);
/// After waiting this long for room, a deferred problem's inputs are left to its candidates (made
/// inside a lease, as before the store existed) rather than holding them back further.
const MAX_DEFERRED: Duration = Duration::from_secs(600);

/// The CPU stage: coming problems' inputs made, [`cpu_ahead`] at once, no lease held. Inputs that
/// no tier has room for yet are tried again every [`RETRY_DEFERRED`] while their candidates wait
/// (off the lease) and other problems' candidates run, those whose entries hold the most room first.
async fn cpu_stage(prep: &Preparer, services: &PrepServices<'_>, cancel: &CancellationToken) {
    let plans = tokio::select! {
        biased;
        _ = cancel.cancelled() => return,
        plans = plan_inputs(services) => plans,
    };
    prep.set_sizes(
        plans
            .iter()
            .filter_map(|(k, p)| p.bytes.map(|b| (*k, b)))
            .collect(),
    );
    let plans = &plans;
    let mut cpu = FuturesUnordered::new();
    let mut retries = FuturesUnordered::new();
    let mut deferred_since: HashMap<ProblemKey, Instant> = HashMap::new();
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            Some((problem, Made { deferred, tier })) = cpu.next() => {
                let since = *deferred_since.entry(problem).or_insert_with(Instant::now);
                if deferred && since.elapsed() < MAX_DEFERRED {
                    prep.inputs_deferred(problem, tier);
                    retries.push(async move {
                        tokio::time::sleep(RETRY_DEFERRED).await;
                        problem
                    });
                } else {
                    deferred_since.remove(&problem);
                    prep.inputs_done(problem, tier);
                }
            }
            Some(problem) = retries.next() => prep.retry_inputs(problem),
            problem = prep.next_inputs() => {
                let spec = services.problems.get(&problem).cloned();
                // A deferral is logged once; the retries that follow log only how they end.
                let again = deferred_since.contains_key(&problem);
                let plan = plans.get(&problem).copied();
                cpu.push(async move {
                    let made = match spec {
                        Some(spec) => make_inputs(services, spec, again, plan).await,
                        None => Made::default(),
                    };
                    (problem, made)
                });
            }
        }
        // While inputs wait for room, the candidates of the problems holding the most of it run
        // first (see `DevicePool::prefer`); none wait: arrival order again.
        services.devices.prefer(prep.room_holders());
    }
}

/// One device's stage: the problems it takes, prepared one after another, until `cancel` or the
/// device is lost.
async fn device_stage(
    prep: &Preparer,
    services: &PrepServices<'_>,
    device: &DeviceId,
    cancel: &CancellationToken,
) {
    loop {
        let problem = tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            problem = prep.next(device) => problem,
        };
        let Some(spec) = services.problems.get(&problem).cloned() else {
            prep.change(|q| q.failed(problem));
            continue;
        };
        let wanted = || prep.wanted(problem);
        match prepare_problem(services, spec, device, wanted, cancel).await {
            Ended::Cancelled => return,
            Ended::Failed => prep.change(|q| q.failed(problem)),
            Ended::Lost => {
                prep.change(|q| q.device_lost(device));
                return;
            }
            Ended::Done | Ended::Stopped => {}
        }
    }
}

/// How long the CPU stage waits for the plans of the run's inputs before making them in arrival
/// order (sizing every problem takes a planner process a few seconds).
const PLAN_WAIT: Duration = Duration::from_secs(60);

/// The plans of every problem's inputs (their sizes and makers' processes, see
/// [`Executor::plan_inputs`]), asked once before any is made; none after [`PLAN_WAIT`].
async fn plan_inputs(services: &PrepServices<'_>) -> HashMap<ProblemKey, InputsPlan> {
    let problems: Vec<Arc<Problem>> = services.problems.values().cloned().collect();
    let cap = services.cpu.map(|cpu| inputs_claim(cpu.budget()) as u32);
    tokio::time::timeout(PLAN_WAIT, services.executor.plan_inputs(problems, cap))
        .await
        .unwrap_or_default()
}

/// How one problem's CPU stage ended, for the queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Made {
    /// No tier had room yet ([`InputsOutcome::is_deferred`]): tried again later.
    pub deferred: bool,
    /// The tier holding the entry, or the only one a deferred entry waits for
    /// ([`InputsOutcome::tier`]).
    pub tier: Option<String>,
}

/// The CPU stage of one problem: its inputs made into the store, no lease held. Logged when the
/// executor has a store (a repeated deferral, `again`, is not); a failure is logged and leaves the
/// inputs to the device stage.
pub async fn make_inputs(
    services: &PrepServices<'_>,
    problem: Arc<Problem>,
    again: bool,
    plan: Option<InputsPlan>,
) -> Made {
    // The processes drawing inputs are the budget's: claimed first, and the maker kept to them. Its
    // plan says how many it runs (one, in its own process, unless its inputs are large); without a
    // plan it may run as many as the budget grants a problem.
    let grant = match services.cpu {
        Some(cpu) => {
            let cap = inputs_claim(cpu.budget());
            let processes = plan.map_or(cap, |p| u64::from(p.processes).clamp(1, cap));
            let asked = Instant::now();
            let grant = cpu.claim(Claim::Inputs, processes * CORE).await;
            if asked.elapsed() > Duration::from_secs(1) {
                tracing::info!(
                    "inputs of {} waited {} ms for {processes} core(s) of the CPU budget",
                    problem.key,
                    asked.elapsed().as_millis()
                );
            }
            Some(grant)
        }
        None => None,
    };
    let processes = grant.as_ref().map(|g| (g.milli() / CORE) as u32);
    let started = Instant::now();
    let outcome = match services
        .executor
        .make_inputs(problem.clone(), processes)
        .await
    {
        Ok(None) => return Made::default(),
        Ok(Some(outcome)) => outcome,
        Err(Unavailable(error)) => InputsOutcome {
            status: "failed".into(),
            bytes: 0,
            duration_ms: started.elapsed().as_millis() as u64,
            parallel: 0,
            detail: Some(error),
            tier: None,
        },
    };
    let made = Made {
        deferred: outcome.is_deferred(),
        tier: outcome.tier.clone(),
    };
    if !(made.deferred && again) {
        let event = Event::InputsPrepared {
            problem: problem.key,
            outcome,
        };
        services.sink.record(None, event).await;
    }
    made
}

/// How preparing one problem ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Everything is built (or nothing more can be built in the background).
    Done,
    /// Its tasks arrived first; they build the rest themselves.
    Stopped,
    /// A step failed (the reference itself, or the worker); logged.
    Failed,
    /// The device is lost (retired, by this preparation or by a candidate's step).
    Lost,
    Cancelled,
}

/// Prepare one problem on `device` step by step while `wanted` says its tasks are still on their
/// way. Each step leases the device only while no candidate waits, and is logged through the sink.
pub async fn prepare_problem(
    services: &PrepServices<'_>,
    problem: Arc<Problem>,
    device: &DeviceId,
    wanted: impl Fn() -> bool,
    cancel: &CancellationToken,
) -> Ended {
    let mut next: Option<PrepareStep> = None;
    loop {
        if !wanted() {
            return Ended::Stopped;
        }
        let lease = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Ended::Cancelled,
            l = services.devices.acquire_idle(Some(device)) => match l {
                Some(l) => l,
                // The device was retired (lost, or its host drained).
                None => return Ended::Lost,
            },
        };
        if !wanted() {
            return Ended::Stopped;
        }
        let id = lease.device.id.clone();
        // The CPU device times the reference only on quiet cores, as it times candidates.
        let pause = match (&id, next) {
            (DeviceId::Cpu, Some(PrepareStep::ReferenceTiming)) => {
                services.compiler.pause_builds().await
            }
            _ => None,
        };
        // Quiet cores of the budget too: no input maker runs, nothing new starts.
        let cores = match (&pause, services.cpu) {
            (Some(_), Some(cpu)) => Some(cpu.claim(Claim::Quiet, 0).await),
            _ => None,
        };
        let quiet = id != DeviceId::Cpu || pause.is_some();
        let started = Instant::now();
        let result = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Ended::Cancelled,
            r = services.executor.prepare_reference(problem.clone(), &id, quiet) => r,
        };
        let held_ms = started.elapsed().as_millis() as u64;
        drop(cores);
        drop(pause);
        let lost = services.executor.retired(&id);
        let remaining = if lost {
            let why = match &result {
                Ok(o) => o.error.clone().unwrap_or_default(),
                Err(Unavailable(e)) => e.clone(),
            };
            tracing::warn!("device {id} is lost and retired: {why}");
            Some((lease.retire(&why), why))
        } else {
            drop(lease);
            None
        };
        let outcome = result.unwrap_or_else(|Unavailable(error)| PrepareOutcome {
            status: PrepareStatus::Failed,
            built: Vec::new(),
            trials_ready: 0,
            done: true,
            next: None,
            duration_ms: held_ms,
            error: Some(error),
        });
        let event = Event::ReferencePrepared {
            problem: problem.key,
            device: id.to_string(),
            held_ms,
            outcome: outcome.clone(),
        };
        services.sink.record(None, event).await;
        if let Some((remaining, error)) = remaining {
            let event = Event::DeviceRetired {
                device: id.to_string(),
                error,
                remaining: remaining as u32,
            };
            services.sink.record(None, event).await;
            return Ended::Lost;
        }
        if outcome.status != PrepareStatus::Ready {
            return Ended::Failed;
        }
        // Done, or no progress possible here (the reference cannot be timed on busy cores): the
        // first candidate does the rest.
        if outcome.done || outcome.built.is_empty() {
            return Ended::Done;
        }
        next = outcome.next;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    fn p(id: u32) -> ProblemKey {
        ProblemKey {
            level: 1,
            problem_id: id,
        }
    }

    /// A problem prepared whole in one step.
    fn prepared_in_one_step() -> PrepareOutcome {
        PrepareOutcome {
            status: PrepareStatus::Ready,
            built: vec!["trial 1".into()],
            trials_ready: 1,
            done: true,
            next: None,
            duration_ms: 0,
            error: None,
        }
    }

    /// An executor that records what it is asked, in order: problem 1's inputs must be made with
    /// the device free, and problem 2's while problem 1 holds the device (each waits for the other
    /// to have started, so the test ends only if both overlap).
    struct Overlap {
        devices: Arc<DevicePool>,
        log: Mutex<Vec<String>>,
        one_on_device: tokio::sync::watch::Sender<bool>,
        two_making: tokio::sync::watch::Sender<bool>,
    }

    impl Overlap {
        fn note(&self, line: String) {
            self.log.lock().unwrap().push(line);
        }
    }

    #[async_trait::async_trait]
    impl Executor for Overlap {
        async fn execute(
            &self,
            _job: crate::services::ExecJob,
            _device: &DeviceId,
        ) -> Result<crate::types::ExecOutcome, Unavailable> {
            Err(Unavailable("not in this test".into()))
        }

        async fn profile(
            &self,
            _job: crate::services::ExecJob,
            _device: &DeviceId,
        ) -> Result<crate::types::ProfileOutcome, Unavailable> {
            Err(Unavailable("not in this test".into()))
        }

        fn prepares_reference(&self) -> bool {
            true
        }

        async fn make_inputs(
            &self,
            problem: Arc<Problem>,
            _processes: Option<u32>,
        ) -> Result<Option<InputsOutcome>, Unavailable> {
            let id = problem.key.problem_id;
            if id == 1 {
                let free = self.devices.try_acquire_idle(None).is_some();
                self.note(format!("inputs 1: device free {free}"));
            }
            if id == 2 {
                self.two_making.send_replace(true);
                let mut on = self.one_on_device.subscribe();
                let _ = on.wait_for(|on| *on).await;
                self.note("inputs 2 made while 1 holds the device".into());
            }
            Ok(Some(InputsOutcome {
                status: "generated".into(),
                bytes: 8,
                duration_ms: 0,
                parallel: 0,
                detail: None,
                tier: None,
            }))
        }

        async fn prepare_reference(
            &self,
            problem: Arc<Problem>,
            device: &DeviceId,
            _quiet: bool,
        ) -> Result<PrepareOutcome, Unavailable> {
            let id = problem.key.problem_id;
            self.note(format!("device {id} on {device}"));
            if id == 1 {
                self.one_on_device.send_replace(true);
                let mut making = self.two_making.subscribe();
                let _ = making.wait_for(|m| *m).await;
            }
            Ok(prepared_in_one_step())
        }
    }

    #[tokio::test]
    async fn inputs_are_made_without_a_lease_while_another_problem_holds_the_device() {
        let devices = Arc::new(DevicePool::new(vec![crate::gpu::DeviceInfo::cpu()]));
        let exec = Overlap {
            devices: devices.clone(),
            log: Mutex::new(Vec::new()),
            one_on_device: tokio::sync::watch::channel(false).0,
            two_making: tokio::sync::watch::channel(false).0,
        };
        let compiler = crate::sim::SimServices::new(Default::default());
        let problems: HashMap<ProblemKey, Arc<Problem>> = [1, 2]
            .into_iter()
            .map(|id| {
                let problem = Problem {
                    key: p(id),
                    name: format!("{id}_p.py"),
                    code: String::new(),
                };
                (p(id), Arc::new(problem))
            })
            .collect();
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let sink = EventSink::new(tx);
        let prep = Preparer::with_cpu(2, 1);
        prep.coming(p(1));
        prep.coming(p(2));
        let cancel = CancellationToken::new();
        let services = PrepServices {
            devices: &devices,
            executor: &exec,
            compiler: &compiler,
            problems: &problems,
            sink: &sink,
            cpu: None,
        };
        let mut events = Vec::new();
        let watch = async {
            while events.len() < 4 {
                let Some((_, event)) = rx.recv().await else {
                    break;
                };
                events.push(event);
            }
            cancel.cancel();
        };
        let both = async { tokio::join!(run(&prep, services, &cancel), watch) };
        tokio::time::timeout(std::time::Duration::from_secs(60), both)
            .await
            .expect("the two stages overlapped");
        assert_eq!(
            *exec.log.lock().unwrap(),
            [
                "inputs 1: device free true",
                "device 1 on cpu",
                "inputs 2 made while 1 holds the device",
                "device 2 on cpu",
            ]
        );
        let kinds: Vec<(&str, u32)> = events
            .iter()
            .map(|e| match e {
                Event::InputsPrepared { problem, .. } => ("inputs", problem.problem_id),
                Event::ReferencePrepared { problem, .. } => ("device", problem.problem_id),
                _ => ("other", 0),
            })
            .collect();
        // Each problem's inputs are logged before its device stage; the two problems' events
        // interleave in whichever order their stages ended.
        let at = |k: (&str, u32)| kinds.iter().position(|x| *x == k).unwrap();
        assert_eq!(kinds.len(), 4, "{kinds:?}");
        assert!(at(("inputs", 1)) < at(("device", 1)), "{kinds:?}");
        assert!(at(("inputs", 2)) < at(("device", 2)), "{kinds:?}");
    }

    /// An executor whose store has no room for problem 1's inputs until its third try; problem 2's
    /// (larger, made at once) hold that room.
    struct NoRoomYet {
        tries: Mutex<u32>,
        prepared: Mutex<Vec<u32>>,
    }

    #[async_trait::async_trait]
    impl Executor for NoRoomYet {
        async fn execute(
            &self,
            _job: crate::services::ExecJob,
            _device: &DeviceId,
        ) -> Result<crate::types::ExecOutcome, Unavailable> {
            Err(Unavailable("not in this test".into()))
        }

        async fn profile(
            &self,
            _job: crate::services::ExecJob,
            _device: &DeviceId,
        ) -> Result<crate::types::ProfileOutcome, Unavailable> {
            Err(Unavailable("not in this test".into()))
        }

        fn prepares_reference(&self) -> bool {
            true
        }

        async fn plan_inputs(
            &self,
            problems: Vec<Arc<Problem>>,
            _processes: Option<u32>,
        ) -> HashMap<ProblemKey, crate::services::InputsPlan> {
            let plan = |bytes| crate::services::InputsPlan {
                bytes: Some(bytes),
                processes: 1,
            };
            problems
                .iter()
                .map(|p| (p.key, plan(u64::from(p.key.problem_id) * 10)))
                .collect()
        }

        async fn make_inputs(
            &self,
            problem: Arc<Problem>,
            _processes: Option<u32>,
        ) -> Result<Option<InputsOutcome>, Unavailable> {
            if problem.key.problem_id == 2 {
                return Ok(Some(InputsOutcome {
                    status: "generated".into(),
                    bytes: 20,
                    duration_ms: 0,
                    parallel: 0,
                    detail: None,
                    tier: None,
                }));
            }
            let mut tries = self.tries.lock().unwrap();
            *tries += 1;
            let status = if *tries < 3 { "deferred" } else { "generated" };
            Ok(Some(InputsOutcome {
                status: status.into(),
                bytes: if *tries < 3 { 0 } else { 8 },
                duration_ms: 0,
                parallel: 0,
                detail: None,
                tier: None,
            }))
        }

        async fn prepare_reference(
            &self,
            problem: Arc<Problem>,
            _device: &DeviceId,
            _quiet: bool,
        ) -> Result<PrepareOutcome, Unavailable> {
            // The device stage may take a problem only once its inputs are made.
            if problem.key.problem_id == 1 {
                assert_eq!(*self.tries.lock().unwrap(), 3, "prepared before its inputs");
            }
            self.prepared.lock().unwrap().push(problem.key.problem_id);
            Ok(prepared_in_one_step())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn inputs_without_room_yet_are_tried_again_while_their_candidate_waits_off_the_lease() {
        let devices = DevicePool::new(vec![crate::gpu::DeviceInfo::cpu()]);
        let exec = NoRoomYet {
            tries: Mutex::new(0),
            prepared: Mutex::new(Vec::new()),
        };
        let compiler = crate::sim::SimServices::new(Default::default());
        let problem = |id: u32| {
            Arc::new(Problem {
                key: p(id),
                name: format!("{id}_p.py"),
                code: String::new(),
            })
        };
        let problems = HashMap::from([(p(1), problem(1)), (p(2), problem(2))]);
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let sink = EventSink::new(tx);
        let prep = Preparer::with_cpu(1, 1);
        prep.coming(p(2));
        prep.coming(p(1));
        let cancel = CancellationToken::new();
        let services = PrepServices {
            devices: &devices,
            executor: &exec,
            compiler: &compiler,
            problems: &problems,
            sink: &sink,
            cpu: None,
        };
        // A candidate of problem 1 waits for its inputs (as the engine does, before any lease),
        // and holds no device meanwhile.
        // Meanwhile the device pool is told to serve problem 2's candidates first (its entry holds
        // room), and told no more once problem 1's inputs are made.
        let preferred = Mutex::new(Vec::new());
        let candidate = async {
            let wait = prep.inputs_ready(p(1));
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    () = &mut wait => break,
                    () = tokio::time::sleep(Duration::from_millis(500)) => {
                        preferred.lock().unwrap().push(devices.preferred());
                    }
                }
            }
            let tries = *exec.tries.lock().unwrap();
            let free = devices.try_acquire_idle(None).is_some();
            prep.arrived(p(1));
            prep.arrived(p(2));
            (tries, free)
        };
        let mut events = Vec::new();
        let watch = async {
            while let Some((_, event)) = rx.recv().await {
                let done = matches!(event, Event::InputsPrepared { ref outcome, problem }
                    if !outcome.is_deferred() && problem == p(1));
                events.push(event);
                if done {
                    break;
                }
            }
        };
        let all = async {
            let (_, (tries, free), ()) =
                tokio::join!(run(&prep, services, &cancel), candidate, async {
                    watch.await;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    cancel.cancel();
                });
            (tries, free)
        };
        let (tries, free) = tokio::time::timeout(Duration::from_secs(3600), all)
            .await
            .expect("the deferred inputs were made");
        assert_eq!(
            tries, 3,
            "the candidate went on only once the inputs were made"
        );
        assert!(free, "no lease was held while it waited");
        let seen = preferred.into_inner().unwrap();
        assert!(seen.contains(&vec![p(2)]), "{seen:?}");
        assert!(devices.preferred().is_empty(), "made: the preference ends");
        // The deferral is logged once, then how it ended.
        let statuses: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                Event::InputsPrepared { outcome, problem } if *problem == p(1) => {
                    Some(outcome.status.as_str())
                }
                _ => None,
            })
            .collect();
        assert_eq!(statuses, ["deferred", "generated"]);
    }
}
