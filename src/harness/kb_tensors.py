"""Tensors and devices, for the reference side and a candidate's check alike: casting and moving
inputs, cloning, sizes and aliasing, the checksums and fingerprints that notice a candidate writing into
cached inputs, poisoning freed memory, and the RNG state kept with each trial.

Pure helpers over torch values (the problem floor, below kb_reference, which builds its trial data from
them); nothing here knows a request or a problem.
"""

from __future__ import annotations

import platform
import zlib
from dataclasses import dataclass
from typing import Any

import torch

from kb_problem import tensors as tensors_in

_CHECKSUM_CHUNK = 1 << 24
_CHECKSUM_MUL = 0x5851F42D4C957F2D  # odd 63-bit constant (PCG multiplier)


# ------------------------------------------------------------------------------------ values and devices


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
    """A checksum of the tensor's bytes that any single changed word changes.

    Used to notice that a candidate wrote into cached inputs; it runs after every trial (and twice
    when a trial is built), so it must cost milliseconds, not a second: on a device a position-
    weighted sum computed there (no copy of the data, one sync, see `weighted_checksum`), in RAM a
    CRC-32 of the bytes (10x faster there than the weighted sum: 0.1 s against 1 s for 200 MB on the
    development machine).
    """
    flat = tensor.detach()
    if not flat.is_contiguous():
        flat = flat.contiguous()
    raw = flat.reshape(-1).view(torch.uint8)
    if raw.device.type == "cpu":
        return zlib.crc32(memoryview(raw.numpy()))  # type: ignore[arg-type]  # numpy types its buffer for 3.12+
    return weighted_checksum(raw)


def weighted_checksum(raw: torch.Tensor) -> int:
    """A position-weighted sum of a byte tensor (as int32 words where possible), on its device:
    every word is multiplied by an odd weight (a bijection modulo 2**32), and every chunk's sum by an
    odd chunk factor (one modulo 2**64)."""
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
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


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
