"""Device memory admission (kb_memory, kb_reference.ReferenceCache): a problem's footprint measured as its
trials are built, what a candidate needs beside krefine's cache, the cache's own data moving off the
device with the same bits, and when a problem does not fit a device at all. The figures are fixed inputs
(no GPU here): what is asserted is each decision and the bits handed out, never a measured size."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch

import kb_memory
import kb_reference
from harness_client import HOSTILE
from kb_memory import GIB, DeviceState, Footprint, figures

ADD = (HOSTILE / "problem_add.py").read_text()
CPU = torch.device("cpu")

# Level 1 problem 87 (a 1x1 convolution): 4 GiB of inputs, an 8 GiB fp32 output, a forward that
# allocates its output (figures as on the H100 that ran out of memory, issue 39).
CONV87 = Footprint(inputs=4 * GIB, output=8 * GIB, forward=8 * GIB)
H100 = 80 * GIB
CARD_24 = 24 * GIB


def test_a_candidates_working_set_is_estimated_from_the_references_forward() -> None:
    assert CONV87.check() == 28 * GIB  # allclose's temporaries on an 8 GiB output
    assert CONV87.candidate() == 8 * GIB + 28 * GIB + kb_memory.CONTEXT_BYTES
    # Strict mode compares in the worker; the candidate's process clones its inputs instead.
    assert CONV87.candidate(strict=True) == 8 * GIB + 4 * GIB + kb_memory.CONTEXT_BYTES
    # The worker compares slice by slice: one slice's temporaries, not 28 GiB.
    assert CONV87.worker_check() == kb_memory.SLICE_CHECK_BYTES < GIB
    # Lent buffers: the input set and the output slot, and in faithful mode the expected output.
    assert CONV87.lent(strict=True) == 4 * GIB + 8 * GIB
    assert CONV87.lent() == 4 * GIB + 8 * GIB + 8 * GIB
    # The worker, serving a checked call on fresh inputs: the pristine set, the output's copy, and the
    # reference's forward on a clone of the set (larger here than the sliced comparison).
    assert CONV87.serving() == 4 * GIB + 8 * GIB + (4 + 8) * GIB
    assert CONV87.kernelbench() == (4 + 8 + 8 + 28) * GIB + kb_memory.CONTEXT_BYTES
    head = int(H100 * kb_memory.HEADROOM_FRACTION)
    # Strict: the process, the lent buffers and the worker's checked call at once.
    assert CONV87.reserve(H100, strict=True) == CONV87.candidate(True) + CONV87.lent(True) + CONV87.serving() + head
    # Faithful: KernelBench's loop in the process (check included, a trial made per use beside it) is the
    # peak; the probes after it find the process's allocator emptied.
    loop = CONV87.candidate() + (4 + 8) * GIB + (4 + 8) * GIB
    probes = 8 * GIB + kb_memory.CONTEXT_BYTES + CONV87.lent() + CONV87.serving()
    assert loop > probes
    assert CONV87.reserve(H100) == loop + head
    # Issue 39: level 1's problem 87 stays on an 80 GB card in both modes, its own data cached beside it.
    assert CONV87.reserve(H100) + CONV87.inputs + CONV87.output <= H100
    assert CONV87.reserve(H100, strict=True) + CONV87.inputs + CONV87.output <= H100
    bigger = CONV87.merged(Footprint(4 * GIB, 8 * GIB, 9 * GIB))
    assert bigger == Footprint(4 * GIB, 8 * GIB, 9 * GIB)


def test_the_cache_keeps_only_what_leaves_room_for_a_candidate() -> None:
    small = Footprint(inputs=GIB, output=GIB, forward=GIB)
    state = DeviceState(total=H100, free=60 * GIB, idle=2 * GIB)
    # 62 GiB available and 10 GiB cached, less the reserve of a problem with 1 GiB tensors.
    assert kb_memory.cache_room(state, 10 * GIB, 0, small) == 72 * GIB - small.reserve(H100)
    # Data being placed counts as krefine's (allocated already, so not in `free`).
    assert kb_memory.cache_room(state, 10 * GIB, 3 * GIB, small) == 75 * GIB - small.reserve(H100)
    # Problem 87 on an 80 GB card: at least its own trial (inputs and output) stays cached beside its
    # candidate in both modes (strict mode's process holds no check, so two do there).
    for strict in (False, True):
        room = kb_memory.cache_room(DeviceState(H100, 78 * GIB, 0), 0, 0, CONV87, strict)
        assert room == 78 * GIB - CONV87.reserve(H100, strict)
        assert room >= CONV87.inputs + CONV87.output
    # On a 24 GB card nothing may stay.
    assert kb_memory.cache_room(DeviceState(CARD_24, 23 * GIB, 0), 0, 0, CONV87) == 0


def test_a_problem_does_not_fit_only_where_kernelbench_would_not_fit_either() -> None:
    on_h100 = figures(H100, 78 * GIB, 0, CONV87, None)
    on_24 = figures(CARD_24, 23 * GIB, 0, CONV87, None)
    # A candidate that runs out of memory: the problem's fault only where KernelBench's flow is too large.
    assert not kb_memory.problem_does_not_fit(on_h100, reference_failed=False, candidate_failed=True)
    assert kb_memory.problem_does_not_fit(on_24, reference_failed=False, candidate_failed=True)
    assert not kb_memory.problem_does_not_fit(on_24, reference_failed=False, candidate_failed=False)
    # The reference: when its own inputs and forward are over what the device gives, or its first forward
    # failed (no footprint); a reference that fits alone ran out beside something else.
    assert not kb_memory.problem_does_not_fit(on_24, reference_failed=True, candidate_failed=False)
    tiny = figures(8 * GIB, 7 * GIB, 0, CONV87, None)
    assert kb_memory.problem_does_not_fit(tiny, reference_failed=True, candidate_failed=False)
    unknown = figures(CARD_24, 23 * GIB, 0, None, 30 * GIB)
    assert kb_memory.problem_does_not_fit(unknown, reference_failed=True, candidate_failed=False)
    # Level 1's problem 45 (16 GiB of inputs, a small output) on an 80 GB card: its reference ran out
    # before its first forward was measured, with 62.5 GiB free to krefine. Three input sets fit: the
    # problem is not too large, the memory was krefine's (issue 39).
    l1_45 = figures(H100, 62 * GIB, 0, None, 16 * GIB)
    assert not kb_memory.problem_does_not_fit(l1_45, reference_failed=True, candidate_failed=False)
    said = kb_memory.unexplained_out_of_memory(l1_45)
    assert "fits this device" in said and "krefine's own data" in said and "16.0 GiB" in said
    # Nothing of its size known: krefine cannot tell, and does not blame the problem.
    assert not kb_memory.problem_does_not_fit(figures(H100, 62 * GIB, 0, None, None), True, False)
    sentence = kb_memory.does_not_fit(on_24, reference_failed=False)
    assert "does not fit this device" in sentence and "not your code's fault" in sentence
    assert "49.0 GiB" in sentence and "24.0 GiB" in sentence


def _context(cache: kb_reference.ReferenceCache | None = None, code: str = ADD) -> kb_reference.ProblemContext:
    cache = cache or kb_reference.ReferenceCache()
    ctx = cache.context(kb_reference.ReferenceSpec(code, CPU))
    assert ctx.error is None
    return ctx


def _snapshot(ctx: kb_reference.ProblemContext) -> list[tuple[list[Any], Any, torch.Tensor]]:
    """Every trial's inputs, output and RNG state, as a candidate would get them, copied."""
    out = []
    for index, seed in enumerate(ctx.trial_seeds(5)):
        data = ctx.trial(5, index, seed)
        out.append(([t.clone() for t in data.inputs], data.output.clone(), data.rng.cpu.clone()))
    return out


