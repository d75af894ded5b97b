"""Correctness checking, KernelBench metadata, the per-worker reference cache, and `op: evaluate`.

Faithful mode reproduces KernelBench's `eval_kernel_against_ref` + `run_and_check_correctness` order of
operations (shared/reference/kernelbench-protocol.md §1, "What an orchestrator must reproduce exactly"):
seeds, casts, no_grad construction on CPU, never `.eval()`, reference forward first on the same input
objects, candidate forward, shape check, `torch.allclose(ref, new, atol=tol, rtol=tol)`, all trials run,
metadata strings as KernelBench writes them.

The one structural change is the reference cache: the reference runs once per (problem, precision, seed,
trials, device, mode) per worker. For each trial we keep the inputs as the reference left them, its
output, and the RNG state right after its forward; before a candidate's forward we restore that RNG
state, so the candidate sees exactly what it would have seen in KernelBench's interleaved order.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import importlib.metadata
import os
import platform
import re
import sys
import time
import traceback
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

import kb_compile
import kb_feedback
import kb_inputs
import kb_timing
from kb_compile import CANDIDATE_ERRORS, get_error_name
from kb_inputs import tensors as tensors_in

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TOLERANCES: dict[str, float] = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 1e-2}
EXCESSIVE_SPEEDUP = 10.0
STICKY_MARKERS = (
    "CUDA error",
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
)
# Share of memory the reference cache may hold: on the GPU for a CUDA device, in RAM otherwise. Half
# the GPU keeps every trial input of KernelBench's largest level-1 problems (6-9 GB each) on an 80 GB
# device; a candidate that then runs out of memory is retried with the cache off the device.
DEVICE_CACHE_FRACTION = 0.5
HOST_CACHE_FRACTION = 0.35
CPU_DEVICE_CACHE_FRACTION = 0.25
MAX_CONTEXTS = 4
_CHECKSUM_CHUNK = 1 << 24
_CHECKSUM_MUL = 0x5851F42D4C957F2D  # odd 63-bit constant (PCG multiplier)


# ------------------------------------------------------------------------------------ KernelBench basics


def set_seed(seed: int) -> None:
    """KernelBench's set_seed: CPU generator and the current CUDA device's generator."""
    torch.manual_seed(seed)
    torch.cuda.manual_seed(seed)  # lazy when CUDA is not initialised: a compile worker stays CUDA-free


def trial_seeds(seed: int, trials: int) -> list[int]:
    """The per-trial seeds: manual_seed(seed), then `trials` draws of randint(0, 2**32 - 1)."""
    torch.manual_seed(seed)
    return [int(torch.randint(0, 2**32 - 1, (1,)).item()) for _ in range(trials)]


def prepare_value(value: Any, device: torch.device, dtype: torch.dtype, cast_integers: bool = False) -> Any:
    """Floating tensors are cast to the precision dtype, then moved. Integer and bool tensors (token
    ids, class targets, masks) keep their dtype and are only moved: KernelBench's `_process_input_tensor`
    casts them too, which breaks every reference that indexes with them (its open bug, whose proposed
    fix this is). `cast_integers` (`eval.cast_integer_inputs`) reproduces that cast for exact parity."""
    if not isinstance(value, torch.Tensor):
        return value
    if not cast_integers and not (value.is_floating_point() or value.is_complex()):
        return value.to(device=device)
    return value.to(dtype=dtype).to(device=device)


def integer_inputs_policy(cast_integers: bool) -> str:
    """How integer and bool inputs were treated, as the result's env records it."""
    return "cast" if cast_integers else "kept"


def cast_integers_of(request: dict[str, Any]) -> bool:
    """The request's `cast_integer_inputs` flag (absent: False, integer inputs keep their dtype)."""
    return bool(request.get("cast_integer_inputs", False))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device=device)


def hardware_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def normalize_device(name: str) -> torch.device:
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def nbytes(value: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(value))


def aliases(output: Any, inputs: list[Any]) -> bool:
    """Does any output tensor share memory with an input tensor (identity or view problems)?"""
    storages = {t.untyped_storage().data_ptr() for t in tensors_in(inputs)}
    return any(t.untyped_storage().data_ptr() in storages for t in tensors_in(output))


