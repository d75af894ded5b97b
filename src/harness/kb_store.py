"""The on-disk store of a problem's seeded inputs: made on the CPU once, off the GPU lease, read by every
later evaluation of the problem.

KernelBench makes every input with the CPU's generator after `set_seed(seed)` (multi-GB for some level-1
problems, 40-100 s of CPU). `generate` does exactly that, for the correctness trials' seeds and the timing
seed, in a process of its own that the orchestrator starts without holding any device
(src/worker/input_store.rs), and writes the results into one store entry; the GPU worker's `load` then
hands back the same bits, and the CPU generator's state right after `get_inputs()`, as if it had called
`get_inputs()` itself.

An entry is a folder (the orchestrator names it by a hash of the problem's code, the seeds and the torch
version, and keeps the store bounded):

    manifest.json      written last: the entry is complete only when it exists
    seed-<seed>.bin    the raw bytes of that seed's tensors, one after another
    used               touched by the orchestrator at every use (LRU)
    verified.json      the seed files' identities when their checksums last matched (see `_stamp`)

Each seed's file carries CRC-32s in the manifest (one per 64 MB of each tensor, checked on several
threads); a loader that finds a wrong size or checksum says so, makes the inputs itself (never a wrong
input) and drops `verified.json`, and the next `generate` rebuilds the entry. A `generate` that finds the
entry answers `hit` without reading it while its files are the ones `verified.json` names (same inode,
size, mtime and ctime); otherwise it checks every checksum first.

Only plain values are stored: a top-level list of contiguous CPU tensors and JSON scalars. A problem
whose `get_inputs()` makes anything else (a tensor on a device, a view, a nested structure) is
`unstorable`, and its inputs are made by the worker as before.

Admission: a request with `admit` set reports the entry's planned bytes (`{"planned": n}`, one line on
stdout; null when get_inputs() cannot run on the meta device) before writing anything, and reads the
orchestrator's answer (`{"admit": bool, "detail": str}`, one line on stdin). Refused: `over_budget`,
nothing written, and the worker makes the inputs.

    python kb_store.py generate < request.json     # one JSON request in, one JSON response out
    python kb_store.py plan < request.json         # several problems' planned bytes and processes
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

# torch (and the modules that need it) are imported where used: a `generate` that finds its entry whole
# answers without importing torch (a second or so per problem, in the orchestrator's critical path).
if TYPE_CHECKING:
    import torch

    import kb_problem

FORMAT = 1
MANIFEST = "manifest.json"
# Written after a checksum pass found every seed file whole: the files' identities then (see `_stamp`).
# A hit whose files still match it answers without reading them (a 32 GB entry took 8 s to check, in
# front of a warm batch's first lease); the GPU worker checks every chunk as it reads anyway.
VERIFIED = "verified.json"
# Each seed's file is checksummed in chunks of this many bytes (one CRC-32 each, listed in the manifest),
# so that a loader checks a multi-GB file on several threads at once (zlib releases the GIL).
_CHUNK = 1 << 26
_THREADS = 8


def _crcs(view: memoryview) -> list[int]:
    """The CRC-32 of every _CHUNK bytes of `view`, computed on several threads."""
    chunks = [view[start : start + _CHUNK] for start in range(0, len(view), _CHUNK)]
    if len(chunks) < 2:
        return [zlib.crc32(c) for c in chunks]
    with ThreadPoolExecutor(max_workers=min(_THREADS, len(chunks))) as pool:
        return list(pool.map(zlib.crc32, chunks))


def _usable_part(entry: str, code: str, seed: int) -> dict[str, Any] | None:
    """The manifest part of `seed` when the entry is for `code` and this torch; None otherwise."""
    import torch

    manifest = read_manifest(entry)
    if manifest is None or manifest.get("code_sha256") != code_hash(code):
        return None
    if manifest.get("torch") != torch.__version__:
        return None
    part: dict[str, Any] | None = manifest.get("seeds", {}).get(str(seed))
    return part


# Pinned host buffers (one per reading thread, kept for the worker's life) and a CUDA stream each.
_STAGING_BUFFERS: list[torch.Tensor] = []
_STAGING_STREAMS: dict[tuple[str, int], Any] = {}


def _staging(index: int, device: torch.device) -> tuple[torch.Tensor, Any]:
    import torch

    while len(_STAGING_BUFFERS) <= index:
        _STAGING_BUFFERS.append(torch.empty(_CHUNK, dtype=torch.uint8, pin_memory=True))
    key = (str(device), index)
    if key not in _STAGING_STREAMS:
        _STAGING_STREAMS[key] = torch.cuda.Stream(device)
    return _STAGING_BUFFERS[index], _STAGING_STREAMS[key]


def _load_to_device(entry: str, code: str, seed: int, device: torch.device) -> tuple[list[Any], torch.Tensor] | None:
    import threading

    import torch

    part = _usable_part(entry, code, seed)
    if part is None:
        return None
    values: list[Any] = []
    chunks: list[tuple[torch.Tensor, int, int]] = []  # (device bytes of the chunk, file offset, length)
    grads: list[torch.Tensor] = []
    offset = 0
    try:
        for item in part["items"]:
            if "value" in item:
                values.append(item["value"])
                continue
            t = torch.empty(item["shape"], dtype=_dtype(item["dtype"]), device=device)
            raw = t.reshape(-1).view(torch.uint8) if t.numel() else t.new_empty(0, dtype=torch.uint8)
            size = raw.numel()
            chunks.extend(
                (raw[start : start + _CHUNK], offset + start, min(_CHUNK, size - start))
                for start in range(0, size, _CHUNK)
            )
            offset += size
            if item.get("requires_grad"):
                grads.append(t)
            values.append(t)
        fd = _open_seed(entry, part, offset)
        try:
            threads = max(1, min(_THREADS, len(chunks)))
            crcs: list[int] = [0] * len(chunks)
            errors: list[BaseException] = []

            def work(index: int) -> None:
                buf, stream = _staging(index, device)
                view = _byte_view(buf)
                try:
                    for i in range(index, len(chunks), threads):
                        target, at, length = chunks[i]
                        # The previous copy out of this buffer must be done before it is refilled.
                        stream.synchronize()
                        crcs[i] = _read_chunk(fd, view[:length], at)
                        with torch.cuda.stream(stream):
                            target.copy_(buf[:length], non_blocking=True)
                    stream.synchronize()
                except BaseException as exc:  # noqa: BLE001 - re-raised by the caller
                    errors.append(exc)

            pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
            for th in pool:
                th.start()
            for th in pool:
                th.join()
            if errors:
                raise errors[0]
        finally:
            os.close(fd)
    except (OSError, ValueError, TypeError, KeyError, RuntimeError) as exc:
        print(f"krefine harness: stored inputs of seed {seed} unusable ({exc}); making them", file=sys.stderr)
        forget_verified(entry)
        return None
    if crcs != part.get("crcs"):
        print(f"krefine harness: stored inputs of seed {seed} fail their checksum; making them", file=sys.stderr)
        forget_verified(entry)
        return None
    for t in grads:
        t.requires_grad_(True)
    rng = torch.frombuffer(bytearray(base64.b64decode(part["rng"])), dtype=torch.uint8)
    return values, rng


def _open_seed(entry: str, part: dict[str, Any], size: int) -> int:
    """The seed's file, opened for reading, when it holds exactly `size` bytes (ValueError otherwise)."""
    fd = os.open(os.path.join(entry, part["file"]), os.O_RDONLY)
    found = os.fstat(fd).st_size
    if found != size:
        os.close(fd)
        raise ValueError(f"file of {found} bytes, its manifest says {size}")
    return fd


