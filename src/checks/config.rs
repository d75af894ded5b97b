//! The `[eval.checks]` table: one level (`off`, `warn`, `error`) per static-check category, with
//! defaults that depend on the evaluation mode.
//!
//! Faithful mode (KernelBench parity) warns for every category: findings are recorded and shown but
//! never change a verdict, as KernelBench's checker never touches `eval_kernel_against_ref`. Strict
//! mode makes KernelBench's `STRICT_CHECKS` (code bypass, timing patch, thread injection, lazy
//! evaluation) and the missing-kernel check errors, plus stream injection and introspection, whose
//! hacks are as direct as a timing patch; the rest (precision downgrade, PyTorch wrapping, PyTorch
//! computation ops) stay warnings.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::types::EvalMode;

/// A static-check category; its name is the config key and the `Finding::category`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// `try`/`except` and `pass`: a failing kernel can fall back silently (KernelBench `code_bypass`).
    CodeBypass,
    /// Replacing timers, `synchronize`, CUDA events or torch functions the harness relies on
    /// (KernelBench `timing_event_patch`).
    TimingPatch,
    /// Threads or processes that can finish work after the timer stops.
    ThreadInjection,
    /// Tensor subclasses and wrappers that defer the computation (`_make_subclass`, ...).
    LazyEval,
    /// Work on streams the timer does not wait for, in Python or in the CUDA sources.
    StreamInjection,
    /// Lower precision than the problem's fp32 (half/bf16 casts, TF32); only checked for fp32.
    PrecisionDowngrade,
    /// `torch.nn` layers doing the work instead of a custom kernel.
    PytorchWrap,
    /// PyTorch computation calls (`torch.matmul`, `F.conv2d`, ...) doing the work.
    TorchComputationOps,
    /// No custom kernel for the backend (CUDA: `__global__` plus a `load_inline` build).
    MissingKernel,
    /// Frame, garbage-collector or raw-memory introspection that can read the reference's output
    /// (`sys._getframe`, `inspect`, `gc.get_objects`, `ctypes`); not in KernelBench.
    Introspection,
}

impl Category {
    pub const ALL: [Category; 10] = [
        Category::CodeBypass,
        Category::TimingPatch,
        Category::ThreadInjection,
        Category::LazyEval,
        Category::StreamInjection,
        Category::PrecisionDowngrade,
        Category::PytorchWrap,
        Category::TorchComputationOps,
        Category::MissingKernel,
        Category::Introspection,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Category::CodeBypass => "code_bypass",
            Category::TimingPatch => "timing_patch",
            Category::ThreadInjection => "thread_injection",
            Category::LazyEval => "lazy_eval",
            Category::StreamInjection => "stream_injection",
            Category::PrecisionDowngrade => "precision_downgrade",
            Category::PytorchWrap => "pytorch_wrap",
            Category::TorchComputationOps => "torch_computation_ops",
            Category::MissingKernel => "missing_kernel",
            Category::Introspection => "introspection",
        }
    }

    /// The level a category has when the config does not set it.
    pub fn default_level(self, mode: EvalMode) -> Level {
        match mode {
            EvalMode::Faithful => Level::Warn,
            EvalMode::Strict => match self {
                Category::CodeBypass
                | Category::TimingPatch
                | Category::ThreadInjection
                | Category::LazyEval
                | Category::MissingKernel
                | Category::StreamInjection
                | Category::Introspection => Level::Error,
                Category::PrecisionDowngrade
                | Category::PytorchWrap
                | Category::TorchComputationOps => Level::Warn,
            },
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a category's findings do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Not checked.
    Off,
    /// Recorded and shown in feedback and reports; the verdict is unchanged.
    Warn,
    /// The candidate is rejected before compiling (verdict `rejected`).
    Error,
}

/// `[eval.checks]`: a level per category (each category is described in docs/static-checks.md);
/// unset categories take the mode's default. Unknown keys are config errors that name the key
/// (`deny_unknown_fields`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ChecksSection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_bypass: Option<Level>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing_patch: Option<Level>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_injection: Option<Level>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lazy_eval: Option<Level>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_injection: Option<Level>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision_downgrade: Option<Level>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pytorch_wrap: Option<Level>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch_computation_ops: Option<Level>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing_kernel: Option<Level>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub introspection: Option<Level>,
}

impl ChecksSection {
    /// True when nothing is set (the table is then left out of the frozen config, so runs made
    /// before the table existed still resume).
    pub fn is_default(&self) -> bool {
        *self == ChecksSection::default()
    }

    fn get(&self, c: Category) -> Option<Level> {
        match c {
            Category::CodeBypass => self.code_bypass,
            Category::TimingPatch => self.timing_patch,
            Category::ThreadInjection => self.thread_injection,
            Category::LazyEval => self.lazy_eval,
            Category::StreamInjection => self.stream_injection,
            Category::PrecisionDowngrade => self.precision_downgrade,
            Category::PytorchWrap => self.pytorch_wrap,
            Category::TorchComputationOps => self.torch_computation_ops,
            Category::MissingKernel => self.missing_kernel,
            Category::Introspection => self.introspection,
        }
    }

    /// The effective level of `c` in `mode`.
    pub fn level(&self, c: Category, mode: EvalMode) -> Level {
        self.get(c).unwrap_or_else(|| c.default_level(mode))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_by_mode() {
        let c = ChecksSection::default();
        for cat in Category::ALL {
            assert_eq!(c.level(cat, EvalMode::Faithful), Level::Warn, "{cat}");
        }
        let errors: Vec<&str> = Category::ALL
            .iter()
            .filter(|c| c.default_level(EvalMode::Strict) == Level::Error)
            .map(|c| c.name())
            .collect();
        assert_eq!(
            errors,
            [
                "code_bypass",
                "timing_patch",
                "thread_injection",
                "lazy_eval",
                "stream_injection",
                "missing_kernel",
                "introspection"
            ]
        );
    }

    #[test]
    fn set_levels_override_the_mode() {
        let c: ChecksSection =
            toml::from_str("timing_patch = \"off\"\npytorch_wrap = \"error\"\n").unwrap();
        assert_eq!(c.level(Category::TimingPatch, EvalMode::Strict), Level::Off);
        assert_eq!(
            c.level(Category::PytorchWrap, EvalMode::Faithful),
            Level::Error
        );
        assert!(!c.is_default());
        assert!(ChecksSection::default().is_default());
    }

    #[test]
    fn names_match_the_config_keys() {
        let all: String = Category::ALL
            .iter()
            .map(|c| format!("{} = \"warn\"\n", c.name()))
            .collect();
        let c: ChecksSection = toml::from_str(&all).unwrap();
        for cat in Category::ALL {
            assert_eq!(c.get(cat), Some(Level::Warn), "{cat}");
        }
    }
}
