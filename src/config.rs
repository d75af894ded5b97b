//! Experiment configuration: TOML with serde defaults, `--set key=value` overrides and validation.
//!
//! Every section denies unknown keys, so a typo is an error that names the file, the line and the key
//! instead of a silently ignored setting. A run directory keeps a frozen copy (`config.toml`) of the
//! effective configuration, overrides applied.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::checks::ChecksSection;
pub use crate::launcher::config::{LauncherKind, SlurmSection, SshSection};
use crate::types::{EvalMode, FeedbackMode, MethodKind, Precision};
pub use crate::worker::sandbox::SandboxMode;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("--set {assignment}: {message}")]
    Override { assignment: String, message: String },
    #[error("config {path}: key `{key}`: {message}")]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub run: RunSection,
    pub dataset: DatasetSection,
    #[serde(default)]
    pub method: MethodSection,
    pub model: ModelSection,
    #[serde(default)]
    pub resources: ResourcesSection,
    #[serde(default)]
    pub budget: BudgetSection,
    #[serde(default)]
    pub eval: EvalSection,
    #[serde(default)]
    pub prompt: PromptSection,
    #[serde(default)]
    pub output: OutputSection,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunSection {
    /// Run name; the run directory is `<output.dir>/<name>`. Defaults to the config file's stem.
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DatasetSection {
    /// A KernelBench checkout, a folder of `{id}_{name}.py` files (or of `level{L}/` folders), or a
    /// JSONL file with `level, problem_id, name, code`.
    pub path: PathBuf,
    #[serde(default = "default_level")]
    pub level: u32,
    /// Problem selection such as `"1-10,42"`, or `"all"`; a problem id (`1`) or a list of ids
    /// (`[1, 3]`) is taken as that selection.
    #[serde(default = "default_problems", deserialize_with = "problem_selection")]
    pub problems: String,
}

/// `dataset.problems` as the selection string: a string as is, an integer as that problem id (so
/// `--set dataset.problems=1`, which reads as a TOML integer, just works), a list of ids (and
/// ranges as strings) joined with commas.
fn problem_selection<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Item {
        Id(i64),
        Text(String),
    }
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        One(Item),
        List(Vec<Item>),
    }
    let expected = "expected a selection such as \"1-10,42\" or \"all\", a problem id, or a list of problem ids";
    let item = |i: Item| match i {
        Item::Id(n) if n >= 0 => Ok(n.to_string()),
        Item::Id(n) => Err(serde::de::Error::custom(format!(
            "{expected}; got {n}, and problem ids are not negative"
        ))),
        Item::Text(t) => Ok(t),
    };
    match Raw::deserialize(d).map_err(|_| serde::de::Error::custom(expected))? {
        Raw::One(i) => item(i),
        Raw::List(v) if v.is_empty() => {
            Err(serde::de::Error::custom(format!("{expected}; got []")))
        }
        Raw::List(v) => Ok(v
            .into_iter()
            .map(item)
            .collect::<Result<Vec<_>, _>>()?
            .join(",")),
    }
}

