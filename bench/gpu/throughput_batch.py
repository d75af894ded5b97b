"""Write the level-1 throughput batch as a KernelBench runs folder: 16 problems x 4 candidates.

    python3 bench/gpu/throughput_batch.py PROBLEMS.jsonl OUT_DIR [--problems 8,14,...] [--samples 0,1,2,3]

The problems are issue 24's (level 1: 8, 14, 15, 17, 43, 49, 54, 60, 64, 66, 70, 71, 77, 80, 86, 93).
Each gets four candidates of our own, so the batch exercises what a real one does (builds, correct
and incorrect verdicts, the reference's full cost):

- sample 0: the reference itself (`Model` renamed `ModelNew`): no build.
- sample 1: the reference's forward, then a float4 grid-stride copy kernel of its own (load_inline).
- sample 2: the reference's forward, then an `fmaf(x, 1, 0)` kernel (load_inline).
- sample 3: the reference's forward, then a kernel adding 1e-2 (load_inline): incorrect.

Every CUDA source names its problem, so no two candidates share a build. Outputs that are not fp32
skip the epilogue (the kernel is still built). The problem code is read from PROBLEMS (KernelBench's
dataset); nothing of it is stored here.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

PROBLEMS = "8,14,15,17,43,49,54,60,64,66,70,71,77,80,86,93"

KERNELS = {
    1: """
__global__ void epi(const float4* __restrict__ x, float4* __restrict__ y, int64_t n4) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n4;
         i += (int64_t)gridDim.x * blockDim.x) {
        y[i] = x[i];
    }
}
__global__ void epi_tail(const float* __restrict__ x, float* __restrict__ y, int64_t s, int64_t n) {
    int64_t i = s + blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
torch::Tensor run(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32);
    auto y = torch::empty_like(x);
    int64_t n = x.numel(), n4 = n / 4;
    auto stream = at::cuda::getCurrentCUDAStream();
    if (n4 > 0) {
        int blocks = (int)std::min<int64_t>((n4 + 255) / 256, 132 * 32);
        epi<<<blocks, 256, 0, stream>>>((const float4*)x.data_ptr<float>(),
                                        (float4*)y.data_ptr<float>(), n4);
    }
    if (n % 4) epi_tail<<<1, 4, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), n4 * 4, n);
    return y;
}
""",
    2: """
__global__ void epi(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaf(x[i], 1.0f, 0.0f);
}
torch::Tensor run(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32);
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    if (n > 0) epi<<<(unsigned)((n + 255) / 256), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
""",
    3: """
__global__ void epi(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + 1e-2f;
}
torch::Tensor run(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == torch::kFloat32);
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    if (n > 0) epi<<<(unsigned)((n + 255) / 256), 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
""",
}

EPILOGUE = '''

from torch.utils.cpp_extension import load_inline as _load_inline

_SOURCE = r"""
// krefine throughput batch: level 1 problem {pid}, sample {sample}
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
{kernel}
"""

_module = _load_inline(
    name="tb_l1_{pid}_s{sample}",
    cpp_sources="torch::Tensor run(torch::Tensor x);",
    cuda_sources=_SOURCE,
    functions=["run"],
    verbose=False,
)


class ModelNew(_Reference):
    def forward(self, *args):
        y = super().forward(*args)
        if isinstance(y, torch.Tensor) and y.dtype == torch.float32 and y.is_cuda:
            return _module.run(y.contiguous())
        return y
'''


def candidate(code: str, pid: int, sample: int) -> str:
    if sample == 0:
        return re.sub(r"\bModel\b", "ModelNew", code)
    body = re.sub(r"\bModel\b", "_Reference", code)
    return body + EPILOGUE.format(pid=pid, sample=sample, kernel=KERNELS[sample])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("problems_jsonl", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--problems", default=PROBLEMS)
    ap.add_argument("--samples", default="0,1,2,3", help="which of the four candidates to write")
    a = ap.parse_args()
    wanted = {int(p) for p in a.problems.split(",")}
    samples = [int(s) for s in a.samples.split(",")]
    a.out.mkdir(parents=True, exist_ok=True)
    written = 0
    with a.problems_jsonl.open() as f:
        for line in f:
            d = json.loads(line)
            if d["level"] != 1 or d["problem_id"] not in wanted:
                continue
            for s in samples:
                name = f"level_1_problem_{d['problem_id']}_sample_{s}_kernel.py"
                (a.out / name).write_text(candidate(d["code"], d["problem_id"], s))
                written += 1
    print(f"{written} candidates in {a.out}")


if __name__ == "__main__":
    main()
