"""What the worker reads from a candidate's process, read without running the candidate's code.

A candidate runs in its own process, and that process holds the worker's end of a pipe: whatever it
writes there, the worker reads. multiprocessing's `Connection.recv` unpickles, and unpickling calls
whatever globals the pickle names (a `__reduce__` to `os.system`, `builtins.exec`, a harness function),
in the worker, which holds strict mode's secrets and the expected outputs. So the worker never calls
`recv` on a candidate's pipe: `recv` here reads the raw bytes and unpickles them with `SafeUnpickler`,
whose `find_class` resolves only the globals the legitimate messages need (`ALLOWED`): torch's CUDA IPC
rebuild (outputs on the GPU), the tensor, storage, size, device and dtype types it takes, and
kb_strict's `HostTensor` (outputs on the CPU, as bytes). Containers, strings, numbers and bytes need no
global. Anything else, or a message that fails to load, is a `ForbiddenMessage`; the worker then ends
the process and fails the candidate (kb_pool).

The other direction (the worker's replies, the job) is written by the worker and read by the candidate:
nothing to guard there.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch

# (module, name) pairs a legitimate message from a candidate process may name.
ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        # CUDA tensors cross by CUDA IPC (torch.multiprocessing's reduction of a tensor).
        ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"),
        ("torch", "Tensor"),
        ("torch._tensor", "Tensor"),
        ("torch.nn.parameter", "Parameter"),
        ("torch", "UntypedStorage"),
        ("torch.storage", "UntypedStorage"),
        ("torch", "TypedStorage"),
        ("torch.storage", "TypedStorage"),
        ("torch", "Size"),
        ("torch", "device"),
        # CPU outputs cross as bytes (kb_strict.HostTensor).
        ("kb_strict", "HostTensor"),
        # Plain values a pickle may spell as a global.
        ("builtins", "bytearray"),
        ("builtins", "complex"),
        ("builtins", "frozenset"),
        ("builtins", "set"),
        ("builtins", "slice"),
    }
)

# torch's dtypes pickle as the global `torch.<name>`.
_DTYPES = frozenset(name for name in dir(torch) if isinstance(getattr(torch, name, None), torch.dtype))


class ForbiddenMessage(Exception):
    """A candidate process wrote something to the worker's pipe that is not a message the harness
    sends: a global outside `ALLOWED`, or bytes that do not load."""


class SafeUnpickler(pickle.Unpickler):
    """An unpickler whose globals are `ALLOWED` (module doc)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED or (module == "torch" and name in _DTYPES):
            return super().find_class(module, name)
        raise ForbiddenMessage(f"the message names {module}.{name}, which no harness message contains")

    def persistent_load(self, pid: Any) -> Any:
        raise ForbiddenMessage("the message holds a persistent id, which no harness message contains")


def loads(data: bytes) -> Any:
    """`data` unpickled with `SafeUnpickler`; any failure is a ForbiddenMessage."""
    try:
        return SafeUnpickler(io.BytesIO(data)).load()
    except ForbiddenMessage:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to load is the candidate's malformed message
        raise ForbiddenMessage(f"the message does not load: {type(exc).__name__}: {exc}") from None


def recv(conn: Any) -> Any:
    """The next message from a candidate process (EOFError/OSError when it is gone, as `recv`)."""
    return loads(conn.recv_bytes())
