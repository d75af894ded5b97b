//! Prompt templates (minijinja) and rendering a turn's conversation.

use std::path::Path;

use crate::config::{Backend, HistoryPolicy, PromptStyle};
use crate::types::{ChatMessage, Precision, Problem, PromptContext, Role};

#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    #[error("template {file}: {message}")]
    Template { file: String, message: String },
}

/// How prompts of a run are rendered.
#[derive(Debug, Clone)]
pub struct PromptSettings {
    pub style: PromptStyle,
    pub backend: Backend,
    pub history: HistoryPolicy,
    pub precision: Precision,
    /// GPU name for the hardware-info block, when enabled.
    pub hardware: Option<String>,
}

pub struct Prompts {}

impl Prompts {
    /// Built-in templates, overridden by files of the same name in `dir`.
    pub fn load(dir: Option<&Path>) -> Result<Self, PromptError> {
        let _ = dir;
        Ok(Prompts {})
    }

    pub fn render(
        &self,
        problem: &Problem,
        ctx: &PromptContext,
        settings: &PromptSettings,
    ) -> Result<Vec<ChatMessage>, PromptError> {
        let _ = settings;
        let mut text = format!("Write ModelNew for:\n{}\n", problem.code);
        if let Some(last) = ctx.history.last() {
            text.push_str(&format!("{:?}", last));
        }
        Ok(vec![ChatMessage {
            role: Role::User,
            content: text,
        }])
    }
}
