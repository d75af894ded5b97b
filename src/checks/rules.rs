//! The rules: what each category looks for, in which view of the source ([`Source::python`] for
//! Python code, [`Source::cpp`] for the C++/CUDA inside string literals).
//!
//! The categories follow KernelBench's `kernel_static_checker.py` (protocol notes §4.3), written anew
//! and widened where KernelBench is blind: CUDA-side streams (`cudaStreamCreate*`), C++ threads,
//! bf16 and TF32 downgrades, `setattr`/`unittest.mock` patches, and frame/gc introspection. Each
//! message says what was found and why it undermines the measurement, because it goes back to the
//! model as feedback.

use std::sync::LazyLock;

use regex::Regex;

use crate::settings::Backend;
use crate::types::Precision;

use super::config::Category;
use super::source::Source;

/// One rule match before levels are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub category: Category,
    /// Byte offset of the match; `None` for findings about the whole file (a missing kernel).
    pub offset: Option<usize>,
    pub message: String,
}

/// What the rules need to know about the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleContext {
    pub backend: Backend,
    pub precision: Precision,
}

// The patterns are constants: a failure to compile one is a bug caught by every test run.
fn re(p: &str) -> Regex {
    Regex::new(p).expect("a static-check pattern is a valid regex")
}

macro_rules! pattern {
    ($name:ident, $p:expr) => {
        static $name: LazyLock<Regex> = LazyLock::new(|| re($p));
    };
}

