"""The fast build (kb_build): header narrowing, the shared precompiled header, the fallback to the plain
build, and replaying a recorded build path. The real C++ builds reuse the session's compile worker
(conftest `compiled`) where they can; one more real build checks a fallback that succeeds."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import kb_build
import kb_compile
import kb_pch
from harness_client import HARNESS_DIR, WorkerProcess, compile_request

TINY_PCH = "#include <vector>\n#include <string>\n"
TINY_FLAGS = ["-std=c++17", "-fPIC"]


def test_narrowing_replaces_only_the_extension_header() -> None:
    source = '#include <torch/extension.h>\n# include "torch/extension.h" // again\n__global__ void k() {}\n'
    narrowed = kb_build.narrow_cuda_sources([source, "int x;"])
    assert narrowed is not None
    assert "torch/extension.h" not in narrowed[0]
    assert narrowed[0].count("#include <torch/types.h>") == 2
    assert narrowed[0].endswith("__global__ void k() {}\n") and narrowed[1] == "int x;"
    # Nothing to narrow, or a file that writes bindings itself: left alone.
    assert kb_build.narrow_cuda_sources(["#include <torch/types.h>\n"]) is None
    with_bindings = "#include <torch/extension.h>\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}\n"
    assert kb_build.narrow_cuda_sources([with_bindings]) is None


def test_build_path_summarises_the_extensions(tmp_path: Path) -> None:
    ctx = kb_build.BuildContext(mode=kb_build.FAST, pch_root=tmp_path)
    assert ctx.build_path() is None
    ctx.builds.append(kb_build.ExtensionBuild("a", kb_build.FAST))
    assert ctx.build_path() == "fast"
    ctx.builds.append(kb_build.ExtensionBuild("b", kb_build.PLAIN, why="options"))
    assert ctx.build_path() == "plain"
    ctx.builds.append(kb_build.ExtensionBuild("c", "fallback", why="fast-build-failed"))
    assert ctx.build_path() == "fallback:fast-build-failed"


def test_main_cpp_flags_are_torchs_without_the_extension_name() -> None:
    flags = kb_pch.main_cpp_flags(["-O3"], None, with_cuda=False)
    assert flags is not None
    assert "-DTORCH_API_INCLUDE_EXTENSION_H" in flags and "-std=c++17" in flags
    assert flags[-1] == "-O3"
    assert not any(f.startswith("-DTORCH_EXTENSION_NAME") for f in flags)


def _compiler() -> str:
    from torch.utils import cpp_extension

    return cpp_extension.get_cxx_compiler()


def test_concurrent_pch_builds_share_one_valid_header(tmp_path: Path) -> None:
    """Two processes asking for the same PCH at once: one builds, the other waits; both get the same,
    complete header, no temporary folder is left, and GCC accepts the PCH."""
    root = tmp_path / "pch"
    script = textwrap.dedent(
        f"""
        import sys, json
        from pathlib import Path
        sys.path.insert(0, {str(HARNESS_DIR)!r})
        import kb_pch
        r = kb_pch.ensure_pch(Path({str(root)!r}), {_compiler()!r}, {TINY_FLAGS!r}, text={TINY_PCH!r})
        print(json.dumps(r.header))
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    headers = [p.communicate(timeout=300)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert headers[0] == headers[1] and headers[0] != "null"
    header = Path(headers[0].strip('"'))
    entries = sorted(p.name for p in root.iterdir())
    key = header.parent.name
    assert entries == [key, f"{key}.lock"]
    assert header.read_text() == TINY_PCH
    main = tmp_path / "m.cpp"
    main.write_text("int main() { std::vector<std::string> v; return (int)v.size(); }\n")
    used = subprocess.run(
        [_compiler(), *TINY_FLAGS, "-include", str(header), "-Winvalid-pch", "-H", "-c", str(main),
         "-o", str(tmp_path / "m.o")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"! {header}.gch" in used.stderr  # GCC's mark for a PCH it used
    assert "invalid" not in used.stderr


def test_a_pch_that_cannot_be_built_is_remembered(tmp_path: Path) -> None:
    root = tmp_path / "pch"
    first = kb_pch.ensure_pch(root, _compiler(), TINY_FLAGS, text="#error no PCH here\n")
    assert first.header is None and "no PCH here" in first.error
    again = kb_pch.ensure_pch(root, _compiler(), TINY_FLAGS, text="#error no PCH here\n")
    assert again.header is None and "no PCH here" in again.error
    assert [p.suffix for p in root.iterdir() if p.is_dir()] == []


def test_only_flags_that_cannot_name_a_file_get_a_shared_header() -> None:
    ok = {"extra_cflags": ["-O3", "-std=c++17", "-DNDEBUG", "-DBLOCK=256", "-ffast-math", "-march=native",
                           "-Wno-unused-variable", "-fopenmp", "-w", "-g"], "with_cuda": True}
    assert kb_pch.trusted_pch_request(ok) == (ok["extra_cflags"], True, kb_pch.PCH_TEXT)
    # A request names one of krefine's headers; the text compiled is krefine's, never the request's.
    assert kb_pch.trusted_pch_request({**ok, "header": "bindings"}) == (
        ok["extra_cflags"], True, kb_pch.PCH_TEXTS["bindings"]
    )
    assert kb_pch.trusted_pch_request({**ok, "header": "#include </etc/shadow>"}) == "malformed request"
    for bad in (["-include", "x.h"], ["-I/tmp"], ["-Wp,-include,/tmp/x.h"], ["-fplugin=/tmp/p.so"],
                ["@/tmp/flags"], ["-specs=/tmp/s"], ["-isystem/tmp"], ["-B/tmp"], ["-DX=$(id)"]):
        refused = kb_pch.trusted_pch_request({"extra_cflags": bad, "with_cuda": False})
        assert isinstance(refused, str) and "must not take" in refused, bad
    assert kb_pch.trusted_pch_request(
        {"extra_cflags": [], "extra_include_paths": ["/tmp"], "with_cuda": False}
    ) == "extra include paths"
    assert kb_pch.trusted_pch_request({"extra_cflags": "-O3", "with_cuda": False}) == "malformed request"
    assert kb_pch.trusted_pch_request(None) == "malformed request"


def test_the_warmed_headers_are_the_ones_a_default_flags_candidate_asks_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """`warm_requests` (what a run makes before its first candidates ask) asks exactly what a compile
    child of a `load_inline` with CUDA sources and no flags would miss (kb_build: `main.cpp`'s header
    and the CUDA split's host unit's), every request one a trusted builder accepts; without CUDA, the
    C++ extension's `main.cpp` header alone."""
    from torch.utils import cpp_extension

    import kb_cusplit

    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/usr/local/cuda")
    cuda = kb_pch.warm_requests()
    assert [(w["header"], w["with_cuda"]) for w in cuda] == [("extension", True), ("cuda_host", True)]
    assert cuda[0]["extra_cflags"] == []
    assert cuda[1]["extra_cflags"] == kb_cusplit.host_extra_cflags([], [])
    assert all(not isinstance(kb_pch.trusted_pch_request(w), str) for w in cuda)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    cpu = kb_pch.warm_requests()
    assert [(w["header"], w["with_cuda"], w["extra_cflags"]) for w in cpu] == [("extension", False, [])]
    assert kb_pch.trusted_pch_request(cpu[0]) == ([], False, kb_pch.PCH_TEXT)


def test_background_builder_publishes_a_header_lookups_find(tmp_path: Path) -> None:
    """What the worker does for a child that missed a PCH: a separate process builds it; a lookup (all a
    confined child may do) finds nothing before and the complete header after; asking again while it
    exists starts nothing."""
    root = tmp_path / "pch"
    assert kb_pch.lookup_pch(root, _compiler(), TINY_FLAGS, text=TINY_PCH).header is None
    builder = kb_pch.BackgroundPch()
    assert builder.start(root, _compiler(), TINY_FLAGS, text=TINY_PCH) is not None
    assert builder.start(root, _compiler(), TINY_FLAGS, text=TINY_PCH) is None  # already under way
    builder.wait()
    assert builder.jobs == {}
    found = kb_pch.lookup_pch(root, _compiler(), TINY_FLAGS, text=TINY_PCH)
    assert found.header is not None and Path(found.header).read_text() == TINY_PCH
    assert Path(found.header + ".gch").is_file()
    assert builder.start(root, _compiler(), TINY_FLAGS, text=TINY_PCH) is None
    broken = kb_pch.BackgroundPch()
    assert broken.start(root, _compiler(), TINY_FLAGS, text="#error no PCH here\n") is not None
    broken.wait()
    assert [p.name.endswith(".failed") for p in root.iterdir() if p.suffix == ".failed"] == [True]


def test_a_worker_told_not_to_builds_no_background_header(tmp_path: Path) -> None:
    """`pch_background: false` (the orchestrator left the run's headers to another sandboxed worker):
    a header the child missed starts no background build here; the request shape accepts the field."""
    import kb_protocol
    import krefine_harness

    request = compile_request(1, "x = 1\n", tmp_path / "build-cache" / "k1", tmp_path / "compile.log")
    request["pch_background"] = False
    assert kb_protocol.check_request(request) == []
    server = krefine_harness.Server("compile", str(tmp_path / "scratch"))
    wanted = [{"extra_cflags": ["-O3"], "with_cuda": False}]
    assert kb_pch.trusted_pch_request(wanted[0]) == (["-O3"], False, kb_pch.PCH_TEXT)
    assert server.build_wanted_pch(request, wanted) is False
    assert server._pch is None or server._pch.jobs == {}
    assert not (tmp_path / "build-cache" / kb_pch.PCH_DIR_NAME).exists()


PCH_TAMPERER = '''
import os, sys
from pathlib import Path
import torch.nn as nn

root = Path(__file__).resolve().parent.parent / "pch"
try:
    root.mkdir(exist_ok=True)
    (root / "planted.h").write_text("#define torch evil\\n")
    print("KREFINE_PCH_TAMPER wrote", flush=True)
except OSError as exc:
    print(f"KREFINE_PCH_TAMPER refused {type(exc).__name__}", flush=True)


class ModelNew(nn.Module):
    def forward(self, a, b):
        return a + b
'''


@pytest.mark.slow
def test_a_compiling_candidate_cannot_write_the_shared_headers(
    cpu_worker: WorkerProcess, compiled: dict[str, dict[str, Any]], work: Path
) -> None:
    import kb_sandbox

    if kb_sandbox.landlock_abi() < 1:
        pytest.skip("this kernel has no Landlock: the compile child is not confined")
    build = work / "build" / "pch_tamperer"
    log = work / "logs" / "pch_tamperer.log"
    response = cpu_worker.request(compile_request(40, PCH_TAMPERER, build, log))
    assert response["status"] == "ok", response
    assert "KREFINE_PCH_TAMPER refused PermissionError" in log.read_text()
    assert not (work / "build" / "pch" / "planted.h").exists()


# ------------------------------------------------------------------------------------------ real builds


@pytest.mark.slow
def test_a_first_build_goes_without_the_header_the_worker_then_builds(
    compiled: dict[str, dict[str, Any]], work: Path
) -> None:
    first = compiled["ok_cpp_first.py"]["response"]
    assert first["status"] == "ok" and first["build_path"] == "plain"
    log = Path(first["log_path"]).read_text()
    assert "no precompiled header for 'krefine_fixture_ok_add': not built yet" in log
    # The worker built the two headers of a split build, and not torch/extension.h's, which a
    # candidate that splits does not need.
    published = [p for p in (work / "build" / "pch").glob("*/krefine_pch.h.gch") if ".tmp-" not in p.parent.name]
    texts = sorted(Path(str(p)[: -len(".gch")]).read_text() for p in published)
    assert texts == sorted([kb_pch.PCH_TEXTS["candidate"], kb_pch.PCH_TEXTS["bindings"]])
    assert "building the shared precompiled header" in (work / "worker.log").read_text()
    assert compiled["ok_cpp.py"]["response"]["build_path"] == "fast"
    [ext] = kb_compile.read_build_info(str(compiled["ok_cpp.py"]["build_dir"]))["extensions"]
    assert ext["split"] is True
    assert Path(ext["pch"]).read_text() == kb_pch.PCH_TEXTS["candidate"]
    assert Path(ext["bindings_pch"]).read_text() == kb_pch.PCH_TEXTS["bindings"]


@pytest.mark.slow
def test_compile_records_fast_and_a_replay_rebuilds_nothing(
    compiled: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    response = compiled["ok_cpp.py"]["response"]
    assert response["status"] == "ok" and response["build_path"] == "fast"
    build: Path = compiled["ok_cpp.py"]["build_dir"]
    info = kb_compile.read_build_info(str(build))
    assert info["build_path"] == "fast"
    [ext] = info["extensions"]
    assert ext["name"] == "krefine_fixture_ok_add" and ext["path"] == "fast" and ext["pch"]
    assert Path(ext["pch"]).parent.parent == kb_pch.pch_root_for(str(build))
    objects = {p: p.stat().st_mtime_ns for p in build.rglob("*.o")}
    assert sorted(p.name for p in objects) == ["krefine_bind.o", "main.o"]  # the split build's two units
    so = {p: p.stat().st_mtime_ns for p in build.rglob("*.so")}
    # The GPU worker's import: same flags, so ninja finds everything up to date.
    loaded = kb_compile.load_candidate(
        (build / "candidate.py").read_text(), str(build), str(tmp_path / "load.log")
    )
    try:
        assert loaded.ok, loaded.feedback
        assert loaded.build_path == "fast"
        assert {p: p.stat().st_mtime_ns for p in build.rglob("*.o")} == objects
        assert {p: p.stat().st_mtime_ns for p in build.rglob("*.so")} == so
        import torch

        ext_module = loaded.module.add_ext  # type: ignore[union-attr]
        # Loaded exactly as load_inline loads it: the module of that name, from the build dir.
        assert ext_module.__name__ == "krefine_fixture_ok_add"
        assert Path(ext_module.__file__).parent == build / "krefine_fixture_ok_add"
        a, b = torch.arange(5.0), torch.full((5,), 2.0)
        assert torch.equal(loaded.model_new()(a, b), a + b)
    finally:
        kb_compile.unload_candidate(loaded)


@pytest.mark.slow
def test_an_error_in_the_candidates_own_code_is_built_once(compiled: dict[str, dict[str, Any]]) -> None:
    """A syntax error fails the plain build as it fails the fast one: no plain retry (issue 36)."""
    response = compiled["compile_error.py"]["response"]
    assert response["status"] == "compile_error"
    assert response["build_path"] == "fast"
    log = Path(response["log_path"]).read_text()
    assert "not building it again the plain way" in log and "building it the plain way" not in log
    assert log.count("error: expected") == 1
    # The fast attempt's output went to the compile log, where a plain build's would have gone.
    assert not any(compiled["compile_error.py"]["build_dir"].rglob(kb_build.FAST_ATTEMPT_LOG))


FALLBACK_CANDIDATE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ext = load_inline(
    name="krefine_fixture_fallback",
    cpp_sources="torch::Tensor twice(torch::Tensor x) { return x * 2; }",
    functions=["twice"],
    extra_cflags=["-Werror"],
)


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.twice(x)
'''


@pytest.mark.slow
def test_a_candidate_that_only_builds_plain_still_builds(tmp_path: Path) -> None:
    """An unusable PCH plus -Werror fails the fast build; the plain build succeeds and is recorded, and
    a replay uses the plain build as it is."""
    from torch.utils import cpp_extension

    build = tmp_path / "builds" / "fallback"
    flags = kb_pch.main_cpp_flags(["-Werror"], None, with_cuda=False)
    assert flags is not None
    compiler = cpp_extension.get_cxx_compiler()
    for text in kb_pch.PCH_TEXTS.values():  # whichever way the fast build goes, its header is bad
        key_dir = kb_pch.pch_root_for(str(build)) / kb_pch.pch_key(compiler, flags, text)
        key_dir.mkdir(parents=True)
        (key_dir / kb_pch.PCH_HEADER).write_text(text)
        (key_dir / (kb_pch.PCH_HEADER + ".gch")).write_bytes(b"not a PCH")
    saved = {k: os.environ.get(k) for k in ("TORCH_EXTENSIONS_DIR", "TORCH_CUDA_ARCH_LIST", "TORCH_USE_CUDA_DSA")}
    try:
        result = kb_compile.load_candidate(
            FALLBACK_CANDIDATE, str(build), str(tmp_path / "c.log"), record=True
        )
        assert result.ok, result.feedback
        assert result.build_path == "fallback:fast-build-failed"
        assert kb_compile.read_build_info(str(build))["build_path"] == "fallback:fast-build-failed"
        assert "invalid-pch" in (build / "krefine_fixture_fallback" / kb_build.FAST_ATTEMPT_LOG).read_text()
        import torch

        x = torch.arange(4.0)
        assert torch.equal(result.model_new()(x), x * 2)
        kb_compile.unload_candidate(result)
        objects = {p: p.stat().st_mtime_ns for p in build.rglob("*.o")}
        again = kb_compile.load_candidate(FALLBACK_CANDIDATE, str(build), str(tmp_path / "d.log"))
        assert again.ok and again.build_path == "fallback:fast-build-failed"
        assert {p: p.stat().st_mtime_ns for p in build.rglob("*.o")} == objects
        kb_compile.unload_candidate(again)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --------------------------------------------------------------- the wrapper's decisions, without a compiler


class FakeLoadInline:
    """Stands in for torch's load_inline (same signature): records each call, fails fast builds on demand."""

    def __init__(self, fail_fast: bool) -> None:
        from torch.utils import cpp_extension

        self.fail_fast = fail_fast
        self.calls: list[dict[str, Any]] = []
        self.__signature__ = __import__("inspect").signature(cpp_extension.load_inline)

    def __call__(self, **kwargs: Any) -> str:
        self.calls.append(kwargs)
        from torch.utils import cpp_extension

        cpp_extension.JIT_EXTENSION_VERSIONER.entries[kwargs["name"]] = len(self.calls)
        if self.fail_fast and "-include" in (kwargs.get("extra_cflags") or []):
            raise RuntimeError(f"Error building extension '{kwargs['name']}'")
        return f"module {kwargs['name']}"


def _fake_pch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    header = str(tmp_path / "pch" / "k" / kb_pch.PCH_HEADER)
    monkeypatch.setattr(kb_pch, "ensure_pch", lambda *a, **k: kb_pch.PchResult(header))
    monkeypatch.setattr(kb_pch, "pch_supported", lambda compiler: True)
    # No CUDA toolkit on CI: torch cannot name a CUDA build's flags there, so give the wrapper some.
    monkeypatch.setattr(kb_pch, "main_cpp_flags", lambda *a, **k: ["-std=c++17"])
    # These fakes check the unsplit fast call; the CUDA split runs real compilers (test_cusplit.py).
    monkeypatch.setenv("KREFINE_SPLIT_CUDA", "0")
    return header


CUDA_SRC = "#include <torch/extension.h>\n__global__ void k() {}\n"


def test_fast_call_keeps_the_candidates_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    header = _fake_pch(monkeypatch, tmp_path)
    fake = FakeLoadInline(fail_fast=False)
    ctx = kb_build.BuildContext(mode=kb_build.FAST, pch_root=tmp_path / "pch")
    cpp = ["torch::Tensor f(torch::Tensor x);"]
    out = kb_build.FastLoadInline(fake, ctx)("ext", cpp, cuda_sources=CUDA_SRC, functions=["f"], extra_cflags=["-O3"])
    assert out == "module ext" and len(fake.calls) == 1
    call = fake.calls[0]
    assert call["name"] == "ext" and call["functions"] == ["f"] and call["build_directory"] is None
    assert call["extra_cflags"] == ["-include", header, "-Winvalid-pch", "-O3"]
    assert "torch/extension.h" not in call["cuda_sources"][0]
    assert call["cpp_sources"] == cpp and call["cpp_sources"] is not cpp  # torch appends to lists
    assert ctx.build_path() == "fast"


def test_failed_fast_call_is_repeated_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils import cpp_extension

    _fake_pch(monkeypatch, tmp_path)
    fake = FakeLoadInline(fail_fast=True)
    ctx = kb_build.BuildContext(mode=kb_build.FAST, pch_root=tmp_path / "pch")
    cpp_extension.JIT_EXTENSION_VERSIONER.entries.clear()
    kwargs = {"cuda_sources": CUDA_SRC, "functions": ["f"], "build_directory": str(tmp_path / "ext")}
    out = kb_build.FastLoadInline(fake, ctx)("ext", "decl;", **kwargs)
    assert out == "module ext" and len(fake.calls) == 2
    plain = fake.calls[1]
    assert plain["extra_cflags"] is None and plain["cuda_sources"] == CUDA_SRC and plain["cpp_sources"] == "decl;"
    # The fast attempt's version entry was rolled back, so the plain build keeps the extension's name.
    assert cpp_extension.JIT_EXTENSION_VERSIONER.entries == {"ext": 2}
    assert ctx.build_path() == "fallback:fast-build-failed"
    assert "Error building extension 'ext'" in (tmp_path / "ext" / kb_build.FAST_ATTEMPT_LOG).read_text()
    # A replay (the GPU worker's import) goes straight to the plain build.
    replay = kb_build.BuildContext(
        mode=kb_build.FAST, pch_root=tmp_path / "pch", replay=kb_build.read_replay({"extensions": [b.to_json() for b in ctx.builds]})
    )
    again = FakeLoadInline(fail_fast=True)
    assert kb_build.FastLoadInline(again, replay)("ext", "decl;", **kwargs) == "module ext"
    assert len(again.calls) == 1 and again.calls[0]["extra_cflags"] is None


def test_plain_mode_and_opt_outs_call_load_inline_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pch(monkeypatch, tmp_path)
    for mode, kwargs, why in [
        (kb_build.PLAIN, {}, "mode"),
        (kb_build.FAST, {"use_pch": True}, "options"),
        (kb_build.FAST, {"no_implicit_headers": True}, "options"),
    ]:
        fake = FakeLoadInline(fail_fast=False)
        ctx = kb_build.BuildContext(mode=mode, pch_root=tmp_path / "pch")
        kb_build.FastLoadInline(fake, ctx)("ext", "decl;", cuda_sources=CUDA_SRC, **kwargs)
        assert fake.calls[0]["extra_cflags"] is None and fake.calls[0]["cuda_sources"] == CUDA_SRC
        assert ctx.builds[0].why == why and ctx.build_path() == "plain"



NOTICE_WAITER = '''
import os, time
from pathlib import Path
import torch.nn as nn
import kb_build

# What a real miss of a shared header does inside load_inline (kb_build.Builder._shared_pch).
kb_build.PCH_MISSED({"extra_cflags": ["-O2"], "with_cuda": False, "header": "extension"})
marker = Path(MARKER)
deadline = time.monotonic() + 120
while not marker.exists():
    if time.monotonic() > deadline:
        raise RuntimeError("the worker heard of the missed header only after this compile")
    time.sleep(0.05)


class ModelNew(nn.Module):
    def forward(self, a, b):
        return a + b
'''


def test_a_compile_child_tells_its_worker_of_a_missed_header_while_it_builds(tmp_path: Path) -> None:
    """The worker hears of a header the child missed while the child still runs (and starts it then,
    not once the build has ended): the child waits for what the worker does on the notice."""
    import krefine_harness

    build = tmp_path / "build-cache" / "k1"
    build.mkdir(parents=True)
    marker = build / "heard"
    heard: list[Any] = []

    def on_missed(item: Any) -> None:
        heard.append(item)
        marker.write_text("heard\n")

    source = NOTICE_WAITER.replace("MARKER", repr(str(marker)))
    response, wanted = krefine_harness.compile_in_child(
        compile_request(1, source, build, tmp_path / "compile.log"), on_missed
    )
    assert response["status"] == "ok", response
    assert heard == [{"extra_cflags": ["-O2"], "with_cuda": False, "header": "extension"}]
    assert wanted == []  # a forged notice is not in the child's own list


def test_a_compile_starts_at_most_four_headers_from_its_childs_notices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A child's notices are the candidate's to forge: the worker checks each (here, flags that name a
    file: refused) and acts on at most PCH_PER_COMPILE of them."""
    import krefine_harness

    request = compile_request(1, "x = 1\n", tmp_path / "build-cache" / "k1", tmp_path / "compile.log")
    server = krefine_harness.Server("compile", str(tmp_path / "scratch"))
    started: list[bool] = []
    starter = server.pch_starter(request, started)
    for n in range(7):
        starter({"extra_cflags": [f"-I/tmp/{n}"], "with_cuda": False, "header": "extension"})
    assert started == [False] * krefine_harness.PCH_PER_COMPILE
    assert capsys.readouterr().err.count("no shared precompiled header for these flags") == 4
