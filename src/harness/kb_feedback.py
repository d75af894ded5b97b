"""Execution feedback ("E"): the plain-words text that goes into the next prompt.

Everything here is pure string work (no torch), so it is cheap to test exactly. It also says what a
candidate's error is (`CANDIDATE_ERRORS`, `get_error_name`), for every floor above. Two jobs:
- trim compiler logs and Python tracebacks down to what a model needs to fix its code;
- phrase a result (compile error, runtime error, mismatch, timing) as short sentences.
"""

from __future__ import annotations

import os
import re
import traceback
from dataclasses import dataclass, field
from types import TracebackType

MAX_LINES = 60
MAX_CHARS = 4000
MAX_LINE_CHARS = 300
MAX_MESSAGE_CHARS = 1500
CONTEXT_BEFORE = 2
CONTEXT_AFTER = 3
CANDIDATE_FILE = "candidate.py"

# Errors a candidate can raise at our call sites. SystemExit is included because `sys.exit()` in model
# code must become a failing result, not a silently exiting worker.
CANDIDATE_ERRORS: tuple[type[BaseException], ...] = (Exception, SystemExit)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Lines that are build-system chatter, never a diagnosis: ninja progress and command lines, torch's
# cpp_extension log lines, and raw compiler invocations (kilobytes of -I flags each).
_NOISE = re.compile(
    r"^(\[\d+/\d+\] "
    r"|FAILED: "
    r"|ninja: "
    r"|Emitting ninja build file"
    r"|Building extension module"
    r"|Allowing ninja to set a default number of workers"
    r"|Using \S+ as PyTorch extensions root"
    r"|Detected CUDA files, patching ldflags"
    r"|Loading extension module"
    r"|Error building extension"  # torch's message prefix; the head line already says the build failed
    r"|No modifications detected for re-loaded extension"
    r"|The input conditions for extension module"
    r"|(\S*/)?(c\+\+|g\+\+|gcc|cc|clang\+\+|nvcc|x86_64-linux-gnu-g\+\+)\s+-"
    r"|krefine: (no )?precompiled header"  # krefine's own build notes (kb_build), for its logs only
    r")"
)
_ERROR = re.compile(
    r"(\berror\b\s*:|\berror\s+[A-Z]?\d+\s*:|\bundefined reference\b|\bundefined symbol\b"
    r"|\bptxas (fatal|error)\b)",
    re.IGNORECASE,
)
# Boilerplate that torch appends to CUDA error messages; it costs prompt tokens and says nothing new.
_CUDA_BOILERPLATE = (
    "CUDA kernel errors might be asynchronously reported",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions",
    "Search for `cudaErrorIllegalAddress'",
)


def get_error_name(exc: BaseException) -> str:
    """KernelBench's error name: `module.ClassName` of the exception's class."""
    return f"{exc.__class__.__module__}.{exc.__class__.__name__}"

def clip(text: str, limit: int) -> str:
    """Cut `text` to at most `limit` characters, saying so."""
    if len(text) <= limit:
        return text
    marker = " ... [truncated]"
    return text[: max(0, limit - len(marker))] + marker


def kernelbench_truncate(text: str, max_length: int = 200) -> str:
    """KernelBench's runtime_error truncation: 197 characters + '...' when longer than 200."""
    return text if len(text) <= max_length else text[: max_length - 3] + "..."


def clean_message(message: str) -> str:
    """An exception message without torch's C++ backtrace and CUDA boilerplate, clipped."""
    cut = message.find("\nException raised from ")
    if cut >= 0:
        message = message[:cut]
    kept = [
        line
        for line in message.splitlines()
        if not line.lstrip().startswith("frame #") and not any(b in line for b in _CUDA_BOILERPLATE)
    ]
    return clip("\n".join(kept).strip(), MAX_MESSAGE_CHARS)


def _shorten_paths(line: str, prefixes: list[str]) -> str:
    for prefix in prefixes:
        if prefix:
            line = line.replace(prefix.rstrip("/") + "/", "")
    return line


