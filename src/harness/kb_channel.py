"""The one channel between the worker and a candidate process: typed, size-limited JSON frames.

A candidate process holds exactly one descriptor that reaches the worker: its end of a Unix socket pair
(kb_process moves it to fd 3 and closes every other inherited descriptor before any candidate code
runs). What crosses it:

- frames, each one JSON object with an `op` string, length-prefixed by multiprocessing's Connection
  (`send_bytes`/`recv_bytes`); the worker reads at most `MAX_FRAME` bytes per frame and refuses
  anything longer, anything that is not JSON, not an object, or has no `op`. No pickle crosses in
  either direction, so nothing a candidate writes can name code for the worker to run;
- descriptors, only from the worker to the candidate (`send_fds`: the sealed memory files of CPU
  buffers, kb_exchange). Descriptors a candidate attaches to its bytes are dropped by the kernel,
  since the worker reads plain bytes (never `recvmsg` with room for them).

`Frame` gives typed access to a received frame: a missing or mistyped field is a `ProtocolError`, which
the worker treats as the candidate's (it fails with `forbidden_message` and its process is killed).
Long strings are clipped, never trusted to be short.

This module imports nothing of the harness and no third-party package.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
from multiprocessing import reduction
from typing import Any

# The largest frame the worker reads from a candidate process (its error texts are clipped to fit).
MAX_FRAME = 4 << 20
# The largest string field taken from a candidate's frame; longer ones are clipped.
MAX_TEXT = 256 << 10


class ProtocolError(Exception):
    """A frame the harness never sends: not JSON, too long, an unexpected op, a mistyped field."""


def encode(op: str, fields: dict[str, Any]) -> bytes:
    """One frame's bytes: strict JSON (non-finite floats are written as null, as serde reads them)."""
    message = {"op": op, **fields}
    try:
        return json.dumps(message, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")
    except ValueError:
        return json.dumps(_finite(message), ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def decode(data: bytes) -> Frame:
    """`data` as a Frame, or ProtocolError."""
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ProtocolError(f"a frame that is not JSON ({type(exc).__name__})") from None
    if type(value) is not dict or type(value.get("op")) is not str:
        raise ProtocolError("a frame that is not an object with an op")
    return Frame(value)


class Frame:
    """A received frame with typed getters (module doc)."""

    __slots__ = ("fields", "op")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.op: str = fields["op"]

    def _get(self, name: str, types: tuple[type, ...], optional: bool) -> Any:
        if name not in self.fields or self.fields[name] is None:
            if optional:
                return None
            raise ProtocolError(f"a {self.op!r} frame without {name!r}")
        value = self.fields[name]
        if type(value) not in types:
            raise ProtocolError(f"a {self.op!r} frame whose {name!r} is a {type(value).__name__}")
        return value

    def get_int(self, name: str, optional: bool = False) -> Any:
        return self._get(name, (int,), optional)

    def get_float(self, name: str, optional: bool = False) -> Any:
        value = self._get(name, (int, float), optional)
        if value is None:
            return None
        value = float(value)
        if not math.isfinite(value):
            raise ProtocolError(f"a {self.op!r} frame whose {name!r} is not finite")
        return value

    def get_bool(self, name: str, optional: bool = False) -> Any:
        return self._get(name, (bool,), optional)

    def get_str(self, name: str, optional: bool = False, limit: int = MAX_TEXT) -> Any:
        value = self._get(name, (str,), optional)
        return clip(value, limit) if value is not None else None

    def get_list(self, name: str, optional: bool = False) -> Any:
        return self._get(name, (list,), optional)

    def get_dict(self, name: str, optional: bool = False) -> Any:
        return self._get(name, (dict,), optional)

    def raw(self, name: str) -> Any:
        return self.fields.get(name)


def clip(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} characters cut]"


class Channel:
    """One end of the socket pair (a multiprocessing Connection), speaking frames."""

    def __init__(self, conn: Any, limit: int = MAX_FRAME) -> None:
        self.conn = conn
        self.limit = limit

    def send(self, op: str, **fields: Any) -> None:
        self.conn.send_bytes(encode(op, fields))

    def recv(self) -> Frame:
        """The next frame. EOFError or OSError when the other end is gone; ProtocolError for anything
        that is not a frame (a frame over the limit leaves the stream unusable: the caller ends it)."""
        try:
            data = self.conn.recv_bytes(self.limit)
        except OSError as exc:
            if "bad message length" in str(exc):
                raise ProtocolError(f"a frame over {self.limit} bytes") from None
            raise
        return decode(data)

    def expect(self, *ops: str) -> Frame:
        """The next frame, which must be one of `ops`."""
        frame = self.recv()
        if frame.op not in ops:
            raise ProtocolError(f"a {frame.op!r} frame where {' or '.join(repr(o) for o in ops)} was due")
        return frame

    def poll(self, timeout: float | None = 0.0) -> bool:
        return bool(self.conn.poll(timeout))

    def send_fds(self, fds: list[int]) -> None:
        """Descriptors to the other end (worker to candidate only), announced by a frame so that the
        reader takes them at the right place in the stream."""
        self.send("fds", count=len(fds))
        with socket.socket(fileno=os.dup(self.conn.fileno())) as sock:
            reduction.sendfds(sock, fds)

    def recv_fds(self, count: int) -> list[int]:
        with socket.socket(fileno=os.dup(self.conn.fileno())) as sock:
            return list(reduction.recvfds(sock, count))

    def fileno(self) -> int:
        return int(self.conn.fileno())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()
