//! Static checks on a candidate's source, run before it is compiled: the room owns the source
//! preprocessing ([`source`]), the rules ([`rules`]), the parsed layer that reads the syntax tree
//! with constant folding ([`parsed`], [`fold`]), their configuration ([`config`], the
//! `[eval.checks]` table) and the compile-service wrapper that applies them ([`service`]).
//!
//! The categories are at parity with KernelBench's `kernel_static_checker.py` and fix its known
//! false positives (comments cut at any `#` or `//`, "pass" in docstrings). Each finding has a
//! category, a severity from the category's level, a message and a 1-based line. A warning is
//! recorded in `CompileOutcome.findings` and shown in feedback and reports; an error rejects the
//! candidate before compiling (verdict `rejected`). The task machine stays pure: it only maps the
//! `rejected` compile status to its verdict.
//!
//! The regex rules run in both modes. The parsed layer runs in both modes too, but only strict mode
//! lets its findings be errors: in faithful mode they are warnings at most, so KernelBench's rules
//! (and only they) keep deciding verdicts there.

pub mod config;
pub mod fold;
pub mod parsed;
pub mod rules;
pub mod service;
pub mod source;

use std::collections::BTreeMap;

use crate::settings::Backend;
use crate::types::{EvalMode, Finding, Precision, Severity};

pub use config::{Category, ChecksSection, Level};
pub use rules::RuleContext;
pub use service::CheckedCompiler;
pub use source::Source;

/// At most this many findings of one category are kept per candidate (the first ones by line), so
/// a long file full of `pass` statements cannot flood the log or the prompt.
pub const MAX_PER_CATEGORY: usize = 20;

/// The checks of one run: a level per category and what the rules need to know.
#[derive(Debug, Clone)]
pub struct StaticChecks {
    /// Each category's level (`eval.checks`): off, a warning, or an error that rejects.
    levels: BTreeMap<Category, Level>,
    /// The backend and precision the prompt asked for, which some rules check against.
    ctx: RuleContext,
    /// In faithful mode a finding of the parsed layer is a warning at most, so that KernelBench's
    /// rules alone decide verdicts there.
    mode: EvalMode,
}

impl StaticChecks {
    pub fn new(
        section: &ChecksSection,
        mode: EvalMode,
        backend: Backend,
        precision: Precision,
    ) -> Self {
        StaticChecks {
            levels: Category::ALL
                .iter()
                .map(|&c| (c, section.level(c, mode)))
                .collect(),
            ctx: RuleContext { backend, precision },
            mode,
        }
    }

    pub fn level(&self, c: Category) -> Level {
        self.levels.get(&c).copied().unwrap_or(Level::Off)
    }

    /// The findings on `code`, ordered by line (file-level findings first), at most
    /// [`MAX_PER_CATEGORY`] per category and one per (category, line).
    pub fn check(&self, code: &str) -> Vec<Finding> {
        let src = Source::parse(code);
        // (category, line, message, from the parsed layer)
        let mut found: Vec<(Category, Option<u32>, String, bool)> = rules::check(&src, &self.ctx)
            .into_iter()
            .map(|h| (h, false))
            .chain(parsed::check(code).into_iter().map(|h| (h, true)))
            .map(|(h, parsed)| (h.category, h.offset.map(|o| src.line(o)), h.message, parsed))
            .collect();
        // Stable: on a line where a regex rule and the parsed layer agree, the regex finding stays.
        found.sort_by_key(|f| (f.1, f.0));
        found.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
        let mut per_category: BTreeMap<Category, usize> = BTreeMap::new();
        let mut out = Vec::new();
        for (category, line, message, parsed) in found {
            let severity = match (self.level(category), parsed, self.mode) {
                (Level::Off, _, _) => continue,
                (Level::Warn, _, _) | (Level::Error, true, EvalMode::Faithful) => Severity::Warning,
                (Level::Error, _, _) => Severity::Error,
            };
            let n = per_category.entry(category).or_insert(0);
            *n += 1;
            if *n > MAX_PER_CATEGORY {
                continue;
            }
            out.push(Finding {
                category: category.name().to_string(),
                severity,
                message,
                line,
            });
        }
        out
    }
}

/// True when any finding is an error.
pub fn has_error(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.severity == Severity::Error)
}

/// One finding as the feedback shows it: `static check: timing_patch at line 12: ...`.
pub fn finding_line(kind: &str, f: &Finding) -> String {
    match f.line {
        Some(line) => format!("{kind} check: {} at line {line}: {}", f.category, f.message),
        None => format!("{kind} check: {}: {}", f.category, f.message),
    }
}

/// The feedback paragraph for a candidate's findings (`kind` is `static` or `runtime`): errors
/// first, then warnings; `None` when there are none. At most `limit` lines are listed.
pub fn findings_text(kind: &str, findings: &[Finding], limit: usize) -> Option<String> {
    if findings.is_empty() {
        return None;
    }
    let mut out = Vec::new();
    for (severity, head) in [
        (
            Severity::Error,
            format!("{kind} check errors (the candidate fails them):"),
        ),
        (
            Severity::Warning,
            format!("{kind} check warnings (recorded; they do not change the verdict):"),
        ),
    ] {
        let of: Vec<&Finding> = findings.iter().filter(|f| f.severity == severity).collect();
        if of.is_empty() {
            continue;
        }
        out.push(capitalize(&head));
        for f in of.iter().take(limit) {
            out.push(format!("- {}", finding_line(kind, f)));
        }
        if of.len() > limit {
            out.push(format!("- ... and {} more", of.len() - limit));
        }
    }
    Some(out.join("\n"))
}

fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(first) => first.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests;
