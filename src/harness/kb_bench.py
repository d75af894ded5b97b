"""The driver of `krefine bench compile`: one candidate's build timed through the harness's own build
code (`build`), the shared precompiled headers made ahead (`pch`), and the machine code of two builds
compared object by object (`compare`). Run as a script (`python kb_bench.py build ...`), one JSON line
on stdout; never imported by a worker.

It sits above kb_compile (it builds through `load_candidate`), so kb_build, which kb_compile drives, never
imports back up.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kb_build
import kb_compile
import kb_cusplit


def _bench_build(args: Any) -> dict[str, Any]:
    import resource
    import time

    import torch.utils.cpp_extension  # noqa: F401 - a compile worker has torch imported already

    source = Path(args.source).read_text()
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = kb_compile.load_candidate(
        source, args.build_dir, args.log, args.arch, record=True, build_mode=args.mode
    )
    seconds = time.perf_counter() - started
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    info = kb_compile.read_build_info(args.build_dir)
    build_path = info.get("build_path")
    # How kb_nvcc built each CUDA object, where it did (see kb_nvcc.MARKER_SUFFIX).
    steps = sorted({m.read_text().strip() for m in Path(args.build_dir).rglob("*.nvcc-steps")})
    if build_path and steps:
        build_path = f"{build_path} [{', '.join(steps)}]"
    return {
        "ok": result.ok,
        "seconds": round(seconds, 3),
        # The compilers' CPU time: steadier than wall time on a busy machine.
        "cpu_seconds": round(cpu, 3),
        "build_path": build_path,
        "error": result.error,
    }


def _bench_pch(args: Any) -> dict[str, Any]:
    """Make the PCH a candidate's first extension needs (untimed warm-up), without building it."""
    import time

    started = time.perf_counter()
    result = kb_compile.load_candidate(
        Path(args.source).read_text(), args.build_dir, args.log, args.arch, record=True, build_mode="pch-only"
    )
    warmed = isinstance(result.exc, kb_build.PchOnly)
    return {"ok": warmed, "pch": str(result.exc) if warmed else None, "seconds": round(time.perf_counter() - started, 3)}