fn default_level() -> u32 {
    1
}
fn default_problems() -> String {
    "all".into()
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum HistoryPolicy {
    /// The paper's: the initial prompt plus the latest generation and its feedback.
    #[default]
    Last,
    /// The whole conversation as chat messages, each feedback a user turn.
    Full,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MethodSection {
    #[serde(default = "default_method")]
    pub kind: MethodKind,
    /// Turns per task for `refine`.
    #[serde(default = "default_turns")]
    pub turns: u32,
    /// Independent samples per problem for `sampling`.
    #[serde(default = "default_k")]
    pub k: u32,
    #[serde(default = "default_feedback")]
    pub feedback: FeedbackMode,
    #[serde(default)]
    pub history: HistoryPolicy,
}

fn default_method() -> MethodKind {
    MethodKind::Refine
}
fn default_turns() -> u32 {
    10
}
fn default_k() -> u32 {
    1
}
fn default_feedback() -> FeedbackMode {
    FeedbackMode::GEP
}

impl Default for MethodSection {
    fn default() -> Self {
        MethodSection {
            kind: default_method(),
            turns: default_turns(),
            k: default_k(),
            feedback: default_feedback(),
            history: HistoryPolicy::default(),
        }
    }
}

impl MethodSection {
    /// Turns each task runs (1 for one-shot and sampling).
    pub fn turns_per_task(&self) -> u32 {
        match self.kind {
            MethodKind::Refine => self.turns,
            MethodKind::OneShot | MethodKind::Sampling => 1,
        }
    }
    /// Samples (independent conversations) per problem.
    pub fn samples_per_problem(&self) -> u32 {
        match self.kind {
            MethodKind::Sampling => self.k,
            MethodKind::OneShot | MethodKind::Refine => 1,
        }
    }
    /// Length of the fast_p@N curve: turns for refinement, samples for sampling.
    pub fn budget_axis(&self) -> u32 {
        match self.kind {
            MethodKind::Refine => self.turns,
            MethodKind::Sampling => self.k,
            MethodKind::OneShot => 1,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// Answers from a JSONL file (`model.answers`); deterministic, offline.
    #[default]
    Scripted,
    /// Any OpenAI-compatible chat-completions endpoint.
    Openai,
    /// Answers recorded in an earlier run (`model.replay_run`, or `krefine run --replay-llm`).
    Replay,
}

/// USD per million tokens.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Price {
    #[serde(default)]
    pub prompt: f64,
    #[serde(default)]
    pub completion: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    #[serde(default)]
    pub provider: Provider,
    #[serde(default)]
    pub name: String,
    /// Scripted provider: JSONL with `problem`, `sample`, `turn`, `content`.
    #[serde(default)]
    pub answers: Option<PathBuf>,
    /// Replay provider: the run directory whose answers are served.
    #[serde(default)]
    pub replay_run: Option<PathBuf>,
    #[serde(default)]
    pub base_url: Option<String>,
    /// Name of the environment variable holding the API key (the key itself is never stored).
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub seed: Option<i64>,
    #[serde(default = "default_request_timeout")]
    pub request_timeout_s: f64,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub extra_headers: BTreeMap<String, String>,
    /// Price table: model name → USD per million tokens.
    #[serde(default)]
    pub prices: BTreeMap<String, Price>,
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    #[serde(default = "default_backoff_base")]
    pub backoff_base_s: f64,
    #[serde(default = "default_backoff_max")]
    pub backoff_max_s: f64,
}

fn default_request_timeout() -> f64 {
    600.0
}
fn default_max_retries() -> u32 {
    6
}
fn default_backoff_base() -> f64 {
    1.0
}
fn default_backoff_max() -> f64 {
    60.0
}

impl Default for ModelSection {
    fn default() -> Self {
        ModelSection {
            provider: Provider::default(),
            name: String::new(),
            answers: None,
            replay_run: None,
            base_url: None,
            api_key_env: None,
            temperature: None,
            top_p: None,
            max_tokens: None,
            seed: None,
            request_timeout_s: default_request_timeout(),
            stream: false,
            extra_headers: BTreeMap::new(),
            prices: BTreeMap::new(),
            max_retries: default_max_retries(),
            backoff_base_s: default_backoff_base(),
            backoff_max_s: default_backoff_max(),
        }
    }
}

/// `auto` (every GPU cudarc finds, else the CPU), `cpu`, or a list of GPU indices.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceSelection {
    #[default]
    Auto,
    Cpu,
    Gpus(Vec<u32>),
}

impl Serialize for DeviceSelection {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            DeviceSelection::Auto => s.serialize_str("auto"),
            DeviceSelection::Cpu => s.serialize_str("cpu"),
            DeviceSelection::Gpus(v) => v.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for DeviceSelection {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Word(String),
            One(u32),
            List(Vec<u32>),
        }
        let expected = "expected \"auto\", \"cpu\", a GPU index or a list of GPU indices";
        match Raw::deserialize(d).map_err(|_| serde::de::Error::custom(expected))? {
            Raw::Word(w) => match w.as_str() {
                "auto" => Ok(DeviceSelection::Auto),
                "cpu" => Ok(DeviceSelection::Cpu),
                other => {
                    // `--set resources.devices=0,1` arrives as a string.
                    let parsed: Result<Vec<u32>, _> =
                        other.split(',').map(|p| p.trim().parse::<u32>()).collect();
                    match parsed {
                        Ok(v) if !v.is_empty() => Ok(DeviceSelection::Gpus(v)),
                        _ => Err(serde::de::Error::custom(format!(
                            "{expected}, got {other:?}"
                        ))),
                    }
                }
            },
            Raw::One(i) => Ok(DeviceSelection::Gpus(vec![i])),
            Raw::List(v) if !v.is_empty() => Ok(DeviceSelection::Gpus(v)),
            Raw::List(_) => Err(serde::de::Error::custom(format!("{expected}, got []"))),
        }
    }
}

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
    /// bytes); least recently used entries go first. 0 turns the store off.
    #[serde(
        default = "default_reference_cache_gb",
        skip_serializing_if = "is_default_reference_cache_gb"
    )]
    pub reference_cache_gb: f64,
}

