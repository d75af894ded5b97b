"""The reference side of an evaluation: the problem's code, its model, and its cached trial data.

Lives only in the persistent worker (trusted: no candidate code ever runs in it). Faithful mode
reproduces KernelBench's `eval_kernel_against_ref` + `run_and_check_correctness` order of operations
(shared/reference/kernelbench-protocol.md §1): seeds, casts, no_grad construction on CPU, never
`.eval()`, reference forward first on the same input objects.

The one structural change is the reference cache: the reference runs once per (problem, precision, seed,
trials, device, mode) per worker. For each trial we keep the inputs as the reference left them, its
output, and the RNG state right after its forward; before a candidate's forward its process restores
that RNG state, so the candidate sees exactly what it would have seen in KernelBench's interleaved order.

Trials are built one at a time, on first use: by `prepare` ahead of any candidate (kb_prepare), or by a
candidate's own check, which asks for trial k only after trial k - 1 passed, so a candidate that fails
trial 1 costs one trial's inputs, not five. Every build runs inside `ProblemContext.building()`, which
tells the orchestrator (through `ReferenceCache.on_reference`) that the time is the reference's, not the
candidate's.
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
import time
import traceback
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch

import kb_inputs
import kb_store
import kb_timing
from kb_feedback import CANDIDATE_ERRORS
from kb_memory import (
    Footprint,
    cache_room,
    device_state,
    evictions,
    figures,
    let_go,
    memory_budgets,
    need_bytes,
    peak_of,
    release_memory,
)
from kb_problem import ProblemCode, load_problem, set_seed, trial_seeds
from kb_problem import tensors as tensors_in
from kb_tensors import (
    RngState,
    aliases,
    capture_rng,
    clone_tensors,
    fingerprint,
    move,
    nbytes,
    normalize_device,
    prepare_value,
    synchronize,
)

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TOLERANCES: dict[str, float] = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 1e-2}


def tolerance(precision: str, spec: dict[str, Any] | None) -> tuple[float, float]:
    """(atol, rtol) of a request's `tolerance` (`eval.tolerance`, resolved by the orchestrator to
    numbers); absent: KernelBench's current per-precision value for both."""
    if not spec:
        tol = TOLERANCES[precision]
        return tol, tol
    return float(spec["atol"]), float(spec["rtol"])


def tolerance_name(request: dict[str, Any] | None) -> str:
    """The preset a request's tolerance came from (`kernelbench`, `kernelbench-v0`, `explicit`)."""
    spec = request.get("tolerance") if request is not None else None
    return str(spec.get("name", "explicit")) if spec else "kernelbench"
# Problems whose reference data one worker keeps at most (least recently used go first).
MAX_CONTEXTS = 8


# ------------------------------------------------------------------------------------ KernelBench basics


# set_seed, trial_seeds, load_problem and ProblemCode live in kb_problem (the floor below, shared with
# kb_inputs and kb_store), the memory rules in kb_memory; both are re-exported here for the modules above.
__all__ = [
    "ProblemCode",
    "evictions",
    "load_problem",
    "memory_budgets",
    "need_bytes",
    "release_memory",
    "set_seed",
    "trial_seeds",
]

# `eval.inputs`: "kernelbench" (get_inputs() on the CPU, KernelBench's bits, from the on-disk store
# when it has them) or "device" (the same distributions drawn on the device by its own generator).
InputsMode = Literal["kernelbench", "device"]


def integer_inputs_policy(cast_integers: bool) -> str:
    """How integer and bool inputs were treated, as the result's env records it."""
    return "cast" if cast_integers else "kept"


def code_key(code: str) -> str:
    """Our own hash of a problem's code, not the request's code_hash: a wrong hash must never serve the
    reference outputs of another problem."""
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ProbeHint:
    """A precision probe's summary as the orchestrator keeps it: the inputs it used (`signed` or
    `kernelbench`) and the reference's own error against float64, or why it is not applicable."""

    kind: str | None = None
    e_ref: float = 0.0
    why: str | None = None

    @classmethod
    def of(cls, wire: Any) -> ProbeHint | None:
        if type(wire) is not dict:
            return None
        why, kind, e_ref = wire.get("why"), wire.get("kind"), wire.get("e_ref")
        if type(why) is str and why:
            return cls(why=why[:300])
        if type(kind) is str and isinstance(e_ref, (int, float)) and type(e_ref) is not bool:
            return cls(kind=kind, e_ref=float(e_ref))
        return None


