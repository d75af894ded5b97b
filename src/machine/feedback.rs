//! What a finished turn feeds back to the next prompt, in words: the execution result, the compiler's
//! complaint, the findings of the checks, the profile; filtered by the feedback mode.

use crate::checks;
use crate::types::{CompileStatus, FeedbackMode, TurnFeedback, TurnRecord};

/// The words a prompt gets when an answer had no usable code.
pub const NO_CODE_FEEDBACK: &str = "Your answer contained no code block with a `ModelNew` class, so nothing could be compiled or evaluated. Reply with the complete new architecture in a single ```python block.";

/// What the next prompt may see of a finished turn under `mode` (also what displays show as the
/// feedback sent back to the model).
pub fn turn_feedback(mode: FeedbackMode, r: &TurnRecord) -> TurnFeedback {
    let execution = mode
        .includes_execution()
        .then(|| execution_text(r))
        .flatten();
    let profile = if mode.includes_profile() {
        r.profile
            .as_ref()
            .filter(|p| p.ok && !p.table.is_empty())
            .map(|p| p.table.clone())
    } else {
        None
    };
    TurnFeedback {
        turn: r.turn,
        answer: r.answer.as_ref().map(|a| a.content.clone()),
        code: r.code.clone(),
        execution,
        profile,
    }
}

/// Findings listed per kind (static, runtime) in one turn's feedback; the rest are counted.
const FINDINGS_IN_FEEDBACK: usize = 10;

/// The execution feedback (E) of a turn in plain words: the result, then the static-check findings
/// on its source and the runtime findings of its evaluation.
pub fn execution_text(r: &TurnRecord) -> Option<String> {
    if let Some(err) = &r.llm_error {
        return Some(format!(
            "The request to the model failed ({err}); no candidate was produced in this turn."
        ));
    }
    if r.answer.is_some() && r.code.is_none() {
        return Some(NO_CODE_FEEDBACK.to_string());
    }
    let static_findings = r.compile.as_ref().map_or(&[][..], |c| &c.findings[..]);
    let runtime_findings = r.exec.as_ref().map_or(&[][..], |e| &e.findings[..]);
    let parts: Vec<String> = [
        result_text(r),
        checks::findings_text("static", static_findings, FINDINGS_IN_FEEDBACK),
        checks::findings_text("runtime", runtime_findings, FINDINGS_IN_FEEDBACK),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| parts.join("\n"))
}

/// What the evaluation (or the build, when it ended the turn) said about a turn's candidate.
fn result_text(r: &TurnRecord) -> Option<String> {
    if let Some(e) = &r.exec {
        return Some(e.feedback.clone());
    }
    let c = r.compile.as_ref()?;
    let head = match c.status {
        CompileStatus::Ok => return None,
        CompileStatus::Error => match &c.error_name {
            Some(name) => format!("Compilation failed ({name})."),
            None => "Compilation failed.".to_string(),
        },
        CompileStatus::Timeout => "Compilation did not finish within the time limit.".to_string(),
        CompileStatus::Crashed => "The compiler process crashed.".to_string(),
        CompileStatus::Rejected => {
            "The candidate was rejected before compiling: static checks found code that the evaluation does not allow.".to_string()
        }
    };
    Some(if c.feedback.trim().is_empty() {
        head
    } else {
        format!("{head}\n{}", c.feedback.trim_end())
    })
}