pattern!(TRY, r"\btry\s*:");
pattern!(PASS, r"\bpass\b");
pattern!(CPP_CATCH, r"\bcatch\s*\(");
pattern!(
    ASSIGN,
    r"(?:^|[^\w.])((?:[A-Za-z_]\w*\s*\.\s*)+[A-Za-z_]\w*)\s*(?:\+|-|\*|/|\|)?="
);
pattern!(
    SETATTR,
    r"\bsetattr\s*\(\s*((?:[A-Za-z_]\w*\s*\.\s*)*[A-Za-z_]\w*)\s*,"
);
pattern!(
    MOCK,
    r"\bunittest\s*\.\s*mock\b|\bfrom\s+unittest\s+import\s+mock\b|\bmock\s*\.\s*patch\b|\bmonkeypatch\b"
);
pattern!(
    PY_THREAD,
    r"\b(threading|_thread|multiprocessing|concurrent\s*\.\s*futures|ThreadPoolExecutor|ProcessPoolExecutor)\b|\bos\s*\.\s*fork\s*\("
);
pattern!(
    CPP_THREAD,
    r"\bstd\s*::\s*(thread|jthread|async)\b|\bpthread_create\b|\bat\s*::\s*launch\s*\("
);
pattern!(
    LAZY,
    r"\b(_make_subclass|_make_wrapper_subclass|__torch_function__|__torch_dispatch__)\b|\bTensor\s*\.\s*__new__\b"
);
pattern!(CLASS, r"\bclass\s+([A-Za-z_]\w*)\s*\(([^)]*)\)");
pattern!(TENSOR_WORD, r"\bTensor\b");
pattern!(
    PY_STREAM,
    r"\b(?:External)?Stream\s*\(|\bcuda\s*\.\s*stream\s*\(|\.\s*wait_stream\s*\(|\.\s*record_stream\s*\(|\bset_stream\s*\(|\bStreamContext\b"
);
pattern!(
    CPP_STREAM,
    r"\b(cudaStreamCreate\w*|cuStreamCreate\w*|hipStreamCreate\w*|getStreamFromPool|getStreamFromExternal|cudaStreamPerThread)\b"
);
pattern!(
    PY_LOW_PRECISION,
    r"\.\s*(?:half|bfloat16)\s*\(\s*\)|\btorch\s*\.\s*(?:float16|half|bfloat16|float8_\w+)\b|\bautocast\b|\btl\s*\.\s*(?:float16|bfloat16|float8\w*)\b"
);
pattern!(MATMUL_PRECISION, r"\bset_float32_matmul_precision\s*\(");
pattern!(
    CPP_LOW_PRECISION,
    r"\b(?:__float2half|__float2bfloat16)(?:_rn|_rz|_rd|_ru)?\s*\(|\b(?:__floats2half2_rn|__float22half2_rn|__floats2bfloat162_rn|__float22bfloat162_rn)\b|\bstatic_cast\s*<\s*(?:__half|half|__nv_bfloat16|nv_bfloat16|(?:at|c10)\s*::\s*(?:Half|BFloat16)|__nv_fp8_\w+)\s*>|\(\s*(?:__half|half|__nv_bfloat16|nv_bfloat16|(?:at|c10)\s*::\s*(?:Half|BFloat16)|__nv_fp8_\w+)\s*\)\s*[\w(]|\.\s*to\s*\(\s*(?:at|torch|c10)\s*::\s*k(?:Half|BFloat16|Float16|Float8\w*)\b|\.\s*half\s*\(\s*\)|\bwmma\s*::\s*precision\s*::\s*tf32\b|\b__float_to_tf32\b|\bcvt\.rna\.tf32|\bCUBLAS_COMPUTE_32F_FAST_\w+|\bCUBLAS_TF32_TENSOR_OP_MATH\b|\bCUBLAS_TENSOR_OP_MATH\b|\bCUBLAS_COMPUTE_16F\b|\bCUDA_R_16B?F\b"
);
pattern!(NN_ATTR, r"\b(?:torch\s*\.\s*)?nn\s*\.\s*([A-Za-z_]\w*)");
pattern!(
    TORCH_OP,
    r"\btorch\s*\.\s*(mm|bmm|matmul|einsum|addmm|addbmm|baddbmm|addmv|mv|dot|outer|tensordot|conv[123]d|conv_transpose[123]d|relu_?|gelu|sigmoid|tanh|softmax|log_softmax|layer_norm|batch_norm|group_norm|instance_norm|(?:adaptive_)?(?:max|avg)_pool[123]d|dropout|sum|mean|max|min|amax|amin|argmax|argmin|prod|cumsum|cumprod|logsumexp|clamp|clip|exp|log|sqrt|rsqrt|pow|abs|norm|var|std|var_mean|std_mean|sort|topk|where|softplus|elu|selu|hardtanh|leaky_relu|triu|tril|cdist|cosine_similarity|pairwise_distance|lstm|gru|rnn_tanh|rnn_relu|erf|sin|cos|maximum|minimum|add|sub|mul|div|square|reciprocal|sign|floor|ceil|round|silu|mish|hardswish|hardsigmoid|threshold|diag|trace|kron|cross|median|cummax|cummin|nansum|nanmean)\s*\(|\btorch\s*\.\s*(?:linalg|fft|special)\s*\.\s*([A-Za-z_]\w*)\s*\("
);
pattern!(
    FUNCTIONAL,
    r"\b(?:nn\s*\.\s*functional|F)\s*\.\s*([A-Za-z_]\w*)\s*\("
);
pattern!(LOADER, r"\bload_inline\b|\bcpp_extension\b");
pattern!(GLOBAL, r"\b__global__\b");
pattern!(
    CPP_FUNCTION,
    r"\b([A-Za-z_]\w*)\s*\([^;{}()]*(?:\([^;{}()]*\)[^;{}()]*)*\)\s*(?:const\s*)?(?:noexcept\s*)?\{"
);
pattern!(TRITON_JIT, r"@\s*triton\s*\.\s*(?:jit|autotune)\b");
pattern!(TRITON_LANG, r"\btl\s*\.\s*[A-Za-z_]\w*");
pattern!(CUTE_DSL_KERNEL, r"@\s*cute\s*\.\s*kernel\b");
pattern!(CUTE_CPP, r"\b(?:cute|cutlass)\s*::");
pattern!(
    TILELANG_FUNC,
    r"@\s*T\s*\.\s*prim_func\b|@\s*tilelang\s*\.\s*jit\b"
);
pattern!(TILELANG_KERNEL, r"\bT\s*\.\s*Kernel\s*\(");
pattern!(TK_NAMESPACE, r"\bkittens\b");
pattern!(TK_TILE, r"\b(?:st|rt)_\w+\s*<");
pattern!(TK_OPS, r"\b(?:warp|warpgroup|group\s*<[^<>]*>)\s*::\s*\w+");
pattern!(
    INTROSPECTION,
    r"\b(_getframe|inspect|f_back|f_locals|f_globals|tb_frame|settrace|setprofile|ctypes|__builtins__|builtins)\b|\bgc\s*\.\s*(get_objects|get_referrers|get_referents)\b|\bsys\s*\.\s*modules\b"
);

/// `nn` attributes that hold parameters or structure, not computation (KernelBench's allow list,
/// plus `functional`, whose calls are `torch_computation_ops`).
const NN_ALLOWED: &[&str] = &[
    "Module",
    "Parameter",
    "parameter",
    "ParameterList",
    "ParameterDict",
    "ModuleList",
    "ModuleDict",
    "init",
    "functional",
];

/// Settings that let PyTorch compute an fp32 problem in lower precision.
const PRECISION_SETTINGS: &[&str] = &[
    "allow_tf32",
    "allow_fp16_reduced_precision_reduction",
    "allow_bf16_reduced_precision_reduction",
];