@dataclass(frozen=True)
class ReferenceSpec:
    """The reference data a request works against (kb_protocol.ReferenceSpec, the top-level fields of
    prepare, evaluate and profile requests), read once: the problem's code, the device, precision, mode
    and seed, the integer-input policy, where the inputs are drawn, and the store entry holding them.
    `key()` is the worker's cache key (ReferenceCache); every reader takes this object, never the fields
    one by one. The positional order is the one `ReferenceCache.context` took before it took a spec."""

    code: str
    device: torch.device
    precision: str = "fp32"
    mode: str = "faithful"
    seed: int = 42
    # eval.cast_integer_inputs: integer and bool inputs cast to the precision as KernelBench does.
    cast_integers: bool = False
    # eval.inputs: KernelBench's CPU generation, or the same distributions drawn on the device.
    inputs: InputsMode = "kernelbench"
    # The store entry holding the problem's CPU-made inputs (kb_store), when the orchestrator has one
    # (src/worker/input_store.rs). Not part of the key: any whole entry of the problem holds the same bits.
    stored: str | None = None
    # What the precision probe (kb_precision) came to for this problem on this kind of device in an
    # earlier run, kept by the orchestrator (src/worker/probes.rs): its float64 forward is not run
    # again. Not part of the key; read as it came, checked where it is used.
    probe_hint: ProbeHint | None = None

    @classmethod
    def of(cls, request: dict[str, Any]) -> ReferenceSpec:
        """The spec of a request (absent optional fields: their defaults)."""
        stored = request.get("stored_inputs")
        return cls(
            probe_hint=ProbeHint.of(request.get("precision_probe")),
            code=request["problem"]["code"],
            device=normalize_device(request["device"]),
            precision=request["precision"],
            mode=request["mode"],
            seed=int(request["seed"]),
            cast_integers=bool(request.get("cast_integer_inputs", False)),
            inputs="device" if request.get("inputs") == "device" else "kernelbench",
            stored=stored if isinstance(stored, str) and stored else None,
        )

    def key(self) -> tuple[Any, ...]:
        """What the worker's reference data is cached by: one context per key (ReferenceCache)."""
        return (code_key(self.code), str(self.device), self.precision, self.mode, self.seed, self.cast_integers, self.inputs)


# ----------------------------------------------------------------------------------------- the problem


@dataclass
class CapturedError:
    """An exception kept for later: the reference's failures are cached with the reference."""

    exc: BaseException
    traceback_text: str
    stage: Literal["load", "init", "forward"]


class ReferenceFailure(Exception):
    """Raised in the trial loop when the cached reference forward failed for that trial."""

    def __init__(self, captured: CapturedError, index: int = 0) -> None:
        super().__init__(str(captured.exc))
        self.captured = captured
        self.index = index


Tier = Literal["device", "device_inputs", "host", "host_inputs", "recompute"]


