"""Buffers the worker lends a candidate process: the only memory the two share.

The worker never hands a candidate process a view of anything it keeps (cached inputs, expected
outputs, another problem's data): what a candidate gets is always a copy, written by the worker into a
buffer allocated for that one process, and what comes back is read by the worker from such a buffer
into private memory before anything looks at it. A candidate that writes into a lent buffer, at any
time, from any thread or kernel, changes only that buffer.

- On a GPU a buffer is its own allocation (`cuMemAlloc`, through the CUDA driver, outside torch's
  caching allocator), exported by its IPC handle (64 raw bytes): an IPC mapping shows the importer the
  whole allocation it belongs to, so lent data never shares an allocation with anything else. The
  candidate process opens the handle (`cuIpcOpenMemHandle`).
- On the CPU a buffer is a memory file (`memfd_create`), sealed against shrinking and growing before
  its descriptor is sent (a candidate that could truncate it would crash the worker on its next read),
  mapped by both processes.

Buffers are reused from call to call when a value's layout repeats (timed calls, trials), so a call
costs one copy, not a new allocation and mapping. They are freed only when the candidate process is
gone (`Exchange.close`): freeing memory another process still maps is undefined behaviour.

Values that are not tensors (ints, floats, bools, strings, None, dtypes, devices, lists and tuples of
them) travel inside the frame as tagged JSON (`to_wire`/`from_wire`); anything else the worker sends
(odd init inputs) goes as a pickle, which only the candidate's side loads: the worker never unpickles
anything a candidate wrote.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import fcntl
import mmap
import os
import pickle
from dataclasses import dataclass
from typing import Any

import torch

from kb_channel import Channel, Frame, ProtocolError

# Every dtype a lent tensor may have, by name.
DTYPES: dict[str, torch.dtype] = {
    name: value for name in dir(torch) if isinstance(value := getattr(torch, name, None), torch.dtype)
}


class ExchangeError(RuntimeError):
    """A lent buffer could not be made or mapped (driver or system error)."""


# ---------------------------------------------------------------------------------- the CUDA driver


class _IpcHandle(ctypes.Structure):
    # Bytes, not chars: a c_char array reads back only up to its first NUL, and a handle has NULs.
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]

    def raw(self) -> bytes:
        return ctypes.string_at(ctypes.addressof(self), ctypes.sizeof(self))

    @staticmethod
    def of(raw: bytes) -> _IpcHandle:
        if len(raw) != 64:
            raise ProtocolError(f"an IPC handle of {len(raw)} bytes")
        handle = _IpcHandle()
        ctypes.memmove(ctypes.addressof(handle), raw, 64)
        return handle


class _Driver:
    """The few CUDA driver calls lending needs, through ctypes (torch exposes none of them)."""

    def __init__(self) -> None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise ExchangeError(f"the CUDA driver (libcuda.so.1) does not load: {exc}") from None
        self.lib = lib
        self.mem_alloc = lib.cuMemAlloc_v2
        self.mem_alloc.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        self.mem_free = lib.cuMemFree_v2
        self.mem_free.argtypes = [ctypes.c_uint64]
        self.get_handle = lib.cuIpcGetMemHandle
        self.get_handle.argtypes = [ctypes.POINTER(_IpcHandle), ctypes.c_uint64]
        self.open_handle = getattr(lib, "cuIpcOpenMemHandle_v2", None) or lib.cuIpcOpenMemHandle
        self.open_handle.argtypes = [ctypes.POINTER(ctypes.c_uint64), _IpcHandle, ctypes.c_uint]
        self.close_handle = lib.cuIpcCloseMemHandle
        self.close_handle.argtypes = [ctypes.c_uint64]
        self.ctx_get = lib.cuCtxGetCurrent
        self.ctx_get.argtypes = [ctypes.POINTER(ctypes.c_void_p)]

    def check(self, result: int, what: str) -> None:
        if result != 0:
            raise ExchangeError(f"{what} failed with CUDA driver error {result}")

    def ensure_context(self, device: torch.device) -> None:
        """torch's primary context current on this thread (the driver calls act on the current one)."""
        torch.cuda.set_device(device)
        torch.empty(1, device=device)
        ctx = ctypes.c_void_p()
        self.check(self.ctx_get(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            raise ExchangeError("no current CUDA context after torch initialised the device")


_driver: _Driver | None = None


def driver() -> _Driver:
    global _driver
    if _driver is None:
        _driver = _Driver()
    return _driver


class _CudaMemory:
    """A device pointer as torch sees it (`__cuda_array_interface__`, bytes), kept alive by the tensor."""

    def __init__(self, pointer: int, size: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (size,),
            "typestr": "|u1",
            "data": (pointer, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }


def _bytes_tensor(pointer: int, size: int, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(_CudaMemory(pointer, size), device=device)


# ------------------------------------------------------------------------------------- the buffers


@dataclass
class Buffer:
    """One lent buffer: `id`, its size, and its bytes as a torch uint8 tensor (worker side)."""

    id: int
    size: int
    data: torch.Tensor
    # How it was made: the device pointer (CUDA) or the memory file and its mapping (CPU).
    pointer: int = 0
    fd: int = -1
    mapping: mmap.mmap | None = None
    handle: bytes = b""


def _cpu_buffer(ident: int, size: int) -> Buffer:
    fd = os.memfd_create(f"krefine-lent-{ident}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, max(size, 1))
        # Sealed before it is lent: the candidate can neither shrink it (the worker's next read would
        # fault) nor grow it; writes stay allowed (it is where outputs come back).
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        mapping = mmap.mmap(fd, max(size, 1))
    except OSError:
        os.close(fd)
        raise
    data = torch.frombuffer(mapping, dtype=torch.uint8)[:size] if size else torch.empty(0, dtype=torch.uint8)
    return Buffer(ident, size, data, fd=fd, mapping=mapping)


def _cuda_buffer(ident: int, size: int, device: torch.device) -> Buffer:
    drv = driver()
    drv.ensure_context(device)
    pointer = ctypes.c_uint64()
    drv.check(drv.mem_alloc(ctypes.byref(pointer), max(size, 1)), f"cuMemAlloc of {size} bytes")
    handle = _IpcHandle()
    try:
        drv.check(drv.get_handle(ctypes.byref(handle), pointer.value), "cuIpcGetMemHandle")
    except ExchangeError:
        drv.mem_free(pointer.value)
        raise
    data = _bytes_tensor(pointer.value, size, device) if size else torch.empty(0, dtype=torch.uint8, device=device)
    return Buffer(ident, size, data, pointer=pointer.value, handle=handle.raw())


@dataclass
class Layout:
    """Where one tensor lives in a buffer: shape, strides (elements), dtype."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @property
    def span(self) -> int:
        """Bytes the strided view reaches (0 for an empty tensor)."""
        if any(n == 0 for n in self.shape):
            return 0
        last = sum((n - 1) * s for n, s in zip(self.shape, self.stride, strict=True))
        return (last + 1) * self.dtype.itemsize

    @staticmethod
    def of(t: torch.Tensor) -> Layout:
        # Dense, non-overlapping strides are kept (a candidate may depend on them); anything else (an
        # expanded or overlapping view) is lent contiguous, as clone() would make it.
        stride = tuple(t.stride()) if _dense(t) else contiguous_strides(tuple(t.shape))
        return Layout(tuple(t.shape), stride, t.dtype)

    def view(self, data: torch.Tensor) -> torch.Tensor:
        typed = data[: self.span].view(self.dtype) if self.span else data[:0].view(self.dtype)
        return typed.as_strided(self.shape, self.stride)

    def wire(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "stride": list(self.stride), "dtype": str(self.dtype).removeprefix("torch.")}


def _dense(t: torch.Tensor) -> bool:
    """Whether `t`'s elements fill a block of memory exactly, in some order of its dimensions."""
    expected = 1
    for dim in sorted(range(t.dim()), key=lambda d: (t.stride(d), t.shape[d])):
        if t.shape[dim] == 1:
            continue
        if t.stride(dim) != expected:
            return False
        expected *= t.shape[dim]
    return True


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides: list[int] = []
    step = 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


# ---------------------------------------------------------------------------------- the worker side


class Exchange:
    """The buffers lent to one candidate process (module doc). `lend` copies values into buffers and
    returns their wire form; `slots` makes output buffers shaped like an expected output; `read` copies
    a slot's content into private memory. Buffers are named by role ("inputs", "out", ...) and position,
    and reused while the layout stays the same."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buffers: dict[int, Buffer] = {}
        self._slots: dict[tuple[str, int], tuple[Buffer, Layout]] = {}
        self._announced: set[int] = set()
        # The worker's views of what was last lent under each role (`lent`).
        self._lent: dict[str, Any] = {}
        self._next = 0
        # Bytes lent on the device, for krefine's device memory budget (kb_reference's admission).
        self.device_bytes = 0

    def _buffer(self, size: int) -> Buffer:
        self._next += 1
        if self.device.type == "cuda":
            buffer = _cuda_buffer(self._next, size, self.device)
            self.device_bytes += size
        else:
            buffer = _cpu_buffer(self._next, size)
        self.buffers[buffer.id] = buffer
        return buffer

    def _slot(self, role: str, index: int, layout: Layout) -> tuple[Buffer, torch.Tensor]:
        found = self._slots.get((role, index))
        if found is not None:
            buffer, old = found
            if old == layout:
                return buffer, layout.view(buffer.data)
            if buffer.size >= layout.span:
                self._slots[(role, index)] = (buffer, layout)
                return buffer, layout.view(buffer.data)
        buffer = self._buffer(layout.span)
        self._slots[(role, index)] = (buffer, layout)
        return buffer, layout.view(buffer.data)

    def lend(self, role: str, values: Any) -> Any:
        """`values` in wire form, every tensor copied into a buffer of `role` (synchronised: the copies
        are complete when this returns). `lent(role)` gives the worker's views of what was lent."""
        wire, views = self.slots(role, values, values=True, keep_strides=True)
        self.write(views, values)
        return wire

    def slots(self, role: str, like: Any, values: bool = False, keep_strides: bool = False) -> tuple[Any, Any]:
        """Buffers shaped as `like`'s tensors, for the candidate to read or write: (their wire form, the
        worker's views). With `values`, what is not a tensor travels as a value (an input's int); else it
        gets no buffer (an output's). `keep_strides` lends a dense non-contiguous tensor with its
        strides (inputs, as KernelBench hands them); outputs are contiguous."""
        counter = [0]

        def make(value: Any) -> tuple[Any, Any]:
            if isinstance(value, torch.Tensor):
                if keep_strides:
                    layout = Layout.of(value)
                else:
                    layout = Layout(tuple(value.shape), contiguous_strides(tuple(value.shape)), value.dtype)
                buffer, view = self._slot(role, counter[0], layout)
                counter[0] += 1
                return {"t": "tensor", "buf": buffer.id, **layout.wire()}, view
            if type(value) in (list, tuple):
                pairs = [make(v) for v in value]
                return {"t": type(value).__name__, "v": [w for w, _ in pairs]}, type(value)(v for _, v in pairs)
            if values:
                return to_wire(value), value
            return {"t": "none"}, None

        wire, views = make(like)
        self._lent[role] = views
        return wire, views

    def lent(self, role: str) -> Any:
        """The worker's views of what was last lent (or slotted) under `role`."""
        return self._lent.get(role)

    def write(self, views: Any, values: Any) -> None:
        """Copy `values`' tensors into `views` (same structure), synchronised."""
        with torch.no_grad():
            for view, value in zip(_tensors(views), _tensors(values), strict=True):
                view.copy_(value.detach())
        self.synchronize()

    def same_values(self, views: Any, values: Any) -> bool:
        """Whether `values` fit the buffers behind `views` as they are bound (same structure, tensor
        layouts and plain values)."""
        if isinstance(views, torch.Tensor):
            return (
                isinstance(values, torch.Tensor)
                and views.shape == values.shape
                and views.dtype == values.dtype
                and views.stride() == Layout.of(values).stride
            )
        if type(views) in (list, tuple):
            return (
                type(values) is type(views)
                and len(values) == len(views)
                and all(self.same_values(a, b) for a, b in zip(views, values, strict=True))
            )
        return type(views) is type(values) and views == values

    def fill(self, views: Any, value: float) -> None:
        """Write `value` over every slot in `views` (poison an output slot before a call)."""
        with torch.no_grad():
            for view in _tensors(views):
                if view.is_floating_point() or view.is_complex():
                    view.fill_(value)
                else:
                    view.fill_(-1 if view.dtype != torch.bool else False)

    def read(self, views: Any) -> Any:
        """Private copies of `views` (what the candidate wrote), synchronised."""

        def copy(value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return value.clone()
            if type(value) in (list, tuple):
                return type(value)(copy(v) for v in value)
            return value

        with torch.no_grad():
            copied = copy(views)
        self.synchronize()
        return copied

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def announce(self, channel: Channel) -> None:
        """Tell the candidate process about buffers it has not seen (their handles, or their memory
        files as descriptors) before a frame that names them."""
        new = [b for b in self.buffers.values() if b.id not in self._announced]
        if not new:
            return
        self._announced.update(b.id for b in new)
        channel.send(
            "buffers",
            buffers=[{"id": b.id, "size": b.size, "handle": b.handle.hex() if b.handle else None} for b in new],
        )
        if self.device.type != "cuda":
            channel.send_fds([b.fd for b in new])

    def close(self) -> None:
        """Free every buffer; only once the candidate process is gone (module doc)."""
        self._slots.clear()
        self._lent.clear()
        buffers, self.buffers = self.buffers, {}
        if self.device.type == "cuda" and buffers:
            with contextlib.suppress(Exception):
                torch.cuda.synchronize(self.device)
        for buffer in buffers.values():
            buffer.data = torch.empty(0, dtype=torch.uint8)
            if buffer.pointer:
                with contextlib.suppress(Exception):
                    driver().mem_free(buffer.pointer)
            if buffer.mapping is not None:
                with contextlib.suppress(BufferError, ValueError):
                    buffer.mapping.close()
            if buffer.fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(buffer.fd)
        self.device_bytes = 0
        self._announced.clear()


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if type(value) in (list, tuple):
        return [t for v in value for t in _tensors(v)]
    return []


# ------------------------------------------------------------------------------- values on the wire


def to_wire(value: Any) -> dict[str, Any]:
    """A value that is not a tensor, tagged."""
    if value is None:
        return {"t": "none"}
    if type(value) is bool:
        return {"t": "bool", "v": value}
    if type(value) is int:
        return {"t": "int", "v": value}
    if type(value) is float:
        return {"t": "float", "v": repr(value)}
    if type(value) is str:
        return {"t": "str", "v": value}
    if isinstance(value, torch.dtype):
        return {"t": "dtype", "v": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"t": "device", "v": str(value)}
    if type(value) in (list, tuple):
        return {"t": type(value).__name__, "v": [to_wire(v) for v in value]}
    # The worker's own value (an init input of an odd type): only ever loaded by the candidate's side.
    return {"t": "pickle", "v": base64.b64encode(pickle.dumps(value)).decode("ascii")}


# ------------------------------------------------------------------------------- the candidate side


class Borrowed:
    """The candidate process's view of what the worker lent it: buffers by id, mapped on first sight."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buffers: dict[int, torch.Tensor] = {}
        self._keep: list[Any] = []

    def take(self, channel: Channel, frame: Frame) -> None:
        """A `buffers` frame (and, on the CPU, the descriptors that follow it)."""
        listed = frame.get_list("buffers")
        fds: list[int] = []
        if self.device.type != "cuda":
            fds = channel.recv_fds(channel.expect("fds").get_int("count"))
        for position, item in enumerate(listed):
            ident, size = int(item["id"]), int(item["size"])
            if self.device.type == "cuda":
                self.buffers[ident] = self._open_cuda(bytes.fromhex(item["handle"]), size)
            else:
                mapping = mmap.mmap(fds[position], max(size, 1))
                os.close(fds[position])
                self._keep.append(mapping)
                self.buffers[ident] = (
                    torch.frombuffer(mapping, dtype=torch.uint8)[:size] if size else torch.empty(0, dtype=torch.uint8)
                )

    def _open_cuda(self, handle: bytes, size: int) -> torch.Tensor:
        drv = driver()
        drv.ensure_context(self.device)
        raw = _IpcHandle.of(handle)
        pointer = ctypes.c_uint64()
        drv.check(drv.open_handle(ctypes.byref(pointer), raw, 1), "cuIpcOpenMemHandle")
        if not size:
            return torch.empty(0, dtype=torch.uint8, device=self.device)
        return _bytes_tensor(pointer.value, size, self.device)

    def value(self, wire: Any) -> Any:
        """The value a wire form names (tensors are views of the lent buffers)."""
        if type(wire) is not dict:
            raise ProtocolError("a lent value that is not tagged")
        tag = wire.get("t")
        if tag == "tensor":
            data = self.buffers[int(wire["buf"])]
            layout = Layout(tuple(wire["shape"]), tuple(wire["stride"]), DTYPES[wire["dtype"]])
            return layout.view(data)
        return from_wire(wire, self)


def from_wire(wire: dict[str, Any], borrowed: Borrowed | None = None) -> Any:
    tag = wire.get("t")
    if tag == "none":
        return None
    if tag in ("bool", "int", "str"):
        return wire["v"]
    if tag == "float":
        return float(wire["v"])
    if tag == "dtype":
        return DTYPES[wire["v"]]
    if tag == "device":
        return torch.device(wire["v"])
    if tag in ("list", "tuple"):
        items = [borrowed.value(v) if borrowed is not None else from_wire(v) for v in wire["v"]]
        return items if tag == "list" else tuple(items)
    if tag == "pickle":
        return pickle.loads(base64.b64decode(wire["v"]))  # the worker's own value, loaded only in the candidate's process
    raise ProtocolError(f"an unknown value tag {tag!r}")