fn default_reference_cache_gb() -> f64 {
    40.0
}
fn is_default_reference_cache_gb(v: &f64) -> bool {
    *v == default_reference_cache_gb()
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
impl ResourcesSection {
    /// `cpu_budget`, or the cores available.
    pub fn cpu_cores(&self) -> u32 {
        self.cpu_budget
            .unwrap_or_else(crate::cpu_budget::available_cores)
            .max(1)
    }

    /// `compile_workers`, or one per core of the budget (at most 16): the budget, not the worker
    /// count, bounds how many build at once, by what builds are measured to use.
    pub fn compile_workers(&self) -> u32 {
        self.compile_workers
            .unwrap_or_else(|| self.cpu_cores().clamp(1, 16))
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
            reference_cache_gb: default_reference_cache_gb(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BudgetSection {
    /// Stop new LLM requests once this much has been spent (USD).
    #[serde(default)]
    pub usd: Option<f64>,
    /// Stop new LLM requests once this many tokens (prompt + completion) have been used.
    #[serde(default)]
    pub tokens: Option<u64>,
}

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
    fn fill_level_defaults(&mut self, level: u32, given: Option<&toml::Table>) {
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

/// Simulated services: durations in (unscaled) seconds; verdicts come from `# krefine-sim:` markers
/// in the candidate code (see `sim`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SimulatedSection {
    #[serde(default = "sim_compile")]
    pub compile_s: f64,
    #[serde(default = "sim_exec_min")]
    pub execute_min_s: f64,
    #[serde(default = "sim_exec_max")]
    pub execute_max_s: f64,
    #[serde(default = "sim_profile")]
    pub profile_s: f64,
    /// Simulated seconds per real second (1 = real time).
    #[serde(default = "sim_scale")]
    pub time_scale: f64,
}

fn sim_compile() -> f64 {
    0.05
}
fn sim_exec_min() -> f64 {
    0.02
}
fn sim_exec_max() -> f64 {
    0.05
}
fn sim_profile() -> f64 {
    0.02
}
fn sim_scale() -> f64 {
    1.0
}

impl Default for SimulatedSection {
    fn default() -> Self {
        SimulatedSection {
            compile_s: sim_compile(),
            execute_min_s: sim_exec_min(),
            execute_max_s: sim_exec_max(),
            profile_s: sim_profile(),
            time_scale: sim_scale(),
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
    /// Static checks on candidates' sources: a level per category (`checks::ChecksSection`).
    /// Left out of the frozen config while empty, so older runs still resume.
    #[serde(default, skip_serializing_if = "ChecksSection::is_default")]
    pub checks: ChecksSection,
    /// Cast integer and bool input tensors to the precision dtype, as KernelBench's
    /// `_process_input_tensor` does (which breaks references that index with them); false keeps
    /// their dtype. Recorded in every result's env as `integer_inputs`.
    #[serde(default)]
    pub cast_integer_inputs: bool,
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
            recycle_after: default_recycle(),
            build_cache: None,
            reference_cache: None,
            inputs: InputsMode::default(),
            build: BuildMode::default(),
            timeouts: Timeouts::default(),
            simulated: SimulatedSection::default(),
            max_speedup: None,
            checks: ChecksSection::default(),
            cast_integer_inputs: false,
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

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum PromptStyle {
    ZeroShot,
    #[default]
    OneShot,
    FewShot,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// Inline CUDA through `load_inline`.
    #[default]
    Cuda,
    Triton,
    /// C++ extensions for the CPU device.
    Cpu,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PromptSection {
    /// A folder of templates overriding the built-in ones (same file names).
    #[serde(default)]
    pub templates: Option<PathBuf>,
    #[serde(default)]
    pub style: PromptStyle,
    /// Kernel language asked for; default: `cuda` on a GPU, `cpu` on the CPU device.
    #[serde(default)]
    pub backend: Option<Backend>,
    /// Add the GPU's specifications to the prompt.
    #[serde(default)]
    pub hardware_info: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OutputSection {
    /// Parent folder of run directories.
    #[serde(default = "default_out_dir")]
    pub dir: PathBuf,
    /// fsync the event log after every batch of events, before any of them is acted on (slower;
    /// survives power loss, not only crashes).
    #[serde(default)]
    pub fsync: bool,
}

fn default_out_dir() -> PathBuf {
    PathBuf::from("trajectories")
}

impl Default for OutputSection {
    fn default() -> Self {
        OutputSection {
            dir: default_out_dir(),
            fsync: false,
        }
    }
}

/// A loaded configuration with where it came from.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    pub config: Config,
    /// The config file; relative paths inside it are resolved against its folder.
    pub path: PathBuf,
    /// The effective configuration as TOML (overrides applied), frozen into the run directory.
    pub effective_toml: String,
}

impl LoadedConfig {
    /// Resolve a path from the config relative to the config file's folder.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            return p.to_path_buf();
        }
        let base = self.path.parent().unwrap_or_else(|| Path::new("."));
        // Configs in the repo's configs/ folder name repo-relative paths; prefer the path as given
        // when it exists from the working directory, else relative to the config's folder.
        if p.exists() {
            p.to_path_buf()
        } else {
            base.join(p)
        }
    }

    /// The run name: `run.name` or the config file's stem.
    pub fn run_name(&self) -> String {
        self.config.run.name.clone().unwrap_or_else(|| {
            self.path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "run".into())
        })
    }
}

/// Read, override and validate a config file.
pub fn load(path: &Path, sets: &[String]) -> Result<LoadedConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, path, sets)
}

/// Parse config text (`path` is only used in messages and to resolve relative paths).
pub fn parse(text: &str, path: &Path, sets: &[String]) -> Result<LoadedConfig, ConfigError> {
    let parse_err = |e: toml::de::Error| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string().trim_end().to_string(),
    };
    // Deserialize the file alone first, so errors in it carry its line numbers.
    let _: Config = toml::from_str(text).map_err(parse_err)?;
    let mut table: toml::Table = toml::from_str(text).map_err(parse_err)?;
    for assignment in sets {
        apply_set(&mut table, assignment)?;
    }
    let mut config: Config = if sets.is_empty() {
        toml::from_str(text).map_err(parse_err)?
    } else {
        toml::Value::Table(table.clone())
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Override {
                assignment: sets.join(" "),
                message: e.to_string().trim_end().to_string(),
            })?
    };
    let given_timeouts = table
        .get("eval")
        .and_then(|e| e.get("timeouts"))
        .and_then(|t| t.as_table());
    let level = config.dataset.level;
    config
        .eval
        .timeouts
        .fill_level_defaults(level, given_timeouts);
    validate(&config, path)?;
    let effective_toml = toml::to_string_pretty(&config).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: format!("cannot serialise the effective config: {e}"),
    })?;
    Ok(LoadedConfig {
        config,
        path: path.to_path_buf(),
        effective_toml,
    })
}