def _read_chunk(fd: int, view: memoryview, offset: int) -> int:
    """Fill `view` from `fd` at `offset`; its CRC-32."""
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise ValueError("file shorter than its manifest")
        done += got
    return zlib.crc32(view)


def _read_chunks(fd: int, chunks: list[tuple[memoryview, int]]) -> list[int]:
    """Read every (view, offset) chunk of `fd` on several threads; their CRC-32s in order."""
    if len(chunks) < 2:
        return [_read_chunk(fd, v, o) for v, o in chunks]
    with ThreadPoolExecutor(max_workers=min(_THREADS, len(chunks))) as pool:
        return list(pool.map(lambda c: _read_chunk(fd, c[0], c[1]), chunks))


class Unstorable(Exception):
    """get_inputs() made something the store does not keep; the worker makes these inputs itself."""


def code_hash(code: str) -> str:
    return hashlib.sha256(code.encode("utf-8")).hexdigest()


def seeds_of(request: dict[str, Any]) -> list[int]:
    """The seeds a problem's evaluation makes inputs for: the correctness trials', then the timing seed."""
    import kb_problem

    seeds = kb_problem.trial_seeds(int(request["seed"]), int(request["trials"]))
    if request.get("timing", True) and int(request["seed"]) not in seeds:
        seeds.append(int(request["seed"]))
    return seeds