def _clean_lines(text: str, strip_prefixes: list[str]) -> list[str]:
    lines: list[str] = []
    for raw in _ANSI.sub("", text).splitlines():
        line = raw.rstrip()
        if _NOISE.match(line.lstrip()):
            continue
        if not line and (not lines or not lines[-1]):
            continue  # collapse runs of blank lines
        lines.append(clip(_shorten_paths(line, strip_prefixes), MAX_LINE_CHARS))
    return lines


@dataclass
class _Budget:
    lines: int = MAX_LINES
    chars: int = MAX_CHARS
    out: list[str] = field(default_factory=list)

    def take(self, block: list[str]) -> int:
        """Append as much of a block as fits (whole lines, in order); return how many lines fitted."""
        taken = 0
        for line in block:
            cost = len(line) + 1
            if self.lines < 1 or cost > self.chars:
                break
            self.out.append(line)
            self.lines -= 1
            self.chars -= cost
            taken += 1
        return taken


def trim_compile_log(text: str, strip_prefixes: list[str] | None = None) -> str | None:
    """The first compiler errors of a build log, each with a little context.

    Returns None when the text holds no compiler error line, so callers can fall back to the
    Python traceback instead.
    """
    lines = _clean_lines(text, strip_prefixes or [])
    error_at = [i for i, line in enumerate(lines) if _ERROR.search(line)]
    if not error_at:
        return None
    windows: list[tuple[int, int]] = []
    for i in error_at:
        start, end = max(0, i - CONTEXT_BEFORE), min(len(lines), i + CONTEXT_AFTER + 1)
        if windows and start <= windows[-1][1]:
            windows[-1] = (windows[-1][0], max(windows[-1][1], end))
        else:
            windows.append((start, end))
    budget = _Budget()
    seen_errors: set[str] = set()
    shown = 0
    for start, end in windows:
        block = lines[start:end]
        key = "\n".join(line for line in block if _ERROR.search(line))
        if key in seen_errors:
            continue  # the same diagnostic repeated (several translation units include one header)
        seen_errors.add(key)
        separator = ["..."] if budget.out else []
        taken = budget.take(separator + block) - len(separator)
        shown += sum(1 for line in block[: max(0, taken)] if _ERROR.search(line))
        if taken < len(block):
            break
    hidden = len(error_at) - shown
    if hidden > 0:
        budget.out.append(f"... ({hidden} more error lines not shown)")
    return "\n".join(budget.out)


def candidate_traceback(
    exc: BaseException, candidate_path: str | None, tb: TracebackType | None = None
) -> str:
    """A traceback cut down to the candidate's own frames, then the exception line.

    The harness's and torch's frames mean nothing to the model; the lines of its own file do. An error
    with no candidate frame (a CUDA error surfacing at the harness's synchronize) is the exception line
    alone.
    """
    frames = traceback.extract_tb(tb if tb is not None else exc.__traceback__)
    own = [f for f in frames if candidate_path and f.filename == candidate_path]
    out = ["Traceback (most recent call last, candidate frames only):"] if own else []
    for frame in own:
        out.append(f'  File "{CANDIDATE_FILE}", line {frame.lineno}, in {frame.name}')
        if frame.line:
            out.append(f"    {frame.line.strip()}")
    out.append(exception_line(exc, candidate_path))
    return "\n".join(out)


_MODEL_NAME = re.compile(r"""^\s*model_name\s*=\s*["']([^"']+)["']""", re.MULTILINE)


