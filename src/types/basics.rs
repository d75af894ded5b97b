//! Identities and evaluation settings that cross rooms: problems and tasks, feedback and method,
//! precision, mode, timing method, tolerance (a leaf of [`super`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A problem's identity: KernelBench level and problem id (`"1/19"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProblemKey {
    pub level: u32,
    pub problem_id: u32,
}

impl fmt::Display for ProblemKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.level, self.problem_id)
    }
}

impl FromStr for ProblemKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (l, p) = s
            .split_once('/')
            .ok_or_else(|| format!("expected \"<level>/<problem_id>\", got {s:?}"))?;
        let level = l
            .trim()
            .parse()
            .map_err(|_| format!("level in {s:?} is not a non-negative integer"))?;
        let problem_id = p
            .trim()
            .parse()
            .map_err(|_| format!("problem id in {s:?} is not a non-negative integer"))?;
        Ok(ProblemKey { level, problem_id })
    }
}

/// A task is one conversation: a problem and a sample index (`"1/19/0"`). Refinement and one-shot runs
/// have sample 0 only; repeated sampling has samples `0..k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId {
    pub problem: ProblemKey,
    pub sample: u32,
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.problem, self.sample)
    }
}

impl FromStr for TaskId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (p, sample) = s
            .rsplit_once('/')
            .ok_or_else(|| format!("expected \"<level>/<problem_id>/<sample>\", got {s:?}"))?;
        let problem = p.parse()?;
        let sample = sample
            .parse()
            .map_err(|_| format!("sample in {s:?} is not a non-negative integer"))?;
        Ok(TaskId { problem, sample })
    }
}

macro_rules! serde_via_string {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}
serde_via_string!(ProblemKey);
serde_via_string!(TaskId);

/// A reference problem in KernelBench format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    pub key: ProblemKey,
    /// File name as KernelBench names it, with `.py` (`19_ReLU.py`); baseline JSON is keyed by it.
    pub name: String,
    pub code: String,
}

impl Problem {
    /// Content hash of the reference source; keys reference caches in the workers.
    pub fn code_hash(&self) -> String {
        blake3::hash(self.code.as_bytes()).to_hex()[..16].to_string()
    }
}

/// What of the previous turn goes into the next prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FeedbackMode {
    /// The previous generation only.
    G,
    /// Generation and execution result.
    GE,
    /// Generation, execution result and profile (profile only for correct candidates).
    GEP,
}

impl FeedbackMode {
    pub fn includes_execution(self) -> bool {
        matches!(self, FeedbackMode::GE | FeedbackMode::GEP)
    }
    pub fn includes_profile(self) -> bool {
        matches!(self, FeedbackMode::GEP)
    }
}

impl fmt::Display for FeedbackMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FeedbackMode::G => "G",
            FeedbackMode::GE => "G+E",
            FeedbackMode::GEP => "G+E+P",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MethodKind {
    OneShot,
    Sampling,
    Refine,
}

impl fmt::Display for MethodKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MethodKind::OneShot => "one_shot",
            MethodKind::Sampling => "sampling",
            MethodKind::Refine => "refine",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    #[default]
    Fp32,
    Fp16,
    Bf16,
}

impl Precision {
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
        }
    }
}

/// `faithful` reproduces KernelBench's checks exactly; `strict` adds the named hardening checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum EvalMode {
    #[default]
    Faithful,
    Strict,
}

impl EvalMode {
    pub fn as_str(self) -> &'static str {
        match self {
            EvalMode::Faithful => "faithful",
            EvalMode::Strict => "strict",
        }
    }
}

/// `eval.timing_method`: KernelBench's four timers (`src/kernelbench/timing.py`). `cuda_event` (the
/// default) flushes L2 with a 256 MiB buffer before each call and drops the first; `do_bench` is
/// Triton's adaptive `triton.testing.do_bench`; `do_bench_impl` is Triton's loop with explicit counts;
/// `host_time` is the wall clock around a device-wide synchronize.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TimingMethod {
    #[default]
    CudaEvent,
    DoBench,
    DoBenchImpl,
    HostTime,
}

impl TimingMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            TimingMethod::CudaEvent => "cuda_event",
            TimingMethod::DoBench => "do_bench",
            TimingMethod::DoBenchImpl => "do_bench_impl",
            TimingMethod::HostTime => "host_time",
        }
    }

    /// Methods that cannot run without a CUDA device (`cuda_event` and `host_time` have CPU loops).
    pub fn needs_gpu(self) -> bool {
        matches!(self, TimingMethod::DoBench | TimingMethod::DoBenchImpl)
    }

    pub fn is_default(&self) -> bool {
        *self == TimingMethod::CudaEvent
    }
}

/// `eval.tolerance`: whose correctness tolerance. `kernelbench` is KernelBench's current table
/// (fp32 1e-4, fp16/bf16 1e-2); `kernelbench-v0` is what v0/v0.1 and most published numbers used
/// (1e-2 at every precision).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum TolerancePreset {
    #[default]
    #[serde(rename = "kernelbench")]
    KernelBench,
    #[serde(rename = "kernelbench-v0")]
    KernelBenchV0,
}

impl TolerancePreset {
    pub fn as_str(self) -> &'static str {
        match self {
            TolerancePreset::KernelBench => "kernelbench",
            TolerancePreset::KernelBenchV0 => "kernelbench-v0",
        }
    }

    /// atol = rtol of this preset at `precision`.
    pub fn value(self, precision: Precision) -> f64 {
        match (self, precision) {
            (TolerancePreset::KernelBench, Precision::Fp32) => 1e-4,
            _ => 1e-2,
        }
    }
}

/// The correctness tolerance in effect: on the wire to the harness, and recorded in every result's
/// env. `name` is the preset, or `explicit` where `eval.atol`/`eval.rtol` set a bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    pub name: String,
    pub atol: f64,
    pub rtol: f64,
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.atol == self.rtol {
            write!(f, "{} (atol = rtol = {:e})", self.name, self.atol)
        } else {
            write!(
                f,
                "{} (atol {:e}, rtol {:e})",
                self.name, self.atol, self.rtol
            )
        }
    }
}