def clone_tensors(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(clone_tensors(item) for item in value)
    return value


def move(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(move(item, device) for item in value)
    return value


# ------------------------------------------------------------------------------ input integrity checks


def tensor_checksum(tensor: torch.Tensor) -> int:
    """A position-weighted sum of the tensor's bytes (as int32 words where possible).

    Cheap on the device (no copy of the data, one sync), and any single changed word changes it: every
    word is multiplied by an odd weight (a bijection modulo 2**32), and every chunk's sum by an odd
    chunk factor (one modulo 2**64). Used to notice that a candidate wrote into cached inputs; it runs
    after every trial, so for a 6 GB input it must cost milliseconds, not a tenth of a second.
    """
    flat = tensor.detach()
    if not flat.is_contiguous():
        flat = flat.contiguous()
    raw = flat.reshape(-1).view(torch.uint8)
    words = raw.view(torch.int32) if raw.numel() % 4 == 0 else raw.to(torch.int32)
    if words.numel() == 0:
        return 0
    weights = _checksum_weights(words.device, min(words.numel(), _CHECKSUM_CHUNK))
    sums = [
        # int32 products wrap, which is what we want; the sum is taken in int64.
        (words[start : start + _CHECKSUM_CHUNK] * weights[: min(_CHECKSUM_CHUNK, words.numel() - start)]).sum(
            dtype=torch.int64
        )
        for start in range(0, words.numel(), _CHECKSUM_CHUNK)
    ]
    factors = torch.arange(len(sums), dtype=torch.int64, device=words.device) * 2 + 1
    return int((torch.stack(sums) * factors).sum().item())


_WEIGHTS: dict[tuple[str, int], torch.Tensor] = {}


def _checksum_weights(device: torch.device, length: int) -> torch.Tensor:
    """Odd int32 weights, kept per device (64 MiB at most) so a checksum makes no index tensors."""
    key = (str(device), _CHECKSUM_CHUNK)
    cached = _WEIGHTS.get(key)
    if cached is None or cached.numel() < length:
        index = torch.arange(length, dtype=torch.int64, device=device)
        cached = (((index * _CHECKSUM_MUL) | 1) & 0x7FFFFFFF).to(torch.int32)
        _WEIGHTS[key] = cached
    return cached


def fingerprint(values: list[Any]) -> list[Any]:
    """Identity and content of every tensor in an argument list (non-tensors are immutable here)."""
    out: list[Any] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            out.append(
                (
                    value.data_ptr(),
                    tuple(value.shape),
                    tuple(value.stride()),
                    value.storage_offset(),
                    value.dtype,
                    tensor_checksum(value),
                )
            )
        else:
            out.append(None)
    return out


def same_bytes(a: Any, b: Any) -> bool:
    """Exact equality, NaN-safe (bytes, not values)."""
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return a is b or a == b
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    return torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    )


def poison_free_memory(output: Any, device: torch.device) -> None:
    """Make a `torch.empty` result useless: hand the allocator back a block the size of the expected
    output filled with 0xFF bytes (NaN for every float dtype), so an uninitialised candidate output
    that reuses freed memory cannot hold a correct result by accident or design."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    for tensor in tensors_in(output):
        # Same shape and dtype as the expected output, so the allocator (CUDA caching allocator or
        # malloc) sees the same request size as the candidate's output allocation.
        block = torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
        block.reshape(-1).view(torch.uint8).fill_(0xFF)
        del block


# -------------------------------------------------------------------------------------------- RNG state


@dataclass
class RngState:
    cpu: torch.Tensor
    cuda: torch.Tensor | None


def capture_rng(device: torch.device) -> RngState:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return RngState(cpu=torch.get_rng_state(), cuda=cuda)


def restore_rng(state: RngState, device: torch.device) -> None:
    torch.set_rng_state(state.cpu)
    if state.cuda is not None:
        torch.cuda.set_rng_state(state.cuda, device)


# ----------------------------------------------------------------------------------------- the problem


@dataclass
class CapturedError:
    """An exception kept for later: the reference's failures are cached with the reference."""

    exc: BaseException
    traceback_text: str
    stage: Literal["load", "init", "forward"]


class ReferenceFailure(Exception):
    """Raised in the trial loop when the cached reference forward failed for that trial."""

    def __init__(self, captured: CapturedError) -> None:
        super().__init__(str(captured.exc))
        self.captured = captured


@dataclass
class ProblemCode:
    model: Any
    get_inputs: Any
    get_init_inputs: Any


def load_problem(code: str) -> ProblemCode:
    """Exec the reference into a fresh namespace, as KernelBench does."""
    namespace: dict[str, Any] = {}
    exec(compile(code, "<reference>", "exec"), namespace)
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in namespace]
    if missing:
        raise NameError(f"reference code does not define {', '.join(missing)}")
    return ProblemCode(namespace["Model"], namespace["get_inputs"], namespace["get_init_inputs"])


Tier = Literal["device", "device_inputs", "host", "recompute"]


@dataclass
class TrialEntry:
    """One correctness trial's cached reference data. `tier` says where the tensors live:
    'device' (inputs and output kept on the device, inputs checked after every candidate),
    'device_inputs' (only the inputs kept; the reference forward runs again per use, which is GPU work
    KernelBench does per trial anyway, while making the inputs is CPU work that can take a minute),
    'host' (kept in RAM, copied per use), or 'recompute' (inputs and output made again per use)."""

    seed: int
    tier: Tier
    inputs: list[Any] | None = None
    output: Any = None
    rng: RngState | None = None
    fingerprint: list[Any] | None = None
    ref_mutates_inputs: bool = False
    dirty: bool = False
    error: CapturedError | None = None


@dataclass
class TrialData:
    """What one trial hands to the check: inputs as the reference left them, its output, RNG after it."""

    inputs: list[Any]
    output: Any
    rng: RngState


