"""E text: compile-log trimming, traceback trimming, KernelBench truncation, sentences."""

from __future__ import annotations

import sys

import kb_feedback
from kb_feedback import Mismatch

BUILD = "/scratch/build/abc123"

GCC_LOG = f"""\
Using {BUILD} as PyTorch extensions root...
Emitting ninja build file {BUILD}/my_ext/build.ninja...
Building extension module my_ext...
Allowing ninja to set a default number of workers... (overridable by setting the environment variable MAX_JOBS=N)
[1/2] c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=my_ext -isystem /torch/include -fPIC -std=c++17 -c {BUILD}/my_ext/main.cpp -o main.o
FAILED: [code=1] main.o
c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=my_ext -isystem /torch/include -fPIC -std=c++17 -c {BUILD}/my_ext/main.cpp -o main.o
{BUILD}/my_ext/main.cpp: In function 'at::Tensor add(at::Tensor, at::Tensor)':
{BUILD}/my_ext/main.cpp:7:5: error: expected ',' or ';' before 'return'
    7 |     return out;
      |     ^~~~~~
ninja: build stopped: subcommand failed.
"""


def test_gcc_log_keeps_the_error_with_context_and_drops_ninja_noise() -> None:
    assert kb_feedback.trim_compile_log(GCC_LOG, [BUILD]) == (
        "my_ext/main.cpp: In function 'at::Tensor add(at::Tensor, at::Tensor)':\n"
        "my_ext/main.cpp:7:5: error: expected ',' or ';' before 'return'\n"
        "    7 |     return out;\n"
        "      |     ^~~~~~"
    )


def test_krefines_own_build_notes_stay_out_of_the_prompt() -> None:
    """kb_build's notes on precompiled headers are for the compile log, not for the model."""
    errors = GCC_LOG.splitlines()[6:]  # the compiler's own lines, from "In function"
    for note in ("krefine: no precompiled header for 'my_ext': not built yet",
                 "krefine: precompiled header 0123abcd from the shared build cache"):
        trimmed = kb_feedback.trim_compile_log("\n".join([note, *errors]), [BUILD])
        assert trimmed is not None and "krefine" not in trimmed, trimmed
        assert trimmed == kb_feedback.trim_compile_log(GCC_LOG, [BUILD])


def test_nvcc_and_linker_errors_are_found() -> None:
    log = (
        'kernel.cu(12): error: identifier "blockIdx_x" is undefined\n'
        "      int i = blockIdx_x;\n"
        "              ^\n"
        "\n"
        '1 error detected in the compilation of "kernel.cu".\n'
        "/usr/bin/ld: main.o: in function `f': undefined reference to `g'\n"
    )
    trimmed = kb_feedback.trim_compile_log(log)
    assert trimmed is not None
    assert 'kernel.cu(12): error: identifier "blockIdx_x" is undefined' in trimmed
    assert "undefined reference to `g'" in trimmed


def test_a_log_without_errors_gives_none() -> None:
    assert kb_feedback.trim_compile_log("warning: unused variable 'x'\nninja: no work to do.\n") is None


def test_many_errors_stay_within_the_budget_and_say_how_many_are_hidden() -> None:
    log = "\n".join(f"main.cpp:{i}:1: error: problem number {i}\n  code line {i}\n  ^" for i in range(200))
    trimmed = kb_feedback.trim_compile_log(log)
    assert trimmed is not None
    lines = trimmed.splitlines()
    assert len(lines) <= kb_feedback.MAX_LINES + 1
    assert len(trimmed) <= kb_feedback.MAX_CHARS + 80
    assert lines[0] == "main.cpp:0:1: error: problem number 0"
    assert lines[-1].startswith("... (") and lines[-1].endswith(" more error lines not shown)")


def test_repeated_diagnostics_are_shown_once() -> None:
    block = "a.h:3:1: error: redefinition of 'int f()'\n    3 | int f() {}\n      | ^~~\n"
    trimmed = kb_feedback.trim_compile_log(block + "\nsomething between\nmore\nlines\n\n" + block)
    assert trimmed is not None
    assert trimmed.count("redefinition") == 1


def test_kernelbench_truncation_is_197_chars_plus_dots() -> None:
    assert kb_feedback.kernelbench_truncate("x" * 200) == "x" * 200
    cut = kb_feedback.kernelbench_truncate("y" * 201)
    assert cut == "y" * 197 + "..."
    assert len(cut) == 200


