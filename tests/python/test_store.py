"""The on-disk input store (kb_store): what it hands back is bit for bit what KernelBench's
`set_seed(seed); get_inputs()` makes, including the CPU generator's state after it; a hit makes
nothing; a corrupt entry is refused by the loader and rebuilt by the next generation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import kb_problem
import kb_store
from harness_client import HARNESS_DIR, HOSTILE

MIXED = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x, idx, k):
        return x[idx] * k

def get_inputs():
    return [torch.randn(7, 5), torch.randint(0, 7, (3,)), 2.5, torch.rand(4) > 0.5]

def get_init_inputs():
    return []
"""

ON_A_VIEW = MIXED.replace("return [torch.randn(7, 5),", "return [torch.randn(5, 7).t(),")


def request(code: str, tmp_path: Path, name: str = "entry") -> dict[str, Any]:
    return {
        "code": code,
        "seed": 42,
        "trials": 5,
        "timing": True,
        "entry": str(tmp_path / name),
        "tmp": str(tmp_path / f".{name}.tmp"),
    }


def kernelbench_inputs(code: str, seed: int) -> tuple[list[Any], torch.Tensor]:
    problem = kb_problem.load_problem(code)
    kb_problem.set_seed(seed)
    raw = problem.get_inputs()
    return list(raw), torch.get_rng_state()


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        )
    return type(a) is type(b) and a == b


def test_stored_inputs_are_kernelbench_bits_and_rng_state(tmp_path: Path) -> None:
    req = request(MIXED, tmp_path)
    answer = kb_store.generate(req)
    assert answer["status"] == "generated", answer
    seeds = kb_problem.trial_seeds(42, 5) + [42]
    assert answer["seeds"] == seeds
    for seed in seeds:
        loaded = kb_store.load(req["entry"], MIXED, seed)
        assert loaded is not None
        values, rng = loaded
        expected, expected_rng = kernelbench_inputs(MIXED, seed)
        assert len(values) == len(expected) == 4
        assert all(same(a, b) for a, b in zip(values, expected, strict=True))
        assert torch.equal(rng, expected_rng)


def test_a_hit_makes_nothing_and_a_corrupt_entry_is_refused_then_rebuilt(tmp_path: Path) -> None:
    code = (HOSTILE / "problem_add.py").read_text()
    req = request(code, tmp_path)
    assert kb_store.generate(req)["status"] == "generated"
    stamp = os.stat(Path(req["entry"]) / kb_store.MANIFEST).st_mtime_ns
    assert kb_store.generate(req)["status"] == "hit"
    assert os.stat(Path(req["entry"]) / kb_store.MANIFEST).st_mtime_ns == stamp
    # One flipped byte in the third seed's file.
    seed = kb_problem.trial_seeds(42, 5)[2]
    path = Path(req["entry"]) / kb_store.seed_file(seed)
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01
    path.write_bytes(bytes(data))
    assert kb_store.load(req["entry"], code, seed) is None
    assert kb_store.verify(req["entry"], code, [seed]) == f"seed {seed}: wrong size or checksum"
    answer = kb_store.generate(req)
    assert answer["status"] == "rebuilt", answer
    loaded = kb_store.load(req["entry"], code, seed)
    assert loaded is not None
    assert same(loaded[0][0], kernelbench_inputs(code, seed)[0][0])
    # A truncated file is refused too.
    path.write_bytes(path.read_bytes()[:-4])
    assert kb_store.load(req["entry"], code, seed) is None


def test_an_entry_serves_only_its_own_code(tmp_path: Path) -> None:
    req = request(MIXED, tmp_path)
    kb_store.generate(req)
    other = MIXED.replace("2.5", "3.5")
    assert kb_store.load(req["entry"], other, 42) is None
    assert kb_store.verify(req["entry"], other, [42]) is not None


def test_views_and_device_tensors_are_unstorable(tmp_path: Path) -> None:
    answer = kb_store.generate(request(ON_A_VIEW, tmp_path))
    assert answer["status"] == "unstorable"
    assert "not a plain contiguous tensor" in answer["detail"]
    assert not (tmp_path / "entry").exists() and not (tmp_path / ".entry.tmp").exists()


