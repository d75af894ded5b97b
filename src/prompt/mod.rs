//! Prompt templates (minijinja) and rendering a turn's conversation.
//!
//! The text of every prompt lives in template files under `prompts/`, compiled into the binary as the
//! built-ins; `prompt.templates` may name a folder whose files of the same relative name replace them.
//! This module decides only the *structure*: which templates are rendered, with which variables, and
//! how the results become chat messages (roles, order, history policy). `docs/prompts.md` lists the
//! templates and the variables each one sees.
//!
//! Structure (after the KernelBench prompt, in our own words):
//! - `system.j2`: role text, sent as a system message (omitted when it renders empty);
//! - the initial user prompt, `initial.j2`, which joins the sections `problem_statement.j2`,
//!   `examples.j2` (one-/few-shot worked examples), `hardware.j2` (when a GPU name is set),
//!   `architecture.j2` (the reference code), `precision.j2` and `instruction.j2`;
//! - for refinement turns, `feedback.j2` per earlier turn (previous code, execution result, profile,
//!   then `improve.j2`), and `assistant.j2` for an earlier turn whose raw answer is missing.
//!
//! Its config section (`[prompt]`) is [`config`].
//!
//! Rooms, from the bottom (each imports only from those before it): [`config`] and [`gpu_specs`];
//! `builtin` (the files compiled into the binary, and which worked examples a style and backend
//! show); `values` (what templates see of a turn, the backend, the precision, a GPU); `templates`
//! ([`Prompts`] loaded from the built-ins and an override folder, one template rendered, errors that
//! name the file and line); and this file: [`PromptSettings`] and the conversation's structure
//! ([`Prompts::render`], [`Prompts::check`]).

pub mod config;
pub mod gpu_specs;

mod builtin;
mod templates;
mod values;

use minijinja::context;
use minijinja::value::Value;

use crate::settings::{Backend, HistoryPolicy};
use crate::types::{
    ChatMessage, FeedbackMode, Precision, Problem, ProblemKey, PromptContext, Role, TurnFeedback,
};
use builtin::{EXAMPLES, example_pairs};
use config::{PromptSection, PromptStyle};
use values::{backend_value, entry_value, non_empty, precision_value, spec_value, style_name};

pub use builtin::builtin_files;
pub use templates::{PromptError, Prompts};

/// How prompts of a run are rendered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptSettings {
    pub style: PromptStyle,
    pub backend: Backend,
    pub history: HistoryPolicy,
    pub precision: Precision,
    /// GPU name for the hardware-info block (as torch or nvidia-smi print it), when enabled.
    pub hardware: Option<String>,
}

impl PromptSettings {
    /// Settings from the config. `gpu_name` is the name of the device the run evaluates on, `None`
    /// on the CPU device. The backend defaults to `cuda` on a GPU and `cpu` on the CPU; the
    /// hardware block is shown only when `prompt.hardware_info` is on and the backend targets a
    /// GPU (the block describes GPUs).
    pub fn from_config(
        prompt: &PromptSection,
        history: HistoryPolicy,
        precision: Precision,
        gpu_name: Option<&str>,
    ) -> Self {
        let backend = prompt.backend.unwrap_or(match gpu_name {
            Some(_) => Backend::Cuda,
            None => Backend::Cpu,
        });
        let hardware = match (prompt.hardware_info, backend) {
            (true, b) if b.needs_gpu() => gpu_name.map(str::to_string),
            _ => None,
        };
        PromptSettings {
            style: prompt.style,
            backend,
            history,
            precision,
            hardware,
        }
    }
}

impl Prompts {
    /// Render the conversation for a turn.
    ///
    /// Messages: an optional system message (`system.j2`), then the initial user prompt. With an
    /// empty history (turn 1) that is all. With history and policy `last` (the paper's), the user
    /// message is the initial prompt followed by the latest earlier turn's feedback; with `full`,
    /// the initial user prompt is followed, for each earlier turn, by an assistant message (the
    /// turn's answer) and a user message with its feedback.
    ///
    /// The context holds what the feedback mode allows (the task machine filters); as a second
    /// guard, execution text is shown only in G+E and G+E+P and profile text only in G+E+P, so a
    /// machine bug cannot leak E or P into a G experiment. Empty texts count as absent.
    pub fn render(
        &self,
        problem: &Problem,
        ctx: &PromptContext,
        settings: &PromptSettings,
    ) -> Result<Vec<ChatMessage>, PromptError> {
        let base = self.base_context(problem, ctx, settings);
        let mut messages = Vec::new();

        let system = self.render_template("system.j2", base.clone())?;
        if !system.trim().is_empty() {
            messages.push(ChatMessage {
                role: Role::System,
                content: system,
            });
        }

        let initial = self.render_initial(&base, settings)?;
        match (settings.history, ctx.history.last()) {
            (_, None) => messages.push(user(initial)),
            (HistoryPolicy::Last, Some(latest)) => {
                let feedback = self.render_feedback(&base, latest, ctx.feedback, true)?;
                messages.push(user(join_sections(&[initial, feedback])));
            }
            (HistoryPolicy::Full, Some(_)) => {
                messages.push(user(initial));
                for entry in &ctx.history {
                    messages.push(ChatMessage {
                        role: Role::Assistant,
                        content: self.render_assistant(&base, entry)?,
                    });
                    let feedback = self.render_feedback(&base, entry, ctx.feedback, false)?;
                    messages.push(user(feedback));
                }
            }
        }
        Ok(messages)
    }

