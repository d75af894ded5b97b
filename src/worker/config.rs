//! The evaluation's config section: `[eval]` (executor, precision, trials, builds, timeouts, sandbox),
//! which also carries the sections of the rooms an evaluation uses (`[eval.simulated]`,
//! `[eval.checks]`, `[eval.hf]`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::sandbox::SandboxMode;
use crate::checks::ChecksSection;
use crate::sim::SimulatedSection;
use crate::types::{EvalMode, Precision, TimingMethod, Tolerance, TolerancePreset};

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ExecutorKind {
    /// The Python workers (real compile, correctness, timing, profile).
    #[default]
    Worker,
    /// Simulated compile/execute with scripted verdicts and durations (tests, scheduler benchmark).
    Simulated,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    #[serde(default = "t_compile")]
    pub compile_s: f64,
    #[serde(default = "t_load")]
    pub load_s: f64,
    /// Building a problem's reference data on a worker (inputs, outputs, timing): once per problem
    /// and worker, never charged to a candidate.
    #[serde(default = "t_reference")]
    pub reference_s: f64,
    /// Correctness and timing of one candidate, the reference data already built.
    #[serde(default = "t_execute")]
    pub execute_s: f64,
    #[serde(default = "t_profile")]
    pub profile_s: f64,
}

fn t_compile() -> f64 {
    600.0
}
fn t_load() -> f64 {
    120.0
}
fn t_reference() -> f64 {
    900.0
}
fn t_execute() -> f64 {
    300.0
}
fn t_profile() -> f64 {
    180.0
}

impl Timeouts {
    /// The defaults for a KernelBench level: level 4 builds whole Hugging Face models (seconds to
    /// load, a forward of a 2.7 B-parameter model per trial), so its reference, execute, load and
    /// profile stages get more time.
    pub fn for_level(level: u32) -> Timeouts {
        let mut t = Timeouts::default();
        if level >= 4 {
            t.load_s = 600.0;
            t.reference_s = 3600.0;
            t.execute_s = 1800.0;
            t.profile_s = 900.0;
        }
        t
    }