@dataclass
class TrialEntry:
    """One correctness trial's cached reference data. `tier` says where the tensors live:
    'device' (inputs and output kept on the device, inputs checked after every candidate),
    'device_inputs' (only the inputs kept; the reference forward runs again per use, which is GPU work
    KernelBench does per trial anyway, while making the inputs is CPU work that can take a minute),
    'host' (kept in RAM, copied per use), 'host_inputs' (the inputs kept in RAM, copied up and the
    forward run per use), or 'recompute' (inputs and output made again per use). Data moved off the
    device to make room for a candidate (ReferenceCache.demote) lands in 'host' or 'host_inputs', or in
    'recompute' when RAM has no room: the same bits either way."""

    seed: int
    tier: Tier
    # The inputs as the reference left them ('device', 'host'), or pristine ('device_inputs',
    # 'host_inputs': only a reference that leaves its inputs alone is kept that way).
    inputs: list[Any] | None = None
    # The reference's output ('device', 'host' only).
    output: Any = None
    # The RNG state right after the reference's forward: the candidate's forward starts from it.
    rng: RngState | None = None
    # The device-kept inputs' fingerprint, checked after every candidate (one that wrote into them marks
    # the entry dirty, and the inputs are made again before the next use).
    fingerprint: list[Any] | None = None
    # The reference writes into its inputs: remaking them means running its forward again.
    ref_mutates_inputs: bool = False
    dirty: bool = False
    # The reference's own failure on this trial (cached: a broken reference is not re-run per candidate).
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

    def __init__(self, cache: ReferenceCache, spec: ReferenceSpec) -> None:
        # The worker's cache this context lives in (its budgets, its reference-work notices).
        self.cache = cache
        # What this context is (its key), and its fields as the attributes below for the check's use.
        self.spec = spec
        # The orchestrator's summary of an earlier run's precision probe (kb_precision), the latest given.
        self.probe_hint = spec.probe_hint
        self.code = spec.code
        self.device = spec.device
        self.precision = spec.precision
        self.dtype = DTYPES[spec.precision]
        # The worker's own view checks with KernelBench's tolerance; a candidate process's with the job's.
        self.atol, self.rtol = tolerance(spec.precision, None)
        self.mode = spec.mode
        self.cast_integers = spec.cast_integers
        self.inputs: InputsMode = spec.inputs
        # The store entry holding this problem's CPU-made inputs (kb_store), when there is one; a later
        # request may name one when the first did not (the entry was still being made).
        self.stored: str | None = spec.stored
        self.seed = spec.seed
        # The problem's loaded code and its model, built once (None when the reference failed to load
        # or to build: `error` says how, and every candidate of it gets that reference error).
        self.problem: ProblemCode | None = None
        self.ref_model: torch.nn.Module | None = None
        self.error: CapturedError | None = None
        # Per number of correctness trials, each trial's entry, built in order on first use.
        self.trials: dict[int, list[TrialEntry | None]] = {}
        # The timing inputs kept on the device (None: not made yet, or not kept beside a candidate's
        # room) and their fingerprint (a candidate that wrote into them has them made again).
        self.timing_inputs_cache: list[Any] | None = None
        self.timing_fingerprint: list[Any] | None = None
        # Raw get_inputs() results made ahead (in parallel) by prepare, per seed; used once.
        self.pregenerated: dict[int, list[Any]] = {}
        # Bytes of this problem's data kept on the device and in RAM: the cache's budgets count them.
        self.device_bytes = 0
        self.host_bytes = 0
        # False once this problem's data must stay off the device (memory admission found no room
        # beside its candidates, or one ran out of memory next to it).
        self.device_cache = True
        # Bytes one get_inputs() call makes (kb_inputs.planned_bytes; 0: unknown), for memory admission
        # (ReferenceCache.make_room); found on first need.
        self.planned_bytes: int | None = None
        self.build_seconds = 0.0
        # The part of build_seconds spent on timing inputs (made when a candidate reaches timing).
        self.timing_build_seconds = 0.0
        # What was built, by kind ("inputs": get_inputs() calls, "trials", "timing_inputs",
        # "strict_inputs", "strict_checks"): tests assert these counts, and prepare reports what it built.
        self.counts: Counter[str] = Counter()
        # How long the reference's forward took in each trial built (kb_prepare estimates from it how
        # long timing the reference would hold the device).
        self.forward_seconds: list[float] = []
        # The problem's sizes on the device (one input set, the output, the forward's peak), measured as
        # trials are built: what memory admission reserves for a candidate beside the cache (kb_memory).
        self.footprint: Footprint | None = None
        with self.building():
            self._build(spec.code)

    @contextlib.contextmanager
    def building(self, for_timing: bool = False) -> Iterator[None]:
        """Reference work: its time is added to `build_seconds` (and `timing_build_seconds` when it
        makes timing inputs; outermost level only) and reported to the orchestrator as the
        reference's (see ReferenceCache.reference_work)."""
        outermost = self.cache.depth == 0
        started = time.perf_counter()
        with self.cache.reference_work():
            try:
                yield
            finally:
                if outermost:
                    spent = time.perf_counter() - started
                    self.build_seconds += spent
                    if for_timing:
                        self.timing_build_seconds += spent

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
            raw = self._stored_inputs(seed)
        if raw is None:
            set_seed(seed)
            if self.inputs == "device" and self.device.type == "cuda":
                # The same distributions, drawn on the device by its generator (seeded by set_seed):
                # no CPU work and no upload, but other bits than KernelBench's.
                with torch.device(self.device):
                    raw = self.problem.get_inputs()
            else:
                raw = self.problem.get_inputs()
        self.counts["inputs"] += 1
        inputs = [prepare_value(x, self.device, self.dtype, self.cast_integers) for x in raw]
        if self.device.type == "cpu":
            # Candidate processes map CPU inputs from shared memory. Sending a tensor moves it there
            # in place (a new data pointer); doing it now keeps the checksummed identity stable.
            for t in tensors_in(inputs):
                t.share_memory_()
        return inputs

    def _stored_inputs(self, seed: int) -> list[Any] | None:
        """`get_inputs()` after `set_seed(seed)`, read from the store, with the CPU generator left where
        get_inputs() would have left it; None when the store cannot serve them (the caller makes them)."""
        if self.inputs != "kernelbench" or self.stored is None:
            return None
        loaded = kb_store.load(self.stored, self.code, seed, self.device)
        if loaded is None:
            return None
        values, rng = loaded
        set_seed(seed)
        torch.set_rng_state(rng)
        self.counts["stored_inputs"] += 1
        return values

    def pregenerate(self, code: str, seeds: list[int]) -> int:
        """Make the inputs of `seeds` at once in parallel processes when they are large (see kb_inputs);
        returns how many were made that way. Any failure leaves the serial path to do the work. Nothing
        is made here when the inputs come from the store or are drawn on the device."""
        assert self.problem is not None
        if self.inputs == "device" or (self.stored is not None and kb_store.read_manifest(self.stored)):
            return 0
        count = kb_inputs.how_many_in_parallel(kb_inputs.planned_bytes(self.problem.get_inputs), len(seeds))
        if count == 0:
            return 0
        with self.building():
            try:
                self.pregenerated.update(kb_inputs.make_in_parallel(code, seeds[:count]))
            except Exception as exc:  # noqa: BLE001 - the serial path reports the problem's own errors
                print(f"krefine harness: parallel input generation failed, going serial: {exc!r}", file=sys.stderr)
                return 0
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
            raise ReferenceFailure(entry.error, index)
        return self._materialize(entry)

    def entry(self, trials: int, index: int, seed: int) -> TrialEntry:
        """Trial `index`'s cache entry, built on first use (inputs, reference forward, placement)."""
        entries = self.trials.setdefault(trials, [None] * trials)
        entry = entries[index]
        if entry is None:
            with self.building():
                entry = self._build_trial(seed, remaining=trials - index)
            self.counts["trials"] += 1
            entries[index] = entry
        return entry

    def built_trials(self, trials: int) -> int:
        """How many of the first trials are built (trial k is only ever built after trial k - 1)."""
        entries = self.trials.get(trials, [])
        return next((i for i, e in enumerate(entries) if e is None), len(entries))

    def _build_trial(self, seed: int, remaining: int) -> TrialEntry:
        try:
            inputs = self._make_inputs(seed)
            before = fingerprint(inputs)
            started = time.perf_counter()
            with peak_of(self.device) as peak:
                output, rng = self._reference_forward_on(inputs, seed)
            self.forward_seconds.append(time.perf_counter() - started)
        except CANDIDATE_ERRORS as exc:
            return TrialEntry(seed, "device", error=CapturedError(exc, traceback.format_exc(), "forward"))
        self._note_footprint(inputs, output, peak)
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
        if tier == "host_inputs":
            self.host_bytes += in_size
            return TrialEntry(seed, "host_inputs", move(inputs, torch.device("cpu")))
        return TrialEntry(seed, "recompute")

    def _note_footprint(self, inputs: list[Any], output: Any, peak: list[int]) -> None:
        """Fold one trial's sizes into the problem's footprint (on the CPU the forward counts as its
        output: torch keeps no allocation count there)."""
        out = nbytes(output)
        found = Footprint(nbytes(inputs), out, max(peak[0] if peak else out, out))
        self.footprint = found if self.footprint is None else self.footprint.merged(found)

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
        if entry.tier == "host_inputs":
            assert entry.inputs is not None
            inputs = self._copy_up(entry.inputs)
            output, rng = self._reference_forward_on(inputs, entry.seed)
            return TrialData(inputs, output, rng)
        assert entry.inputs is not None and entry.rng is not None
        if entry.tier == "host":
            return TrialData(self._copy_up(entry.inputs), self._copy_up(entry.output), entry.rng)
        if entry.dirty:
            self._regenerate(entry)
        return TrialData(entry.inputs, entry.output, entry.rng)

    def _copy_up(self, value: Any) -> Any:
        """A throw-away device copy of RAM-kept data (a copy on the CPU device too: the candidate may
        write into what it gets)."""
        return clone_tensors(value) if self.device.type == "cpu" else move(value, self.device)

    def _regenerate(self, entry: TrialEntry) -> None:
        """Rebuild a trial's inputs after a candidate wrote into them. For a reference that mutates its
        own inputs, its forward runs again so the inputs are as the candidate would find them."""
        with self.building():
            entry.inputs = self._make_inputs(entry.seed)
            if entry.ref_mutates_inputs:
                self._reference_forward_on(entry.inputs, entry.seed)
            entry.fingerprint = fingerprint(entry.inputs)
        entry.dirty = False

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
        if self.timing_inputs_cache is not None and fingerprint(self.timing_inputs_cache) == self.timing_fingerprint:
            return self.timing_inputs_cache
        if self.timing_inputs_cache is not None:
            self.device_bytes -= nbytes(self.timing_inputs_cache)
        self.timing_inputs_cache = None
        with self.building(for_timing=True):
            inputs = self._make_inputs(self.seed)
        self.counts["timing_inputs"] += 1
        if self.cache.keeps(self, nbytes(inputs)):
            self.timing_inputs_cache = inputs
            self.timing_fingerprint = fingerprint(inputs)
            self.device_bytes += nbytes(inputs)
        return inputs

    def demote(self, short: int) -> int:
        """Move this problem's cached data off the device until `short` bytes are freed (all of it when
        short is larger): the timing inputs first (made again on next use), then the trials from the
        last one back (the first trials serve every candidate, even one that fails early), each to RAM
        within the host budget ('host', 'host_inputs'), else to 'recompute'. The same bits are handed
        out afterwards. Returns the device bytes freed (the caller gives them back to the driver)."""
        freed = 0
        if self.timing_inputs_cache is not None and freed < short:
            size = nbytes(self.timing_inputs_cache)
            self.timing_inputs_cache = self.timing_fingerprint = None
            self.device_bytes -= size
            freed += size
        host_budget = memory_budgets(self.device)[1]
        entries = [e for per_count in self.trials.values() for e in per_count if e is not None]
        for entry in reversed(entries):
            if freed >= short:
                break
            if entry.tier not in ("device", "device_inputs") or entry.inputs is None:
                continue
            size = nbytes(entry.inputs) + nbytes(entry.output)
            room = host_budget and self.cache.host_bytes(self.device) + size <= host_budget
            if entry.dirty or not room:
                entry.tier, entry.inputs, entry.output, entry.rng = "recompute", None, None, None
            else:
                host = torch.device("cpu")
                entry.tier = "host" if entry.tier == "device" else "host_inputs"
                entry.inputs, entry.output = move(entry.inputs, host), move(entry.output, host)
                self.host_bytes += size
            entry.fingerprint = None
            self.device_bytes -= size
            freed += size
        self.counts["demoted"] += 1
        if freed:
            let_go()
        return freed


    # ---- strict timing (kb_strict holds the secrets and the check decisions; kb_drive lends the copies)

    def fresh_inputs(self, seed: int) -> list[Any]:
        """get_inputs() under set_seed(seed), never cached: made on the device (as the default device
        of torch's factories) where get_inputs allows it, else on the host and moved, then cast and
        placed like every other input. Not booked as reference time: it is part of strict timing's
        loop, outside the timed region."""
        assert self.problem is not None
        set_seed(seed)
        try:
            with torch.device(self.device):
                raw = self.problem.get_inputs()
        except CANDIDATE_ERRORS:
            set_seed(seed)
            raw = self.problem.get_inputs()
        self.counts["strict_inputs"] += 1
        return [prepare_value(x, self.device, self.dtype, self.cast_integers) for x in raw]

    def reference_output(self, inputs: list[Any]) -> Any:
        """The reference's output on (a clone of) `inputs`, for a checked call of the worker's clock.
        When the clone does not fit the device (a 16 GiB input set beside the one lent to the candidate
        on an 80 GB card, issue 39), the reference runs on `inputs` themselves: see `_output_in_place`."""
        assert self.ref_model is not None
        with torch.no_grad():
            try:
                args = clone_tensors(inputs)
            except torch.OutOfMemoryError as exc:
                oom = exc.with_traceback(None)  # its frames would hold what was cloned so far
            else:
                output = self.ref_model(*args)
                synchronize(self.device)
                self.counts["strict_checks"] += 1
                return output
        return self._output_in_place(inputs, oom)

    def _output_in_place(self, inputs: list[Any], oom: BaseException) -> Any:
        """The reference's output on `inputs` themselves, which must stay pristine: each tensor's host
        copy is kept, and one the reference changed in place (its version counter moved: trusted PyTorch
        code, whose in-place ops all count) is written back. An output that is (a view of) a changed
        input cannot be kept beside the restored input without the clone that did not fit: `oom` is
        raised then, as before."""
        assert self.ref_model is not None
        release_memory(self.device)  # what the failed clone left in the allocator
        saved = [(t, t._version, t.detach().to("cpu", copy=True)) for t in tensors_in(inputs)]
        with torch.no_grad():
            output = self.ref_model(*inputs)
        synchronize(self.device)
        changed = [(t, host) for t, version, host in saved if t._version != version]
        clash = bool(changed) and aliases(output, inputs)
        with torch.no_grad():
            for t, host in changed:
                t.copy_(host)
        synchronize(self.device)
        if clash:
            raise oom
        self.counts["strict_checks"] += 1
        self.counts["checks_in_place"] += 1
        return output