/// Attributes of the `time` module and of CUDA timing objects that a timer patch replaces.
const TIMER_NAMES: &[&str] = &["synchronize", "elapsed_time", "__code__"];

/// Run every rule over `src`.
pub fn check(src: &Source, ctx: &RuleContext) -> Vec<Hit> {
    let mut hits = Vec::new();
    code_bypass(src, &mut hits);
    patches(src, ctx, &mut hits);
    thread_injection(src, &mut hits);
    lazy_eval(src, &mut hits);
    stream_injection(src, &mut hits);
    if ctx.precision == Precision::Fp32 {
        precision_downgrade(src, &mut hits);
    }
    pytorch_wrap(src, &mut hits);
    torch_computation_ops(src, &mut hits);
    missing_kernel(src, ctx.backend, &mut hits);
    introspection(src, &mut hits);
    hits
}

fn hit(hits: &mut Vec<Hit>, category: Category, offset: usize, message: String) {
    hits.push(Hit {
        category,
        offset: Some(offset),
        message,
    });
}

/// Collapse `torch . cuda` to `torch.cuda`.
fn dotted(path: &str) -> String {
    path.chars().filter(|c| !c.is_whitespace()).collect()
}

fn code_bypass(src: &Source, hits: &mut Vec<Hit>) {
    for m in TRY.find_iter(&src.python) {
        hit(
            hits,
            Category::CodeBypass,
            m.start(),
            "`try`/`except` block: a failing kernel can fall back to another path without anyone noticing".into(),
        );
    }
    for m in PASS.find_iter(&src.python) {
        hit(
            hits,
            Category::CodeBypass,
            m.start(),
            "`pass` statement: a stubbed-out body can skip the work (KernelBench flags every `pass`)".into(),
        );
    }
    for m in CPP_CATCH.find_iter(&src.cpp) {
        hit(
            hits,
            Category::CodeBypass,
            m.start(),
            "C++ `catch` block in the kernel source: a failing kernel can fall back without anyone noticing".into(),
        );
    }
}

/// What assigning to (or `setattr` on) `path` patches, if anything the harness relies on.
fn classify_target(path: &str, precision: Precision) -> Option<(Category, String)> {
    let parts: Vec<&str> = path.split('.').collect();
    let last = *parts.last()?;
    if PRECISION_SETTINGS.contains(&last) {
        return (precision == Precision::Fp32).then(|| {
            (
                Category::PrecisionDowngrade,
                format!(
                    "sets `{path}`: lets PyTorch compute in reduced precision (TF32/fp16) for an fp32 problem"
                ),
            )
        });
    }
    let timing = parts[0] == "time"
        || parts.iter().any(|p| matches!(*p, "Event" | "Stream"))
        || TIMER_NAMES.contains(&last)
        || parts.get(1) == Some(&"cuda") && parts[0] == "torch";
    if timing {
        return Some((
            Category::TimingPatch,
            format!(
                "assigns `{path}`: replacing a timer, `synchronize` or a CUDA event fakes the measured time"
            ),
        ));
    }
    if parts[0] == "torch" && parts.get(1) != Some(&"backends") && parts.len() >= 2 {
        return Some((
            Category::TimingPatch,
            format!(
                "assigns `{path}`: patching torch can change how the harness times or checks the result"
            ),
        ));
    }
    None
}

fn patches(src: &Source, ctx: &RuleContext, hits: &mut Vec<Hit>) {
    let py = src.python.as_bytes();
    for c in ASSIGN.captures_iter(&src.python) {
        let (Some(whole), Some(target)) = (c.get(0), c.get(1)) else {
            continue;
        };
        // `a.b == c` is a comparison, not an assignment.
        if py.get(whole.end()) == Some(&b'=') {
            continue;
        }
        let path = dotted(target.as_str());
        if let Some((category, message)) = classify_target(&path, ctx.precision) {
            hit(hits, category, target.start(), message);
        }
    }
    for c in SETATTR.captures_iter(&src.python) {
        let (Some(whole), Some(target)) = (c.get(0), c.get(1)) else {
            continue;
        };
        let obj = dotted(target.as_str());
        let path = match src.string_at(whole.end()) {
            Some(name) => format!("{obj}.{}", name.content),
            // A computed attribute name on a timing object is as suspicious as a literal one.
            None => format!("{obj}.<computed>"),
        };
        let classified = classify_target(&path, ctx.precision).or_else(|| {
            let root = obj.split('.').next().unwrap_or_default();
            matches!(root, "torch" | "time" | "cuda").then(|| {
                (
                    Category::TimingPatch,
                    format!("`setattr` on `{obj}`: patching torch or the timer can fake the measured time"),
                )
            })
        });
        if let Some((category, message)) = classified {
            hit(
                hits,
                category,
                target.start(),
                message.replace("assigns", "setattr sets"),
            );
        }
    }
    for m in MOCK.find_iter(&src.python) {
        hit(
            hits,
            Category::TimingPatch,
            m.start(),
            "uses `unittest.mock`/monkeypatching: patched functions can fake the timing or the check"
                .into(),
        );
    }
}