def _disassemble(obj: Path) -> str | None:
    """Machine code of an object: SASS for a CUDA object (cuobjdump), x86 for a host one (objdump)."""
    if obj.name.endswith(".cuda.o"):
        tool = shutil.which("cuobjdump") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump")
        cmd = [tool, "-sass", str(obj)]
    else:
        cmd = ["objdump", "-d", "--no-show-raw-insn", "-C", str(obj)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    # File names differ between the two builds; the code must not.
    return "\n".join(line for line in done.stdout.splitlines() if str(obj.parent) not in line and "file format" not in line)


_PADDING = re.compile(r"(?:(?:cs |data16 )*nop[wl]?\b|xchg\s+%ax,%ax$|int3$)")


def _functions(objects: list[Path]) -> dict[str, tuple[str, list[str]]] | None:
    """Each function of host objects: its symbol's binding (`nm` letter) and its instructions with
    addresses and call targets' offsets left out (they move when the rest of the object differs)."""
    out: dict[str, tuple[str, list[str]]] = {}
    for obj in objects:
        try:
            kinds = subprocess.run(["nm", str(obj)], capture_output=True, text=True, timeout=300, check=False)
            code = subprocess.run(
                ["objdump", "-d", "--no-show-raw-insn", str(obj)], capture_output=True, text=True, timeout=300, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        if kinds.returncode != 0 or code.returncode != 0:
            return None
        binding = {}
        for line in kinds.stdout.splitlines():
            parts = line.split()
            if len(parts) == 3:
                binding[parts[2]] = parts[1]
        current: list[str] | None = None
        for line in code.stdout.splitlines():
            head = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
            if head:
                current = []
                out.setdefault(head.group(1), (binding.get(head.group(1), "?"), current))
                continue
            insn = re.match(r"^\s+[0-9a-f]+:\s+(.*)$", line)
            if insn and current is not None:
                current.append(re.sub(r"[0-9a-f]+ <[^>]*>", "<>", insn.group(1)))
    for _, insns in out.values():
        # The alignment padding after a function depends on what follows it in the object, not on it.
        while insns and _PADDING.match(insns[-1]):
            insns.pop()
    return out


def _compare_split(plain: list[Path], candidate_unit: Path, bindings_unit: Path) -> dict[str, str]:
    """A split build against the plain one, function by function: the candidate's own functions (global
    or file-local ones, not compiler clones) of the candidate unit, then every other function."""
    a, own, bound = _functions(plain), _functions([candidate_unit]), _functions([bindings_unit])
    if a is None or own is None or bound is None:
        return {"functions": "unavailable"}
    b = {**bound, **own}  # the linker keeps the first unit's copy of a shared function: main.o's
    mine = {name for name, (kind, _) in own.items() if kind in ("T", "t") and "." not in name}
    verdict: dict[str, str] = {}
    differ = sorted(name for name in mine if name not in a or a[name][1] != b[name][1])
    verdict["candidate functions"] = "identical" if not differ else "different: " + ", ".join(differ)[:300]
    others = [name for name in a if name not in mine]
    same = sum(1 for name in others if name in b and a[name][1] == b[name][1])
    verdict["other functions"] = "identical" if same == len(others) else f"{same} of {len(others)} identical"
    return verdict


def _kernels(text: str) -> dict[str, list[str]]:
    """`cuobjdump -sass` output as each kernel's instructions."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        head = re.match(r"\s*Function : (\S+)", line)
        if head:
            current = out.setdefault(head.group(1), [])
        elif current is not None and line.strip():
            current.append(line.strip())
    return out


def _bench_compare(args: Any) -> dict[str, Any]:
    """Compare the machine code of two builds of one candidate, object by object (a split build
    against a plain one: function by function, see `_compare_split`; a CUDA object kernel by kernel
    when the whole differs: a CUDA split instantiates template kernels in another order)."""
    a, b = Path(args.a), Path(args.b)
    in_a = {p.relative_to(a).as_posix() for p in a.rglob("*.o")}
    in_b = {p.relative_to(b).as_posix() for p in b.rglob("*.o")}
    objects: dict[str, str] = {}
    for rel in [r for r in in_b - in_a if r.endswith("/" + kb_cusplit.HOST_OBJECT)]:
        # The host unit of a CUDA split: the plain build compiled that code inside its `.cu`.
        objects[rel] = "host unit of the CUDA split (host code, compiled apart)"
        in_b.discard(rel)
    split = {rel for rel in in_b - in_a if rel.endswith("/krefine_bind.o")}
    for rel in split:
        main = rel[: -len("krefine_bind.o")] + "main.o"
        if main in in_a and main in in_b:
            found = _compare_split([a / main], b / main, b / rel)
            objects.update({f"split {k}": v for k, v in found.items()})
            in_a.discard(main)
            in_b.discard(main)
            in_b.discard(rel)
    for rel in sorted(in_a | in_b):
        da = _disassemble(a / rel) if (a / rel).exists() else None
        db = _disassemble(b / rel) if (b / rel).exists() else None
        if da is None or db is None:
            objects[rel] = "unavailable"
        elif da == db:
            objects[rel] = "identical"
        elif rel.endswith(".cuda.o") and (ka := _kernels(da)) and ka == _kernels(db):
            objects[rel] = f"identical kernels ({len(ka)}, in another order)"
        else:
            objects[rel] = "different"
    return {"objects": objects}


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="kb_bench.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    for cmd in ("build", "pch"):
        p = sub.add_parser(cmd)
        p.add_argument("--source", required=True)
        p.add_argument("--build-dir", required=True)
        p.add_argument("--log", required=True)
        p.add_argument("--arch", default=None)
        p.add_argument("--mode", choices=kb_build.BUILD_MODES, default=kb_build.FAST)
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    args = parser.parse_args(argv)
    handlers = {"build": _bench_build, "pch": _bench_pch, "compare": _bench_compare}
    print(json.dumps(handlers[args.cmd](args)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