class ProblemContext:
    """One reference problem at one (device, precision, mode, seed): the loaded code, the reference
    model (built once), cached trial data per trial count, and the seed-`seed` timing inputs."""

    def __init__(
        self,
        cache: ReferenceCache,
        code: str,
        device: torch.device,
        precision: str,
        mode: str,
        seed: int,
        cast_integers: bool = False,
    ) -> None:
        self.cache = cache
        self.device = device
        self.precision = precision
        self.dtype = DTYPES[precision]
        self.mode = mode
        self.cast_integers = cast_integers
        self.seed = seed
        self.problem: ProblemCode | None = None
        self.ref_model: torch.nn.Module | None = None
        self.error: CapturedError | None = None
        self.trials: dict[int, list[TrialEntry | None]] = {}
        self.timing_inputs_cache: list[Any] | None = None
        self.timing_fingerprint: list[Any] | None = None
        # Raw get_inputs() results made ahead (in parallel) by prepare, per seed; used once.
        self.pregenerated: dict[int, list[Any]] = {}
        self.device_bytes = 0
        self.host_bytes = 0
        self.device_cache = True
        self.build_seconds = 0.0
        started = time.perf_counter()
        self._build(code)
        self.build_seconds += time.perf_counter() - started

    def _build(self, code: str) -> None:
        stage: Literal["load", "init"] = "load"
        try:
            self.problem = load_problem(code)
            stage = "init"
            init_inputs = self.init_inputs()
            with torch.no_grad():
                set_seed(self.seed)
                model = self.problem.model(*init_inputs)
                if not hasattr(model, "forward"):
                    raise AssertionError("reference Model has no forward")
            self.ref_model = model.to(device=self.device, dtype=self.dtype)
        except CANDIDATE_ERRORS as exc:
            self.error = CapturedError(exc, traceback.format_exc(), stage)

    def init_inputs(self) -> list[Any]:
        """Fresh init inputs per use (cheap; usually ints): a candidate may mutate what it is given."""
        assert self.problem is not None
        set_seed(self.seed)
        raw = self.problem.get_init_inputs()
        return [prepare_value(x, self.device, self.dtype, self.cast_integers) for x in raw]

    def _make_inputs(self, seed: int) -> list[Any]:
        assert self.problem is not None
        raw = self.pregenerated.pop(seed, None)
        if raw is None:
            set_seed(seed)
            raw = self.problem.get_inputs()
        return [prepare_value(x, self.device, self.dtype, self.cast_integers) for x in raw]

    def pregenerate(self, code: str, seeds: list[int]) -> int:
        """Make the inputs of `seeds` at once in parallel processes when they are large (see kb_inputs);
        returns how many were made that way. Any failure leaves the serial path to do the work."""
        assert self.problem is not None
        count = kb_inputs.how_many_in_parallel(kb_inputs.planned_bytes(self.problem.get_inputs), len(seeds))
        if count == 0:
            return 0
        started = time.perf_counter()
        try:
            self.pregenerated.update(kb_inputs.make_in_parallel(code, seeds[:count]))
        except Exception as exc:  # noqa: BLE001 - the serial path reports the problem's own errors
            print(f"krefine harness: parallel input generation failed, going serial: {exc!r}", file=sys.stderr)
            return 0
        finally:
            self.build_seconds += time.perf_counter() - started
        return count

    def _reference_forward_on(self, inputs: list[Any], seed: int) -> tuple[Any, RngState]:
        """KernelBench's trial: (inputs made after set_seed(seed)), set_seed(seed), reference forward,
        sync. The RNG state right after the forward is what the candidate's forward starts from."""
        assert self.ref_model is not None
        set_seed(seed)
        with torch.no_grad():
            output = self.ref_model(*inputs)
        synchronize(self.device)
        return output, capture_rng(self.device)

    # ---- correctness trials

    def trial_seeds(self, trials: int) -> list[int]:
        return trial_seeds(self.seed, trials)

    def trial(self, trials: int, index: int, seed: int) -> TrialData:
        """The cached data of trial `index`; builds it on first use. Raises ReferenceFailure if the
        reference forward failed for it (cached too: a broken reference is not re-run per candidate)."""
        entry = self.entry(trials, index, seed)
        if entry.error is not None:
            raise ReferenceFailure(entry.error)
        return self._materialize(entry)

    def entry(self, trials: int, index: int, seed: int) -> TrialEntry:
        """Trial `index`'s cache entry, built on first use (inputs, reference forward, placement)."""
        entries = self.trials.setdefault(trials, [None] * trials)
        entry = entries[index]
        if entry is None:
            started = time.perf_counter()
            try:
                entry = self._build_trial(seed, remaining=trials - index)
            finally:
                self.build_seconds += time.perf_counter() - started
            entries[index] = entry
        return entry

    def _build_trial(self, seed: int, remaining: int) -> TrialEntry:
        try:
            inputs = self._make_inputs(seed)
            before = fingerprint(inputs)
            output, rng = self._reference_forward_on(inputs, seed)
        except CANDIDATE_ERRORS as exc:
            return TrialEntry(seed, "device", error=CapturedError(exc, traceback.format_exc(), "forward"))
        after = fingerprint(inputs)
        mutates = [p[-1] for p in before if p] != [p[-1] for p in after if p]
        if aliases(output, inputs):
            if self.mode == "faithful":
                # In KernelBench the expected output *is* (a view of) the input the candidate receives,
                # so a candidate writing into its input also moves the target. Only a fresh reference
                # run per use reproduces that without letting one candidate corrupt the cache.
                return TrialEntry(seed, "recompute")
            output = clone_tensors(output)  # strict: candidates get clones, the target stays fixed
        # Recomputing the output from kept inputs is only the same as KernelBench when the reference
        # leaves its inputs alone and returns fresh memory.
        lean_ok = not mutates and not aliases(output, inputs)
        in_size = nbytes(inputs)
        size = in_size + nbytes(output)
        tier = self.cache.place(self, in_size, size, remaining, lean_ok)
        if tier == "device":
            self.device_bytes += size
            return TrialEntry(seed, "device", inputs, output, rng, after, ref_mutates_inputs=mutates)
        if tier == "device_inputs":
            self.device_bytes += in_size
            del output
            return TrialEntry(seed, "device_inputs", inputs, None, None, after)
        if tier == "host":
            self.host_bytes += size
            host = torch.device("cpu")
            return TrialEntry(seed, "host", move(inputs, host), move(output, host), rng)
        return TrialEntry(seed, "recompute")

    def _materialize(self, entry: TrialEntry) -> TrialData:
        if entry.tier == "recompute":
            inputs = self._make_inputs(entry.seed)
            output, rng = self._reference_forward_on(inputs, entry.seed)
            return TrialData(inputs, output, rng)
        if entry.tier == "device_inputs":
            if entry.dirty:
                self._regenerate(entry)
            assert entry.inputs is not None
            output, rng = self._reference_forward_on(entry.inputs, entry.seed)
            return TrialData(entry.inputs, output, rng)
        assert entry.inputs is not None and entry.rng is not None
        if entry.tier == "host":
            return TrialData(move(entry.inputs, self.device), move(entry.output, self.device), entry.rng)
        if entry.dirty:
            self._regenerate(entry)
        return TrialData(entry.inputs, entry.output, entry.rng)

    def _regenerate(self, entry: TrialEntry) -> None:
        """Rebuild a trial's inputs after a candidate wrote into them. For a reference that mutates its
        own inputs, its forward runs again so the inputs are as the candidate would find them."""
        started = time.perf_counter()
        entry.inputs = self._make_inputs(entry.seed)
        if entry.ref_mutates_inputs:
            self._reference_forward_on(entry.inputs, entry.seed)
        entry.fingerprint = fingerprint(entry.inputs)
        entry.dirty = False
        self.build_seconds += time.perf_counter() - started

    def verify_trial(self, trials: int, index: int) -> bool:
        """After a candidate ran on trial `index`: are the cached inputs still pristine? A changed trial
        is marked for regeneration; returns False when it changed."""
        entry = self.trials[trials][index]
        if entry is None or entry.tier not in ("device", "device_inputs") or entry.inputs is None:
            return True  # host and recompute tiers hand out throw-away device copies
        try:
            unchanged = fingerprint(entry.inputs) == entry.fingerprint
        except CANDIDATE_ERRORS:
            unchanged = False
        entry.dirty = entry.dirty or not unchanged
        return unchanged

    # ---- timing inputs

    def timing_inputs(self) -> list[Any]:
        """KernelBench's timing inputs (set_seed(seed) -> get_inputs -> cast/move), kept on the device
        and regenerated only when a candidate changed them."""
        if (
            self.timing_inputs_cache is not None
            and fingerprint(self.timing_inputs_cache) == self.timing_fingerprint
        ):
            return self.timing_inputs_cache
        if self.timing_inputs_cache is not None:
            self.device_bytes -= nbytes(self.timing_inputs_cache)
        self.timing_inputs_cache = None
        inputs = self._make_inputs(self.seed)
        self.timing_inputs_cache = inputs
        self.timing_fingerprint = fingerprint(inputs)
        self.device_bytes += nbytes(inputs)
        return inputs


