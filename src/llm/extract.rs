//! Extracting the candidate code from an LLM answer.

/// The candidate code in an answer, or `None` when it has no usable code block.
pub fn extract_code(answer: &str) -> Option<String> {
    let start = answer.find("```")?;
    let rest = &answer[start + 3..];
    let nl = rest.find('\n')?;
    let body = &rest[nl + 1..];
    let end = body.find("```")?;
    Some(body[..end].to_string())
}
