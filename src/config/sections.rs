//! The shape of an experiment's configuration: [`Config`], which gathers every room's section, and
//! the sections no lower room owns besides `[dataset]` and `[report]` (their own submodules):
//! `[run]`, `[method]` and `[output]`, with their serde defaults.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::dataset::DatasetSection;
use super::report::ReportSection;
use crate::launcher::config::ResourcesSection;
use crate::llm::config::{BudgetSection, ModelSection};
use crate::prompt::config::PromptSection;
use crate::settings::HistoryPolicy;
use crate::types::{FeedbackMode, MethodKind};
use crate::worker::config::EvalSection;

/// An experiment's config file, one field per `[section]`. Every key of every section is described
/// in the README's "Configuration reference"; the comments on the sections' fields add what the
/// code relies on.
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
    pub report: ReportSection,
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