/// Apply one `key.path=value` override. The value is read as a TOML value when it parses as one
/// (`3`, `0.7`, `true`, `[0, 1]`, `"x"`), else taken as a plain string (`GEP`, `refine`).
fn apply_set(table: &mut toml::Table, assignment: &str) -> Result<(), ConfigError> {
    let err = |message: String| ConfigError::Override {
        assignment: assignment.to_string(),
        message,
    };
    let (key, raw) = assignment
        .split_once('=')
        .ok_or_else(|| err("expected key=value, e.g. method.turns=5".into()))?;
    let key = key.trim();
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(err(format!("malformed key {key:?}")));
    }
    let value = parse_set_value(raw.trim());
    let (last, parents) = parts.split_last().ok_or_else(|| err("empty key".into()))?;
    let mut cur = table;
    for p in parents {
        let entry = cur
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = match entry {
            toml::Value::Table(t) => t,
            _ => return Err(err(format!("`{p}` is not a section"))),
        };
    }
    cur.insert(last.to_string(), value);
    Ok(())
}

fn parse_set_value(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match toml::from_str::<toml::Table>(&doc) {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_string())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

fn validate(c: &Config, path: &Path) -> Result<(), ConfigError> {
    let invalid = |key: &str, message: &str| ConfigError::Invalid {
        path: path.to_path_buf(),
        key: key.to_string(),
        message: message.to_string(),
    };
    if c.method.turns == 0 {
        return Err(invalid("method.turns", "expected at least 1 turn"));
    }
    if c.method.k == 0 {
        return Err(invalid("method.k", "expected at least 1 sample"));
    }
    if let Some(name) = &c.run.name
        && (name.is_empty() || name.contains('/') || name.contains('\\') || name == "..")
    {
        return Err(invalid("run.name", "expected a plain folder name"));
    }
    match c.model.provider {
        Provider::Scripted if c.model.answers.is_none() => {
            return Err(invalid(
                "model.answers",
                "the scripted provider needs a JSONL file of answers",
            ));
        }
        Provider::Openai if c.model.name.is_empty() => {
            return Err(invalid(
                "model.name",
                "the openai provider needs a model name",
            ));
        }
        _ => {}
    }
    if let Some(t) = c.model.temperature
        && !(0.0..=2.0).contains(&t)
    {
        return Err(invalid(
            "model.temperature",
            "expected a number from 0 to 2",
        ));
    }
    if let Some(p) = c.model.top_p
        && !(p > 0.0 && p <= 1.0)
    {
        return Err(invalid("model.top_p", "expected a number in (0, 1]"));
    }
    if c.model.request_timeout_s.is_nan() || c.model.request_timeout_s <= 0.0 {
        return Err(invalid(
            "model.request_timeout_s",
            "expected a positive number",
        ));
    }
    if c.resources.llm_concurrency == 0 {
        return Err(invalid("resources.llm_concurrency", "expected at least 1"));
    }
    if c.resources.prepare_ahead > crate::refprep::MAX_AHEAD {
        return Err(invalid(
            "resources.prepare_ahead",
            &format!(
                "expected 0 to {} (a worker keeps the reference data of {} problems; more prepared \
                 ahead would evict each other before their candidates arrive), got {}",
                crate::refprep::MAX_AHEAD,
                crate::refprep::MAX_AHEAD + 1,
                c.resources.prepare_ahead
            ),
        ));
    }
    if !(c.resources.reference_cache_gb.is_finite() && c.resources.reference_cache_gb >= 0.0) {
        return Err(invalid(
            "resources.reference_cache_gb",
            &format!(
                "expected a size in GB, 0 or more (0 turns the reference input store off), got {}",
                c.resources.reference_cache_gb
            ),
        ));
    }
    if c.resources.compile_workers == Some(0) {
        return Err(invalid("resources.compile_workers", "expected at least 1"));
    }
    if c.resources.cpu_budget == Some(0) {
        return Err(invalid(
            "resources.cpu_budget",
            "expected at least 1 (cores shared by builds, input preparation and CPU timing)",
        ));
    }
    if c.resources.drain_after == 0 {
        return Err(invalid("resources.drain_after", "expected at least 1"));
    }
    let r = &c.resources;
    crate::launcher::config::validate(
        r.launcher,
        &r.slurm,
        &r.ssh,
        r.devices == DeviceSelection::Cpu,
    )
    .map_err(|(key, message)| invalid(&key, &message))?;
    if c.eval.correct_trials == 0 {
        return Err(invalid("eval.correct_trials", "expected at least 1"));
    }
    if c.eval.timing_trials == 0 {
        return Err(invalid("eval.timing_trials", "expected at least 1"));
    }
    if let Some(bound) = c.eval.max_speedup
        && !(bound.is_finite() && bound > 0.0)
    {
        return Err(invalid("eval.max_speedup", "expected a positive number"));
    }
    let t = &c.eval.timeouts;
    for (key, v) in [
        ("eval.timeouts.compile_s", t.compile_s),
        ("eval.timeouts.load_s", t.load_s),
        ("eval.timeouts.reference_s", t.reference_s),
        ("eval.timeouts.execute_s", t.execute_s),
        ("eval.timeouts.profile_s", t.profile_s),
    ] {
        if v.is_nan() || v <= 0.0 {
            return Err(invalid(key, "expected a positive number of seconds"));
        }
    }
    let s = &c.eval.simulated;
    if s.time_scale.is_nan() || s.time_scale <= 0.0 {
        return Err(invalid(
            "eval.simulated.time_scale",
            "expected a positive number",
        ));
    }
    if s.execute_min_s > s.execute_max_s {
        return Err(invalid(
            "eval.simulated.execute_min_s",
            "must not be larger than eval.simulated.execute_max_s",
        ));
    }
    if let Some(u) = c.budget.usd
        && (u.is_nan() || u < 0.0)
    {
        return Err(invalid("budget.usd", "expected a non-negative number"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: &str = r#"
[dataset]
path = "problems"
[model]
provider = "scripted"
answers = "answers.jsonl"
"#;

    fn p(text: &str, sets: &[&str]) -> Result<LoadedConfig, ConfigError> {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        parse(text, Path::new("exp.toml"), &sets)
    }

    #[test]
    fn level_4_gets_whole_model_timeouts_unless_set() {
        let t = p(MIN, &[]).unwrap().config.eval.timeouts;
        assert_eq!(t, Timeouts::default());
        let l4 = p(MIN, &["dataset.level=4", "eval.timeouts.execute_s=99"]).unwrap();
        let t = &l4.config.eval.timeouts;
        assert_eq!(
            (
                t.compile_s,
                t.load_s,
                t.reference_s,
                t.execute_s,
                t.profile_s
            ),
            (600.0, 600.0, 3600.0, 99.0, 900.0)
        );
        // The effective config states them, so a resume reads the same values.
        assert!(l4.effective_toml.contains("reference_s = 3600.0"));
        let text = format!("{MIN}[eval.timeouts]\nreference_s = 10\n");
        let t = p(&text, &["dataset.level=4"]).unwrap().config.eval.timeouts;
        assert_eq!((t.reference_s, t.execute_s), (10.0, 1800.0));
    }

    #[test]
    fn integer_inputs_and_hf_cache_keys() {
        let c = p(MIN, &[]).unwrap().config;
        assert!(!c.eval.cast_integer_inputs);
        assert!(c.eval.hf.offline);
        assert_eq!(c.eval.hf.cache, None);
        let text = format!(
            "{MIN}[eval]\ncast_integer_inputs = true\n[eval.hf]\ncache = \"/m/hub\"\noffline = false\n"
        );
        let c = p(&text, &[]).unwrap().config;
        assert!(c.eval.cast_integer_inputs && !c.eval.hf.offline);
        assert_eq!(c.eval.hf.cache, Some(PathBuf::from("/m/hub")));
        let err = p(&format!("{MIN}[eval.hf]\ncahce = 1\n"), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("cahce"), "{err}");
    }

    #[test]
    fn defaults_fill_in() {
        let c = p(MIN, &[]).unwrap().config;
        assert_eq!(c.method.kind, MethodKind::Refine);
        assert_eq!(c.method.turns, 10);
        assert_eq!(c.method.feedback, FeedbackMode::GEP);
        assert_eq!(c.eval.correct_trials, 5);
        assert_eq!(c.eval.timing_trials, 100);
        assert_eq!(c.eval.warmup, 3);
        assert_eq!(c.eval.precision, Precision::Fp32);
        assert_eq!(c.resources.devices, DeviceSelection::Auto);
        assert_eq!(c.dataset.problems, "all");
    }

    #[test]
    fn eval_build_defaults_to_fast_and_takes_plain() {
        assert_eq!(p(MIN, &[]).unwrap().config.eval.build, BuildMode::Fast);
        let plain = p(MIN, &["eval.build=plain"]).unwrap().config;
        assert_eq!(plain.eval.build, BuildMode::Plain);
        let e = p(&format!("{MIN}\n[eval]\nbuild = \"quick\"\n"), &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("build") && e.contains("line 9"), "{e}");
    }

    #[test]
    fn sandbox_mode_defaults_to_required_in_strict_mode() {
        let mode = |sets: &[&str]| p(MIN, sets).unwrap().config.eval.sandbox_mode();
        assert_eq!(mode(&[]), SandboxMode::Auto);
        assert_eq!(mode(&["eval.mode=\"strict\""]), SandboxMode::Required);
        assert_eq!(
            mode(&["eval.mode=\"strict\"", "eval.sandbox=\"off\""]),
            SandboxMode::Off
        );
        assert_eq!(mode(&["eval.sandbox=\"required\""]), SandboxMode::Required);
        let e = p(MIN, &["eval.sandbox=\"maybe\""]).unwrap_err().to_string();
        assert!(e.contains("sandbox"), "{e}");
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let text = format!("{MIN}\n[method]\nturnz = 3\n");
        let e = p(&text, &[]).unwrap_err().to_string();
        assert!(e.contains("exp.toml"), "{e}");
        assert!(e.contains("turnz"), "{e}");
        assert!(e.contains("line 9"), "{e}");
    }

    #[test]
    fn wrong_type_names_key() {
        let text = format!("{MIN}\n[method]\nturns = \"many\"\n");
        let e = p(&text, &[]).unwrap_err().to_string();
        assert!(e.contains("turns"), "{e}");
        assert!(e.contains("line 9"), "{e}");
    }

    #[test]
    fn sets_override_and_parse_types() {
        let c = p(
            MIN,
            &[
                "method.kind=sampling",
                "method.k=4",
                "method.feedback=GE",
                "model.temperature=0.7",
                "resources.devices=[0, 1]",
                "eval.precision=bf16",
                "dataset.problems=1-3,7",
            ],
        )
        .unwrap()
        .config;
        assert_eq!(c.method.kind, MethodKind::Sampling);
        assert_eq!(c.method.k, 4);
        assert_eq!(c.method.feedback, FeedbackMode::GE);
        assert_eq!(c.model.temperature, Some(0.7));
        assert_eq!(c.resources.devices, DeviceSelection::Gpus(vec![0, 1]));
        assert_eq!(c.eval.precision, Precision::Bf16);
        assert_eq!(c.dataset.problems, "1-3,7");
    }

    #[test]
    fn problem_ids_as_integers_and_lists() {
        for (set, want) in [
            ("dataset.problems=1", "1"),
            ("dataset.problems=[1, 3]", "1,3"),
            ("dataset.problems=[2, \"5-7\"]", "2,5-7"),
            ("dataset.problems=all", "all"),
        ] {
            let c = p(MIN, &[set]).unwrap().config;
            assert_eq!(c.dataset.problems, want, "{set}");
        }
        for bad in [
            "dataset.problems=-1",
            "dataset.problems=[]",
            "dataset.problems=1.5",
        ] {
            let e = p(MIN, &[bad]).unwrap_err().to_string();
            assert!(e.contains("problem id"), "{bad}: {e}");
        }
    }

    #[test]
    fn devices_forms() {
        for (v, want) in [
            ("cpu", DeviceSelection::Cpu),
            ("auto", DeviceSelection::Auto),
            ("0,2", DeviceSelection::Gpus(vec![0, 2])),
            ("3", DeviceSelection::Gpus(vec![3])),
        ] {
            let c = p(MIN, &[&format!("resources.devices={v}")]).unwrap().config;
            assert_eq!(c.resources.devices, want, "{v}");
        }
        let e = p(MIN, &["resources.devices=gpu"]).unwrap_err().to_string();
        assert!(e.contains("devices") || e.contains("auto"), "{e}");
    }

    #[test]
    fn bad_set_is_named() {
        let e = p(MIN, &["method.turns=lots"]).unwrap_err().to_string();
        assert!(e.contains("--set method.turns=lots"), "{e}");
        let e = p(MIN, &["method.bogus=1"]).unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");
        let e = p(MIN, &["noequals"]).unwrap_err().to_string();
        assert!(e.contains("key=value"), "{e}");
    }

    #[test]
    fn reference_store_and_inputs_keys() {
        let c = p(MIN, &[]).unwrap().config;
        assert_eq!(c.resources.reference_cache_gb, 40.0);
        assert_eq!(c.eval.inputs, InputsMode::Kernelbench);
        assert!(c.eval.reference_cache.is_none());
        let c = p(
            MIN,
            &[
                "eval.inputs=\"device\"",
                "resources.reference_cache_gb=0",
                "eval.reference_cache=\"/tmp/refs\"",
            ],
        )
        .unwrap()
        .config;
        assert_eq!(c.eval.inputs, InputsMode::Device);
        assert_eq!(c.resources.reference_cache_gb, 0.0);
        assert_eq!(
            c.eval.reference_cache.as_deref(),
            Some(Path::new("/tmp/refs"))
        );
        let e = p(MIN, &["resources.reference_cache_gb=-1"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("resources.reference_cache_gb") && e.contains("got -1"),
            "{e}"
        );
        let e = p(MIN, &["eval.inputs=\"gpu\""]).unwrap_err().to_string();
        assert!(e.contains("inputs"), "{e}");
    }

    #[test]
    fn semantic_validation_names_key() {
        let e = p(MIN, &["method.turns=0"]).unwrap_err().to_string();
        assert!(e.contains("method.turns"), "{e}");
        let e = p(MIN, &["model.temperature=5"]).unwrap_err().to_string();
        assert!(e.contains("model.temperature"), "{e}");
        let text = "[dataset]\npath = \"x\"\n[model]\nprovider = \"scripted\"\n";
        let e = p(text, &[]).unwrap_err().to_string();
        assert!(e.contains("model.answers"), "{e}");
        let e = p(MIN, &["resources.prepare_ahead=4"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("resources.prepare_ahead")
                && e.contains("expected 0 to 3")
                && e.contains("got 4"),
            "{e}"
        );
        let c = p(MIN, &[]).unwrap().config;
        assert_eq!(c.resources.prepare_ahead, 2);
        // Compile workers follow the CPU budget unless set.
        let r = p(MIN, &["resources.cpu_budget=6"])
            .unwrap()
            .config
            .resources;
        assert_eq!((r.cpu_cores(), r.compile_workers()), (6, 6));
        let r = p(
            MIN,
            &["resources.cpu_budget=64", "resources.compile_workers=3"],
        )
        .unwrap()
        .config
        .resources;
        assert_eq!((r.cpu_cores(), r.compile_workers()), (64, 3));
        let e = p(MIN, &["resources.cpu_budget=0"]).unwrap_err().to_string();
        assert!(e.contains("resources.cpu_budget"), "{e}");
        assert_eq!(
            p(MIN, &["resources.prepare_ahead=0"])
                .unwrap()
                .config
                .resources
                .prepare_ahead,
            0
        );
    }

    #[test]
    fn checks_levels_parse_and_unknown_categories_are_named() {
        use crate::checks::{Category, Level};
        let text =
            format!("{MIN}\n[eval]\nmode = \"strict\"\n[eval.checks]\ncode_bypass = \"warn\"\n");
        let c = p(&text, &["eval.checks.pytorch_wrap=off"]).unwrap().config;
        assert_eq!(
            c.eval.checks.level(Category::CodeBypass, c.eval.mode),
            Level::Warn
        );
        assert_eq!(
            c.eval.checks.level(Category::TimingPatch, c.eval.mode),
            Level::Error
        );
        assert_eq!(
            c.eval.checks.level(Category::PytorchWrap, c.eval.mode),
            Level::Off
        );
        let text = format!("{MIN}\n[eval.checks]\ntiming_hack = \"error\"\n");
        let e = p(&text, &[]).unwrap_err().to_string();
        assert!(e.contains("timing_hack") && e.contains("line 9"), "{e}");
        let e = p(MIN, &["eval.checks.lazy_eval=fatal"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("lazy_eval=fatal") && e.contains("`warn`"), "{e}");
        // Unset, the table stays out of the frozen config (older runs resume unchanged).
        assert!(!p(MIN, &[]).unwrap().effective_toml.contains("checks"));
    }

    #[test]
    fn effective_toml_round_trips() {
        let l = p(MIN, &["method.turns=3", "eval.checks.timing_patch=off"]).unwrap();
        let again: Config = toml::from_str(&l.effective_toml).unwrap();
        assert_eq!(again, l.config);
    }
}