class ReferenceCache:
    """Per-worker cache of ProblemContexts (LRU) plus reference timings (kept across eviction)."""

    def __init__(self, max_contexts: int = MAX_CONTEXTS) -> None:
        self.max_contexts = max_contexts
        self.contexts: OrderedDict[tuple[Any, ...], ProblemContext] = OrderedDict()
        self.ref_timings: dict[tuple[Any, ...], dict[str, Any]] = {}
        # Problems whose candidates ran out of memory next to cached device data: cached in RAM from
        # then on, so the device is the candidate's.
        self.off_device: set[tuple[Any, ...]] = set()

    @staticmethod
    def code_key(code: str) -> str:
        # Our own hash of the code, not the request's code_hash: a wrong hash must never serve the
        # reference outputs of another problem.
        return hashlib.sha256(code.encode("utf-8")).hexdigest()

    def context(
        self, code: str, device: torch.device, precision: str, mode: str, seed: int, cast_integers: bool = False
    ) -> ProblemContext:
        key = (self.code_key(code), str(device), precision, mode, seed, cast_integers)
        ctx = self.contexts.get(key)
        if ctx is not None:
            self.contexts.move_to_end(key)
            return ctx
        while len(self.contexts) >= self.max_contexts:
            self._evict_oldest(keep=None)
        ctx = ProblemContext(self, code, device, precision, mode, seed, cast_integers)
        ctx.device_cache = key not in self.off_device
        self.contexts[key] = ctx
        return ctx

    def device_bytes(self, device: torch.device) -> int:
        return self._used(device, "device_bytes")

    def move_off_device(
        self, code: str, device: torch.device, precision: str, mode: str, seed: int, cast_integers: bool = False
    ) -> None:
        """Forget every cached problem on `device` (freeing its memory) and keep this problem's
        reference data off the device from now on."""
        self.off_device.add((self.code_key(code), str(device), precision, mode, seed, cast_integers))
        for key in [k for k, c in self.contexts.items() if c.device == device]:
            del self.contexts[key]
        release_memory(device)

    def _evict_oldest(self, keep: ProblemContext | None) -> bool:
        victim = next((key for key, ctx in self.contexts.items() if ctx is not keep), None)
        if victim is None:
            return False
        device = self.contexts.pop(victim).device  # drop the last reference before freeing memory
        release_memory(device)
        return True

    def _used(self, device: torch.device, attr: str) -> int:
        return sum(getattr(c, attr) for c in self.contexts.values() if c.device == device)

    def place(
        self, ctx: ProblemContext, in_size: int, size: int, remaining: int, lean_ok: bool
    ) -> Tier:
        """Choose a tier for one trial (`in_size` bytes of inputs, `size` with the output), evicting
        older problems when that makes room. The choice looks ahead: when this and the `remaining - 1`
        trials after it, plus the timing inputs, fit on the device only without their outputs, every
        trial keeps just its inputs there, rather than the first few keeping everything and the rest
        landing in RAM (copied per candidate) or being rebuilt on the CPU."""
        device_budget, host_budget = memory_budgets(ctx.device)
        if not ctx.device_cache:
            device_budget = 0
        timing = 0 if ctx.timing_inputs_cache is not None else in_size
        lean = lean_ok and in_size > 0
        while True:
            free = device_budget - self._used(ctx.device, "device_bytes")
            if remaining * size + timing <= free:
                return "device"
            if lean and remaining * in_size + timing <= free:
                return "device_inputs"
            if not self._evict_oldest(keep=ctx):
                break
        if size <= free:
            return "device"
        if lean and in_size <= free:
            return "device_inputs"
        if host_budget and self._used(ctx.device, "host_bytes") + size <= host_budget:
            return "host"
        return "recompute"


def memory_budgets(device: torch.device) -> tuple[int, int]:
    """(device budget, host budget) in bytes for cached reference data."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return int(total * DEVICE_CACHE_FRACTION), int(ram * HOST_CACHE_FRACTION)
    return int(ram * CPU_DEVICE_CACHE_FRACTION), 0


def release_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------ failure handling


def is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, torch.OutOfMemoryError) or "can't allocate memory" in text


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "PiB": 1 << 50}
_UNITS.update({"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15, "EB": 10**18})
_UNITS["EiB"] = 1 << 60


def oom_request_bytes(text: str) -> int | None:
    """The size of the allocation that failed, from torch's CUDA ("Tried to allocate 6.00 GiB") or
    CPU ("you tried to allocate 123 bytes") message; None when the message does not say."""
    match = re.search(r"you tried to allocate (\d+) bytes", text)
    if match:
        return int(match.group(1))
    # "Tried to allocate 6.00 GiB", or for absurd sizes "Tried to allocate more than 1EB memory".
    match = re.search(r"Tried to allocate (?:more than )?([\d.]+) ?([KMGTPE]?i?B)\b", text)
    if match and match.group(2) in _UNITS:
        return int(float(match.group(1)) * _UNITS[match.group(2)])
    return None


def cache_could_have_caused(verdict: Verdict, cached_bytes: int, device: torch.device) -> bool:
    """Could freeing `cached_bytes` of reference data have let the failed allocation succeed?"""
    if verdict.status != "out_of_memory" or verdict.sticky or cached_bytes <= 0:
        return False
    wanted = verdict.oom_request_bytes
    if wanted is None:
        return True
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0
    return wanted <= cached_bytes + free


def sticky_error(exc: BaseException, device: torch.device) -> BaseException | None:
    """The error that poisons the CUDA context, if any: the failing sync after `exc`, or `exc` itself
    when its text names a sticky CUDA failure. None when the context is still usable."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device=device)
    except Exception as sync_exc:  # noqa: BLE001 - any failure here means the context is gone
        return sync_exc
    if any(marker in str(exc) for marker in STICKY_MARKERS):
        return exc
    return None


# ---------------------------------------------------------------------------------------- the verdict