def test_the_command_line_answers_one_json_line(tmp_path: Path) -> None:
    req = request(MIXED, tmp_path)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    done = subprocess.run(
        [sys.executable, str(HARNESS_DIR / "kb_store.py"), "generate"],
        input=json.dumps(req),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    answer = json.loads(done.stdout)
    assert answer["status"] == "generated", done.stderr
    broken = dict(req, code="this is not python")
    done = subprocess.run(
        [sys.executable, str(HARNESS_DIR / "kb_store.py"), "generate"],
        input=json.dumps(broken),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert json.loads(done.stdout)["status"] == "error"


def test_admission_reports_the_planned_bytes_first_and_a_refusal_writes_nothing(tmp_path: Path) -> None:
    req = dict(request(MIXED, tmp_path), admit=True)
    seeds = len(kb_store.seeds_of(req))
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME")}
    env["CUDA_VISIBLE_DEVICES"] = ""
    for reply, status in (({"admit": False, "detail": "no room"}, "over_budget"), ({"admit": True}, "generated")):
        done = subprocess.run(
            [sys.executable, str(HARNESS_DIR / "kb_store.py"), "generate"],
            input=json.dumps(req) + "\n" + json.dumps(reply) + "\n",
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        # randn(7, 5) float32 + randint(3) int64 + rand(4) > 0.5 bool, per seed.
        assert lines[0] == {"planned": (7 * 5 * 4 + 3 * 8 + 4) * seeds}, done.stderr
        assert lines[-1]["status"] == status, done.stderr
        assert (tmp_path / "entry").exists() == (status == "generated")
    assert lines[-1]["bytes"] == (7 * 5 * 4 + 3 * 8 + 4) * seeds


def test_large_inputs_are_made_in_parallel_processes_with_the_same_bits(tmp_path: Path, monkeypatch: Any) -> None:
    import kb_inputs

    monkeypatch.setattr(kb_inputs, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(kb_inputs, "cpu_count", lambda: 2)
    req = dict(request(MIXED, tmp_path), trials=1)
    answer = kb_store.generate(req)
    assert answer["status"] == "generated" and answer["parallel"] == 2, answer
    for seed in answer["seeds"]:
        loaded = kb_store.load(req["entry"], MIXED, seed)
        assert loaded is not None
        expected, expected_rng = kernelbench_inputs(MIXED, seed)
        assert all(same(a, b) for a, b in zip(loaded[0], expected, strict=True))
        assert torch.equal(loaded[1], expected_rng)


def test_the_processes_granted_bound_the_parallel_makers(tmp_path: Path, monkeypatch: Any) -> None:
    import kb_inputs

    assert [kb_store.within_processes(4, p) for p in (None, 6, 3, 2, 1, 0)] == [4, 4, 3, 2, 0, 0]
    assert kb_store.within_processes(0, 6) == 0
    monkeypatch.setattr(kb_inputs, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(kb_inputs, "cpu_count", lambda: 2)
    # One process granted: the seeds are made one after another in the generator itself.
    req = dict(request(MIXED, tmp_path), trials=1, processes=1)
    answer = kb_store.generate(req)
    assert answer["status"] == "generated" and answer["parallel"] == 0, answer
    loaded = kb_store.load(req["entry"], MIXED, answer["seeds"][0])
    assert loaded is not None
    expected, _ = kernelbench_inputs(MIXED, answer["seeds"][0])
    assert all(same(a, b) for a, b in zip(loaded[0], expected, strict=True))


def test_the_reference_cache_reads_stored_inputs_and_matches_making_them(tmp_path: Path) -> None:
    import kb_reference

    code = (HOSTILE / "problem_add.py").read_text()
    req = request(code, tmp_path)
    assert kb_store.generate(req)["status"] == "generated"
    cpu = torch.device("cpu")
    seeds = kb_problem.trial_seeds(42, 5)
    stored = kb_reference.ReferenceCache().context(kb_reference.ReferenceSpec(code, cpu, stored=req["entry"]))
    made = kb_reference.ReferenceCache().context(kb_reference.ReferenceSpec(code, cpu))
    for index, seed in enumerate(seeds):
        a, b = stored.trial(5, index, seed), made.trial(5, index, seed)
        assert all(same(x, y) for x, y in zip(a.inputs, b.inputs, strict=True))
        assert same(a.output, b.output)
        assert torch.equal(a.rng.cpu, b.rng.cpu)
    assert same(stored.timing_inputs()[0], made.timing_inputs()[0])
    assert stored.counts["stored_inputs"] == 6 and made.counts["stored_inputs"] == 0
    # A context that draws its inputs on the device never reads the store.
    drawn = kb_reference.ReferenceCache().context(
        kb_reference.ReferenceSpec(code, cpu, inputs="device", stored=req["entry"])
    )
    drawn.trial(5, 0, seeds[0])
    assert drawn.counts["stored_inputs"] == 0


def test_checksums_in_chunks_catch_a_change_in_any_chunk(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(kb_store, "_CHUNK", 1024)  # 16 KiB per tensor: 16 chunks each, on threads
    code = (HOSTILE / "problem_add.py").read_text()
    req = dict(request(code, tmp_path), trials=1)
    assert kb_store.generate(req)["status"] == "generated"
    seed = kb_problem.trial_seeds(42, 1)[0]
    manifest = kb_store.read_manifest(req["entry"])
    assert manifest is not None and len(manifest["seeds"][str(seed)]["crcs"]) == 32
    assert kb_store.load(req["entry"], code, seed) is not None
    path = Path(req["entry"]) / kb_store.seed_file(seed)
    data = bytearray(path.read_bytes())
    data[20 * 1024 + 5] ^= 0x80  # the second tensor's fifth chunk
    path.write_bytes(bytes(data))
    assert kb_store.load(req["entry"], code, seed) is None
    assert kb_store.generate(req)["status"] == "rebuilt"
    assert kb_store.load(req["entry"], code, seed) is not None


def test_in_memory_entries_make_fewer_seeds_at_once() -> None:
    gb = 1 << 30
    # 1/49 on a 128 GB machine: six 8.6 GB seeds fill 51.5 GB of memory once written; of the
    # 100 GB available, half of what is left (24 GB) holds two seeds being made at once.
    assert kb_store.within_memory(6, int(8.6 * gb), 6, 100 * gb) == 2
    # Small entries keep every process granted.
    assert kb_store.within_memory(6, gb, 6, 100 * gb) == 6
    # Not two: the serial path (one process, the generator itself).
    assert kb_store.within_memory(6, 30 * gb, 6, 200 * gb) == 0
    assert kb_store.within_memory(6, 8 * gb, 6, 40 * gb) == 0


def test_an_in_memory_generation_stores_the_same_bits(tmp_path: Path, monkeypatch: Any) -> None:
    import kb_inputs

    monkeypatch.setattr(kb_inputs, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(kb_inputs, "cpu_count", lambda: 2)
    req = dict(request(MIXED, tmp_path), trials=1, in_memory=True)
    answer = kb_store.generate(req)
    assert answer["status"] == "generated", answer
    for seed in answer["seeds"]:
        loaded = kb_store.load(req["entry"], MIXED, seed)
        assert loaded is not None
        expected, expected_rng = kernelbench_inputs(MIXED, seed)
        assert all(same(a, b) for a, b in zip(loaded[0], expected, strict=True))
        assert torch.equal(loaded[1], expected_rng)


def test_a_hit_trusts_the_files_it_verified_and_checks_them_again_once_they_change(
    tmp_path: Path, monkeypatch: Any
) -> None:
    code = (HOSTILE / "problem_add.py").read_text()
    req = request(code, tmp_path)
    assert kb_store.generate(req)["status"] == "generated"
    assert (Path(req["entry"]) / kb_store.VERIFIED).exists()
    reads: list[str] = []
    real = kb_store._file_crcs

    def counted(path: str, part: dict[str, Any]) -> list[int] | None:
        reads.append(path)
        return real(path, part)

    monkeypatch.setattr(kb_store, "_file_crcs", counted)
    assert kb_store.generate(req)["status"] == "hit"
    assert reads == [], "a hit on files unchanged since their checksums matched reads none of them"
    # A seed file written again (same bytes: only its identity changes) is checked before a hit.
    seed = kb_problem.trial_seeds(42, 5)[1]
    path = Path(req["entry"]) / kb_store.seed_file(seed)
    path.write_bytes(path.read_bytes())
    assert kb_store.generate(req)["status"] == "hit"
    assert len(reads) == len(kb_store.seeds_of(req)), "every seed file is checked once"
    reads.clear()
    assert kb_store.generate(req)["status"] == "hit"
    assert reads == [], "and trusted again after that check"


def test_a_reader_that_finds_a_bad_checksum_makes_the_next_generate_rebuild(tmp_path: Path) -> None:
    code = (HOSTILE / "problem_add.py").read_text()
    req = request(code, tmp_path)
    assert kb_store.generate(req)["status"] == "generated"
    seed = kb_problem.trial_seeds(42, 5)[0]
    path = Path(req["entry"]) / kb_store.seed_file(seed)
    stat = path.stat()
    # Bit rot: the bytes change, the file's identity as `verified.json` records it does not.
    data = bytearray(path.read_bytes())
    data[64] ^= 0x04
    with open(path, "r+b") as f:
        f.write(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    manifest = kb_store.read_manifest(req["entry"])
    assert manifest is not None
    kb_store._write_stamp(req["entry"], manifest["seeds"])
    assert kb_store.generate(req)["status"] == "hit", "the record is trusted until a reader finds the damage"
    assert kb_store.load(req["entry"], code, seed) is None
    assert not (Path(req["entry"]) / kb_store.VERIFIED).exists()
    assert kb_store.generate(req)["status"] == "rebuilt"
    loaded = kb_store.load(req["entry"], code, seed)
    assert loaded is not None
    assert same(loaded[0][0], kernelbench_inputs(code, seed)[0][0])
