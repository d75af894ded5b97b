"""The worker making reference data for a job (kb_drive.serve_with_room): a reference that runs out of
device memory makes krefine's own caches give way (other problems' reference data on that device) and
the data is made once more; a failure then is the reference's (not the candidate's), marked out of
memory so that kb_eval evaluates again after freeing more. The problem context is a stand-in whose
device is named, never used (no GPU here)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kb_drive
import kb_pool


class _Cache:
    def __init__(self) -> None:
        self.evicted = 0

    def evict_others(self, ctx: Any) -> int:
        self.evicted += 1
        return 1 << 30


class _Context:
    """Runs out of memory on its first `fails` timing_inputs calls."""

    def __init__(self, fails: int, device: str = "cuda") -> None:
        self.device = torch.device(device)
        self.cache = _Cache()
        self.fails = fails
        self.calls = 0

    def timing_inputs(self) -> list[torch.Tensor]:
        self.calls += 1
        if self.calls <= self.fails:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB.")
        return [torch.ones(2)]


def test_other_problems_give_way_and_the_data_is_made() -> None:
    ctx = _Context(fails=1)
    made = kb_drive.serve_with_room(ctx, "the timing inputs", ctx.timing_inputs)
    assert torch.equal(made[0], torch.ones(2))
    assert (ctx.cache.evicted, ctx.calls) == (1, 2)


def test_a_second_failure_is_the_references_error() -> None:
    ctx = _Context(fails=2)
    with pytest.raises(kb_drive.ReferenceServingError) as caught:
        kb_drive.serve_with_room(ctx, "the timing inputs", ctx.timing_inputs)
    verdict = kb_pool.reference_error_verdict(caught.value)
    assert verdict.status == "reference_error"
    assert verdict.metadata["reference_out_of_memory"] is True
    assert "not your code's fault" in verdict.feedback[0]


def test_on_the_cpu_nothing_is_evicted() -> None:
    ctx = _Context(fails=1, device="cpu")
    with pytest.raises(kb_drive.ReferenceServingError):
        kb_drive.serve_with_room(ctx, "the timing inputs", ctx.timing_inputs)
    assert ctx.cache.evicted == 0
