//! Loading the prompt files: the built-ins, overridden by a folder's files of the same name (files
//! that replace nothing are refused), compiled into a minijinja environment with the `fence`
//! filter; rendering one template; and minijinja's errors as [`PromptError`]s that name the file and
//! line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Value;
use minijinja::{AutoEscape, Environment, UndefinedBehavior};

use super::builtin::builtin_files;

#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// A template failed to parse or to render. `file` is `path:line` where the line is known; the
    /// path is the override file's, or `prompts/<name> (built-in)`.
    #[error("template {file}: {message}")]
    Template { file: String, message: String },
    #[error("cannot read prompt file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The override folder is missing or holds a file that replaces no built-in (a typo would
    /// otherwise be silently ignored).
    #[error("prompt templates folder {path}: {message}")]
    Folder { path: PathBuf, message: String },
}

/// The loaded templates and examples; cheap to share, rendering takes `&self`.
pub struct Prompts {
    env: Environment<'static>,
    /// Example texts by file name.
    examples: BTreeMap<&'static str, String>,
    /// Where each file came from, for error messages: the override path or the built-in name.
    origins: BTreeMap<&'static str, String>,
}

impl std::fmt::Debug for Prompts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prompts")
            .field("origins", &self.origins)
            .finish_non_exhaustive()
    }
}

impl Prompts {
    /// Built-in templates, overridden by files of the same name in `dir`.
    ///
    /// Every template is compiled here, so a syntax error surfaces at load time; use
    /// [`Prompts::check`] to also catch render errors (e.g. an unknown variable) before a run.
    pub fn load(dir: Option<&Path>) -> Result<Self, PromptError> {
        let mut texts: BTreeMap<&'static str, String> = BTreeMap::new();
        let mut origins: BTreeMap<&'static str, String> = BTreeMap::new();
        for (name, text) in builtin_files() {
            texts.insert(name, text.to_string());
            origins.insert(name, format!("prompts/{name} (built-in)"));
        }
        if let Some(dir) = dir {
            if !dir.is_dir() {
                return Err(PromptError::Folder {
                    path: dir.to_path_buf(),
                    message: "not a folder".into(),
                });
            }
            reject_unknown_files(dir)?;
            for (name, _) in builtin_files() {
                let path = dir.join(name);
                if path.is_file() {
                    let text =
                        std::fs::read_to_string(&path).map_err(|source| PromptError::Read {
                            path: path.clone(),
                            source,
                        })?;
                    texts.insert(name, text);
                    origins.insert(name, path.display().to_string());
                }
            }
        }

        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            // Block tags on their own lines leave no blank lines behind, so templates can be laid
            // out readably without changing the prompt text.
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| PromptError::Template {
                file: "(syntax configuration)".into(),
                message: e.to_string(),
            })?;
        env.set_syntax(syntax);
        // A misspelt variable in an override must be an error, not an empty string in the prompt.
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        // Prompts are plain text: never HTML-escape (code is full of `<` and `&`).
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.add_filter("fence", fence);

        let mut examples = BTreeMap::new();
        for (name, text) in texts {
            if name.ends_with(".j2") {
                if let Err(e) = env.add_template_owned(name, text) {
                    return Err(template_error(&origins, &e));
                }
            } else {
                examples.insert(name, text);
            }
        }
        Ok(Prompts {
            env,
            examples,
            origins,
        })
    }

    /// The built-in templates only.
    pub fn builtin() -> Result<Self, PromptError> {
        Self::load(None)
    }

    /// Where each file in use came from (override path or built-in), by file name.
    pub fn origins(&self) -> &BTreeMap<&'static str, String> {
        &self.origins
    }

    pub(super) fn example_text(&self, name: &str) -> String {
        // Every name in `example_pairs` is in `EXAMPLES`, and load() keeps all of them.
        self.examples.get(name).cloned().unwrap_or_default()
    }

    pub(super) fn render_template(&self, name: &str, ctx: Value) -> Result<String, PromptError> {
        let template = self
            .env
            .get_template(name)
            .map_err(|e| template_error(&self.origins, &e))?;
        // A template file's own final newline is not part of the text it contributes; dropping
        // trailing newlines lets templates end with a block tag or an expression alike.
        template
            .render(ctx)
            .map(|text| text.trim_end_matches('\n').to_string())
            .map_err(|e| template_error(&self.origins, &e))
    }
}

