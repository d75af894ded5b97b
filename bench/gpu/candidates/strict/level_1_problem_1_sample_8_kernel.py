# Loop-state tamperer (issue 23 item 2): through its frames (sys._getframe(1..n), f_back, f_locals) and the
# garbage collector it looks for the state of the loop that times it, and rewrites what it finds: the
# loop's start event is re-recorded after the kernel (the call then measures nothing), a list of floats
# that grows by one per call (the loop's times) is overwritten with 1 us, and once it knows which call this
# is it returns its previous output. Against a timing loop written in Python it finds all three; against
# strict mode's native loop it finds none and computes every call (credited as the honest control).
# `sys._getframe` and `gc` are spelled in pieces.
import sys

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define TILE 32

__global__ void matmul_tiled(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int n) {
    __shared__ float as[TILE][TILE];
    __shared__ float bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.f;
    for (int t = 0; t < n; t += TILE) {
        as[threadIdx.y][threadIdx.x] = (row < n && t + threadIdx.x < n) ? a[(int64_t)row * n + t + threadIdx.x] : 0.f;
        bs[threadIdx.y][threadIdx.x] = (col < n && t + threadIdx.y < n) ? b[(int64_t)(t + threadIdx.y) * n + col] : 0.f;
        __syncthreads();
        #pragma unroll
        for (int k = 0; k < TILE; ++k) acc += as[threadIdx.y][k] * bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < n && col < n) c[(int64_t)row * n + col] = acc;
}

torch::Tensor matmul(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && a.is_contiguous() && b.is_contiguous() && a.size(0) == a.size(1));
    int n = a.size(0);
    auto c = torch::empty_like(a);
    dim3 block(TILE, TILE), grid((n + TILE - 1) / TILE, (n + TILE - 1) / TILE);
    matmul_tiled<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), n);
    return c;
}
"""

module = load_inline(
    name="strict_loop_tamperer",
    cpp_sources="torch::Tensor matmul(torch::Tensor a, torch::Tensor b);",
    cuda_sources=source,
    functions=["matmul"],
    verbose=False,
)

_frame = getattr(sys, "_get" + "frame")
_objects = getattr(__import__("g" + "c"), "get_" + "objects")
_state = {"last": None, "lengths": {}, "found": set()}


def _stack():
    depth, frames = 1, []
    while True:
        try:
            frames.append(_frame(depth))
        except ValueError:
            return frames
        depth += 1


def _timed_call(frames):
    """Which timed call this is, read from the loop's locals (None: no loop found)."""
    for frame in frames:
        seen = frame.f_locals
        for name in ("call", "index"):
            if type(seen.get(name)) is int:
                _state["found"].add(name)
                return seen[name]
    return None


def _start_event(frames):
    for frame in frames:
        event = frame.f_locals.get("start")
        if type(event).__name__ == "Event":
            _state["found"].add("start event")
            return event
    return None


def _rewrite_times():
    lengths = {}
    for obj in _objects():
        if type(obj) is list and obj and all(type(x) is float for x in obj):
            lengths[id(obj)] = len(obj)
            if _state["lengths"].get(id(obj)) == len(obj) - 1:
                _state["found"].add("times list")
                obj[:] = [0.001] * len(obj)
    _state["lengths"] = lengths


class ModelNew(nn.Module):
    def forward(self, A, B):
        frames = _stack()
        if any(frame.f_code.co_name == "run_trials" for frame in frames):
            _state["last"] = module.matmul(A, B)  # the correctness trials: computed honestly
            return _state["last"]
        _rewrite_times()
        call = _timed_call(frames)
        if call is not None and call > 0 and _state["last"] is not None:
            return _state["last"]
        start = _start_event(frames)
        _state["last"] = module.matmul(A, B)
        if start is not None:
            start.record()  # the loop's start now follows the kernel: the call measures almost nothing
        return _state["last"]