    /// Level-aware defaults for the keys the config did not set (`given`: the `[eval.timeouts]`
    /// table as written, with overrides applied).
    pub(crate) fn fill_level_defaults(&mut self, level: u32, given: Option<&toml::Table>) {
        let defaults = Timeouts::for_level(level);
        let set = |key: &str| given.is_some_and(|t| t.contains_key(key));
        for (key, field, default) in [
            ("compile_s", &mut self.compile_s, defaults.compile_s),
            ("load_s", &mut self.load_s, defaults.load_s),
            ("reference_s", &mut self.reference_s, defaults.reference_s),
            ("execute_s", &mut self.execute_s, defaults.execute_s),
            ("profile_s", &mut self.profile_s, defaults.profile_s),
        ] {
            if !set(key) {
                *field = default;
            }
        }
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            compile_s: t_compile(),
            load_s: t_load(),
            reference_s: t_reference(),
            execute_s: t_execute(),
            profile_s: t_profile(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EvalSection {
    #[serde(default)]
    pub executor: ExecutorKind,
    #[serde(default)]
    pub precision: Precision,
    #[serde(default)]
    pub mode: EvalMode,
    #[serde(default = "default_seed")]
    pub seed: u64,
    #[serde(default = "default_correct_trials")]
    pub correct_trials: u32,
    #[serde(default = "default_timing_trials")]
    pub timing_trials: u32,
    #[serde(default = "default_warmup")]
    pub warmup: u32,
    /// `TORCH_CUDA_ARCH_LIST` for builds; default: from the target device's compute capability.
    #[serde(default)]
    pub arch_list: Option<String>,
    /// A KernelBench baseline timing JSON (`{levelN: {file.py: stats}}`) used instead of timing the
    /// reference.
    #[serde(default)]
    pub baseline: Option<PathBuf>,
    /// Rows of the profiler table fed back in G+E+P.
    #[serde(default = "default_profile_rows")]
    pub profile_rows: u32,
    /// Also collect Nsight Compute metrics when `ncu` exists.
    #[serde(default)]
    pub ncu: bool,
    /// What the P feedback shows: `torch` (the torch.profiler table), `ncu` (Nsight Compute:
    /// KernelBench's profile.py metrics, a roofline line and the top kernels by time) or `both`.
    /// Unset: `torch`, or `both` where `ncu = true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profiler: Option<ProfilerKind>,
    /// Recycle a GPU worker after this many candidates.
    #[serde(default = "default_recycle")]
    pub recycle_after: u32,
    /// Where compiled extensions are cached (content-addressed); default `<output.dir>/.build-cache`.
    #[serde(default)]
    pub build_cache: Option<PathBuf>,
    /// Where problems' CPU-made inputs are stored (`worker::input_store`); default
    /// `<output.dir>/.reference-cache`, next to the build cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_cache: Option<PathBuf>,
    /// `kernelbench`: inputs made by `get_inputs()` on the CPU, bit for bit KernelBench's (stored
    /// on disk, see `reference_cache`); `device`: the same distributions drawn on the GPU (other
    /// bits, no CPU work). Recorded in every result's env as `inputs`.
    #[serde(default, skip_serializing_if = "InputsMode::is_default")]
    pub inputs: InputsMode,
    /// `fast` (krefine's faster build of `load_inline`, falling back to the plain one) or `plain`
    /// (torch's own build, nothing changed).
    #[serde(default)]
    pub build: BuildMode,
    #[serde(default)]
    pub timeouts: Timeouts,
    #[serde(default)]
    pub simulated: SimulatedSection,
    /// Excessive-speedup bound: a speedup above it is flagged (and re-timed in a fresh process on
    /// fresh inputs in strict mode before it counts). Default: what the reference's FLOPs and bytes
    /// allow at the GPU's peak (its roofline), or 50 where that is unknown.
    #[serde(default)]
    pub max_speedup: Option<f64>,
    /// `cuda_event` | `do_bench` | `do_bench_impl` | `host_time` (KernelBench's timers). Recorded in
    /// every result's env; left out of the frozen config at its default.
    #[serde(default, skip_serializing_if = "TimingMethod::is_default")]
    pub timing_method: TimingMethod,
    /// `kernelbench` (fp32 1e-4, fp16/bf16 1e-2) or `kernelbench-v0` (1e-2 everywhere, as in v0/v0.1
    /// and most published numbers). Unset: `kernelbench`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<TolerancePreset>,
    /// `eager` (default) or `compile`: how the evaluation times the reference. `compile` runs it
    /// under `torch.compile(backend = compile_backend, mode = compile_mode)` after
    /// `torch._dynamo.reset()`, as KernelBench's `measure_ref_program_time(use_torch_compile=True)`;
    /// speedups are then against the compiled reference. Recorded in every result's env.
    #[serde(default, skip_serializing_if = "ReferenceMode::is_default")]
    pub reference: ReferenceMode,
    /// torch.compile backend for `reference = "compile"` (KernelBench's default: `inductor`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile_backend: Option<String>,
    /// torch.compile mode for `reference = "compile"`: `default`, `reduce-overhead`,
    /// `max-autotune` or `max-autotune-no-cudagraphs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile_mode: Option<String>,
    /// Explicit absolute tolerance; overrides the preset's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub atol: Option<f64>,
    /// Explicit relative tolerance; overrides the preset's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtol: Option<f64>,
    /// Static checks on candidates' sources: a level per category (`checks::ChecksSection`).
    /// Left out of the frozen config while empty, so older runs still resume.
    #[serde(default, skip_serializing_if = "ChecksSection::is_default")]
    pub checks: ChecksSection,
    /// Cast integer and bool input tensors to the precision dtype, as KernelBench's
    /// `_process_input_tensor` does (which breaks references that index with them); false keeps
    /// their dtype. Recorded in every result's env as `integer_inputs`.
    #[serde(default)]
    pub cast_integer_inputs: bool,
    /// Each GPU or CPU worker writes one line per job to its log saying where the job's time went
    /// (the harness's lease trace, README "Where a lease goes"); `krefine bench throughput` sums them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lease_trace: bool,
    /// The Hugging Face cache the workers load level-4 models from.
    #[serde(default)]
    pub hf: crate::hf::HfSection,
    /// `auto` | `required` | `off`: confine workers in namespaces (README "Threat model"). Unset:
    /// `required` in strict mode, else `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxMode>,
}

impl EvalSection {
    /// The sandbox mode in effect: the configured one, else `required` in strict mode and `auto`
    /// otherwise.
    pub fn sandbox_mode(&self) -> SandboxMode {
        self.sandbox.unwrap_or(match self.mode {
            EvalMode::Strict => SandboxMode::Required,
            EvalMode::Faithful => SandboxMode::Auto,
        })
    }
}

/// `eval.reference`: the reference timed eagerly or under `torch.compile`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum ReferenceMode {
    #[default]
    Eager,
    Compile,
}

impl ReferenceMode {
    pub fn is_default(&self) -> bool {
        *self == ReferenceMode::Eager
    }
}

/// `eval.profiler`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ProfilerKind {
    Torch,
    Ncu,
    Both,
}

impl ProfilerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProfilerKind::Torch => "torch",
            ProfilerKind::Ncu => "ncu",
            ProfilerKind::Both => "both",
        }
    }

    pub fn wants_ncu(self) -> bool {
        self != ProfilerKind::Torch
    }
}