class ReferenceCache:
    """Per-worker cache of ProblemContexts (LRU) plus reference timings (kept across eviction)."""

    def __init__(self, max_contexts: int = MAX_CONTEXTS) -> None:
        # Problems kept at most; the least recently used context goes first.
        self.max_contexts = max_contexts
        # By ReferenceSpec.key(), least recently used first.
        self.contexts: OrderedDict[tuple[Any, ...], ProblemContext] = OrderedDict()
        # Reference timings (kb_eval.reference_timing_key): kept when their context is evicted, since a
        # problem's reference is timed once per worker.
        self.ref_timings: dict[tuple[Any, ...], dict[str, Any]] = {}
        # Problems whose candidates ran out of memory next to cached device data: cached in RAM from
        # then on, so the device is the candidate's.
        self.off_device: set[tuple[Any, ...]] = set()
        # Told True when reference work starts and False when it ends (outermost level only). The
        # serve loop points it at a `progress` notice while it answers an evaluate, so that the
        # orchestrator charges that time to eval.timeouts.reference_s, not to the candidate.
        self.on_reference: Callable[[bool], None] | None = None
        # Nesting of reference work (only the outermost stretch is announced and timed).
        self.depth = 0
        # Problems evicted to make room on a device (memory admission and out-of-memory retries).
        self.evicted_for_room = 0
        # The sizes (footprint, planned input bytes) of problems whose contexts were dropped, by key: a
        # verdict's memory figures still have them when its own context gave way (a reference that ran
        # out of memory must not be called too large for the device for want of its sizes).
        self.sizes: dict[tuple[Any, ...], tuple[Footprint | None, int | None]] = {}

    @contextlib.contextmanager
    def reference_work(self) -> Iterator[None]:
        """Mark a stretch of reference work (building trial data, timing the reference)."""
        if self.depth == 0 and self.on_reference is not None:
            self.on_reference(True)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0 and self.on_reference is not None:
                self.on_reference(False)

    @staticmethod
    def code_key(code: str) -> str:
        return code_key(code)

    def context(self, spec: ReferenceSpec) -> ProblemContext:
        """The problem's context for `spec`, made on first use (the store entry it names is taken up
        by a context made before the entry was whole)."""
        key = spec.key()
        ctx = self.contexts.get(key)
        if ctx is not None:
            self.contexts.move_to_end(key)
            ctx.stored = spec.stored or ctx.stored
            ctx.probe_hint = spec.probe_hint or ctx.probe_hint
            self.make_room(ctx)
            return ctx
        while len(self.contexts) >= self.max_contexts:
            self._evict_oldest(keep=None)
        ctx = ProblemContext(self, spec)
        ctx.device_cache = key not in self.off_device
        self.contexts[key] = ctx
        self.make_room(ctx)
        return ctx

    def make_room(self, ctx: ProblemContext) -> list[tuple[Any, ...]]:
        """Memory admission before a request of `ctx`'s problem puts data or a candidate on a CUDA
        device (kb_memory's module doc): what it needs (its footprint's reserve once its reference ran,
        else its planned bytes, `need_bytes`) against what the device can give (its free memory, which
        counts every process on it, and what this worker's allocator holds unused). Other problems'
        cached data gives way first, least recently used first (`evictions`); when even that is not
        enough, this problem's own data moves off the device (`ProblemContext.demote`) and stays off.
        Returns the keys evicted."""
        if ctx.device.type != "cuda" or ctx.problem is None or ctx.error is not None:
            return []
        state = device_state(ctx.device)
        if ctx.footprint is not None:
            need = ctx.footprint.reserve(state.total, ctx.mode == "strict")
        else:
            if ctx.planned_bytes is None:
                ctx.planned_bytes = kb_inputs.planned_bytes(ctx.problem.get_inputs) or 0
            need = need_bytes(ctx.planned_bytes, state.total)
        evicted = self.admit(ctx, state.available, need)
        if need > state.free and not evicted:
            # What this worker's allocator holds unused goes back to the driver, for the candidate's process.
            torch.cuda.empty_cache()
        return evicted

    def admit(self, ctx: ProblemContext, free: int, need: int) -> list[tuple[Any, ...]]:
        """The bookkeeping of make_room for `free` and `need` bytes: evict what `evictions` says; when
        even that is not enough, move `ctx`'s own data off the device for what is still short, and keep
        its later data off the device."""
        cached = [(k, c.device_bytes) for k, c in self.contexts.items() if c.device == ctx.device and c is not ctx]
        evict, fits = evictions(free, need, cached)
        freed = sum(self.contexts[key].device_bytes for key in evict)
        for key in evict:
            self._drop(key)
        self.evicted_for_room += len(evict)
        if not fits:
            ctx.device_cache = False
            freed += ctx.demote(need - free - freed)
        if freed:
            release_memory(ctx.device)
        return evict

    def keeps(self, ctx: ProblemContext, size: int) -> bool:
        """May `size` more bytes of `ctx`'s data stay on its device (the timing inputs, kept beyond the
        trials' share of the device, as they always were)? Not where they would take a candidate's room
        (`_device_budget`); older problems give way when that makes room."""
        if not ctx.device_cache:
            return False
        budget = self._device_budget(ctx, size, share=False)
        while self._used(ctx.device, "device_bytes") + size > budget:
            if not self._evict_oldest(keep=ctx):
                return False
        return True

    def evict_for_retry(self, spec: ReferenceSpec) -> int:
        """`spec`'s reference ran out of memory on its device: forget every problem cached there (this
        one too, so that it is built again, with its data off the device when its own cache was part of
        the memory in use, or when no cache held any: then krefine's buffers beside it or its
        allocator's fragments were what was short, as for a 16 GiB-input problem on an 80 GB card,
        issue 39). Returns the device bytes the caches held."""
        device, mine = spec.device, self.code_key(spec.code)
        on_device = [k for k, c in self.contexts.items() if c.device == device]
        held = sum(self.contexts[k].device_bytes for k in on_device)
        if held == 0:
            self.off_device.add(spec.key())
        for key in on_device:
            if key[0] == mine and self.contexts[key].device_bytes > 0:
                self.off_device.add(key)
            self._drop(key)
        self.evicted_for_room += sum(1 for k in on_device if k[0] != mine)
        release_memory(device)
        return held

    def evict_others(self, ctx: ProblemContext) -> int:
        """`ctx`'s problem ran out of memory on its device while a candidate of it is being evaluated:
        every other problem cached there gives way; when they held nothing, `ctx`'s own cached data
        moves off the device (what is lent to the candidate's process stays allocated until it lets go).
        Returns the device bytes freed (0: krefine's own caches were not in the way, and a retry would
        not help)."""
        others = [k for k, c in self.contexts.items() if c.device == ctx.device and c is not ctx]
        held = sum(self.contexts[k].device_bytes for k in others)
        for key in others:
            self._drop(key)
        self.evicted_for_room += len(others)
        if held == 0 and ctx.device_bytes > 0:
            ctx.device_cache = False
            held = ctx.demote(ctx.device_bytes)
        if held:
            release_memory(ctx.device)
        return held

    def memory_figures(self, spec: ReferenceSpec) -> dict[str, Any]:
        """The device memory figures of `spec`'s problem as a verdict records them (kb_memory.figures)."""
        if spec.device.type != "cuda":
            return {}
        footprint, planned = self.known_sizes(spec)
        state = device_state(spec.device)
        held = self.device_bytes(spec.device)
        return figures(state.total, state.available + held, held, footprint, planned, spec.mode == "strict")

    def known_sizes(self, spec: ReferenceSpec) -> tuple[Footprint | None, int | None]:
        """`spec`'s problem's footprint and planned input bytes, from its context or, when the context
        was dropped, from what it had measured."""
        ctx = self.contexts.get(spec.key())
        if ctx is not None:
            return ctx.footprint, ctx.planned_bytes
        return self.sizes.get(spec.key(), (None, None))

    def host_bytes(self, device: torch.device) -> int:
        return self._used(device, "host_bytes")

    def device_bytes(self, device: torch.device) -> int:
        return self._used(device, "device_bytes")

    def move_off_device(self, spec: ReferenceSpec) -> None:
        """Forget every cached problem on `spec`'s device (freeing its memory) and keep this problem's
        reference data off the device from now on."""
        self.off_device.add(spec.key())
        for key in [k for k, c in self.contexts.items() if c.device == spec.device]:
            self._drop(key)
        release_memory(spec.device)

    def _evict_oldest(self, keep: ProblemContext | None) -> bool:
        victim = next((key for key, ctx in self.contexts.items() if ctx is not keep), None)
        if victim is None:
            return False
        device = self._drop(victim).device  # drop the last reference before freeing memory
        release_memory(device)
        return True

    def _drop(self, key: tuple[Any, ...]) -> ProblemContext:
        """Forget the context of `key` (its memory goes with the last reference), keeping its sizes."""
        ctx = self.contexts.pop(key)
        self.sizes[key] = (ctx.footprint, ctx.planned_bytes)
        let_go()
        return ctx

    def _used(self, device: torch.device, attr: str) -> int:
        return sum(getattr(c, attr) for c in self.contexts.values() if c.device == device)

    def _device_budget(self, ctx: ProblemContext, holding: int, share: bool = True) -> int:
        """The most krefine's cache may hold on `ctx`'s device: DEVICE_CACHE_FRACTION of it (with
        `share`; without, no such bound), and on a CUDA device once the problem's footprint is known
        never more than what leaves room for a candidate of it and the worker's serving beside the cache
        (Footprint.reserve): the device's available memory, the cache itself and `holding` (the data
        being placed, allocated already), less that reserve."""
        if not ctx.device_cache:
            return 0
        budget = memory_budgets(ctx.device)[0] if share else 1 << 62
        if ctx.device.type != "cuda" or ctx.footprint is None:
            return budget
        used = self._used(ctx.device, "device_bytes")
        room = cache_room(device_state(ctx.device), used, holding, ctx.footprint, ctx.mode == "strict")
        return min(budget, room)

    def place(self, ctx: ProblemContext, in_size: int, size: int, remaining: int, lean_ok: bool) -> Tier:
        """Choose a tier for one trial (`in_size` bytes of inputs, `size` with the output), evicting
        older problems when that makes room. The choice looks ahead: when this and the `remaining - 1`
        trials after it, plus the timing inputs, fit on the device only without their outputs, every
        trial keeps just its inputs there, rather than the first few keeping everything and the rest
        landing in RAM (copied per candidate) or being rebuilt on the CPU. What fits is what leaves room
        for a candidate beside the cache (`_device_budget`)."""
        device_budget = self._device_budget(ctx, size)
        host_budget = memory_budgets(ctx.device)[1]
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
        host_used = self._used(ctx.device, "host_bytes")
        if host_budget and host_used + size <= host_budget:
            return "host"
        if lean and host_budget and host_used + in_size <= host_budget:
            return "host_inputs"
        return "recompute"