def _same(a: list[tuple[list[Any], Any, torch.Tensor]], b: list[tuple[list[Any], Any, torch.Tensor]]) -> bool:
    return all(
        all(torch.equal(x, y) for x, y in zip(ia, ib, strict=True)) and torch.equal(oa, ob) and torch.equal(ra, rb)
        for (ia, oa, ra), (ib, ob, rb) in zip(a, b, strict=True)
    )


def test_a_dropped_context_keeps_its_sizes_for_the_verdicts_figures() -> None:
    """A reference that ran out of memory drops its context before the verdict's figures are taken: its
    sizes stay known (they were lost, and a 16 GiB-input problem was called too large for an 80 GB
    card), and its data stays off the device when it is built again."""
    cache = kb_reference.ReferenceCache()
    spec = kb_reference.ReferenceSpec(ADD, CPU)
    ctx = cache.context(spec)
    _snapshot(ctx)
    ctx.planned_bytes = 2 * 64 * 64 * 4
    sizes = (ctx.footprint, ctx.planned_bytes)
    assert sizes[0] is not None
    cache.evict_for_retry(spec)
    assert not cache.contexts and spec.key() in cache.off_device
    assert cache.known_sizes(spec) == sizes
    again = cache.context(spec)
    assert not again.device_cache
    assert cache.known_sizes(spec) == (None, None)  # the new context's, measured afresh