/// torch.compile's modes, as KernelBench's `torch_compile_options` takes them.
pub const COMPILE_MODES: [&str; 4] = [
    "default",
    "reduce-overhead",
    "max-autotune",
    "max-autotune-no-cudagraphs",
];

impl EvalSection {
    /// The compiled reference's backend and mode, with `eval.reference = "compile"`.
    pub fn reference_compile(&self) -> Option<super::protocol::ReferenceCompile> {
        (self.reference == ReferenceMode::Compile).then(|| super::protocol::ReferenceCompile {
            backend: self
                .compile_backend
                .clone()
                .unwrap_or_else(|| "inductor".into()),
            mode: self
                .compile_mode
                .clone()
                .unwrap_or_else(|| "default".into()),
        })
    }

    /// The tolerance in effect: the preset's value at the run's precision, with `atol`/`rtol`
    /// overriding (the name is then `explicit`).
    pub fn tolerance_in_effect(&self) -> Tolerance {
        let preset = self.tolerance.unwrap_or_default();
        let value = preset.value(self.precision);
        let explicit = self.atol.is_some() || self.rtol.is_some();
        Tolerance {
            name: if explicit {
                "explicit".into()
            } else {
                preset.as_str().into()
            },
            atol: self.atol.unwrap_or(value),
            rtol: self.rtol.unwrap_or(value),
        }
    }

    /// What goes on the wire: nothing while every tolerance key is unset (the harness then uses
    /// KernelBench's table, the same numbers), so requests stay as they were.
    pub fn tolerance_request(&self) -> Option<Tolerance> {
        (self.tolerance.is_some() || self.atol.is_some() || self.rtol.is_some())
            .then(|| self.tolerance_in_effect())
    }
}

fn default_seed() -> u64 {
    42
}
fn default_correct_trials() -> u32 {
    5
}
fn default_timing_trials() -> u32 {
    100
}
fn default_warmup() -> u32 {
    3
}
fn default_profile_rows() -> u32 {
    12
}
fn default_recycle() -> u32 {
    200
}

impl Default for EvalSection {
    fn default() -> Self {
        EvalSection {
            executor: ExecutorKind::default(),
            precision: Precision::default(),
            mode: EvalMode::default(),
            seed: default_seed(),
            correct_trials: default_correct_trials(),
            timing_trials: default_timing_trials(),
            warmup: default_warmup(),
            arch_list: None,
            baseline: None,
            profile_rows: default_profile_rows(),
            ncu: false,
            profiler: None,
            recycle_after: default_recycle(),
            build_cache: None,
            reference_cache: None,
            inputs: InputsMode::default(),
            build: BuildMode::default(),
            timeouts: Timeouts::default(),
            simulated: SimulatedSection::default(),
            max_speedup: None,
            timing_method: TimingMethod::default(),
            reference: ReferenceMode::default(),
            compile_backend: None,
            compile_mode: None,
            tolerance: None,
            atol: None,
            rtol: None,
            checks: ChecksSection::default(),
            cast_integer_inputs: false,
            lease_trace: false,
            hf: crate::hf::HfSection::default(),
            sandbox: None,
        }
    }
}

/// Where a problem's inputs are drawn (`eval.inputs`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum InputsMode {
    #[default]
    Kernelbench,
    Device,
}

impl InputsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            InputsMode::Kernelbench => "kernelbench",
            InputsMode::Device => "device",
        }
    }

    pub fn is_default(&self) -> bool {
        *self == InputsMode::Kernelbench
    }
}

/// How candidates' `load_inline` extensions are built (see `src/harness/kb_build.py`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum BuildMode {
    #[default]
    Fast,
    Plain,
}

impl BuildMode {
    pub fn as_str(self) -> &'static str {
        match self {
            BuildMode::Fast => "fast",
            BuildMode::Plain => "plain",
        }
    }
}
