//! Rendering prompts: feedback modes, history policies, styles, backends, hardware block, override
//! folders and template errors, plus one byte-for-byte golden prompt.
//!
//! Regenerate the golden file after an intended template change with
//! `UPDATE_GOLDEN=1 cargo test --test prompt_render`, then review the diff.
#![allow(clippy::unwrap_used, reason = "test code: a panic is how a test fails")]

use std::path::{Path, PathBuf};

use krefine::config::{Backend, HistoryPolicy, PromptStyle};
use krefine::prompt::{PromptError, PromptSettings, Prompts};
use krefine::types::{
    ChatMessage, FeedbackMode, Precision, Problem, ProblemKey, PromptContext, Role, TurnFeedback,
};

const PROBLEM_CODE: &str = "\
import torch
import torch.nn as nn


class Model(nn.Module):
    \"\"\"Scales a tensor and clamps it to [0, 1].\"\"\"

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x * self.scale, 0.0, 1.0)


def get_inputs():
    return [torch.randn(1024, 4096)]


def get_init_inputs():
    return [0.5]
";

const CODE_1: &str = "\
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r\"\"\"
__global__ void scale_clamp_kernel(const float* x, float* y, float s, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fminf(fmaxf(x[i] * s, 0.f), 1.f);
}
torch::Tensor scale_clamp(torch::Tensor x, double s) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    scale_clamp_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), s, n);
    return y;
}
\"\"\"
ext = load_inline(name=\"scale_clamp\", cpp_sources=\"torch::Tensor scale_clamp(torch::Tensor x, double s);\",
                  cuda_sources=cuda_src, functions=[\"scale_clamp\"])


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return ext.scale_clamp(x.contiguous(), self.scale)
";

const EXECUTION_1: &str = "\
compiled: true, correctness: true (correctness_trials: (5 / 5))
runtime: 0.0412 ms (reference: 0.0520 ms), speedup: 1.26x";

const PROFILE_1: &str = "\
-------------------------  ------------  ------------  ------------
Name                       Self CUDA %   Self CUDA     # of Calls
-------------------------  ------------  ------------  ------------
scale_clamp(float const*,  100.00%       41.216us      5
-------------------------  ------------  ------------  ------------
Self CUDA time total: 41.216us";

fn problem() -> Problem {
    Problem {
        key: ProblemKey {
            level: 1,
            problem_id: 7,
        },
        name: "7_ScaleClamp.py".into(),
        code: PROBLEM_CODE.into(),
    }
}

fn turn(
    n: u32,
    code: Option<&str>,
    execution: Option<&str>,
    profile: Option<&str>,
) -> TurnFeedback {
    TurnFeedback {
        turn: n,
        answer: code.map(|c| format!("Answer {n}.\n\n```python\n{c}```\n")),
        code: code.map(str::to_string),
        execution: execution.map(str::to_string),
        profile: profile.map(str::to_string),
    }
}

/// A full-information history: every field set, so tests see what rendering does with each mode.
fn history(turns: u32) -> Vec<TurnFeedback> {
    (1..=turns)
        .map(|n| {
            let code = format!("{CODE_1}# turn {n}\n");
            let exec = format!("{EXECUTION_1}\n# exec {n}");
            let prof = format!("{PROFILE_1}\n# prof {n}");
            turn(n, Some(&code), Some(&exec), Some(&prof))
        })
        .collect()
}

fn ctx(turn: u32, feedback: FeedbackMode, history: Vec<TurnFeedback>) -> PromptContext {
    PromptContext {
        turn,
        feedback,
        history,
    }
}

fn settings() -> PromptSettings {
    PromptSettings::default()
}

fn render(c: &PromptContext, s: &PromptSettings) -> Vec<ChatMessage> {
    Prompts::builtin()
        .expect("built-ins load")
        .render(&problem(), c, s)
        .expect("render")
}

fn roles(m: &[ChatMessage]) -> Vec<Role> {
    m.iter().map(|m| m.role).collect()
}

fn all_text(m: &[ChatMessage]) -> String {
    m.iter()
        .map(|m| m.content.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

fn user_text(m: &[ChatMessage]) -> String {
    m.iter()
        .filter(|m| m.role == Role::User)
        .map(|m| m.content.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------------------------
// Feedback modes

#[test]
fn modes_show_exactly_the_previous_turns_texts() {
    let h = history(1);
    let code = h[0].code.clone().unwrap();
    let exec = h[0].execution.clone().unwrap();
    let prof = h[0].profile.clone().unwrap();

    // G: even though the context carries execution and profile text, only the code is shown.
    let g = user_text(&render(&ctx(2, FeedbackMode::G, h.clone()), &settings()));
    assert!(g.contains(&code), "{g}");
    assert!(!g.contains("# exec 1"), "{g}");
    assert!(!g.contains("correctness_trials"), "{g}");
    assert!(!g.contains("# prof 1"), "{g}");
    assert!(!g.contains("Self CUDA"), "{g}");

    let ge = user_text(&render(&ctx(2, FeedbackMode::GE, h.clone()), &settings()));
    assert!(ge.contains(&code), "{ge}");
    assert!(ge.contains(&exec), "{ge}");
    assert!(ge.contains("result of evaluating"), "{ge}");
    assert!(!ge.contains("# prof 1"), "{ge}");

    let gep = user_text(&render(&ctx(2, FeedbackMode::GEP, h.clone()), &settings()));
    assert!(gep.contains(&code), "{gep}");
    assert!(gep.contains(&exec), "{gep}");
    assert!(gep.contains(&prof), "{gep}");
    assert!(gep.contains("profiler output"), "{gep}");

    // Each longer mode's prompt adds to the shorter one's.
    assert!(g.len() < ge.len() && ge.len() < gep.len());
}

#[test]
fn rendering_shows_what_the_context_holds() {
    // The machine leaves out what a mode must not see; a G+E+P turn whose candidate failed has no
    // profile, and its prompt has no profiler block.
    let h = vec![turn(1, Some(CODE_1), Some(EXECUTION_1), None)];
    let text = user_text(&render(&ctx(2, FeedbackMode::GEP, h), &settings()));
    assert!(text.contains(EXECUTION_1));
    assert!(!text.contains("profiler output"), "{text}");
    // Empty texts count as absent (a failed profile leaves an empty table).
    let h = vec![turn(1, Some(CODE_1), Some(EXECUTION_1), Some("  \n"))];
    let text = user_text(&render(&ctx(2, FeedbackMode::GEP, h), &settings()));
    assert!(!text.contains("profiler output"), "{text}");
}

#[test]
fn a_turn_without_code_still_shows_its_feedback() {
    let exec = "No code block was found in the answer.";
    let mut t = turn(1, None, Some(exec), None);
    t.answer = Some("I think the kernel should use shared memory.".into());
    for history in [HistoryPolicy::Last, HistoryPolicy::Full] {
        let s = PromptSettings {
            history,
            ..settings()
        };
        let m = render(&ctx(2, FeedbackMode::GE, vec![t.clone()]), &s);
        let text = all_text(&m);
        assert!(text.contains(exec), "{history:?}: {text}");
        if history == HistoryPolicy::Last {
            assert!(text.contains("contained no code block"), "{text}");
        } else {
            assert_eq!(m[2].content, "I think the kernel should use shared memory.");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// History policies

#[test]
fn turn_one_is_the_initial_prompt() {
    for history in [HistoryPolicy::Last, HistoryPolicy::Full] {
        let s = PromptSettings {
            history,
            ..settings()
        };
        let m = render(&ctx(1, FeedbackMode::GEP, vec![]), &s);
        assert_eq!(roles(&m), vec![Role::System, Role::User]);
        assert!(m[1].content.contains(PROBLEM_CODE));
        assert!(!m[1].content.contains("improved ModelNew"));
    }
}

#[test]
fn last_policy_is_one_user_message_with_the_latest_turn() {
    let h = history(3);
    let m = render(&ctx(4, FeedbackMode::GEP, h.clone()), &settings());
    assert_eq!(roles(&m), vec![Role::System, Role::User]);
    let u = &m[1].content;
    let initial = render(&ctx(1, FeedbackMode::GEP, vec![]), &settings())[1]
        .content
        .clone();
    assert!(u.starts_with(&initial), "the initial prompt comes first");
    assert!(u.contains(h[2].code.as_deref().unwrap()));
    assert!(u.contains(h[2].execution.as_deref().unwrap()));
    assert!(u.contains(h[2].profile.as_deref().unwrap()));
    // Only the latest turn.
    for old in [
        "# turn 1", "# turn 2", "# exec 1", "# exec 2", "# prof 1", "# prof 2",
    ] {
        assert!(!u.contains(old), "{old} leaked into the `last` prompt");
    }
    assert!(
        u.trim_end().ends_with("single ```python code block."),
        "{u}"
    );
}

#[test]
fn full_policy_is_the_whole_conversation() {
    let h = history(3);
    let s = PromptSettings {
        history: HistoryPolicy::Full,
        ..settings()
    };
    let m = render(&ctx(4, FeedbackMode::GEP, h.clone()), &s);
    assert_eq!(
        roles(&m),
        vec![
            Role::System,
            Role::User,
            Role::Assistant,
            Role::User,
            Role::Assistant,
            Role::User,
            Role::Assistant,
            Role::User,
        ]
    );
    let initial = render(&ctx(1, FeedbackMode::GEP, vec![]), &s)[1]
        .content
        .clone();
    assert_eq!(m[1].content, initial);
    for (i, t) in h.iter().enumerate() {
        let assistant = &m[2 + 2 * i];
        let feedback = &m[3 + 2 * i];
        assert_eq!(
            &assistant.content,
            t.answer.as_ref().unwrap(),
            "answer verbatim"
        );
        assert!(feedback.content.contains(t.execution.as_deref().unwrap()));
        assert!(feedback.content.contains(t.profile.as_deref().unwrap()));
        // The code is already in the assistant message; the feedback does not repeat it.
        assert!(!feedback.content.contains(&format!("# turn {}", t.turn)));
        assert!(feedback.content.contains("improved ModelNew"));
    }
}

#[test]
fn full_policy_without_a_kept_answer_shows_the_code_in_a_fence() {
    let mut h = history(1);
    h[0].answer = None;
    let s = PromptSettings {
        history: HistoryPolicy::Full,
        ..settings()
    };
    let m = render(&ctx(2, FeedbackMode::G, h.clone()), &s);
    assert_eq!(
        roles(&m),
        vec![Role::System, Role::User, Role::Assistant, Role::User]
    );
    let code = h[0].code.as_deref().unwrap();
    assert_eq!(m[2].content, format!("```python\n{code}```"));
    // G under `full`: the feedback message is just the request to improve.
    assert!(
        m[3].content.starts_with("Now write an improved ModelNew."),
        "{}",
        m[3].content
    );
}

// ---------------------------------------------------------------------------------------------
// Styles, backends, precision

fn initial_prompt(s: &PromptSettings) -> String {
    let m = render(&ctx(1, FeedbackMode::GEP, vec![]), s);
    m.last().unwrap().content.clone()
}

#[test]
fn zero_one_and_few_shot_differ_in_their_examples() {
    let zero = initial_prompt(&PromptSettings {
        style: PromptStyle::ZeroShot,
        ..settings()
    });
    let one = initial_prompt(&PromptSettings {
        style: PromptStyle::OneShot,
        ..settings()
    });
    let few = initial_prompt(&PromptSettings {
        style: PromptStyle::FewShot,
        ..settings()
    });
    let add = include_str!("../prompts/examples/add_cuda.py");
    let gelu = include_str!("../prompts/examples/gelu_cuda.py");
    let softmax = include_str!("../prompts/examples/softmax_cuda.py");

    assert!(!zero.contains("worked example"), "{zero}");
    assert!(!zero.contains(add));
    assert!(zero.contains(PROBLEM_CODE));

    assert!(one.contains("Here is a worked example"));
    assert!(one.contains(include_str!("../prompts/examples/add_ref.py")));
    assert!(one.contains(add));
    assert!(!one.contains(gelu));

    assert!(few.contains("Here are 3 worked examples"));
    assert!(few.contains(add) && few.contains(gelu) && few.contains(softmax));
    assert!(few.contains(include_str!("../prompts/examples/softmax_ref.py")));

    // The examples come before the problem, as in KernelBench's prompt.
    let ex = few.find(softmax).unwrap();
    let pr = few.find(PROBLEM_CODE).unwrap();
    assert!(ex < pr);
}

#[test]
fn triton_backend() {
    for style in [PromptStyle::OneShot, PromptStyle::FewShot] {
        let text = all_text(&render(
            &ctx(1, FeedbackMode::GEP, vec![]),
            &PromptSettings {
                style,
                backend: Backend::Triton,
                ..settings()
            },
        ));
        assert!(text.contains(include_str!("../prompts/examples/add_triton.py")));
        assert!(text.contains("@triton.jit"));
        assert!(text.contains("custom Triton kernels"));
        // Few-shot falls back to the one Triton pair.
        assert!(text.contains("Here is a worked example"), "{style:?}");
        assert!(!text.contains("load_inline"), "{text}");
    }
}

/// CuTe, TileLang and ThunderKittens: their own worked example (few-shot falls back to it), their
/// kernel language in the system prompt, how to build the kernels, and no other backend's example.
#[test]
fn dsl_backends_have_their_example_and_instructions() {
    let cases = [
        (
            Backend::Cute,
            include_str!("../prompts/examples/add_cute.py"),
            "custom CuTe kernels",
            "@cute.kernel launched from a @cute.jit function",
            "custom CuTe kernels",
        ),
        (
            Backend::Tilelang,
            include_str!("../prompts/examples/add_tilelang.py"),
            "custom TileLang kernels",
            "a @T.prim_func with a T.Kernel block",
            "custom TileLang kernels",
        ),
        (
            Backend::Thunderkittens,
            include_str!("../prompts/examples/add_thunderkittens.py"),
            "custom ThunderKittens kernels",
            "THUNDERKITTENS_ROOT environment variable, -std=c++20 and -arch=sm_90a",
            "custom ThunderKittens kernels",
        ),
    ];
    let others = [
        include_str!("../prompts/examples/add_cuda.py"),
        include_str!("../prompts/examples/add_triton.py"),
        include_str!("../prompts/examples/add_cpp.py"),
    ];
    for (backend, example, statement, how, system) in cases {
        for style in [PromptStyle::OneShot, PromptStyle::FewShot] {
            let text = all_text(&render(
                &ctx(1, FeedbackMode::GEP, vec![]),
                &PromptSettings {
                    style,
                    backend,
                    ..settings()
                },
            ));
            assert!(text.contains(example), "{backend:?} {style:?}");
            assert!(text.contains(include_str!("../prompts/examples/add_ref.py")));
            assert!(
                text.contains("Here is a worked example"),
                "{backend:?} {style:?}"
            );
            assert!(text.contains(statement), "{text}");
            assert!(text.contains(how), "{text}");
            assert!(text.contains(system), "{text}");
            for other in others {
                assert!(
                    !text.contains(other),
                    "{backend:?}: another backend's example"
                );
            }
        }
    }
}

#[test]
fn cpu_backend() {
    let text = all_text(&render(
        &ctx(1, FeedbackMode::GEP, vec![]),
        &PromptSettings {
            backend: Backend::Cpu,
            ..settings()
        },
    ));
    assert!(text.contains(include_str!("../prompts/examples/add_cpp.py")));
    assert!(text.contains("passing only cpp_sources"));
    assert!(text.contains("for the CPU"));
    assert!(
        !text.contains("cuda_sources="),
        "no CUDA example in a CPU prompt"
    );
    assert!(!text.contains("__global__"));
}

#[test]
fn precision_note_follows_the_setting() {
    let fp32 = initial_prompt(&settings());
    assert!(fp32.contains("float32 (torch.float32)") && fp32.contains("1e-4"));
    let fp16 = initial_prompt(&PromptSettings {
        precision: Precision::Fp16,
        ..settings()
    });
    assert!(fp16.contains("torch.float16") && fp16.contains("1e-2"));
    let bf16 = initial_prompt(&PromptSettings {
        precision: Precision::Bf16,
        ..settings()
    });
    assert!(bf16.contains("bf16 (torch.bfloat16)") && bf16.contains("1e-2"));
}

// ---------------------------------------------------------------------------------------------
// Hardware block

#[test]
fn hardware_block_for_h100_has_its_numbers() {
    let text = initial_prompt(&PromptSettings {
        hardware: Some("NVIDIA H100 80GB HBM3".into()),
        ..settings()
    });
    for want in [
        "NVIDIA H100 SXM",
        "\"NVIDIA H100 80GB HBM3\"",
        "compute capability 9.0",
        "80 GB HBM3",
        "3350 GB/s",
        "| Streaming multiprocessors (SMs) | 132 |",
        "67 TFLOP/s",
        "495 TFLOP/s",
        "989 TFLOP/s",
        "50 MB",
        "228 KB",
        "227 KB",
        "65536",
        "2048",
        "Coalescing",
        "Good practice",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    // The block sits between the examples and the reference architecture.
    let hw = text.find("Target hardware").unwrap();
    assert!(text.find("Here is a worked example").unwrap() < hw);
    assert!(hw < text.find(PROBLEM_CODE).unwrap());
}

#[test]
fn unknown_gpu_gets_a_generic_block_without_numbers() {
    let text = initial_prompt(&PromptSettings {
        hardware: Some("Imaginary Accelerator 9000".into()),
        ..settings()
    });
    assert!(text.contains("\"Imaginary Accelerator 9000\""));
    assert!(text.contains("not in our table"));
    assert!(text.contains("Good practice"));
    for absent in ["TFLOP/s", "GB/s", "| Property |", "compute capability"] {
        assert!(!text.contains(absent), "{absent:?} in:\n{text}");
    }
}

#[test]
fn no_hardware_block_when_off() {
    let text = initial_prompt(&settings());
    assert!(!text.contains("Target hardware"));
    assert!(!text.contains("Good practice"));
}

// ---------------------------------------------------------------------------------------------
// Determinism

#[test]
fn rendering_is_deterministic() {
    let s = PromptSettings {
        style: PromptStyle::FewShot,
        history: HistoryPolicy::Full,
        hardware: Some("NVIDIA A100-SXM4-80GB".into()),
        ..settings()
    };
    let c = ctx(3, FeedbackMode::GEP, history(2));
    let a = render(&c, &s);
    let b = render(&c, &s);
    let p = Prompts::builtin().unwrap();
    let c1 = p.render(&problem(), &c, &s).unwrap();
    let c2 = p.render(&problem(), &c, &s).unwrap();
    assert_eq!(a, b);
    assert_eq!(a, c1);
    assert_eq!(c1, c2);
}

// ---------------------------------------------------------------------------------------------
// Override folder and template errors

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn override_folder_replaces_files_of_the_same_name() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "system.j2",
        "You are a {{ backend.language }} wizard.\n",
    );
    write(dir.path(), "examples/add_cuda.py", "# my own example\n");
    write(dir.path(), "README.md", "notes about my templates\n");
    let p = Prompts::load(Some(dir.path())).unwrap();
    let m = p
        .render(&problem(), &ctx(1, FeedbackMode::G, vec![]), &settings())
        .unwrap();
    assert_eq!(m[0].content, "You are a CUDA wizard.");
    assert!(m[1].content.contains("```python\n# my own example\n```"));
    // Files not overridden stay built-in.
    assert!(
        m[1].content
            .contains(include_str!("../prompts/examples/add_ref.py"))
    );
    assert!(p.origins()["system.j2"].ends_with("system.j2"));
    assert!(p.origins()["feedback.j2"].contains("built-in"));
}

#[test]
fn empty_system_template_sends_no_system_message() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "system.j2", "");
    let p = Prompts::load(Some(dir.path())).unwrap();
    let m = p
        .render(
            &problem(),
            &ctx(2, FeedbackMode::GE, history(1)),
            &settings(),
        )
        .unwrap();
    assert_eq!(roles(&m), vec![Role::User]);
}

#[test]
fn syntax_error_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "feedback.j2",
        "Line one.\n{% if show_code %}\nLine three {{ entry.code | fence( }}\n{% endif %}\n",
    );
    let err = Prompts::load(Some(dir.path())).unwrap_err();
    let text = err.to_string();
    match &err {
        PromptError::Template { file, .. } => {
            assert_eq!(file, &format!("{}:3", path.display()), "{text}")
        }
        other => panic!("expected a template error, got {other:?}"),
    }
    assert!(text.contains("syntax error"), "{text}");
}

#[test]
fn render_error_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    // Included from feedback.j2: the error must still name improve.j2.
    let path = write(
        dir.path(),
        "improve.j2",
        "Improve it.\nUse {{ no_such_variable }} here.\n",
    );
    let p = Prompts::load(Some(dir.path())).expect("it parses");
    // Turn 1 does not use improve.j2 ...
    p.render(&problem(), &ctx(1, FeedbackMode::G, vec![]), &settings())
        .unwrap();
    // ... turn 2 does.
    let err = p
        .render(
            &problem(),
            &ctx(2, FeedbackMode::G, history(1)),
            &settings(),
        )
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(&format!("{}:2", path.display())),
        "error should name {}:2, got: {text}",
        path.display()
    );
    assert!(text.contains("undefined"), "{text}");
    // check() finds it before any run.
    let err = p.check(&settings()).unwrap_err().to_string();
    assert!(err.contains(&format!("{}:2", path.display())), "{err}");
}

#[test]
fn unknown_override_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "feedbak.j2", "typo\n");
    let err = Prompts::load(Some(dir.path())).unwrap_err().to_string();
    assert!(err.contains("feedbak.j2"), "{err}");
    assert!(err.contains("feedback.j2"), "lists the known names: {err}");

    let missing = dir.path().join("nope");
    let err = Prompts::load(Some(&missing)).unwrap_err().to_string();
    assert!(err.contains("not a folder"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Golden

/// Messages as reviewable text: a header line per message, then its content.
fn transcript(m: &[ChatMessage]) -> String {
    let mut out = String::new();
    for msg in m {
        let role = match msg.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        out.push_str(&format!("===== {role} =====\n{}\n", msg.content));
    }
    out
}

#[test]
fn golden_turn2_gep_prompt() {
    let h = vec![TurnFeedback {
        turn: 1,
        answer: Some(format!(
            "Here is a fused kernel.\n\n```python\n{CODE_1}```\n"
        )),
        code: Some(CODE_1.to_string()),
        execution: Some(EXECUTION_1.to_string()),
        profile: Some(PROFILE_1.to_string()),
    }];
    let s = PromptSettings {
        style: PromptStyle::OneShot,
        backend: Backend::Cuda,
        history: HistoryPolicy::Last,
        precision: Precision::Fp32,
        hardware: Some("NVIDIA H100 80GB HBM3".into()),
    };
    let got = transcript(&render(&ctx(2, FeedbackMode::GEP, h), &s));
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/prompts/turn2_gep_last.txt");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; create it with UPDATE_GOLDEN=1 cargo test --test prompt_render",
            path.display()
        )
    });
    if got != want {
        let line = got
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .map(|i| i + 1)
            .unwrap_or(got.lines().count().min(want.lines().count()) + 1);
        panic!(
            "rendered prompt differs from {} (first difference at line {line}); if the change is \
             intended, run UPDATE_GOLDEN=1 cargo test --test prompt_render and review the diff",
            path.display()
        );
    }
}