class _Cycle:
    """An object that holds itself: only a collection that walks it frees it."""

    def __init__(self) -> None:
        self.me = self


def test_a_collection_walks_only_what_was_made_since_the_last_one() -> None:
    """kb_memory.collect freezes what survives it, so that a worker's collection after each evaluation
    walks only what that evaluation made (45-60 ms each on the GPU host when it walked everything); what
    the job made and left in a cycle is still freed by the next one."""
    kb_memory.collect()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    garbage = _Cycle()
    gone = weakref.ref(garbage)
    del garbage
    kb_memory.collect()
    assert gone() is None
    assert gc.get_freeze_count() >= frozen


def test_a_dropped_problems_cycles_are_freed_though_an_earlier_collection_froze_them() -> None:
    """A problem's cached data dropped from the cache (here: its reference ran out of memory) is let go:
    the next collection walks every object again, so a cycle in what the cache held (a problem's code:
    its functions' globals hold its classes) frees its memory, device memory included, now and not at
    the next settling collection (kb_memory.SETTLE_EVERY)."""
    cache = kb_reference.ReferenceCache()
    spec = kb_reference.ReferenceSpec(ADD, CPU)
    ctx = cache.context(spec)
    ctx.kept_for_test = _Cycle()
    held = weakref.ref(ctx.kept_for_test)
    kb_memory.collect()  # ctx and what it holds are frozen now
    del ctx
    cache.evict_for_retry(spec)  # drops the context, then releases memory
    assert held() is None


def test_the_footprint_is_measured_as_trials_are_built() -> None:
    ctx = _context()
    assert ctx.footprint is None
    _snapshot(ctx)
    size = 64 * 64 * 4  # problem_add: two 64 x 64 fp32 inputs, one output
    # On the CPU torch counts no allocations: the forward counts as its output.
    assert ctx.footprint == Footprint(inputs=2 * size, output=size, forward=size)


@pytest.mark.parametrize("host_room", [True, False])
def test_own_data_moves_off_the_device_with_the_same_bits(monkeypatch: pytest.MonkeyPatch, host_room: bool) -> None:
    """The cache's own data gives way (timing inputs first, then trials from the last): to RAM within
    its budget, else made again per use; a candidate gets the same bits afterwards."""
    monkeypatch.setattr(kb_reference, "memory_budgets", lambda device: (10**9, 10**9 if host_room else 0))
    ctx = _context()
    before = _snapshot(ctx)
    timing = [t.clone() for t in ctx.timing_inputs()]
    assert {e.tier for e in ctx.trials[5] if e is not None} == {"device"}
    held = ctx.device_bytes
    assert ctx.footprint is not None
    trial = ctx.footprint.inputs + ctx.footprint.output
    # Only what is short goes: the timing inputs, then the last trial.
    assert ctx.demote(ctx.footprint.inputs + 1) == ctx.footprint.inputs + trial
    assert ctx.timing_inputs_cache is None
    assert [e.tier for e in ctx.trials[5] if e is not None][-2:] == ["device", "host" if host_room else "recompute"]
    # All of it.
    ctx.demote(held)
    assert ctx.device_bytes == 0
    assert {e.tier for e in ctx.trials[5] if e is not None} == {"host" if host_room else "recompute"}
    assert ctx.host_bytes == (5 * trial if host_room else 0)
    assert _same(before, _snapshot(ctx))
    assert all(torch.equal(a, b) for a, b in zip(timing, ctx.timing_inputs(), strict=True))


