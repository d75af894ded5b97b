//! The evaluation room: what one job on a device's evaluation worker works through (evaluating or
//! profiling a candidate, preparing a problem's reference data). [`EvalRoom`] borrows the pool's
//! parts it needs (the slots, the call room, the build room) and the few settings its requests
//! carry; [`ReferenceRecipe`] is the one place the settings become a problem's reference spec. The
//! pool builds the room ([`WorkerPool::eval_room`]); the jobs themselves live above it (`prepare`,
//! `execute`).

use serde_json::json;

use super::baseline::BaselineTable;
use super::build_cache::Builds;
use super::call::Calls;
use super::config::{InputsMode, ProfilerKind};
use super::inputs::InputStores;
use super::pool::WorkerPool;
use super::probes::ProbeSummaries;
use super::protocol::{ProblemSpec, ReferenceCompile, ReferenceSpec, TimingSpec};
use super::sandbox::SandboxLevel;
use super::settings::{Deadlines, WorkerSettings};
use super::slot::{Slot, Slots};
use crate::services::{DeviceId, Unavailable};
use crate::types::{EvalMode, ExecOutcome, Precision, Problem, TimingMethod, Tolerance};

impl WorkerPool {
    /// The evaluation room over this pool's parts and settings.
    pub(super) fn eval_room(&self) -> EvalRoom<'_> {
        let s = &self.settings;
        EvalRoom {
            slots: &self.slots,
            calls: &self.calls,
            builds: &self.builds,
            deadlines: self.deadlines,
            retries: s.launcher.loss_retries(),
            sandbox_level: &self.sandbox_level,
            driver: s.driver.as_deref(),
            max_speedup: s.max_speedup,
            profile_rows: s.profile_rows,
            ncu: s.ncu,
            profiler: s.profiler,
            reference: ReferenceRecipe::of(s, &self.inputs),
            probes: &self.probes,
        }
    }
}

/// The evaluation room: what one job on a device's evaluation worker works through.
pub(super) struct EvalRoom<'a> {
    /// The devices' evaluation slots (one worker each; the engine's device lease keeps it to one job).
    pub(super) slots: &'a Slots,
    /// Sending requests through them (closing, recycling, lost workers).
    pub(super) calls: &'a Calls,
    /// The candidate's build dir, and its lock (held while the worker loads the build).
    pub(super) builds: &'a Builds,
    /// The requests' deadlines (`execute`, `profile`, `reference`).
    pub(super) deadlines: Deadlines,
    /// Lost workers retried before the job gives up (`resources.loss_retries`).
    pub(super) retries: u32,
    /// What the workers run in, recorded in every outcome's `env.sandbox`.
    pub(super) sandbox_level: &'a SandboxLevel,
    /// The GPU driver version, recorded in every outcome's `env.driver`.
    pub(super) driver: Option<&'a str>,
    /// The excessive-speedup guard's bound (`eval.max_speedup`), sent with every evaluation.
    pub(super) max_speedup: Option<f64>,
    /// Rows of the profile table (`eval.profile_rows`), sent with every profile request.
    pub(super) profile_rows: u32,
    /// Whether a profile runs Nsight Compute too (`eval.ncu`, or a profiler that wants it).
    pub(super) ncu: bool,
    /// `eval.profiler`, sent with every profile request.
    pub(super) profiler: Option<ProfilerKind>,
    /// What every request's reference spec is made of (also the run's precision and mode).
    pub(super) reference: ReferenceRecipe<'a>,
    /// The precision probes' summaries, sent with every request of their problem and device kind.
    pub(super) probes: &'a ProbeSummaries,
}

impl EvalRoom<'_> {
    /// The evaluation slot of `device`.
    pub(super) fn eval_slot(&self, device: &DeviceId) -> Result<&Slot, Unavailable> {
        self.slots.eval(device).ok_or_else(|| {
            Unavailable(format!("device {device} is not served by this worker pool"))
        })
    }

    /// The reference data `problem`'s requests on `device` work against (prepare, evaluate and
    /// profile all carry it), with the precision probe's summary when one is kept for it.
    pub(super) fn reference_spec(&self, problem: &Problem, device: &DeviceId) -> ReferenceSpec {
        self.reference_spec_keyed(problem, device).0
    }

    /// [`EvalRoom::reference_spec`] and the key its precision probe's summary is kept under.
    pub(super) fn reference_spec_keyed(
        &self,
        problem: &Problem,
        device: &DeviceId,
    ) -> (ReferenceSpec, Option<String>) {
        let mut spec = self.reference.spec(problem, device);
        let key = self.probe_key(&spec, device);
        if let Some(key) = &key {
            spec.precision_probe = self.probes.get(key);
        }
        (spec, key)
    }

    /// The key of `spec`'s precision probe on `device` (`worker::probes`): None until its worker said
    /// which GPU it has. A CPU worker names no device: its machine stands for it.
    fn probe_key(&self, spec: &ReferenceSpec, device: &DeviceId) -> Option<String> {
        let slot = self.slots.eval(device)?;
        let hardware = match (slot.hardware(), device) {
            (Some(name), _) => name,
            (None, DeviceId::Cpu) => format!("cpu on {}", slot.host().unwrap_or_default()),
            (None, DeviceId::Gpu(_)) => return None,
        };
        Some(ProbeSummaries::key(
            spec,
            &hardware,
            self.builds.torch(),
            super::harness::harness_digest(),
        ))
    }

    /// Orchestrator-made outcomes still say which device they concern.
    pub(super) fn with_device(
        &self,
        mut o: ExecOutcome,
        dev: &str,
        hardware: Option<String>,
    ) -> ExecOutcome {
        // KernelBench's metadata always names the hardware and the device.
        if let Some(h) = hardware {
            o.metadata.insert("hardware".into(), json!(h));
            o.env.device_name = h;
        }
        o.metadata.insert("device".into(), json!(dev));
        o.env.driver = self.driver.map(str::to_string);
        o.env.precision = Some(self.reference.precision.as_str().into());
        o.env.mode = Some(self.reference.mode.as_str().into());
        o.env.sandbox = Some(self.sandbox_level.as_str().into());
        o
    }
}