def test_clean_message_drops_cpp_backtrace_and_cuda_boilerplate() -> None:
    message = (
        "CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
        "below might be incorrect.\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
        "\nException raised from c10_cuda_check_implementation at /pytorch/c10/cuda/CUDAException.cpp:44\n"
        "frame #0: c10::Error::Error(...) + 0x98\n"
    )
    assert kb_feedback.clean_message(message) == "CUDA error: an illegal memory access was encountered"


def _raise_from_candidate(path: str) -> BaseException:
    code = compile(
        "def forward(x):\n    return helper(x)\n\ndef helper(x):\n    raise ValueError('bad ' + x)\n",
        path,
        "exec",
    )
    namespace: dict[str, object] = {}
    exec(code, namespace)
    try:
        namespace["forward"]("input")  # type: ignore[operator]
    except ValueError as exc:
        return exc
    raise AssertionError("no exception")


def test_traceback_keeps_only_candidate_frames() -> None:
    path = "/scratch/build/abc/candidate.py"
    exc = _raise_from_candidate(path)
    text = kb_feedback.candidate_traceback(exc, path)
    assert text == (
        "Traceback (most recent call last, candidate frames only):\n"
        '  File "candidate.py", line 2, in forward\n'
        '  File "candidate.py", line 5, in helper\n'
        "ValueError: bad input"
    )
    assert __file__ not in text


def test_traceback_without_candidate_frames_is_the_exception_line_alone() -> None:
    try:
        raise RuntimeError(
            "CUDA error: an illegal memory access was encountered\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
        )
    except RuntimeError as exc:
        text = kb_feedback.candidate_traceback(exc, "/scratch/b/candidate.py")
    assert text == "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_syntax_error_feedback_shows_line_and_caret() -> None:
    path = "/scratch/b/candidate.py"
    try:
        compile("class ModelNew:\n    def forward(self)\n        pass\n", path, "exec")
    except SyntaxError as exc:
        text = kb_feedback.compile_feedback("SyntaxError", exc, "", path, "/scratch/b")
    assert text.startswith("Compilation failed (SyntaxError): the Python code does not parse.\n")
    assert 'File "candidate.py", line 2' in text
    assert "SyntaxError: expected ':'" in text
    assert path not in text


def test_missing_modelnew_feedback() -> None:
    text = kb_feedback.compile_feedback("SyntaxError", None, "", "/x/candidate.py", "/x")
    assert text == (
        "Compilation failed (SyntaxError): the code ran but does not define `class ModelNew`. "
        "Define `class ModelNew(nn.Module)` at module level."
    )


def test_mismatch_sentences() -> None:
    m = Mismatch(
        trial=2,
        max_abs=1.0,
        mean_abs=0.000244140625,
        bad=1,
        total=4096,
        first_index=(0, 3),
        expected=0.5,
        got=1.5,
    )
    assert kb_feedback.mismatch_sentence(m, 5) == (
        "Trial 2 of 5: output mismatch: max abs diff 1, mean abs diff 0.000244141; 1 of 4096 elements "
        "(0.02%) outside tolerance; first mismatch at index (0, 3): expected 0.5, got 1.5."
    )
    many = [Mismatch(t, 1.0, 1.0, 1, 1, None, None, None, nonfinite=1) for t in range(1, 6)]
    sentences = kb_feedback.mismatch_sentences(many, 5)
    assert len(sentences) == 4
    assert sentences[0].endswith("your output has 1 NaN/Inf values where the reference is finite.")
    assert sentences[-1] == "Trials 4, 5 also mismatch."


def test_summary_and_timing_sentences() -> None:
    assert kb_feedback.correctness_summary(3, 5, "fp16", 1e-2) == (
        "Correctness: 3 / 5 trials passed (fp16, torch.allclose with atol = rtol = 0.01)."
    )
    assert kb_feedback.timing_sentence(0.5, 0.49, 0.01, 100, 1.0) == (
        "Performance: your ModelNew takes 0.5 ms on average (median 0.49 ms, std 0.01 ms, 100 timed runs); "
        "the reference Model takes 1 ms; speedup 2.00x."
    )
    assert kb_feedback.timing_sentence(0.5, 0.5, 0.0, 10, None).endswith("10 timed runs).")


def test_clip() -> None:
    assert kb_feedback.clip("abc", 10) == "abc"
    clipped = kb_feedback.clip("a" * 100, 40)
    assert len(clipped) == 40 and clipped.endswith(" ... [truncated]")


def test_module_has_no_torch_dependency() -> None:
    # kb_feedback is pure string work; keep it importable (and testable) without initialising torch.
    assert "torch" not in kb_feedback.__dict__
    assert sys.modules["kb_feedback"] is kb_feedback