def test_inputs_a_candidate_wrote_into_are_made_again_not_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kb_reference, "memory_budgets", lambda device: (10**9, 10**9))
    ctx = _context()
    before = _snapshot(ctx)
    first = ctx.trial(5, 0, ctx.trial_seeds(5)[0])
    first.inputs[0].add_(1.0)  # a candidate writing into the inputs it was handed
    assert not ctx.verify_trial(5, 0)
    ctx.demote(ctx.device_bytes)
    assert ctx.trials[5][0] is not None and ctx.trials[5][0].tier == "recompute"
    assert _same(before, _snapshot(ctx))


def test_lean_trials_move_to_ram_as_inputs_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial that keeps only its inputs on the device keeps only its inputs in RAM; the forward runs
    per use, as it did on the device."""
    ctx = _context()
    size = 64 * 64 * 4
    # Room for five trials' inputs and the timing inputs, not their outputs.
    monkeypatch.setattr(kb_reference, "memory_budgets", lambda device: (6 * 2 * size, 10**9))
    before = _snapshot(ctx)
    assert {e.tier for e in ctx.trials[5] if e is not None} == {"device_inputs"}
    ctx.demote(ctx.device_bytes)
    assert {e.tier for e in ctx.trials[5] if e is not None} == {"host_inputs"}
    assert ctx.host_bytes == 5 * 2 * size
    assert _same(before, _snapshot(ctx))


def test_other_problems_give_way_before_the_problems_own_data() -> None:
    cache = kb_reference.ReferenceCache()
    other = _context(cache, ADD.replace("return a + b", "return a + b + 0 * 1"))
    _snapshot(other)
    mine = _context(cache)
    _snapshot(mine)
    (other_key, _), held_other, held_mine = cache.contexts, other.device_bytes, mine.device_bytes
    # Enough once the other problem is gone: the problem's own data stays.
    assert cache.admit(mine, 0, held_other) == [other_key]
    assert list(cache.contexts.values()) == [mine] and mine.device_bytes == held_mine and mine.device_cache
    # Still short: its own data moves off the device, and stays off.
    cache.admit(mine, 0, held_mine)
    assert mine.device_bytes == 0 and not mine.device_cache
    assert {e.tier for e in mine.trials[5] if e is not None} == {"recompute"}


def test_a_request_out_of_memory_while_serving_moves_the_problems_own_data_when_nothing_else_is_cached() -> None:
    cache = kb_reference.ReferenceCache()
    ctx = _context(cache)
    before = _snapshot(ctx)
    held = ctx.device_bytes
    assert cache.evict_others(ctx) == held
    assert ctx.device_bytes == 0 and not ctx.device_cache
    assert _same(before, _snapshot(ctx))
    # Nothing left on the device: a retry would not help.
    assert cache.evict_others(ctx) == 0


@pytest.mark.parametrize(
    "shape",
    [(3, 5), (70, 9, 11), (2, 5000), (1, 3, 4000), (4000,), ()],
)
def test_the_workers_sliced_comparison_answers_as_allclose_does(shape: tuple[int, ...], monkeypatch: Any) -> None:
    import kb_correctness

    monkeypatch.setattr(kb_correctness, "SLICE_ELEMENTS", 64)
    gen = torch.Generator().manual_seed(len(shape))
    expected = torch.randn(shape, generator=gen)
    for got in (expected.clone(), expected + 1e-6, expected * 1.5):
        assert kb_correctness.sliced_allclose(expected, got, 1e-4, 1e-4) == torch.allclose(
            expected, got, atol=1e-4, rtol=1e-4
        )
    if expected.numel() > 1:
        # One element off, in the last slice: found.
        got = expected.clone()
        got.view(-1)[-1] += 1.0
        assert not kb_correctness.sliced_allclose(expected, got, 1e-4, 1e-4)
        got = expected.clone()
        got.view(-1)[-1] = float("nan")
        assert not kb_correctness.sliced_allclose(expected, got, 1e-4, 1e-4)


@pytest.mark.parametrize("shape", [(70, 9, 11), (2, 5000), (4000,)])
def test_the_workers_sliced_mismatch_reports_what_the_whole_output_would(
    shape: tuple[int, ...], monkeypatch: Any
) -> None:
    """A failed trial's figures in the worker (max and mean difference, failing count, first failing
    element, non-finite count) come out of the slices as they would from the whole output."""
    import kb_correctness

    monkeypatch.setattr(kb_correctness, "SLICE_ELEMENTS", 64)
    gen = torch.Generator().manual_seed(7)
    expected = torch.randn(shape, generator=gen)
    got = expected.clone()
    flat = got.view(-1)
    flat[100] += 0.5
    flat[-3] = float("inf")
    flat[-70:-65] -= 2.0
    whole = kb_correctness.compare_trial(expected, got, 1e-4, 1e-4, 0)
    sliced = kb_correctness.compare_trial(expected, got, 1e-4, 1e-4, 0, sliced=True)
    assert not whole.passed and not sliced.passed
    assert whole.detail is not None and sliced.detail is not None
    assert sliced.max_diff == whole.max_diff == float("inf")
    assert sliced.avg_diff == whole.avg_diff == float("inf")
    assert (sliced.detail.bad, sliced.detail.nonfinite, sliced.detail.total) == (
        whole.detail.bad,
        whole.detail.nonfinite,
        whole.detail.total,
    ) == (7, 1, expected.numel())
    assert sliced.detail.first_index == whole.detail.first_index
    assert (sliced.detail.expected, sliced.detail.got) == (whole.detail.expected, whole.detail.got)
    # Finite differences: the mean agrees to rounding.
    flat[-3] = expected.view(-1)[-3]
    whole = kb_correctness.compare_trial(expected, got, 1e-4, 1e-4, 0)
    sliced = kb_correctness.compare_trial(expected, got, 1e-4, 1e-4, 0, sliced=True)
    assert sliced.max_diff == whole.max_diff
    assert sliced.avg_diff == pytest.approx(whole.avg_diff, rel=1e-5)
    assert sliced.detail is not None and sliced.detail.bad == 6


_IN_PLACE = ADD.replace("return a + b", "{body}")


def _no_room_for_a_clone(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(value: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB.")

    monkeypatch.setattr(kb_reference, "clone_tensors", refuse)


def test_a_checked_call_whose_clone_does_not_fit_runs_the_reference_on_the_inputs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 39: 1/45's 16 GiB input set beside the one lent to the candidate left no room on an 80 GB card
    for the clone a checked call ran the reference on (krefine's out-of-memory, not the problem's). The
    reference then runs on the call's inputs themselves: same output, inputs untouched."""
    ctx = _context()
    a, b = torch.rand(64, 64), torch.rand(64, 64)
    with_clone = ctx.reference_output([a, b])
    _no_room_for_a_clone(monkeypatch)
    pristine = (a.clone(), b.clone())
    in_place = ctx.reference_output([a, b])
    assert torch.equal(in_place, with_clone)
    assert torch.equal(a, pristine[0]) and torch.equal(b, pristine[1])
    assert (ctx.counts["strict_checks"], ctx.counts["checks_in_place"]) == (2, 1)


def test_a_reference_that_changes_its_inputs_in_place_has_them_written_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx = _context(code=_IN_PLACE.format(body="a.mul_(2)\n        return a + b"))
    a, b = torch.rand(64, 64), torch.rand(64, 64)
    pristine = (a.clone(), b.clone())
    expected = ctx.reference_output([a, b])
    _no_room_for_a_clone(monkeypatch)
    assert torch.equal(ctx.reference_output([a, b]), expected)
    assert torch.equal(a, pristine[0]) and torch.equal(b, pristine[1])
    # An output that is the changed input itself cannot be kept beside the restored input: the
    # out-of-memory error stands (the reference's, as before), and the inputs are restored still.
    ctx = _context(code=_IN_PLACE.format(body="return a.add_(b)"))
    with pytest.raises(torch.OutOfMemoryError):
        ctx.reference_output([a, b])
    assert torch.equal(a, pristine[0]) and torch.equal(b, pristine[1])