fn thread_injection(src: &Source, hits: &mut Vec<Hit>) {
    for m in PY_THREAD.find_iter(&src.python) {
        hit(
            hits,
            Category::ThreadInjection,
            m.start(),
            format!(
                "uses `{}`: work in another thread or process can finish after the timer stops",
                dotted(m.as_str()).trim_end_matches('(')
            ),
        );
    }
    for m in CPP_THREAD.find_iter(&src.cpp) {
        hit(
            hits,
            Category::ThreadInjection,
            m.start(),
            format!(
                "starts a C++ thread or task (`{}`): work can finish after the timer stops",
                dotted(m.as_str()).trim_end_matches('(')
            ),
        );
    }
}

fn lazy_eval(src: &Source, hits: &mut Vec<Hit>) {
    for m in LAZY.find_iter(&src.python) {
        hit(
            hits,
            Category::LazyEval,
            m.start(),
            format!(
                "uses `{}`: a tensor subclass can defer or fake the computation until it is inspected",
                dotted(m.as_str())
            ),
        );
    }
    for c in CLASS.captures_iter(&src.python) {
        let (Some(name), Some(bases)) = (c.get(1), c.get(2)) else {
            continue;
        };
        if TENSOR_WORD.is_match(bases.as_str()) {
            hit(
                hits,
                Category::LazyEval,
                name.start(),
                format!(
                    "class `{}` subclasses Tensor: a tensor subclass can defer or fake the computation",
                    name.as_str()
                ),
            );
        }
    }
}

fn stream_injection(src: &Source, hits: &mut Vec<Hit>) {
    for m in PY_STREAM.find_iter(&src.python) {
        hit(
            hits,
            Category::StreamInjection,
            m.start(),
            format!(
                "uses a CUDA stream (`{}`): work on another stream can escape the timer, which waits on the current stream",
                dotted(m.as_str())
                    .trim_end_matches('(')
                    .trim_start_matches('.')
            ),
        );
    }
    for m in CPP_STREAM.find_iter(&src.cpp) {
        hit(
            hits,
            Category::StreamInjection,
            m.start(),
            format!(
                "`{}` in the CUDA source: work on a stream other than PyTorch's current stream escapes the timer",
                m.as_str()
            ),
        );
    }
}

fn precision_downgrade(src: &Source, hits: &mut Vec<Hit>) {
    for m in PY_LOW_PRECISION.find_iter(&src.python) {
        hit(
            hits,
            Category::PrecisionDowngrade,
            m.start(),
            format!(
                "`{}`: computing an fp32 problem in half/bf16/fp8 trades accuracy for speed",
                dotted(m.as_str()).trim_start_matches('.')
            ),
        );
    }
    for m in MATMUL_PRECISION.find_iter(&src.python) {
        let arg = src.string_at(m.end()).map(|s| s.content.as_str());
        if arg != Some("highest") {
            hit(
                hits,
                Category::PrecisionDowngrade,
                m.start(),
                "`set_float32_matmul_precision` below \"highest\": fp32 matmuls may run in TF32/bf16"
                    .into(),
            );
        }
    }
    for m in CPP_LOW_PRECISION.find_iter(&src.cpp) {
        hit(
            hits,
            Category::PrecisionDowngrade,
            m.start(),
            format!(
                "`{}` in the kernel source: half/bf16/TF32 arithmetic for an fp32 problem trades accuracy for speed",
                m.as_str()
                    .trim_end_matches(|c: char| c == '(' || c.is_whitespace())
            ),
        );
    }
}

fn pytorch_wrap(src: &Source, hits: &mut Vec<Hit>) {
    for c in NN_ATTR.captures_iter(&src.python) {
        let (Some(whole), Some(name)) = (c.get(0), c.get(1)) else {
            continue;
        };
        if NN_ALLOWED.contains(&name.as_str()) {
            continue;
        }
        hit(
            hits,
            Category::PytorchWrap,
            whole.start(),
            format!(
                "uses `nn.{}`: a PyTorch layer, not a custom kernel, may be doing the work",
                name.as_str()
            ),
        );
    }
}