def seed_file(seed: int) -> str:
    return f"seed-{seed}.bin"


def _byte_view(t: torch.Tensor) -> memoryview:
    import torch

    flat = t.detach().reshape(-1)
    if not flat.numel():
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())  # type: ignore[arg-type]  # numpy types its buffer for 3.12+


def _dtype(name: str) -> torch.dtype:
    import torch

    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"unknown dtype {name!r}")
    return dtype


def describe(raw: Any) -> list[dict[str, Any]]:
    """The manifest items of one get_inputs() value (shapes, dtypes, scalars); raises Unstorable."""
    import torch

    if not isinstance(raw, (list, tuple)):
        raise Unstorable(f"get_inputs() returned a {type(raw).__name__}, not a list")
    items: list[dict[str, Any]] = []
    for i, value in enumerate(raw):
        if isinstance(value, torch.Tensor):
            if value.device.type != "cpu":
                raise Unstorable(f"input {i} is made on {value.device}")
            if not value.is_contiguous() or value.is_sparse or value.is_quantized:
                raise Unstorable(f"input {i} is not a plain contiguous tensor")
            items.append(
                {
                    "dtype": str(value.dtype),
                    "shape": list(value.shape),
                    "nbytes": value.numel() * value.element_size(),
                    "requires_grad": value.requires_grad,
                }
            )
        elif value is None or isinstance(value, (bool, int, float, str)):
            items.append({"value": value})
        else:
            raise Unstorable(f"input {i} is a {type(value).__name__}")
    return items


def write_seed(problem: kb_problem.ProblemCode, seed: int, folder: str) -> dict[str, Any]:
    """KernelBench's `set_seed(seed); get_inputs()` on the CPU, written to `folder/seed-<seed>.bin`;
    returns the seed's manifest part."""
    import torch

    import kb_problem

    kb_problem.set_seed(seed)
    raw = problem.get_inputs()
    rng = torch.get_rng_state()
    items = describe(raw)
    crcs: list[int] = []
    path = os.path.join(folder, seed_file(seed))
    with open(path, "wb") as f:
        for t in (v for v in raw if isinstance(v, torch.Tensor)):
            view = _byte_view(t)
            crcs.extend(_crcs(view))
            f.writelines(view[start : start + _CHUNK] for start in range(0, len(view), _CHUNK))
        f.flush()
        os.fsync(f.fileno())
    return {
        "file": seed_file(seed),
        "bytes": sum(int(i.get("nbytes", 0)) for i in items),
        # One CRC-32 per _CHUNK bytes of each tensor, tensor after tensor.
        "crcs": crcs,
        "items": items,
        "rng": base64.b64encode(bytes(rng.numpy())).decode("ascii"),
    }