@dataclass
class Verdict:
    """Everything evaluate() reports; filled in phase by phase."""

    status: str = "correct"
    compiled: bool = True
    correctness: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    feedback: list[str] = field(default_factory=list)
    sticky: bool = False
    sticky_cause: BaseException | None = None
    oom_request_bytes: int | None = None
    runtime_stats: dict[str, Any] = field(default_factory=dict)
    ref_runtime_stats: dict[str, Any] = field(default_factory=dict)
    ref_runtime_source: str | None = None
    phases: dict[str, float] = field(
        default_factory=lambda: {
            "load_s": 0.0,
            "reference_s": 0.0,
            "correctness_s": 0.0,
            "timing_s": 0.0,
            "ref_timing_s": 0.0,
        }
    )


def _fail_candidate_exception(
    verdict: Verdict, exc: BaseException, device: torch.device, candidate_path: str, what: str
) -> bool:
    """Classify an exception raised by candidate code (sticky CUDA error, OOM, plain runtime error),
    set status and feedback. Returns True when the context is poisoned (stop touching the GPU)."""
    poisoned = sticky_error(exc, device)
    detail = kb_feedback.candidate_traceback(exc, candidate_path)
    if poisoned is not None:
        verdict.status, verdict.sticky, verdict.sticky_cause = "cuda_error", True, poisoned
        verdict.feedback.append(
            f"CUDA error {what}: the kernel left the GPU context unusable (typically an out-of-bounds "
            f"memory access or a failed launch).\n{detail}"
        )
        return True
    if is_out_of_memory(exc):
        verdict.status = "out_of_memory"
        verdict.oom_request_bytes = oom_request_bytes(str(exc))
        verdict.feedback.append(f"Out of memory {what}.\n{detail}")
        release_memory(device)
        return False
    verdict.status = "runtime_error"
    verdict.feedback.append(f"Runtime error {what}.\n{detail}")
    return False


def _kernelbench_cuda_error_metadata(
    exc: BaseException, hardware: str, device: torch.device
) -> dict[str, Any]:
    """What KernelBench's batch script records when a sticky error escapes eval (its final sync)."""
    return {
        "cuda_error": f"CUDA Error: {exc}",
        "cuda_error_name": get_error_name(exc),
        "hardware": hardware,
        "device": str(device),
    }


def _other_error_metadata(exc: BaseException, hardware: str, device: torch.device) -> dict[str, Any]:
    """What KernelBench's batch script records for any other exception escaping eval."""
    return {
        "other_error": f"error: {exc}",
        "other_error_name": get_error_name(exc),
        "hardware": hardware,
        "device": str(device),
    }


# ------------------------------------------------------------------------------------ correctness loop


def mismatch_detail(
    trial: int, expected: torch.Tensor, got: torch.Tensor, tol: float
) -> kb_feedback.Mismatch | None:
    """Numbers for the E text beyond KernelBench's max/avg: how many elements fail and where first.
    Best effort only: it never changes the verdict."""
    try:
        close = torch.isclose(expected, got, rtol=tol, atol=tol)
        bad_mask = ~close
        bad = int(bad_mask.sum().item())
        diff = (expected.double() - got.double()).abs()
        first_index: tuple[int, ...] | None = None
        expected_value = got_value = None
        if bad:
            flat = int(bad_mask.reshape(-1).to(torch.uint8).argmax().item())
            first_index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), expected.shape))
            expected_value = float(expected.reshape(-1)[flat].item())
            got_value = float(got.reshape(-1)[flat].item())
        nonfinite = int((~torch.isfinite(got) & torch.isfinite(expected)).sum().item())
        return kb_feedback.Mismatch(
            trial=trial,
            max_abs=float(diff.max().item()),
            mean_abs=float(diff.mean().item()),
            bad=bad,
            total=expected.numel(),
            first_index=first_index,
            expected=expected_value,
            got=got_value,
            nonfinite=nonfinite,
        )
    except Exception:  # noqa: BLE001 - feedback detail only
        return None


@dataclass
class LoopOutcome:
    passed: int
    stop: bool  # the loop returned early (shape mismatch, exception, modified input, reference failure)
    poisoned: bool = False


def run_trials(
    ctx: ProblemContext,
    model_new: torch.nn.Module,
    trials: int,
    verdict: Verdict,
    candidate_path: str,
) -> LoopOutcome:
    """KernelBench's run_and_check_correctness with the reference served from the cache."""
    tol = TOLERANCES[ctx.precision]
    metadata = verdict.metadata
    passed = 0
    mismatches: list[kb_feedback.Mismatch] = []
    wrote_inputs: list[int] = []
    seeds = ctx.trial_seeds(trials)
    with torch.no_grad():
        for index, seed in enumerate(seeds):
            label = f"in correctness trial {index + 1} of {trials}"
            data = ctx.trial(trials, index, seed)  # ReferenceFailure escapes, as in KernelBench
            set_seed(seed)
            model_new = model_new.to(device=ctx.device, dtype=ctx.dtype)
            restore_rng(data.rng, ctx.device)
            inputs = data.inputs if ctx.mode == "faithful" else clone_tensors(data.inputs)
            if ctx.mode == "strict":
                poison_free_memory(data.output, ctx.device)
            output = data.output
            try:
                output_new = model_new(*inputs)
                synchronize(ctx.device)
                if ctx.mode == "strict" and _inputs_modified(verdict, data.inputs, inputs, label):
                    ctx.verify_trial(trials, index)
                    return LoopOutcome(passed, stop=True)
                if output.shape != output_new.shape:
                    message = f"Output shape mismatch: Expected {output.shape}, got {output_new.shape}"
                    metadata["correctness_issue"] = message
                    metadata["correctness_issue_name"] = "correctness_issue"
                    verdict.status = "incorrect"
                    verdict.feedback.append(
                        f"Output shape mismatch {label}: expected {output.shape}, got {output_new.shape}."
                    )
                    ctx.verify_trial(trials, index)
                    return LoopOutcome(passed, stop=True)
                if not torch.allclose(output, output_new, atol=tol, rtol=tol):
                    max_diff = torch.max(torch.abs(output - output_new)).item()
                    avg_diff = torch.mean(torch.abs(output - output_new)).item()
                    metadata.setdefault("max_difference", []).append(f"{max_diff:.6f}")
                    metadata.setdefault("avg_difference", []).append(f"{avg_diff:.6f}")
                    metadata["correctness_issue"] = "Output mismatch"
                    detail = mismatch_detail(index + 1, output, output_new, tol)
                    if detail is not None:
                        mismatches.append(detail)
                else:
                    passed += 1
            except CANDIDATE_ERRORS as exc:
                metadata["runtime_error"] = kb_feedback.kernelbench_truncate(str(exc))
                metadata["runtime_error_name"] = get_error_name(exc)
                metadata["runtime_error_traceback"] = traceback.format_exc()
                poisoned = _fail_candidate_exception(verdict, exc, ctx.device, candidate_path, label)
                if not poisoned:
                    ctx.verify_trial(trials, index)
                return LoopOutcome(passed, stop=True, poisoned=poisoned)
            if not ctx.verify_trial(trials, index):
                wrote_inputs.append(index + 1)
    metadata["correctness_trials"] = f"({passed} / {trials})"
    verdict.feedback.extend(kb_feedback.mismatch_sentences(mismatches, trials))
    if wrote_inputs:
        verdict.feedback.append(kb_feedback.inputs_written_note(wrote_inputs))
    return LoopOutcome(passed, stop=False)


