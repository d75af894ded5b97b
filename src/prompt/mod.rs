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

pub mod config;
pub mod gpu_specs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Value;
use minijinja::{AutoEscape, Environment, UndefinedBehavior, context};

use crate::settings::{Backend, HistoryPolicy};
use crate::types::{
    ChatMessage, FeedbackMode, Precision, Problem, ProblemKey, PromptContext, Role, TurnFeedback,
};
use config::{PromptSection, PromptStyle};

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

/// Templates, by file name relative to `prompts/`.
const TEMPLATES: &[(&str, &str)] = &[
    ("system.j2", include_str!("../../prompts/system.j2")),
    ("initial.j2", include_str!("../../prompts/initial.j2")),
    (
        "problem_statement.j2",
        include_str!("../../prompts/problem_statement.j2"),
    ),
    ("examples.j2", include_str!("../../prompts/examples.j2")),
    ("hardware.j2", include_str!("../../prompts/hardware.j2")),
    (
        "architecture.j2",
        include_str!("../../prompts/architecture.j2"),
    ),
    ("precision.j2", include_str!("../../prompts/precision.j2")),
    (
        "instruction.j2",
        include_str!("../../prompts/instruction.j2"),
    ),
    ("feedback.j2", include_str!("../../prompts/feedback.j2")),
    ("improve.j2", include_str!("../../prompts/improve.j2")),
    ("assistant.j2", include_str!("../../prompts/assistant.j2")),
];

/// Example code, inserted verbatim (never rendered as a template: CUDA braces would clash with
/// template syntax, and examples must reach the model byte for byte).
const EXAMPLES: &[(&str, &str)] = &[
    (
        "examples/add_ref.py",
        include_str!("../../prompts/examples/add_ref.py"),
    ),
    (
        "examples/add_cuda.py",
        include_str!("../../prompts/examples/add_cuda.py"),
    ),
    (
        "examples/add_triton.py",
        include_str!("../../prompts/examples/add_triton.py"),
    ),
    (
        "examples/add_cute.py",
        include_str!("../../prompts/examples/add_cute.py"),
    ),
    (
        "examples/add_tilelang.py",
        include_str!("../../prompts/examples/add_tilelang.py"),
    ),
    (
        "examples/add_thunderkittens.py",
        include_str!("../../prompts/examples/add_thunderkittens.py"),
    ),
    (
        "examples/add_cpp.py",
        include_str!("../../prompts/examples/add_cpp.py"),
    ),
    (
        "examples/gelu_ref.py",
        include_str!("../../prompts/examples/gelu_ref.py"),
    ),
    (
        "examples/gelu_cuda.py",
        include_str!("../../prompts/examples/gelu_cuda.py"),
    ),
    (
        "examples/softmax_ref.py",
        include_str!("../../prompts/examples/softmax_ref.py"),
    ),
    (
        "examples/softmax_cuda.py",
        include_str!("../../prompts/examples/softmax_cuda.py"),
    ),
];

/// Every built-in file (templates and examples) with its text, e.g. for exporting them as a
/// starting point for an override folder.
pub fn builtin_files() -> impl Iterator<Item = (&'static str, &'static str)> {
    TEMPLATES.iter().chain(EXAMPLES.iter()).copied()
}

/// One worked example: a reference file and its faster rewrite.
struct ExamplePair {
    title: &'static str,
    reference: &'static str,
    solution: &'static str,
}

const ADD_CUDA: ExamplePair = ExamplePair {
    title: "element-wise addition",
    reference: "examples/add_ref.py",
    solution: "examples/add_cuda.py",
};
const GELU_CUDA: ExamplePair = ExamplePair {
    title: "bias add fused with GELU",
    reference: "examples/gelu_ref.py",
    solution: "examples/gelu_cuda.py",
};
const SOFTMAX_CUDA: ExamplePair = ExamplePair {
    title: "row-wise softmax",
    reference: "examples/softmax_ref.py",
    solution: "examples/softmax_cuda.py",
};
const ADD_TRITON: ExamplePair = ExamplePair {
    title: "element-wise addition",
    reference: "examples/add_ref.py",
    solution: "examples/add_triton.py",
};
const ADD_CUTE: ExamplePair = ExamplePair {
    title: "element-wise addition",
    reference: "examples/add_ref.py",
    solution: "examples/add_cute.py",
};
const ADD_TILELANG: ExamplePair = ExamplePair {
    title: "element-wise addition",
    reference: "examples/add_ref.py",
    solution: "examples/add_tilelang.py",
};
const ADD_THUNDERKITTENS: ExamplePair = ExamplePair {
    title: "element-wise addition",
    reference: "examples/add_ref.py",
    solution: "examples/add_thunderkittens.py",
};
const ADD_CPP: ExamplePair = ExamplePair {
    title: "element-wise addition",
    reference: "examples/add_ref.py",
    solution: "examples/add_cpp.py",
};