def _write_one(code: str, seed: int, folder: str) -> dict[str, Any]:
    """In a spawned child: one seed's inputs, single-threaded as KernelBench's generator is."""
    import torch

    import kb_problem

    torch.set_num_threads(1)
    return write_seed(kb_problem.load_problem(code), seed, folder)


def _write_all(
    code: str, seeds: list[int], folder: str, processes: int | None = None, in_memory: bool = False
) -> tuple[dict[str, Any], int]:
    """Every seed's file and manifest part; large inputs are made in parallel processes (each seed has
    its own generator, so the bits are the same), at most `processes` of them (the orchestrator's CPU
    budget). In the in-memory store (`in_memory`) the files fill memory too, so fewer run at once.
    Returns (parts by seed, processes used)."""
    import torch

    import kb_inputs
    import kb_problem

    problem = kb_problem.load_problem(code)
    per_seed = kb_inputs.planned_bytes(problem.get_inputs)
    count = parallel_processes(per_seed, len(seeds), processes, in_memory)
    if count == 0:
        return {str(s): write_seed(problem, s, folder) for s in seeds}, 0
    context = torch.multiprocessing.get_context("spawn")
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    with context.Pool(processes=count) as pool:
        parts = pool.starmap(_write_one, [(code, s, folder) for s in seeds])
    return {str(s): p for s, p in zip(seeds, parts, strict=True)}, count


def parallel_processes(per_seed: int | None, seeds: int, processes: int | None, in_memory: bool = False) -> int:
    """How many processes make an entry's seeds at once (0: one after another, in the generator's own
    process): large inputs only (kb_inputs), at most `processes` (the orchestrator's CPU budget), fewer
    in the in-memory store. `plan` answers the same number before anything is made, so the orchestrator
    claims the cores the generator will use."""
    import kb_inputs

    count = within_processes(kb_inputs.how_many_in_parallel(per_seed, seeds), processes)
    if in_memory and per_seed:
        count = within_memory(count, per_seed, seeds, kb_inputs.available_ram())
    return count


def plan(request: dict[str, Any]) -> dict[str, Any]:
    """The entries of several problems, before any is made (the orchestrator asks once, for every problem
    of a run, and starts the largest first): per problem, in order, the entry's planned bytes (null when
    get_inputs() does not run on the meta device) and the processes its generator would use (1: its
    own), given `seeds` seeds and at most `processes` processes."""
    import kb_inputs
    import kb_problem

    seeds, processes = int(request["seeds"]), request.get("processes")
    cap = None if processes is None else int(processes)
    plans = []
    for code in request["codes"]:
        try:
            per_seed = kb_inputs.planned_bytes(kb_problem.load_problem(code).get_inputs)
        except Exception:  # noqa: BLE001 - a problem that does not load plans nothing (its generator says why)
            per_seed = None
        plans.append(
            {
                "bytes": None if per_seed is None else per_seed * seeds,
                "processes": max(parallel_processes(per_seed, seeds, cap), 1),
            }
        )
    return {"plans": plans}