def _inputs_modified(verdict: Verdict, pristine: list[Any], used: list[Any], label: str) -> bool:
    """Strict mode: the candidate got clones; any change to them fails the candidate."""
    changed = [i for i, (a, b) in enumerate(zip(pristine, used, strict=True)) if not same_bytes(a, b)]
    if not changed:
        return False
    names = ", ".join(str(i) for i in changed)
    verdict.metadata["correctness_issue"] = f"Input modified in place: input {names}"
    verdict.metadata["correctness_issue_name"] = "input_modified"
    verdict.status = "incorrect"
    verdict.feedback.append(
        f"Your ModelNew modified its input tensor(s) {names} in place {label}. Strict mode requires "
        "inputs to stay unchanged: write results into new output tensors."
    )
    return True


# ------------------------------------------------------------------------------------------ evaluate


@contextlib.contextmanager
def precision_policy(mode: str, precision: str) -> Iterator[None]:
    """Strict fp32 pins TF32 off (reference and candidate); faithful keeps PyTorch's defaults."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    if mode == "strict" and precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def environment(
    device: torch.device, hardware: str, precision: str, mode: str, cast_integers: bool = False
) -> dict[str, Any]:
    return {
        "device_name": hardware,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "precision": precision,
        "mode": mode,
        "timing_method": kb_timing.timing_method(device),
        "grad_mode": "no_grad",
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "integer_inputs": integer_inputs_policy(cast_integers),
        "transformers": package_version("transformers"),
        "python": platform.python_version(),
    }


@functools.lru_cache(maxsize=None)
def package_version(name: str) -> str | None:
    """An installed package's version without importing it (importing transformers takes seconds)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def construct_candidate(ctx: ProblemContext, model_new_cls: type) -> torch.nn.Module:
    """KernelBench: under no_grad, set_seed(seed) -> ModelNew(*init_inputs) -> assert forward ->
    .to(device, dtype) -> sync. Weights match the reference only by RNG replay."""
    init_inputs = ctx.init_inputs()
    with torch.no_grad():
        set_seed(ctx.seed)
        model = model_new_cls(*init_inputs)
        if not hasattr(model, "forward"):
            raise AssertionError()
        model = model.to(device=ctx.device, dtype=ctx.dtype)
        synchronize(ctx.device)
    return model


class Worker:
    """State a worker keeps between requests."""

    def __init__(self) -> None:
        self.references = ReferenceCache()
        self.flusher = kb_timing.L2Flusher()