def select_device(request: dict[str, Any]) -> torch.device:
    """The request's device, made current for CUDA (the worker sees one GPU)."""
    device = normalize_device(request["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def time_reference(
    ctx: ProblemContext, timing: dict[str, Any], flusher: kb_timing.L2Flusher, key: int | None
) -> list[float]:
    """The reference timed here, in the worker, as reference work, with KernelBench's loop (faithful
    mode, as its candidates are timed; strict mode times the reference in a process of its own, as its
    candidates are: kb_eval.time_strict_reference)."""
    assert ctx.ref_model is not None
    model = compiled_reference(ctx.ref_model, timing.get("reference_compile"))
    with ctx.cache.reference_work():
        return kb_timing.time_callable(model, ctx.timing_inputs(), ctx.device, timing, flusher)


def compiled_reference(model: torch.nn.Module, spec: dict[str, Any] | None) -> Any:
    """`eval.reference = "compile"`: the reference under torch.compile, as KernelBench's
    measure_ref_program_time(use_torch_compile=True) makes it (dynamo reset first; compiling happens
    lazily in the timer's warm-up calls). Only timing uses it: correctness compares with the eager
    reference's outputs. Absent spec: the eager model."""
    if not spec:
        return model
    torch._dynamo.reset()
    return torch.compile(model, backend=spec["backend"], mode=spec["mode"])


def reference_mode(timing: dict[str, Any]) -> str:
    """What a result records as its reference timing mode: `eager` or `compile (backend, mode)`."""
    spec = timing.get("reference_compile")
    return f"compile ({spec['backend']}, {spec['mode']})" if spec else "eager"