/// The `fence` filter: `text` in a Markdown code fence, tagged with `lang` when given. The text is
/// kept byte for byte; a newline is added before the closing fence only when the text lacks one.
/// The fence is one backtick longer than the longest backtick run in the text, so code that itself
/// contains a fence (a docstring, a compiler log quoting one) cannot close it early.
fn fence(text: String, lang: Option<String>) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in text.chars() {
        if c == '`' {
            run += 1;
            longest = longest.max(run);
        } else {
            run = 0;
        }
    }
    let ticks = "`".repeat((longest + 1).max(3));
    let lang = lang.unwrap_or_default();
    let newline = if text.ends_with('\n') { "" } else { "\n" };
    format!("{ticks}{lang}\n{text}{newline}{ticks}")
}

/// A minijinja error as ours: the file (override path or built-in) and line, and the message. An
/// error inside an included template arrives wrapped in the including template's error; the
/// innermost one is where the fault is, so it names the file, and the includes are listed after.
fn template_error(origins: &BTreeMap<&'static str, String>, e: &minijinja::Error) -> PromptError {
    let locate = |err: &minijinja::Error| {
        let file = match err.name() {
            Some(name) => origins
                .get(name)
                .cloned()
                .unwrap_or_else(|| name.to_string()),
            None => "(unknown template)".to_string(),
        };
        match err.line() {
            Some(line) => format!("{file}:{line}"),
            None => file,
        }
    };
    let mut chain = vec![e];
    let mut source = std::error::Error::source(e);
    while let Some(inner) = source {
        match inner.downcast_ref::<minijinja::Error>() {
            Some(inner) => chain.push(inner),
            None => break,
        }
        source = inner.source();
    }
    let innermost = chain[chain.len() - 1];
    let mut message = match innermost.detail() {
        Some(detail) => format!("{}: {detail}", innermost.kind()),
        None => innermost.kind().to_string(),
    };
    for outer in chain.iter().rev().skip(1) {
        message.push_str(&format!(" (included from {})", locate(outer)));
    }
    PromptError::Template {
        file: locate(innermost),
        message,
    }
}

/// Fail on files in the override folder that replace no built-in: a misspelt name would otherwise
/// leave the built-in in use without a word. Only `.j2` and `.py` files are considered, so a README
/// or editor files can live there; hidden entries are skipped.
fn reject_unknown_files(dir: &Path) -> Result<(), PromptError> {
    let known: BTreeSet<&str> = builtin_files().map(|(name, _)| name).collect();
    let mut stack = vec![(dir.to_path_buf(), String::new(), 0usize)];
    while let Some((path, prefix, depth)) = stack.pop() {
        let entries = std::fs::read_dir(&path).map_err(|source| PromptError::Read {
            path: path.clone(),
            source,
        })?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| PromptError::Read {
                path: path.clone(),
                source,
            })?;
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        for name in names {
            if name.starts_with('.') {
                continue;
            }
            let full = path.join(&name);
            let rel = format!("{prefix}{name}");
            // Built-ins are at most one folder deep; the bound also stops symlink loops.
            if full.is_dir() {
                if depth < 2 {
                    stack.push((full, format!("{rel}/"), depth + 1));
                }
                continue;
            }
            let candidate = name.ends_with(".j2") || name.ends_with(".py");
            if candidate && !known.contains(rel.as_str()) {
                return Err(PromptError::Folder {
                    path: dir.to_path_buf(),
                    message: format!(
                        "`{rel}` does not replace any built-in file; known files: {}",
                        known.iter().copied().collect::<Vec<_>>().join(", ")
                    ),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::PromptSettings;
    use crate::prompt::builtin::example_pairs;
    use crate::prompt::config::PromptStyle;
    use crate::settings::Backend;

    #[test]
    fn fence_keeps_text_and_closes_on_its_own_line() {
        assert_eq!(
            fence("x = 1\n".into(), Some("python".into())),
            "```python\nx = 1\n```"
        );
        assert_eq!(fence("x = 1".into(), None), "```\nx = 1\n```");
        assert_eq!(fence("a ``` b".into(), None), "````\na ``` b\n````");
    }

    #[test]
    fn every_builtin_compiles_and_examples_exist() {
        let p = Prompts::builtin().unwrap();
        for style in [
            PromptStyle::ZeroShot,
            PromptStyle::OneShot,
            PromptStyle::FewShot,
        ] {
            for backend in [
                Backend::Cuda,
                Backend::Triton,
                Backend::Cute,
                Backend::Tilelang,
                Backend::Thunderkittens,
                Backend::Cpu,
            ] {
                for pair in example_pairs(style, backend) {
                    assert!(
                        p.examples.contains_key(pair.reference),
                        "{}",
                        pair.reference
                    );
                    assert!(p.examples.contains_key(pair.solution), "{}", pair.solution);
                }
            }
        }
        p.check(&PromptSettings::default()).unwrap();
        p.check(&PromptSettings {
            style: PromptStyle::FewShot,
            hardware: Some("NVIDIA H100 80GB HBM3".into()),
            ..Default::default()
        })
        .unwrap();
    }
}