def select_device(request: dict[str, Any]) -> torch.device:
    """The request's device, made current for CUDA (the worker sees one GPU)."""
    device = normalize_device(request["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def evaluate(request: dict[str, Any], worker: Worker) -> dict[str, Any]:
    device = select_device(request)
    precision, mode = request["precision"], request["mode"]
    hardware = hardware_name(device)
    # KernelBench sets these print options in every eval; they shape tensor text inside error messages.
    torch.set_printoptions(precision=4, threshold=10, edgeitems=3, linewidth=80)
    verdict = Verdict(metadata={"hardware": hardware, "device": str(device)})
    with precision_policy(mode, precision):
        env = environment(device, hardware, precision, mode, cast_integers_of(request))
        _evaluate_into(verdict, request, worker, device, hardware)
        cache = worker.references
        if cache_could_have_caused(verdict, cache.device_bytes(device), device):
            # KernelBench holds no reference data on the device between trials; a candidate must not
            # fail for memory that our cache took. Free it and evaluate once more.
            spent = dict(verdict.phases)
            cache.move_off_device(
                request["problem"]["code"], device, precision, mode, request["seed"], cast_integers_of(request)
            )
            verdict = Verdict(metadata={"hardware": hardware, "device": str(device)})
            _evaluate_into(verdict, request, worker, device, hardware)
            verdict.metadata["retried_without_device_cache"] = True
            verdict.metadata["first_try_s"] = round(sum(spent.values()), 3)
            verdict.feedback.append(
                "(Evaluated a second time with the cached reference data moved off the device, after "
                "the first attempt ran out of memory.)"
            )
    return _response(request, verdict, env)


def prepare(request: dict[str, Any], worker: Worker) -> dict[str, Any]:
    """`op: prepare`: build everything about the reference that evaluate would build on first use
    (model, every trial's inputs and output, the timing inputs, the reference timing) so that its cost,
    which can be a minute of CPU work for KernelBench's largest inputs, is not charged to a candidate's
    timeout. Cheap when it is all cached already."""
    device = select_device(request)
    precision, mode, seed = request["precision"], request["mode"], request["seed"]
    started = time.perf_counter()
    status, feedback = "ready", ""
    with precision_policy(mode, precision):
        ctx = worker.references.context(
            request["problem"]["code"], device, precision, mode, seed, cast_integers_of(request)
        )
        error = ctx.error
        parallel = 0
        if error is None:
            trials = request["correct_trials"]
            parallel = ctx.pregenerate(request["problem"]["code"], _unbuilt_seeds(ctx, request))
            with torch.no_grad():
                for index, trial_seed in enumerate(ctx.trial_seeds(trials)):
                    error = ctx.entry(trials, index, trial_seed).error
                    if error is not None:
                        break
        if error is None and request["timing"]["measure"]:
            ctx.timing_inputs()
            # A failure is cached nowhere: evaluate tries again and says so in its feedback.
            _reference_timing(Verdict(), request, worker, ctx)
        if error is not None:
            status = "reference_error"
            feedback = kb_feedback.exception_line(error.exc)
        tiers = [e.tier for entries in ctx.trials.values() for e in entries if e is not None]
        device_bytes, host_bytes = ctx.device_bytes, ctx.host_bytes
        ctx.pregenerated.clear()  # unused only if a trial failed; do not hold shared memory
    release_memory(device)
    return {
        "id": request["id"],
        "ok": True,
        "kind": "prepare",
        "status": status,
        "seconds": round(time.perf_counter() - started, 6),
        "tiers": tiers,
        "device_bytes": device_bytes,
        "host_bytes": host_bytes,
        "parallel_inputs": parallel,
        "feedback": feedback,
    }


def _unbuilt_seeds(ctx: ProblemContext, request: dict[str, Any]) -> list[int]:
    """The seeds whose inputs prepare is about to make: trials not built yet, then the timing inputs."""
    trials = request["correct_trials"]
    entries = ctx.trials.get(trials, [None] * trials)
    seeds = [s for s, e in zip(ctx.trial_seeds(trials), entries, strict=True) if e is None]
    if request["timing"]["measure"] and ctx.timing_inputs_cache is None and ctx.seed not in seeds:
        seeds.append(ctx.seed)
    return seeds


def _evaluate_into(
    verdict: Verdict, request: dict[str, Any], worker: Worker, device: torch.device, hardware: str
) -> None:
    precision, mode, seed = request["precision"], request["mode"], request["seed"]
    started = time.perf_counter()
    ctx = worker.references.context(
        request["problem"]["code"], device, precision, mode, seed, cast_integers_of(request)
    )
    verdict.phases["reference_s"] = time.perf_counter() - started
    if ctx.error is not None:  # KernelBench builds the reference before loading the candidate
        _reference_failed(verdict, ctx.error, hardware, device)
        hint = kb_feedback.hf_offline_hint(ctx.error.exc, request["problem"]["code"])
        if hint is not None:
            verdict.feedback.append(hint)
        return
    candidate = request["candidate"]
    build_dir = candidate["build_dir"]
    started = time.perf_counter()
    loaded = kb_compile.load_candidate(candidate["source"], build_dir, os.path.join(build_dir, "load.log"))
    try:
        if not loaded.ok:
            verdict.phases["load_s"] = time.perf_counter() - started
            _compile_failed(verdict, loaded)
            return
        model_new = _construct_or_fail(verdict, ctx, loaded, hardware)
        verdict.phases["load_s"] = time.perf_counter() - started
        if model_new is not None:
            # Reference trials are built lazily inside the correctness loop; book that time as
            # reference time, not as the candidate's.
            reference_before = ctx.build_seconds
            _check_and_time(verdict, request, worker, ctx, model_new, loaded.candidate_path, hardware)
            reference_in_loop = ctx.build_seconds - reference_before
            verdict.phases["reference_s"] += reference_in_loop
            verdict.phases["correctness_s"] = max(0.0, verdict.phases["correctness_s"] - reference_in_loop)
    finally:
        kb_compile.unload_candidate(loaded)
        if not verdict.sticky:
            release_memory(device)


def _reference_failed(verdict: Verdict, error: CapturedError, hardware: str, device: torch.device) -> None:
    # The full traceback is for whoever maintains the problem set: the worker log, not the prompt.
    print(f"krefine harness: the reference failed ({error.stage}):\n{error.traceback_text}", file=sys.stderr)
    verdict.status = "reference_error"
    if error.stage == "forward":
        # Escapes run_and_check_correctness in KernelBench: outer catch, compiled=True, untruncated.
        verdict.compiled = True
        verdict.metadata["runtime_error"] = str(error.exc)
        verdict.metadata["runtime_error_name"] = get_error_name(error.exc)
    else:
        verdict.compiled = False
        verdict.metadata = _other_error_metadata(error.exc, hardware, device)
    verdict.feedback.append(
        "The reference PyTorch Model itself failed on this machine (this is not your code's fault), "
        f"so the candidate cannot be checked.\n{kb_feedback.exception_line(error.exc)}"
    )


def _compile_failed(verdict: Verdict, loaded: kb_compile.LoadResult) -> None:
    verdict.status, verdict.compiled = "compile_error", False
    verdict.metadata["compilation_error_name"] = loaded.error_name
    verdict.metadata["compilation_error"] = loaded.error
    verdict.feedback.append(loaded.feedback)


def _construct_or_fail(
    verdict: Verdict, ctx: ProblemContext, loaded: kb_compile.LoadResult, hardware: str
) -> torch.nn.Module | None:
    assert loaded.model_new is not None
    try:
        return construct_candidate(ctx, loaded.model_new)
    except RuntimeError as exc:
        # KernelBench catches only RuntimeError here: compiled=True, correctness=False.
        verdict.metadata["runtime_error"] = str(exc)
        verdict.metadata["runtime_error_name"] = get_error_name(exc)
        _fail_candidate_exception(
            verdict, exc, ctx.device, loaded.candidate_path, "while constructing ModelNew"
        )
        return None
    except CANDIDATE_ERRORS as exc:
        # Anything else escapes KernelBench's eval; its batch script records compiled=False.
        verdict.compiled = False
        poisoned = sticky_error(exc, ctx.device)
        if poisoned is not None:
            verdict.metadata = _kernelbench_cuda_error_metadata(poisoned, hardware, ctx.device)
            verdict.status, verdict.sticky, verdict.sticky_cause = "cuda_error", True, poisoned
        else:
            verdict.metadata = _other_error_metadata(exc, hardware, ctx.device)
            verdict.status = "runtime_error"
        verdict.feedback.append(
            "ModelNew(*get_init_inputs()) failed: ModelNew's constructor must accept the same arguments "
            f"as Model's.\n{kb_feedback.candidate_traceback(exc, loaded.candidate_path)}"
        )
        return None


def _check_and_time(
    verdict: Verdict,
    request: dict[str, Any],
    worker: Worker,
    ctx: ProblemContext,
    model_new: torch.nn.Module,
    candidate_path: str,
    hardware: str,
) -> None:
    trials = request["correct_trials"]
    started = time.perf_counter()
    try:
        outcome = run_trials(ctx, model_new, trials, verdict, candidate_path)
    except ReferenceFailure as failure:
        verdict.phases["correctness_s"] = time.perf_counter() - started
        _reference_failed(verdict, failure.captured, hardware, ctx.device)
        return
    except CANDIDATE_ERRORS as exc:
        # Outside the per-trial try (e.g. ModelNew.to failing): KernelBench's outer catch.
        verdict.metadata["runtime_error"] = str(exc)
        verdict.metadata["runtime_error_name"] = get_error_name(exc)
        _fail_candidate_exception(verdict, exc, ctx.device, candidate_path, "during the correctness check")
        outcome = LoopOutcome(0, stop=True, poisoned=verdict.sticky)
    verdict.phases["correctness_s"] = time.perf_counter() - started
    if outcome.poisoned:
        _kernelbench_sticky_result(verdict, hardware, ctx.device)
        return
    if outcome.stop:
        verdict.correctness = False
        return
    verdict.correctness = outcome.passed == trials
    tol = TOLERANCES[ctx.precision]
    verdict.feedback.append(kb_feedback.correctness_summary(outcome.passed, trials, ctx.precision, tol))
    if not verdict.correctness:
        verdict.status = "incorrect"
        return
    verdict.status = "correct"
    if request["timing"]["measure"]:
        _time_candidate(verdict, request, worker, ctx, model_new, candidate_path, hardware)


def _kernelbench_sticky_result(verdict: Verdict, hardware: str, device: torch.device) -> None:
    """A sticky error in the correctness or timing phase: KernelBench's next device sync raises it
    outside any try, and its batch script records compiled=False with cuda_error metadata."""
    assert verdict.sticky_cause is not None
    verdict.compiled = verdict.correctness = False
    verdict.metadata = _kernelbench_cuda_error_metadata(verdict.sticky_cause, hardware, device)


def _time_candidate(
    verdict: Verdict,
    request: dict[str, Any],
    worker: Worker,
    ctx: ProblemContext,
    model_new: torch.nn.Module,
    candidate_path: str,
    hardware: str,
) -> None:
    timing = request["timing"]
    started = time.perf_counter()
    try:
        inputs = ctx.timing_inputs()
        model_new = model_new.to(device=ctx.device, dtype=ctx.dtype)
        synchronize(ctx.device)
        times = kb_timing.time_callable(model_new, inputs, ctx.device, timing, worker.flusher)
        verdict.runtime_stats = kb_timing.runtime_stats(times)
    except CANDIDATE_ERRORS as exc:
        verdict.phases["timing_s"] = time.perf_counter() - started
        verdict.metadata["error_during_performance"] = str(exc)
        if _fail_candidate_exception(verdict, exc, ctx.device, candidate_path, "while timing"):
            _kernelbench_sticky_result(verdict, hardware, ctx.device)
        else:
            verdict.status = "correct"  # KernelBench keeps correctness; only the runtime stays -1
        return
    verdict.phases["timing_s"] = time.perf_counter() - started
    started = time.perf_counter()
    _reference_timing(verdict, request, worker, ctx)
    verdict.phases["ref_timing_s"] = time.perf_counter() - started
    _add_timing_feedback(verdict)


def _reference_timing(verdict: Verdict, request: dict[str, Any], worker: Worker, ctx: ProblemContext) -> None:
    given = request.get("reference_runtime")
    if given:
        verdict.ref_runtime_stats = {k: v for k, v in given.items() if k != "source"}
        verdict.ref_runtime_source = given["source"]
        return
    timing = request["timing"]
    key = (
        ReferenceCache.code_key(request["problem"]["code"]),
        str(ctx.device),
        ctx.precision,
        ctx.mode,
        ctx.seed,
        ctx.cast_integers,
        timing["warmup"],
        timing["trials"],
        timing["discard_first"],
        timing["l2_flush"],
    )
    cached = worker.references.ref_timings.get(key)
    if cached is not None:
        verdict.ref_runtime_stats, verdict.ref_runtime_source = dict(cached), "cached"
        return
    assert ctx.ref_model is not None
    try:
        times = kb_timing.time_callable(
            ctx.ref_model, ctx.timing_inputs(), ctx.device, timing, worker.flusher
        )
    except CANDIDATE_ERRORS as exc:
        verdict.feedback.append(f"(The reference could not be timed: {kb_feedback.exception_line(exc)})")
        return
    stats = kb_timing.runtime_stats(times)
    worker.references.ref_timings[key] = stats
    verdict.ref_runtime_stats, verdict.ref_runtime_source = dict(stats), "measured"


def _add_timing_feedback(verdict: Verdict) -> None:
    stats, ref = verdict.runtime_stats, verdict.ref_runtime_stats
    ref_mean = ref.get("mean") if ref else None
    verdict.feedback.append(
        kb_feedback.timing_sentence(
            stats["mean"], stats["median"], stats["std"], stats["num_trials"], ref_mean
        )
    )
    if ref_mean:
        rounded = kb_timing.kernelbench_rounded({"ref": float(ref_mean), "new": float(stats["mean"])})
        if rounded["new"] > 0 and rounded["ref"] / rounded["new"] > EXCESSIVE_SPEEDUP:
            verdict.metadata["excessive_speedup"] = True
            verdict.feedback.append(
                "Warning: a speedup above 10x is flagged as suspicious; make sure the kernel computes the "
                "full result on every call (no caching, no skipped work, no side streams)."
            )


def _response(request: dict[str, Any], verdict: Verdict, env: dict[str, Any]) -> dict[str, Any]:
    stats, ref = verdict.runtime_stats, verdict.ref_runtime_stats
    runtime = float(stats["mean"]) if stats else -1.0
    ref_runtime = float(ref["mean"]) if ref else -1.0
    speedup = ref_runtime / runtime if stats and ref and runtime > 0 else None
    return {
        "id": request["id"],
        "ok": True,
        "kind": "evaluate",
        "status": verdict.status,
        "compiled": verdict.compiled,
        "correctness": verdict.correctness,
        "metadata": json_safe_metadata(verdict.metadata),
        "runtime": runtime,
        "runtime_stats": stats,
        "ref_runtime": ref_runtime,
        "ref_runtime_stats": ref,
        "ref_runtime_source": verdict.ref_runtime_source if ref else None,
        "speedup": speedup,
        "feedback": "\n".join(verdict.feedback),
        "env": env,
        "phases": {k: round(v, 6) for k, v in verdict.phases.items()},
        "sticky": verdict.sticky,
    }


def json_safe_metadata(value: Any) -> Any:
    """KernelBench str()s anything that is not JSON before persisting; do the same."""
    if isinstance(value, dict):
        return {str(k): json_safe_metadata(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe_metadata(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