/// What a problem's reference spec is made of besides the problem and the device: the settings
/// that decide its data and timing, and the input stores that may hold its inputs already.
pub(super) struct ReferenceRecipe<'a> {
    /// `eval.precision` (also recorded in every outcome's `env`, and the speedup guard's peaks).
    pub(super) precision: Precision,
    /// `eval.mode` (also recorded in every outcome's `env`).
    pub(super) mode: EvalMode,
    /// KernelBench's seed (the trials' seeds derive from it).
    seed: u64,
    /// Correctness trials: how many input sets and reference outputs the check reaches.
    correct_trials: u32,
    /// Warm-up calls before timing.
    warmup: u32,
    /// Timed trials; 0 turns the reference's timing off.
    timing_trials: u32,
    /// `eval.timing_method`.
    timing_method: TimingMethod,
    /// `eval.reference = "compile"`: the reference's torch.compile backend and mode.
    reference_compile: Option<&'a ReferenceCompile>,
    /// A baseline's reference runtimes, used instead of timing the reference (`eval.baseline`).
    baseline: Option<&'a BaselineTable>,
    /// `eval.cast_integer_inputs`.
    cast_integer_inputs: bool,
    /// `eval.inputs`: where the inputs are drawn.
    inputs: InputsMode,
    /// `eval.tolerance` resolved.
    tolerance: Option<&'a Tolerance>,
    /// The stores of CPU-made inputs (a whole entry is named in the spec).
    stores: &'a InputStores,
}

impl<'a> ReferenceRecipe<'a> {
    fn of(s: &'a WorkerSettings, stores: &'a InputStores) -> ReferenceRecipe<'a> {
        ReferenceRecipe {
            precision: s.precision,
            mode: s.mode,
            seed: s.seed,
            correct_trials: s.correct_trials,
            warmup: s.warmup,
            timing_trials: s.timing_trials,
            timing_method: s.timing_method,
            reference_compile: s.reference_compile.as_ref(),
            baseline: s.baseline.as_deref(),
            cast_integer_inputs: s.cast_integer_inputs,
            inputs: s.inputs,
            tolerance: s.tolerance.as_ref(),
            stores,
        }
    }

    /// The reference spec of `problem` on `device`: the one place the pool's settings become the
    /// harness's reference spec.
    fn spec(&self, problem: &Problem, device: &DeviceId) -> ReferenceSpec {
        ReferenceSpec {
            problem: problem_spec(problem),
            device: worker_device(device).into(),
            precision: self.precision.as_str().into(),
            mode: self.mode.as_str().into(),
            seed: self.seed,
            correct_trials: self.correct_trials,
            timing: TimingSpec {
                measure: self.timing_trials > 0,
                warmup: self.warmup,
                trials: self.timing_trials,
                // KernelBench's cuda_event defaults: drop the first timed call, flush L2 each time.
                discard_first: 1,
                l2_flush: true,
                method: self.timing_method,
                reference_compile: self.reference_compile.cloned(),
            },
            reference_runtime: self.baseline.and_then(|b| b.reference_runtime(problem)),
            cast_integer_inputs: self.cast_integer_inputs,
            inputs: (self.inputs == InputsMode::Device).then(|| InputsMode::Device.as_str().into()),
            stored_inputs: self.stores.stored(problem),
            tolerance: self.tolerance.cloned(),
            precision_probe: None,
        }
    }
}

fn problem_spec(problem: &Problem) -> ProblemSpec {
    ProblemSpec {
        key: problem.key.to_string(),
        code: problem.code.clone(),
        code_hash: problem.code_hash(),
    }
}

fn worker_device(device: &DeviceId) -> &'static str {
    match device {
        // The worker sees only its own GPU (CUDA_VISIBLE_DEVICES), as device 0.
        DeviceId::Gpu(_) => "cuda:0",
        DeviceId::Cpu => "cpu",
    }
}
