"""The worker answering a candidate's process (kb_candidate.serve_reference): a reference that runs out of
device memory while serving a request makes krefine's own caches give way (other problems' reference data
on that device), and the request is answered once more; the candidate sees an error only when that fails
too. Real pipes; the problem context is a stand-in whose device is named, never used (no GPU here)."""

from __future__ import annotations

import multiprocessing
from typing import Any

import torch

import kb_candidate


class _Cache:
    def __init__(self) -> None:
        self.evicted = 0

    def evict_others(self, ctx: Any) -> int:
        self.evicted += 1
        return 1 << 30


class _Context:
    """Runs out of memory on its first `fails` timing_inputs requests."""

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


def _serve(ctx: _Context) -> tuple[dict[str, Any], Any]:
    worker, candidate = multiprocessing.Pipe()
    candidate.send(("timing_inputs",))
    candidate.send(("result", {"status": "correct"}))
    result = kb_candidate.serve_reference(worker, ctx)  # type: ignore[arg-type]
    return result, candidate.recv()


def test_other_problems_give_way_and_the_request_is_answered() -> None:
    ctx = _Context(fails=1)
    result, reply = _serve(ctx)
    assert result == {"status": "correct"}
    assert reply[0] == "ok" and torch.equal(reply[1][0], torch.ones(2))
    assert (ctx.cache.evicted, ctx.calls) == (1, 2)


def test_a_second_failure_is_the_candidates_error() -> None:
    ctx = _Context(fails=2)
    _, reply = _serve(ctx)
    assert reply[0] == "error"
    assert "OutOfMemoryError" in reply[1] and "timing_inputs" in reply[1]
    assert (ctx.cache.evicted, ctx.calls) == (1, 2)


def test_no_retry_off_the_gpu() -> None:
    ctx = _Context(fails=1, device="cpu")
    _, reply = _serve(ctx)
    assert reply[0] == "error"
    assert (ctx.cache.evicted, ctx.calls) == (0, 1)
