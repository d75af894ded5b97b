"""How fast a stored seed reaches the GPU: the input store's host read (pageable, then `.to(cuda)`)
against its direct load (pinned chunks copied up as they are read and checked), on one synthetic
entry of SIZE_GB per seed, written to the disk store's folder or to /dev/shm (the in-memory tier).

    python3 bench/gpu/store_load.py [--gb 4] [--folder /dev/shm/kb-load]

Prints seconds and GB/s of each path, and whether both give the same bits as `get_inputs()`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "src", "harness"))

import torch  # noqa: E402

import kb_store  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=4.0)
    parser.add_argument("--folder", default="/dev/shm/kb-load")
    args = parser.parse_args()
    elements = int(args.gb * (1 << 30)) // 4
    code = (
        "import torch\nimport torch.nn as nn\n"
        "class Model(nn.Module):\n    def forward(self, x):\n        return x\n"
        f"def get_inputs():\n    return [torch.rand({elements})]\n"
        "def get_init_inputs():\n    return []\n"
    )
    shutil.rmtree(args.folder, ignore_errors=True)
    os.makedirs(args.folder)
    request = {
        "code": code,
        "seed": 42,
        "trials": 1,
        "timing": False,
        "torch": torch.__version__,
        "entry": os.path.join(args.folder, "entry"),
        "tmp": os.path.join(args.folder, "tmp"),
    }
    started = time.perf_counter()
    answer = kb_store.generate(request)
    print(f"generate: {answer['status']} in {time.perf_counter() - started:.1f} s")
    seed = answer["seeds"][0]
    device = torch.device("cuda")
    gb = elements * 4 / 1e9
    results = {}
    for label in ("host then .to(cuda)", "direct to cuda", "host then .to(cuda)", "direct to cuda"):
        torch.cuda.synchronize()
        started = time.perf_counter()
        if label.startswith("host"):
            loaded = kb_store.load(request["entry"], code, seed)
            assert loaded is not None
            values = [v.to(device) for v in loaded[0]]
        else:
            loaded = kb_store.load(request["entry"], code, seed, device)
            assert loaded is not None
            values = loaded[0]
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        results[label] = values
        print(f"{label:>20}: {seconds:6.2f} s, {gb / seconds:5.2f} GB/s")
    same = torch.equal(results["host then .to(cuda)"][0], results["direct to cuda"][0])
    print(f"same bits: {same}")
    shutil.rmtree(args.folder, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
