"""Integer and bool inputs keep their dtype (KernelBench's open bug, fixed by default); the old cast
stays available for exact parity; level-4-style problems (a transformers model fed token ids) evaluate.
In process on CPU with pure-Python candidates."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

import kb_eval
import kb_protocol
from harness_client import FIXTURES, WorkerProcess, evaluate_request

KB = FIXTURES / "kernelbench"
CROSS_ENTROPY = (KB / "level1" / "95_CrossEntropyLoss.py").read_text()
NLL_MASKED = (KB / "level1" / "101_NLLLossMasked.py").read_text()
TINY_GPT2 = (KB / "level4" / "1_tiny-gpt2_bs2_seq8.py").read_text()
CACHED_GPT2 = (KB / "level4" / "2_krefine-test-tiny-gpt2_bs2_seq8.py").read_text()
needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="transformers is not installed (scripts/setup-venv)"
)


def same_as_reference(problem: str) -> str:
    """A reference-equivalent candidate: the problem's own code plus `ModelNew = Model`."""
    return problem + "\n\nclass ModelNew(Model):\n    pass\n"


def evaluate(tmp_path: Path, problem: str, cast: bool | None = None, **options: Any) -> dict[str, Any]:
    request = evaluate_request(1, problem, same_as_reference(problem), tmp_path / "c1", **options)
    if cast is not None:
        request["cast_integer_inputs"] = cast
    assert kb_protocol.check_request(request, allow_extra=False) == []
    response = kb_eval.evaluate(request, kb_eval.Worker())
    assert kb_protocol.check_response(response) == []
    return response


@pytest.mark.parametrize("problem", [CROSS_ENTROPY, NLL_MASKED], ids=["cross_entropy", "nll_masked"])
def test_integer_targets_keep_their_dtype_by_default(tmp_path: Path, problem: str) -> None:
    r = evaluate(tmp_path, problem, timing_trials=3)
    assert (r["status"], r["correctness"]) == ("correct", True), r["feedback"]
    assert r["env"]["integer_inputs"] == "kept"
    assert r["ref_runtime"] > 0 and r["speedup"] is not None


def test_cast_integer_inputs_reproduces_kernelbench(tmp_path: Path) -> None:
    # KernelBench casts the class targets to float32, and cross_entropy then reads them as class
    # probabilities of the wrong shape: the reference fails, as it does in KernelBench.
    r = evaluate(tmp_path, CROSS_ENTROPY, cast=True, measure=False)
    assert r["status"] == "reference_error"
    assert r["env"]["integer_inputs"] == "cast"
    kept = evaluate(tmp_path, CROSS_ENTROPY, cast=False, measure=False)
    assert kept["status"] == "correct"


def test_the_flag_keys_the_reference_cache(tmp_path: Path) -> None:
    worker = kb_eval.Worker()
    base = evaluate_request(1, CROSS_ENTROPY, same_as_reference(CROSS_ENTROPY), tmp_path / "a", measure=False)
    assert kb_eval.evaluate(base, worker)["status"] == "correct"
    cast = dict(base, id=2, candidate={"source": base["candidate"]["source"], "build_dir": str(tmp_path / "b")})
    cast["cast_integer_inputs"] = True
    assert kb_eval.evaluate(cast, worker)["status"] == "reference_error"


@needs_transformers
def test_level4_style_model_from_a_tiny_config(tmp_path: Path) -> None:
    r = evaluate(tmp_path, TINY_GPT2, timing_trials=5)
    assert (r["status"], r["correctness"]) == ("correct", True), r["feedback"]
    assert r["metadata"]["correctness_trials"] == "(5 / 5)"
    assert r["env"]["transformers"] == kb_eval.package_version("transformers")
    assert r["speedup"] is not None and r["speedup"] > 0


@needs_transformers
def test_level4_model_from_the_hugging_face_cache_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # huggingface_hub reads HF_HUB_OFFLINE when it is imported, so this needs a fresh worker process
    # started with the variables set (as the orchestrator starts its workers).
    from hf_cache import make_cached_model

    cache = tmp_path / "hub"
    make_cached_model(cache)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    worker = WorkerProcess("compile", tmp_path / "scratch", tmp_path / "worker.log")
    try:
        request = evaluate_request(1, CACHED_GPT2, same_as_reference(CACHED_GPT2), tmp_path / "c1", timing_trials=3)
        r = worker.request(request)
        assert (r["status"], r["correctness"]) == ("correct", True), r["feedback"]
        missing = CACHED_GPT2.replace("krefine-test/tiny-gpt2", "krefine-test/not-cached")
        request = evaluate_request(2, missing, same_as_reference(missing), tmp_path / "c2", measure=False)
        r = worker.request(request)
        # Offline: an immediate, precise failure, never a wait on the network.
        assert r["status"] == "reference_error"
        assert "couldn't find them in the cached files" in r["feedback"]
        assert f"model krefine-test/not-cached is not in the cache {cache}" in r["feedback"]
    finally:
        assert worker.close() == 0


def test_offline_hint_only_for_offline_cache_misses(monkeypatch: pytest.MonkeyPatch) -> None:
    import kb_feedback

    miss = OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the cached files.")
    code = 'model_name = "org/m"\n'
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert kb_feedback.hf_offline_hint(miss, code) is None
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", "/c/hub")
    assert kb_feedback.hf_offline_hint(miss, code) == (
        "Hugging Face model org/m is not in the cache /c/hub, and workers run offline (eval.hf.offline = true). "
        "Download it first (e.g. `hf download NAME`) or set eval.hf.cache."
    )
    assert kb_feedback.hf_offline_hint(ValueError("cached files"), code) is None
