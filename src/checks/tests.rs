//! Exact findings on KernelBench's adversarial kernels (rewritten from the protocol notes), on the
//! hacks of issue 10, on KernelBench's known false positives, and on clean model-written kernels.

use super::*;
use crate::llm::extract::extract_code;
use crate::types::{EvalMode, Precision, Severity};

/// (category, line, severity) of each finding, in the checker's order.
pub(super) type Found = Vec<(&'static str, Option<u32>, Severity)>;

pub(super) fn run(code: &str, mode: EvalMode, backend: Backend, precision: Precision) -> Found {
    let checks = StaticChecks::new(&ChecksSection::default(), mode, backend, precision);
    checks
        .check(code)
        .into_iter()
        .map(|f| {
            let name = Category::ALL
                .iter()
                .map(|c| c.name())
                .find(|n| *n == f.category)
                .expect("a known category");
            (name, f.line, f.severity)
        })
        .collect()
}

pub(super) fn faithful(code: &str) -> Found {
    run(code, EvalMode::Faithful, Backend::Cuda, Precision::Fp32)
}

pub(super) fn strict(code: &str) -> Found {
    run(code, EvalMode::Strict, Backend::Cuda, Precision::Fp32)
}

pub(super) const W: Severity = Severity::Warning;
pub(super) const E: Severity = Severity::Error;

/// A clean CUDA candidate; hacks are appended after its last line.
pub(super) const CLEAN: &str = r#"import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void relu_kernel(const float* x, float* y, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

torch::Tensor relu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(name="relu_ext", cpp_sources="torch::Tensor relu(torch::Tensor x);",
                  cuda_sources=source, functions=["relu"], verbose=False)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu(x)
"#;

/// `CLEAN` with `hack` appended, and the line number of the hack's first line.
pub(super) fn with_hack(hack: &str) -> (String, u32) {
    let base = CLEAN.lines().count() as u32;
    (format!("{CLEAN}{hack}"), base + 1)
}

#[test]
fn the_clean_candidate_has_no_findings_in_either_mode() {
    assert_eq!(faithful(CLEAN), vec![]);
    assert_eq!(strict(CLEAN), vec![]);
}

#[test]
fn kernelbench_adversarial_kernels() {
    // Both call ATen only: KernelBench flags them only for the missing `__global__` kernel.
    for code in [
        include_str!("../../tests/fixtures/static/kb_result_reuse.py"),
        include_str!("../../tests/fixtures/static/kb_zero_out.py"),
    ] {
        assert_eq!(faithful(code), vec![("missing_kernel", None, W)]);
        assert_eq!(strict(code), vec![("missing_kernel", None, E)]);
    }
    // The side-stream kernel: KernelBench misses `cudaStreamCreateWithFlags`; here it is found.
    let code = include_str!("../../tests/fixtures/static/kb_non_default_stream.py");
    assert_eq!(
        faithful(code),
        vec![
            ("missing_kernel", None, W),
            ("stream_injection", Some(15), W)
        ]
    );
    assert_eq!(
        strict(code),
        vec![
            ("missing_kernel", None, E),
            ("stream_injection", Some(15), E)
        ]
    );
}

#[test]
fn timer_patches() {
    let (code, l) = with_hack(
        "_orig = torch.cuda.Event.elapsed_time\n\
         torch.cuda.Event.elapsed_time = lambda self, end: 0.001 * _orig(self, end)\n\
         import time\n\
         time.perf_counter = lambda: 0.0\n\
         setattr(torch.cuda, \"synchronize\", lambda *a: None)\n\
         torch.allclose = lambda *a, **k: True\n\
         from unittest import mock\n\
         ok = torch.cuda.Event.elapsed_time == _orig\n",
    );
    assert_eq!(
        strict(&code),
        vec![
            ("timing_patch", Some(l + 1), E),
            ("timing_patch", Some(l + 3), E),
            ("timing_patch", Some(l + 4), E),
            ("timing_patch", Some(l + 5), E),
            ("timing_patch", Some(l + 6), E),
        ]
    );
    let messages: Vec<String> = StaticChecks::new(
        &ChecksSection::default(),
        EvalMode::Strict,
        Backend::Cuda,
        Precision::Fp32,
    )
    .check(&code)
    .into_iter()
    .map(|f| f.message)
    .collect();
    assert!(
        messages[0].starts_with("assigns `torch.cuda.Event.elapsed_time`"),
        "{messages:?}"
    );
    assert!(
        messages[2].starts_with("setattr sets `torch.cuda.synchronize`"),
        "{messages:?}"
    );
}

#[test]
fn side_streams_in_python_and_cuda() {
    let (code, l) = with_hack(
        "_side = torch.cuda.Stream()\n\
         def fast(x):\n    with torch.cuda.stream(_side):\n        return ext.relu(x)\n\
         cuda_src = r\"\"\"\n\
         void go() { cudaStream_t s; cudaStreamCreateWithPriority(&s, 0, -1); }\n\
         \"\"\"\n",
    );
    assert_eq!(
        strict(&code),
        vec![
            ("stream_injection", Some(l), E),
            ("stream_injection", Some(l + 2), E),
            ("stream_injection", Some(l + 5), E),
        ]
    );
}

#[test]
fn background_threads_in_python_and_cpp() {
    let (code, l) = with_hack(
        "import threading\n\
         def fill_later(x, out):\n    threading.Thread(target=lambda: out.copy_(ext.relu(x))).start()\n\
         from concurrent.futures import ThreadPoolExecutor\n\
         cpp = r\"\"\"\nvoid go() { std::thread t([] {}); t.detach(); }\n\"\"\"\n",
    );
    assert_eq!(
        strict(&code),
        vec![
            ("thread_injection", Some(l), E),
            ("thread_injection", Some(l + 2), E),
            ("thread_injection", Some(l + 3), E),
            ("thread_injection", Some(l + 5), E),
        ]
    );
}

#[test]
fn precision_downgrades_only_for_fp32() {
    let (code, l) = with_hack(
        "torch.backends.cuda.matmul.allow_tf32 = True\n\
         torch.backends.cudnn.allow_tf32 = True\n\
         torch.set_float32_matmul_precision(\"high\")\n\
         torch.set_float32_matmul_precision(\"highest\")\n\
         def bf16(x):\n    return ext.relu(x.to(torch.bfloat16)).float()\n\
         h = r\"\"\"\n__global__ void k(__nv_bfloat16* y, const float* x) { y[0] = __float2bfloat16(x[0]); }\n\"\"\"\n\
         torch.backends.cudnn.benchmark = True\n",
    );
    assert_eq!(
        strict(&code),
        vec![
            ("precision_downgrade", Some(l), W),
            ("precision_downgrade", Some(l + 1), W),
            ("precision_downgrade", Some(l + 2), W),
            ("precision_downgrade", Some(l + 5), W),
            ("precision_downgrade", Some(l + 7), W),
        ]
    );
    assert_eq!(
        run(&code, EvalMode::Strict, Backend::Cuda, Precision::Fp16),
        vec![]
    );
}

#[test]
fn frame_and_gc_introspection() {
    let (code, l) = with_hack(
        "import sys\n\
         def steal():\n    return sys._getframe(2).f_locals[\"output\"]\n\
         import gc\n\
         leaked = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]\n\
         import inspect\n\
         import ctypes\n",
    );
    assert_eq!(
        strict(&code),
        vec![
            ("introspection", Some(l + 2), E),
            ("introspection", Some(l + 4), E),
            ("introspection", Some(l + 5), E),
            ("introspection", Some(l + 6), E),
        ]
    );
}

#[test]
fn lazy_tensor_subclasses() {
    let (code, l) = with_hack(
        "class LazyOut(\n    torch.Tensor):\n    @staticmethod\n    def __new__(cls, x):\n        return torch.Tensor._make_subclass(cls, x)\n\
         class Plain(nn.Module):\n    def __torch_function__(self):\n        return 1\n",
    );
    assert_eq!(
        strict(&code),
        vec![
            ("lazy_eval", Some(l), E),
            ("lazy_eval", Some(l + 4), E),
            ("lazy_eval", Some(l + 6), E),
        ]
    );
}

#[test]
fn fallbacks_and_pytorch_doing_the_work() {
    let (code, l) = with_hack(
        "import torch.nn.functional as F\n\
         def safe(x):\n    try:\n        return ext.relu(x)\n    except RuntimeError:\n        return torch.relu(x)\n\
         def lazy(x):\n    pass\n\
         lin = nn.Linear(4, 4)\n\
         y = F.gelu(torch.matmul(lin.weight, lin.weight))\n",
    );
    assert_eq!(
        faithful(&code),
        vec![
            ("code_bypass", Some(l + 2), W),
            ("torch_computation_ops", Some(l + 5), W),
            ("code_bypass", Some(l + 7), W),
            ("pytorch_wrap", Some(l + 8), W),
            ("torch_computation_ops", Some(l + 9), W),
        ]
    );
    let s = strict(&code);
    assert_eq!(s[0], ("code_bypass", Some(l + 2), E));
    assert_eq!(s[3], ("pytorch_wrap", Some(l + 8), W));
}

#[test]
fn kernelbench_false_positives_are_fixed() {
    // "pass"/"except"/"try" in docstrings, comments and strings, `#` inside a string, `//` as
    // floor division, and C++ comments naming streams, threads and half conversions.
    let code = include_str!("../../tests/fixtures/static/false_positives.py");
    assert_eq!(strict(code), vec![]);
}

#[test]
fn hacks_that_kernelbench_comment_stripping_hides_are_found() {
    let code = include_str!("../../tests/fixtures/static/hidden_by_kernelbench.py");
    assert_eq!(
        faithful(code),
        vec![
            ("stream_injection", Some(19), W),
            ("timing_patch", Some(27), W),
            ("thread_injection", Some(28), W),
        ]
    );
}

#[test]
fn missing_kernel_per_backend() {
    let cpp = include_str!("../../prompts/examples/add_cpp.py");
    assert_eq!(
        run(cpp, EvalMode::Strict, Backend::Cpu, Precision::Fp32),
        vec![]
    );
    assert_eq!(
        run(cpp, EvalMode::Strict, Backend::Cuda, Precision::Fp32),
        vec![("missing_kernel", None, E)]
    );
    let triton = include_str!("../../prompts/examples/add_triton.py");
    assert_eq!(
        run(triton, EvalMode::Strict, Backend::Triton, Precision::Fp32),
        vec![]
    );
    // Each DSL example passes its own rule and no other's (their kernels are not in each other's
    // language), in the precision its runs take.
    let examples = [
        (
            Backend::Cute,
            include_str!("../../prompts/examples/add_cute.py"),
            Precision::Fp32,
        ),
        (
            Backend::Tilelang,
            include_str!("../../prompts/examples/add_tilelang.py"),
            Precision::Fp16,
        ),
        (
            Backend::Thunderkittens,
            include_str!("../../prompts/examples/add_thunderkittens.py"),
            Precision::Bf16,
        ),
        (Backend::Triton, triton, Precision::Fp32),
    ];
    for (backend, code, precision) in examples {
        assert_eq!(
            run(code, EvalMode::Strict, backend, precision),
            vec![],
            "{backend:?}"
        );
        for (other, _, _) in examples.iter().filter(|(b, _, _)| *b != backend) {
            assert_eq!(
                run(code, EvalMode::Strict, *other, precision),
                vec![("missing_kernel", None, E)],
                "{backend:?} example checked as {other:?}"
            );
        }
    }
    // CuTe written as CUTLASS C++ through load_inline counts; the namespace alone in Python does not.
    let cute_cpp = "from torch.utils.cpp_extension import load_inline\nsrc = '''\n#include <cute/tensor.hpp>\n__global__ void k(float* x) { auto t = cute::make_tensor(x, cute::make_shape(4)); }\n'''\nm = load_inline(name='x', cpp_sources='', cuda_sources=src, functions=[])\n";
    assert_eq!(
        run(cute_cpp, EvalMode::Faithful, Backend::Cute, Precision::Fp32),
        vec![]
    );
    let cute_import = "import cutlass\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n";
    assert_eq!(
        run(
            cute_import,
            EvalMode::Strict,
            Backend::Cute,
            Precision::Fp32
        ),
        vec![("missing_kernel", None, E)]
    );
    // A ThunderKittens build whose kernel has tiles but no tile operation does no work.
    let tk_idle =
        include_str!("../../prompts/examples/add_thunderkittens.py").replace("warp::", "noop_");
    assert_eq!(
        run(
            &tk_idle,
            EvalMode::Strict,
            Backend::Thunderkittens,
            Precision::Bf16
        ),
        vec![("missing_kernel", None, E)]
    );
    let bare = "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n";
    assert_eq!(
        run(bare, EvalMode::Strict, Backend::Cpu, Precision::Fp32),
        vec![("missing_kernel", None, E)]
    );
    // A declaration alone is not a function.
    let decl = "from torch.utils.cpp_extension import load_inline\nm = load_inline(name='x', cpp_sources='int f(int x);', functions=['f'])\n";
    assert_eq!(
        run(decl, EvalMode::Strict, Backend::Cpu, Precision::Fp32),
        vec![("missing_kernel", None, E)]
    );
}

#[test]
fn levels_turn_categories_off_or_into_errors() {
    let (code, _) = with_hack("torch.allclose = lambda *a, **k: True\nlin = nn.Linear(4, 4)\n");
    let section: ChecksSection =
        toml::from_str("timing_patch = \"off\"\npytorch_wrap = \"error\"\n").unwrap();
    let checks = StaticChecks::new(&section, EvalMode::Strict, Backend::Cuda, Precision::Fp32);
    let found: Vec<(String, Severity)> = checks
        .check(&code)
        .into_iter()
        .map(|f| (f.category, f.severity))
        .collect();
    assert_eq!(found, vec![("pytorch_wrap".to_string(), E)]);
}

#[test]
fn findings_per_category_are_capped() {
    let (code, _) = with_hack(&"def f():\n    pass\n".repeat(30));
    let found = faithful(&code);
    assert_eq!(found.len(), MAX_PER_CATEGORY);
}

#[test]
fn clean_model_written_kernels_have_no_errors_in_strict_mode() {
    let mut checked = 0;
    // The quickstart's scripted answers (CUDA with a C++ fallback), on both backends.
    for line in include_str!("../../configs/quickstart/answers.jsonl").lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let Some(code) = extract_code(v["content"].as_str().unwrap()) else {
            continue;
        };
        for backend in [Backend::Cuda, Backend::Cpu] {
            assert_eq!(
                run(&code, EvalMode::Strict, backend, Precision::Fp32),
                vec![],
                "{line}"
            );
        }
        checked += 1;
    }
    // Eleven of the twelve answers carry code; one only explains that it keeps its version.
    assert_eq!(checked, 11);
    // The GPU benchmark candidates and the prompt's CUDA examples: warnings at most.
    for (name, code) in [
        (
            "l1_19_relu_float4",
            include_str!("../../bench/gpu/candidates/l1_19_relu_float4.py"),
        ),
        (
            "l1_25_swish",
            include_str!("../../bench/gpu/candidates/l1_25_swish.py"),
        ),
        (
            "l2_12_gemm_scale_leaky",
            include_str!("../../bench/gpu/candidates/l2_12_gemm_scale_leaky.py"),
        ),
        (
            "l2_1_conv_relu_bias",
            include_str!("../../bench/gpu/candidates/l2_1_conv_relu_bias.py"),
        ),
        (
            "add_cuda",
            include_str!("../../prompts/examples/add_cuda.py"),
        ),
        (
            "gelu_cuda",
            include_str!("../../prompts/examples/gelu_cuda.py"),
        ),
        (
            "softmax_cuda",
            include_str!("../../prompts/examples/softmax_cuda.py"),
        ),
    ] {
        let found = strict(code);
        assert!(found.iter().all(|f| f.2 == W), "{name}: {found:?}");
    }
}

#[test]
fn feedback_lists_errors_then_warnings() {
    let (code, l) = with_hack("torch.cuda.synchronize = lambda: None\nlin = nn.Linear(4, 4)\n");
    let checks = StaticChecks::new(
        &ChecksSection::default(),
        EvalMode::Strict,
        Backend::Cuda,
        Precision::Fp32,
    );
    let text = findings_text("static", &checks.check(&code), 10).unwrap();
    assert_eq!(
        text,
        format!(
            "Static check errors (the candidate fails them):\n\
             - static check: timing_patch at line {l}: assigns `torch.cuda.synchronize`: replacing a timer, `synchronize` or a CUDA event fakes the measured time\n\
             Static check warnings (recorded; they do not change the verdict):\n\
             - static check: pytorch_wrap at line {}: uses `nn.Linear`: a PyTorch layer, not a custom kernel, may be doing the work",
            l + 1
        )
    );
    assert_eq!(findings_text("static", &[], 10), None);
}
