"""GPU memory admission on a CUDA device, run by hand on a GPU box (CI has none):

    python tests/python/run_gpu_memory_check.py

Problem A's reference data (2 GiB inputs a trial) is cached on cuda:0, then an allocation standing for
another process leaves 8 GiB free, then problem B (the same size) is prepared. Three workers:

- `admission`: B's planned bytes do not fit the free memory, so A's data is evicted before B starts;
- `retry`: admission off; B's reference runs out of memory next to A's data, which is freed, and B is
  prepared again;
- `neither`: admission and the retry off (krefine before them): B's preparation ends in a
  reference_error that krefine caused.

A fourth, `room` (issue 39): a problem whose output is twice its inputs (a sixteenth of the device, as
level 1 problem 87's 8 GiB output is of an 80 GB card) is prepared; its measured footprint leaves the
cache only what fits beside a candidate as large as its reference, and a reference-equivalent candidate
then evaluates correct with `metadata.device_memory` recorded.

Prints one JSON line per worker; exits 1 unless admission and retry end `ready`, `neither` does not,
and `room` keeps the candidate's room and ends correct.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness_client import evaluate_request, prepare_request

# isort: split
# harness_client puts the harness on sys.path.
import kb_eval
import kb_prepare

DEVICE = "cuda:0"
GIB = 1 << 30


def problem(gib: int, tag: int) -> str:
    return f"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * {tag}.0


def get_inputs():
    return [torch.rand({gib * GIB // 4})]


def get_init_inputs():
    return []
"""


def scenario(name: str) -> dict[str, Any]:
    worker = kb_eval.Worker(isolate=False)
    cache = worker.references
    if name in ("retry", "neither"):
        cache.make_room = lambda ctx: []  # type: ignore[method-assign]
    if name == "neither":
        # No retry: nothing freed, and the problem taken as too large for the device.
        cache.evict_for_retry = lambda spec: 0  # type: ignore[method-assign]
        cache.memory_figures = lambda spec: {"available_bytes": 0, "inputs_bytes": 1}  # type: ignore[method-assign]
    a = kb_prepare.prepare(prepare_request(1, problem(2, 1), device=DEVICE), worker)
    held_a = sum(c.device_bytes for c in cache.contexts.values())
    free, _ = torch.cuda.mem_get_info(DEVICE)
    hog = torch.empty(max(free - 8 * GIB, 0), dtype=torch.uint8, device=DEVICE)
    b = kb_prepare.prepare(prepare_request(2, problem(2, 2), device=DEVICE), worker)
    result = {
        "scenario": name,
        "a": a["status"],
        "a_device_gib": round(held_a / GIB, 2),
        "free_before_b_gib": round(torch.cuda.mem_get_info(DEVICE)[0] / GIB, 2),
        "b": b["status"],
        "b_feedback": b["feedback"][:160],
        "b_tiers": b["tiers"],
        "evicted_for_room": cache.evicted_for_room,
        "problems_cached": len(cache.contexts),
    }
    del hog
    cache.contexts.clear()
    worker.close()
    torch.cuda.empty_cache()
    return result


def room() -> dict[str, Any]:
    """A problem whose output is twice its inputs, prepared and then evaluated (reference-equivalent)."""
    import kb_memory

    total = torch.cuda.mem_get_info(DEVICE)[1]
    elements = total // 64 // 4  # inputs a sixty-fourth of the device, the output twice that
    code = f"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.cat([x, x * 2.0])


def get_inputs():
    return [torch.rand({elements})]


def get_init_inputs():
    return []
"""
    worker = kb_eval.Worker(isolate=False)
    prepared = kb_prepare.prepare(prepare_request(1, code, device=DEVICE), worker)
    (ctx,) = worker.references.contexts.values()
    state = kb_memory.device_state(ctx.device)
    assert ctx.footprint is not None
    reserve = ctx.footprint.reserve(state.total)
    candidate = code.replace("class Model(", "class ModelNew(")
    result = kb_eval.evaluate(evaluate_request(2, code, candidate, Path("."), device=DEVICE), worker)
    out = {
        "scenario": "room",
        "prepared": prepared["status"],
        "tiers": prepared["tiers"],
        "footprint_gib": [round(x / GIB, 2) for x in (ctx.footprint.inputs, ctx.footprint.output, ctx.footprint.forward)],
        "cached_gib": round(ctx.device_bytes / GIB, 2),
        "available_gib": round(state.available / GIB, 2),
        "reserve_gib": round(reserve / GIB, 2),
        "room_kept": state.available >= reserve or ctx.device_bytes == 0,
        "status": result["status"],
        "device_memory": result["metadata"].get("device_memory"),
    }
    worker.references.contexts.clear()
    worker.close()
    torch.cuda.empty_cache()
    return out


def main() -> int:
    results = {name: scenario(name) for name in ("admission", "retry", "neither")}
    results["room"] = room()
    for r in results.values():
        print(json.dumps(r), flush=True)
    ok = (
        results["admission"]["b"] == "ready"
        and results["retry"]["b"] == "ready"
        and results["neither"]["b"] == "reference_error"
        and results["room"]["room_kept"]
        and results["room"]["status"] == "correct"
    )
    print("ok" if ok else "FAIL", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