/// The worked examples for a style and backend. Few-shot has three CUDA pairs; every other backend
/// has one pair, so few-shot falls back to one-shot there (as KernelBench does for backends without
/// few-shot pairs).
fn example_pairs(style: PromptStyle, backend: Backend) -> &'static [ExamplePair] {
    match (style, backend) {
        (PromptStyle::ZeroShot, _) => &[],
        (PromptStyle::OneShot, Backend::Cuda) => &[ADD_CUDA],
        (PromptStyle::FewShot, Backend::Cuda) => &[ADD_CUDA, GELU_CUDA, SOFTMAX_CUDA],
        (_, Backend::Triton) => &[ADD_TRITON],
        (_, Backend::Cute) => &[ADD_CUTE],
        (_, Backend::Tilelang) => &[ADD_TILELANG],
        (_, Backend::Thunderkittens) => &[ADD_THUNDERKITTENS],
        (_, Backend::Cpu) => &[ADD_CPP],
    }
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

    fn example_text(&self, name: &str) -> String {
        // Every name in `example_pairs` is in `EXAMPLES`, and load() keeps all of them.
        self.examples.get(name).cloned().unwrap_or_default()
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

    fn render_template(&self, name: &str, ctx: Value) -> Result<String, PromptError> {
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

fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|t| !t.trim().is_empty())
}

/// What a template sees of an earlier turn, limited to what the feedback mode allows.
fn entry_value(entry: &TurnFeedback, mode: FeedbackMode) -> Value {
    let execution = non_empty(&entry.execution).filter(|_| mode.includes_execution());
    let profile = non_empty(&entry.profile).filter(|_| mode.includes_profile());
    context! {
        turn => entry.turn,
        code => non_empty(&entry.code),
        answer => non_empty(&entry.answer),
        execution => execution,
        profile => profile,
    }
}

fn backend_value(backend: Backend) -> Value {
    let (name, language, device) = match backend {
        Backend::Cuda => ("cuda", "CUDA", "GPU"),
        Backend::Triton => ("triton", "Triton", "GPU"),
        Backend::Cute => ("cute", "CuTe", "GPU"),
        Backend::Tilelang => ("tilelang", "TileLang", "GPU"),
        Backend::Thunderkittens => ("thunderkittens", "ThunderKittens", "GPU"),
        Backend::Cpu => ("cpu", "C++", "CPU"),
    };
    context! { name => name, language => language, device => device }
}

fn style_name(style: PromptStyle) -> &'static str {
    match style {
        PromptStyle::ZeroShot => "zero_shot",
        PromptStyle::OneShot => "one_shot",
        PromptStyle::FewShot => "few_shot",
    }
}

fn precision_value(precision: Precision) -> Value {
    // Tolerances are KernelBench's allclose atol = rtol per precision.
    let (dtype, tolerance) = match precision {
        Precision::Fp32 => ("torch.float32", "1e-4"),
        Precision::Fp16 => ("torch.float16", "1e-2"),
        Precision::Bf16 => ("torch.bfloat16", "1e-2"),
    };
    context! { name => precision.as_str(), dtype => dtype, tolerance => tolerance }
}

/// A spec as display strings, so number formatting is decided here once (minijinja would print
/// `67.0` for a float) and templates only lay them out.
fn spec_value(s: &gpu_specs::GpuSpec) -> Value {
    let tflops = |v: f64| format!("{v} TFLOP/s");
    let opt_tflops = |v: Option<f64>| match v {
        Some(v) => tflops(v),
        None => "not supported".to_string(),
    };
    context! {
        model => s.model,
        architecture => s.architecture,
        compute_capability => s.compute_capability,
        memory => format!("{} GB {}", s.memory_gb, s.memory_type),
        memory_bandwidth => format!("{} GB/s", s.memory_bandwidth_gbs),
        sm_count => s.sm_count.to_string(),
        fp32 => tflops(s.fp32_tflops),
        tf32 => opt_tflops(s.tf32_tflops),
        fp16 => tflops(s.fp16_tflops),
        bf16 => opt_tflops(s.bf16_tflops),
        l2 => format!("{} MB", s.l2_mb),
        shared_mem_per_sm => format!("{} KB", s.shared_mem_per_sm_kb),
        shared_mem_per_block => format!("{} KB", s.shared_mem_per_block_kb),
        registers_per_sm => s.registers_per_sm.to_string(),
        max_registers_per_thread => gpu_specs::MAX_REGISTERS_PER_THREAD.to_string(),
        max_threads_per_sm => s.max_threads_per_sm.to_string(),
        max_threads_per_block => gpu_specs::MAX_THREADS_PER_BLOCK.to_string(),
        warp_size => gpu_specs::WARP_SIZE.to_string(),
        note => s.note,
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

    #[test]
    fn prompts_can_be_shared_across_tasks() {
        // The engine renders from many task drivers at once.
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Prompts>();
    }

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

    #[test]
    fn entry_value_obeys_the_mode() {
        let entry = TurnFeedback {
            turn: 1,
            answer: Some("a".into()),
            code: Some("c".into()),
            execution: Some("e".into()),
            profile: Some("p".into()),
        };
        let g = entry_value(&entry, FeedbackMode::G);
        assert!(g.get_attr("execution").unwrap().is_none());
        assert!(g.get_attr("profile").unwrap().is_none());
        let ge = entry_value(&entry, FeedbackMode::GE);
        assert_eq!(ge.get_attr("execution").unwrap().as_str(), Some("e"));
        assert!(ge.get_attr("profile").unwrap().is_none());
        let gep = entry_value(&entry, FeedbackMode::GEP);
        assert_eq!(gep.get_attr("profile").unwrap().as_str(), Some("p"));
    }
}