def hf_offline_hint(exc: BaseException, code: str) -> str | None:
    """When a problem's model could not be loaded because the worker is offline (HF_HUB_OFFLINE) and the
    model is not in its cache, say which model and which cache: transformers' own message names
    neither. None for any other failure."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    if not offline or not isinstance(exc, OSError):
        return None
    text = str(exc)
    if "cached files" not in text and "offline" not in text.lower():
        return None
    models = sorted(set(_MODEL_NAME.findall(code)))
    cache = os.environ.get("HF_HUB_CACHE", "(the default Hugging Face cache)")
    named = ", ".join(models) if models else "the problem's model"
    return (
        f"Hugging Face model {named} is not in the cache {cache}, and workers run offline "
        "(eval.hf.offline = true). Download it first (e.g. `hf download NAME`) or set eval.hf.cache."
    )


def exception_line(exc: BaseException, candidate_path: str | None = None) -> str:
    """`Type: message` (for SyntaxError: file, line and caret as Python prints them)."""
    if isinstance(exc, SyntaxError):
        text = "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
        if candidate_path:
            text = text.replace(candidate_path, CANDIDATE_FILE)
        return clip(text, MAX_MESSAGE_CHARS)
    message = clean_message(str(exc))
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def compile_feedback(
    error_name: str,
    exc: BaseException | None,
    log_text: str,
    candidate_path: str,
    build_dir: str,
) -> str:
    """The E text for a candidate that did not load: compiler errors first, else the traceback."""
    if exc is None:  # imported fine but defines no ModelNew
        return (
            "Compilation failed (SyntaxError): the code ran but does not define `class ModelNew`. "
            "Define `class ModelNew(nn.Module)` at module level."
        )
    if isinstance(exc, SyntaxError):
        head = "Compilation failed (SyntaxError): the Python code does not parse."
        return f"{head}\n{exception_line(exc, candidate_path)}"
    combined = log_text + "\n" + str(exc)
    diagnostics = trim_compile_log(combined, [build_dir])
    if diagnostics is None:
        diagnostics = candidate_traceback(exc, candidate_path)
    return clip(f"Compilation failed ({error_name}).\n{diagnostics}", MAX_CHARS + 200)


# ---------------------------------------------------------------------------------- evaluation E text


@dataclass
class Mismatch:
    """What went wrong in one failing correctness trial (value mismatch)."""

    trial: int
    max_abs: float
    mean_abs: float
    bad: int
    total: int
    first_index: tuple[int, ...] | None
    expected: float | None
    got: float | None
    nonfinite: int = 0


def fmt_value(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.6g}"


def mismatch_sentence(m: Mismatch, num_trials: int) -> str:
    pct = 100.0 * m.bad / m.total if m.total else 0.0
    text = (
        f"Trial {m.trial} of {num_trials}: output mismatch: max abs diff {fmt_value(m.max_abs)}, "
        f"mean abs diff {fmt_value(m.mean_abs)}; {m.bad} of {m.total} elements ({pct:.2f}%) outside "
        "tolerance"
    )
    if m.first_index is not None:
        text += (
            f"; first mismatch at index {m.first_index}: expected {fmt_value(m.expected)}, "
            f"got {fmt_value(m.got)}"
        )
    if m.nonfinite:
        text += f"; your output has {m.nonfinite} NaN/Inf values where the reference is finite"
    return text + "."


def mismatch_sentences(mismatches: list[Mismatch], num_trials: int, limit: int = 3) -> list[str]:
    """One sentence per failing trial, the first `limit` of them (later ones rarely add anything)."""
    out = [mismatch_sentence(m, num_trials) for m in mismatches[:limit]]
    if len(mismatches) > limit:
        rest = ", ".join(str(m.trial) for m in mismatches[limit:])
        out.append(f"Trials {rest} also mismatch.")
    return out


def inputs_written_note(trials: list[int]) -> str:
    which = ", ".join(str(t) for t in trials)
    return (
        f"Note: your ModelNew wrote into its input tensors (trials {which}). That passes here because "
        "the reference has already run on them, but a kernel should not modify its inputs."
    )


def correctness_summary(passed: int, trials: int, precision: str, tol: float, rtol: float | None = None) -> str:
    """`tol` is atol, and rtol too unless `rtol` is given."""
    rtol = tol if rtol is None else rtol
    bounds = f"atol = rtol = {tol:g}" if rtol == tol else f"atol = {tol:g}, rtol = {rtol:g}"
    return f"Correctness: {passed} / {trials} trials passed ({precision}, torch.allclose with {bounds})."


def ms(x: float) -> str:
    return f"{x:.4g} ms"


def timing_sentence(mean: float, median: float, std: float, num_trials: int, ref_mean: float | None) -> str:
    text = (
        f"Performance: your ModelNew takes {ms(mean)} on average (median {ms(median)}, "
        f"std {ms(std)}, {num_trials} timed runs)"
    )
    if ref_mean is None or ref_mean <= 0:
        return text + "."
    return text + f"; the reference Model takes {ms(ref_mean)}; speedup {ref_mean / mean:.2f}x."
