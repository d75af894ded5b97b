//! The built-in prompt files compiled into the binary: the templates under `prompts/`, the worked
//! examples' code, and which example pairs a style and backend show.

use super::config::PromptStyle;
use crate::settings::Backend;

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
pub(super) const EXAMPLES: &[(&str, &str)] = &[
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
pub(super) struct ExamplePair {
    pub(super) title: &'static str,
    pub(super) reference: &'static str,
    pub(super) solution: &'static str,
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
pub(super) fn example_pairs(style: PromptStyle, backend: Backend) -> &'static [ExamplePair] {
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