def within_memory(count: int, per_seed: int, seeds: int, available: int) -> int:
    """`count` parallel processes cut so that, with the entry's files in memory (`seeds` x `per_seed`
    bytes once written), the processes' own seeds take at most half of what is left of `available`
    (0: the serial path)."""
    left = max(available - per_seed * seeds, 0)
    count = min(count, int(left * 0.5) // max(per_seed, 1))
    return count if count >= 2 else 0


def within_processes(count: int, processes: int | None) -> int:
    """`count` parallel processes cut to the `processes` granted (0: the serial path, one process)."""
    if processes is None:
        return count
    count = min(count, max(processes, 1))
    return count if count >= 2 else 0


def read_manifest(entry: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(entry, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def _file_crcs(path: str, part: dict[str, Any]) -> list[int] | None:
    """The chunk CRCs of a seed's file as its manifest part lays it out (per tensor, from each tensor's
    start); None when the file is missing or not the size the manifest says. Read on several threads,
    each into one reused buffer: a hit on a 51.5 GB entry was checked in 57 s reading each tensor into a
    fresh buffer on one thread, beside a batch waiting for it."""
    try:
        if os.path.getsize(path) != int(part["bytes"]):
            return None
        spans: list[tuple[int, int]] = []
        offset = 0
        for item in part["items"]:
            if "nbytes" in item:
                size = int(item["nbytes"])
                spans.extend((offset + start, min(_CHUNK, size - start)) for start in range(0, size, _CHUNK))
                offset += size
        fd = os.open(path, os.O_RDONLY)
        try:
            return _span_crcs(fd, spans)
        finally:
            os.close(fd)
    except (OSError, KeyError, ValueError):
        return None


def _span_crcs(fd: int, spans: list[tuple[int, int]]) -> list[int]:
    """The CRC-32 of each (offset, length) span of `fd`, read on several threads into one buffer each."""
    local = threading.local()

    def one(span: tuple[int, int]) -> int:
        buffer = getattr(local, "buffer", None)
        if buffer is None:
            buffer = local.buffer = bytearray(_CHUNK)
        at, length = span
        return _read_chunk(fd, memoryview(buffer)[:length], at)

    if len(spans) < 2:
        return [one(s) for s in spans]
    with ThreadPoolExecutor(max_workers=min(_THREADS, len(spans))) as pool:
        return list(pool.map(one, spans))


def verify(entry: str, code: str, seeds: list[int]) -> str | None:
    """Why the entry cannot serve (missing, another problem, a seed missing, a bad checksum); None when
    every seed's file is whole."""
    import torch

    manifest = read_manifest(entry)
    if manifest is None:
        return "no complete entry"
    if manifest.get("code_sha256") != code_hash(code) or manifest.get("torch") != torch.__version__:
        return "the entry was made for other code or another torch"
    for seed in seeds:
        part = manifest.get("seeds", {}).get(str(seed))
        if part is None:
            return f"seed {seed} is missing"
        if _file_crcs(os.path.join(entry, part["file"]), part) != part.get("crcs"):
            return f"seed {seed}: wrong size or checksum"
    return None


def _whole_for(entry: str, code: str, request: dict[str, Any]) -> list[int] | None:
    """The entry's seeds when it was made for this very request (code, seed, trials, timing, torch)
    and every file is whole; None otherwise. Imports torch only when the request does not name its
    version."""
    manifest = read_manifest(entry)
    if manifest is None or manifest.get("code_sha256") != code_hash(code):
        return None
    version = request.get("torch")
    if not isinstance(version, str):
        import torch

        version = torch.__version__
    if manifest.get("torch") != version or manifest.get("request") != _request_key(request):
        return None
    order = manifest.get("order")
    parts = manifest.get("seeds", {})
    if not isinstance(order, list) or sorted(str(s) for s in order) != sorted(parts):
        return None
    if _stamp(entry, parts) != _read_stamp(entry):
        for part in parts.values():
            if _file_crcs(os.path.join(entry, part["file"]), part) != part.get("crcs"):
                return None
        _write_stamp(entry, parts)
    _prefetch(entry, parts)
    return [int(s) for s in order]


def _stamp(entry: str, parts: dict[str, Any]) -> dict[str, list[int]] | None:
    """Each seed file's identity as the file system keeps it (device, inode, size, mtime and ctime in ns):
    what a checksum pass found whole stays whole while these are unchanged. ctime moves with every write
    and no call can set it back. None when a file is missing."""
    stamp: dict[str, list[int]] = {}
    try:
        for part in parts.values():
            st = os.stat(os.path.join(entry, str(part["file"])))
            stamp[str(part["file"])] = [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    except (OSError, KeyError, TypeError):
        return None
    return stamp


def _read_stamp(entry: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(entry, VERIFIED), encoding="utf-8") as f:
            stamp = json.load(f)
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) else None


def _write_stamp(entry: str, parts: dict[str, Any]) -> None:
    """Record that every seed file of `entry` matched its checksums just now (best effort: without the
    record the next hit checks them again)."""
    stamp = _stamp(entry, parts)
    if stamp is None:
        return
    tmp = os.path.join(entry, f".{VERIFIED}.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(stamp, f)
        os.replace(tmp, os.path.join(entry, VERIFIED))
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def forget_verified(entry: str) -> None:
    """A reader found a seed file failing its checksum: the next `generate` checks (and rebuilds) the
    entry instead of trusting the record (best effort: a reader that may not write leaves it)."""
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(entry, VERIFIED))


def _prefetch(entry: str, parts: dict[str, Any]) -> None:
    """Ask the kernel to read an entry's files ahead (the GPU worker reads them next): a hit no longer
    reads them itself. A no-op for the in-memory store."""
    if not hasattr(os, "posix_fadvise"):
        return
    for part in parts.values():
        try:
            fd = os.open(os.path.join(entry, str(part["file"])), os.O_RDONLY)
        except (OSError, KeyError, TypeError):
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


def _request_key(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "seed": int(request["seed"]),
        "trials": int(request["trials"]),
        "timing": bool(request.get("timing", True)),
    }


def generate(request: dict[str, Any]) -> dict[str, Any]:
    """Make sure `entry` holds the inputs of every seed of the request: `hit` when it does already,
    else made in `tmp` and renamed into place (`generated`, or `rebuilt` when a broken entry was
    there). The caller holds the entry's lock (no two generations of one entry at once)."""
    started = time.perf_counter()
    code, entry, tmp = request["code"], request["entry"], request["tmp"]
    whole = _whole_for(entry, code, request)
    if whole is not None:
        manifest = read_manifest(entry) or {}
        size = sum(int(p["bytes"]) for p in manifest.get("seeds", {}).values())
        return _answer("hit", started, whole, size)
    import torch

    seeds = seeds_of(request)
    if request.get("admit"):
        refusal = _ask_admission(code, len(seeds))
        if refusal is not None:
            return _answer("over_budget", started, seeds, 0, detail=refusal)
    why = verify(entry, code, seeds)
    broken = os.path.exists(entry)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        limit = request.get("processes")
        parts, parallel = _write_all(
            code, seeds, tmp, None if limit is None else int(limit), bool(request.get("in_memory"))
        )
    except Unstorable as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        return _answer("unstorable", started, seeds, 0, detail=str(exc))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    manifest = {
        "format": FORMAT,
        "torch": torch.__version__,
        "code_sha256": code_hash(code),
        "request": _request_key(request),
        "order": seeds,
        "seeds": parts,
    }
    with open(os.path.join(tmp, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f)
        f.flush()
        os.fsync(f.fileno())
    shutil.rmtree(entry, ignore_errors=True)
    os.rename(tmp, entry)
    # The checksums were taken from the bytes written; the GPU worker checks every chunk it reads.
    _write_stamp(entry, parts)
    size = sum(int(p["bytes"]) for p in parts.values())
    status = "rebuilt" if broken else "generated"
    return _answer(status, started, seeds, size, detail=(why or "") if broken else "", parallel=parallel)


def planned_entry_bytes(code: str, seeds: int) -> int | None:
    """The bytes an entry of `seeds` seeds will hold (found on the meta device, nothing made); None when
    the problem's get_inputs() cannot say without running."""
    import kb_inputs
    import kb_problem

    per_seed = kb_inputs.planned_bytes(kb_problem.load_problem(code).get_inputs)
    return None if per_seed is None else per_seed * seeds


def _ask_admission(code: str, seeds: int) -> str | None:
    """Admission before anything is written: the entry's planned bytes go to the orchestrator (one JSON
    line on stdout, `{"planned": bytes or null}`), which reserves them against the store's cap and
    answers one line on stdin (`{"admit": bool, "detail": str}`). None when admitted, else why not."""
    planned = planned_entry_bytes(code, seeds)
    sys.stdout.write(json.dumps({"planned": planned}) + "\n")
    sys.stdout.flush()
    line = sys.stdin.readline()
    try:
        reply = json.loads(line)
    except ValueError:
        return "no admission answer from the orchestrator"
    if isinstance(reply, dict) and reply.get("admit") is True:
        return None
    detail = reply.get("detail") if isinstance(reply, dict) else None
    return str(detail or "the store has no room for this entry")


def _answer(
    status: str, started: float, seeds: list[int], size: int, detail: str = "", parallel: int = 0
) -> dict[str, Any]:
    return {
        "status": status,
        "seconds": round(time.perf_counter() - started, 6),
        "seeds": seeds,
        "bytes": size,
        "parallel": parallel,
        "detail": detail,
    }


def load(entry: str, code: str, seed: int, device: torch.device | None = None) -> tuple[list[Any], torch.Tensor] | None:
    """One seed's inputs and the CPU generator's state right after they were made, as `set_seed(seed);
    get_inputs()` would leave it; None when the entry cannot serve them (each tensor is checked against
    the seed's checksum as it is read: a corrupt file is never handed out).

    With a CUDA `device` the tensors are made there directly (same dtype and bits): each chunk is
    read into a pinned buffer, checked, and copied up, so the seed never lands in pageable memory
    (touching freshly allocated host memory, not the read, was what made a multi-GB seed slow)."""
    import torch

    if device is not None and device.type == "cuda":
        return _load_to_device(entry, code, seed, device)

    part = _usable_part(entry, code, seed)
    if part is None:
        return None
    values: list[Any] = []
    # Every _CHUNK of every tensor with its offset in the file, read and checksummed on several
    # threads at once (pread and zlib release the GIL): a multi-GB seed reads at memory speed from
    # the page cache or the in-memory store, not at one thread's copy speed.
    chunks: list[tuple[memoryview, int]] = []
    offset = 0
    try:
        for item in part["items"]:
            if "value" in item:
                values.append(item["value"])
                continue
            t = torch.empty(item["shape"], dtype=_dtype(item["dtype"]))
            view = _byte_view(t)
            chunks.extend((view[start : start + _CHUNK], offset + start) for start in range(0, len(view), _CHUNK))
            offset += len(view)
            if item.get("requires_grad"):
                t.requires_grad_(True)
            values.append(t)
        fd = _open_seed(entry, part, offset)
        try:
            crcs = _read_chunks(fd, chunks)
        finally:
            os.close(fd)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        print(f"krefine harness: stored inputs of seed {seed} unusable ({exc}); making them", file=sys.stderr)
        forget_verified(entry)
        return None
    if crcs != part.get("crcs"):
        print(f"krefine harness: stored inputs of seed {seed} fail their checksum; making them", file=sys.stderr)
        forget_verified(entry)
        return None
    rng = torch.frombuffer(bytearray(base64.b64decode(part["rng"])), dtype=torch.uint8)
    return values, rng


def main(argv: list[str]) -> int:
    if argv[1:] not in (["generate"], ["plan"]):
        print("usage: python kb_store.py generate|plan < request.json", file=sys.stderr)
        return 2
    # One line: with `admit`, the orchestrator answers the admission question on the same stdin.
    request = json.loads(sys.stdin.readline())
    if argv[1] == "plan":
        sys.stdout.write(json.dumps(plan(request)) + "\n")
        return 0
    # Through the module, not __main__: the spawned children then find `_write_one` by its module name.
    import kb_store

    try:
        answer = kb_store.generate(request)
    except Exception as exc:  # noqa: BLE001 - the problem's own errors are reported, not raised
        answer = {"status": "error", "detail": f"{type(exc).__name__}: {exc}", "seconds": 0.0, "bytes": 0}
    sys.stdout.write(json.dumps(answer) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