    /// Render a sample conversation (turn 1 and turn 3 with two earlier turns carrying code,
    /// execution and profile text, under both history policies) to surface render errors of
    /// override templates before a run starts rather than at its first refinement turn.
    pub fn check(&self, settings: &PromptSettings) -> Result<(), PromptError> {
        let problem = Problem {
            key: ProblemKey {
                level: 1,
                problem_id: 1,
            },
            name: "1_Check.py".into(),
            code: EXAMPLES
                .first()
                .map(|(_, text)| text.to_string())
                .unwrap_or_default(),
        };
        let turn = |n: u32| TurnFeedback {
            turn: n,
            answer: Some(format!("answer {n}")),
            code: Some(format!("# code {n}\n")),
            execution: Some(format!("execution {n}")),
            profile: Some(format!("profile {n}")),
        };
        for history in [HistoryPolicy::Last, HistoryPolicy::Full] {
            let settings = PromptSettings {
                history,
                ..settings.clone()
            };
            for (n, hist) in [(1, vec![]), (3, vec![turn(1), turn(2)])] {
                let ctx = PromptContext {
                    turn: n,
                    feedback: FeedbackMode::GEP,
                    history: hist,
                };
                self.render(&problem, &ctx, &settings)?;
            }
        }
        Ok(())
    }

    fn base_context(
        &self,
        problem: &Problem,
        ctx: &PromptContext,
        settings: &PromptSettings,
    ) -> Value {
        let examples: Vec<Value> = example_pairs(settings.style, settings.backend)
            .iter()
            .map(|pair| {
                context! {
                    title => pair.title,
                    reference => self.example_text(pair.reference),
                    solution => self.example_text(pair.solution),
                }
            })
            .collect();
        let hardware = settings.hardware.as_deref().map(|name| {
            context! {
                device_name => name,
                spec => gpu_specs::lookup(name).map(spec_value),
            }
        });
        context! {
            backend => backend_value(settings.backend),
            style => style_name(settings.style),
            precision => precision_value(settings.precision),
            problem => context! {
                name => problem.name.clone(),
                level => problem.key.level,
                problem_id => problem.key.problem_id,
                code => problem.code.clone(),
            },
            examples => examples,
            hardware => hardware,
            turn => ctx.turn,
            mode => ctx.feedback.to_string(),
            history => match settings.history {
                HistoryPolicy::Last => "last",
                HistoryPolicy::Full => "full",
            },
        }
    }

    fn render_initial(
        &self,
        base: &Value,
        settings: &PromptSettings,
    ) -> Result<String, PromptError> {
        let section = |name: &str| self.render_template(name, base.clone());
        let hardware = match settings.hardware {
            Some(_) => section("hardware.j2")?,
            None => String::new(),
        };
        let sections = context! {
            problem_statement => section("problem_statement.j2")?,
            examples => section("examples.j2")?,
            hardware => hardware,
            architecture => section("architecture.j2")?,
            precision => section("precision.j2")?,
            instruction => section("instruction.j2")?,
        };
        self.render_template(
            "initial.j2",
            context! { sections => sections, ..base.clone() },
        )
    }

    fn render_feedback(
        &self,
        base: &Value,
        entry: &TurnFeedback,
        mode: FeedbackMode,
        show_code: bool,
    ) -> Result<String, PromptError> {
        let ctx = context! {
            entry => entry_value(entry, mode),
            show_code => show_code,
            ..base.clone()
        };
        self.render_template("feedback.j2", ctx)
    }

    /// The assistant message for an earlier turn: its answer exactly as received; only when the
    /// answer is missing does `assistant.j2` stand in (the code in a fence, or a note).
    fn render_assistant(&self, base: &Value, entry: &TurnFeedback) -> Result<String, PromptError> {
        if let Some(answer) = non_empty(&entry.answer) {
            return Ok(answer.to_string());
        }
        let ctx = context! {
            entry => entry_value(entry, FeedbackMode::G),
            ..base.clone()
        };
        self.render_template("assistant.j2", ctx)
    }
}

fn user(content: String) -> ChatMessage {
    ChatMessage {
        role: Role::User,
        content,
    }
}

/// Sections joined by one blank line, empty ones dropped.
fn join_sections(parts: &[String]) -> String {
    parts
        .iter()
        .map(|s| s.trim_end_matches('\n'))
        .filter(|s| !s.trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_can_be_shared_across_tasks() {
        // The engine renders from many task drivers at once.
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Prompts>();
    }

    #[test]
    fn settings_from_config() {
        let mut section = PromptSection {
            hardware_info: true,
            ..Default::default()
        };
        let s = PromptSettings::from_config(
            &section,
            HistoryPolicy::Full,
            Precision::Bf16,
            Some("NVIDIA H100 80GB HBM3"),
        );
        assert_eq!(s.backend, Backend::Cuda);
        assert_eq!(s.hardware.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(s.history, HistoryPolicy::Full);
        let s = PromptSettings::from_config(&section, HistoryPolicy::Last, Precision::Fp32, None);
        assert_eq!(s.backend, Backend::Cpu);
        assert_eq!(s.hardware, None);
        section.hardware_info = false;
        section.backend = Some(Backend::Triton);
        let s =
            PromptSettings::from_config(&section, HistoryPolicy::Last, Precision::Fp32, Some("x"));
        assert_eq!(s.backend, Backend::Triton);
        assert_eq!(s.hardware, None);
    }
}
