//! LLM providers behind the [`crate::services::Llm`] trait: scripted (tests, quickstart),
//! OpenAI-compatible, and replay of a recorded run; plus code extraction.

pub mod extract;
pub mod scripted;