fn torch_computation_ops(src: &Source, hits: &mut Vec<Hit>) {
    for c in TORCH_OP.captures_iter(&src.python) {
        let Some(whole) = c.get(0) else { continue };
        hit(
            hits,
            Category::TorchComputationOps,
            whole.start(),
            format!(
                "calls `{}`: PyTorch, not a custom kernel, does this computation",
                dotted(whole.as_str()).trim_end_matches('(')
            ),
        );
    }
    for c in FUNCTIONAL.captures_iter(&src.python) {
        let (Some(whole), Some(name)) = (c.get(0), c.get(1)) else {
            continue;
        };
        hit(
            hits,
            Category::TorchComputationOps,
            whole.start(),
            format!(
                "calls `F.{}`: PyTorch, not a custom kernel, does this computation",
                name.as_str()
            ),
        );
    }
}

fn has_cpp_function(src: &Source) -> bool {
    CPP_FUNCTION.captures_iter(&src.cpp).any(|c| {
        c.get(1).is_some_and(|n| {
            !matches!(
                n.as_str(),
                "if" | "for" | "while" | "switch" | "catch" | "return" | "sizeof"
            )
        })
    })
}

fn missing_kernel(src: &Source, backend: Backend, hits: &mut Vec<Hit>) {
    let loader = LOADER.is_match(&src.python);
    let mut missing: Vec<&str> = Vec::new();
    match backend {
        Backend::Cuda => {
            if !GLOBAL.is_match(&src.cpp) {
                missing.push("no `__global__` kernel in the CUDA sources: the work is not done by a custom CUDA kernel");
            }
            if !loader {
                missing.push("no `load_inline`/`torch.utils.cpp_extension` build: the CUDA sources are never compiled");
            }
        }
        Backend::Cpu => {
            if !GLOBAL.is_match(&src.cpp) && !has_cpp_function(src) {
                missing.push("no C++ function in the extension sources: the work is not done by a custom kernel");
            }
            if !loader {
                missing.push("no `load_inline`/`torch.utils.cpp_extension` build: the C++ sources are never compiled");
            }
        }
        Backend::Cute => {
            // The CuTe DSL in Python, or CuTe/CUTLASS C++ built by load_inline.
            let dsl = CUTE_DSL_KERNEL.is_match(&src.python);
            let cpp = CUTE_CPP.is_match(&src.cpp) && loader;
            if !dsl && !cpp {
                missing.push("no CuTe kernel: neither a `@cute.kernel` (CuTe DSL) nor `cute::`/`cutlass::` code in sources built with `load_inline`");
            }
        }
        Backend::Tilelang => {
            if !TILELANG_FUNC.is_match(&src.python) {
                missing.push("no `@T.prim_func`/`@tilelang.jit` kernel");
            }
            if !TILELANG_KERNEL.is_match(&src.python) {
                missing.push("no `T.Kernel(...)` launch block: the TileLang kernel does no work");
            }
        }
        Backend::Thunderkittens => {
            if !TK_NAMESPACE.is_match(&src.cpp) || !TK_TILE.is_match(&src.cpp) {
                missing.push("no ThunderKittens tiles (`kittens` with `rt_*<...>`/`st_*<...>`) in the CUDA sources");
            }
            if !TK_OPS.is_match(&src.cpp) {
                missing.push("no `warp::`/`warpgroup::` tile operation: the ThunderKittens kernel does no work");
            }
            if !GLOBAL.is_match(&src.cpp) {
                missing.push("no `__global__` kernel in the CUDA sources");
            }
            if !loader {
                missing.push("no `load_inline`/`torch.utils.cpp_extension` build: the CUDA sources are never compiled");
            }
        }
        Backend::Triton => {
            if !TRITON_JIT.is_match(&src.python) {
                missing.push("no `@triton.jit`/`@triton.autotune` kernel");
            }
            if !TRITON_LANG.is_match(&src.python) {
                missing.push("no `tl.*` operation: the Triton kernel does no work");
            }
        }
    }
    // One finding about the whole file, however many parts are missing.
    if !missing.is_empty() {
        hits.push(Hit {
            category: Category::MissingKernel,
            offset: None,
            message: missing.join("; "),
        });
    }
}

fn introspection(src: &Source, hits: &mut Vec<Hit>) {
    for m in INTROSPECTION.find_iter(&src.python) {
        hit(
            hits,
            Category::Introspection,
            m.start(),
            format!(
                "uses `{}`: frame, garbage-collector or raw-memory access can read the reference's output instead of computing it",
                dotted(m.as_str())
            ),
        );
    }
}
