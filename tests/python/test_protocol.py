"""Golden protocol fixtures and the shape checker (the Rust side deserializes the same files)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

import kb_protocol
from harness_client import HARNESS, PROTOCOL

EXPECTED_FIXTURES = {
    "ready.json",
    "compile_request.json",
    "compile_response_ok.json",
    "compile_response_error.json",
    "prepare_request.json",
    "prepare_response.json",
    "progress_reference_start.json",
    "evaluate_request.json",
    "evaluate_response_correct.json",
    "evaluate_response_incorrect.json",
    "profile_request.json",
    "profile_response.json",
    "warm_headers_request.json",
    "warm_headers_response.json",
    "shutdown_request.json",
    "shutdown_response.json",
    "error_response.json",
}


def test_every_expected_fixture_exists() -> None:
    assert not EXPECTED_FIXTURES - {p.name for p in PROTOCOL.glob("*.json")}


@pytest.mark.parametrize("name", sorted(p.name for p in PROTOCOL.glob("*.json")))
def test_fixture_matches_its_shape_strictly(name: str) -> None:
    message = json.loads((PROTOCOL / name).read_text())
    assert kb_protocol.check_message(message) == []
    # `<op>_request*.json`, `<kind>_response*.json`, or `<kind>[_what].json` (an op may hold a `_`).
    if "_request" in name:
        assert message["op"] == name.split("_request")[0]
    elif "_response" in name and name != "error_response.json":
        assert message["kind"] == name.split("_response")[0]
    elif name != "error_response.json":
        assert message["kind"] == name.split("_")[0].removesuffix(".json")


def test_fixture_values_are_consistent() -> None:
    correct = json.loads((PROTOCOL / "evaluate_response_correct.json").read_text())
    assert correct["status"] == "correct" and correct["correctness"] is True
    assert correct["metadata"]["correctness_trials"] == "(5 / 5)"
    assert math.isclose(correct["speedup"], correct["ref_runtime"] / correct["runtime"])
    assert correct["runtime"] == correct["runtime_stats"]["mean"]
    incorrect = json.loads((PROTOCOL / "evaluate_response_incorrect.json").read_text())
    assert incorrect["status"] == "incorrect" and incorrect["runtime"] == -1.0
    assert incorrect["metadata"]["max_difference"] == ["1.000000"] * 5
    error = json.loads((PROTOCOL / "compile_response_error.json").read_text())
    assert error["error_name"] == "builtins.RuntimeError" and "error:" in error["feedback"]


def test_checker_rejects_wrong_types_missing_and_unknown_fields() -> None:
    good = json.loads((PROTOCOL / "shutdown_request.json").read_text())
    assert kb_protocol.check_request({**good, "id": True}) == ["$.id: expected int, got True"]
    assert kb_protocol.check_request({"op": "shutdown"}) == ["$: missing field 'id'"]
    assert kb_protocol.check_request({"id": 1, "op": "launch"})[0].startswith("$.op: unknown op 'launch'")
    # Requests tolerate new fields from Rust; responses and fixtures are strict.
    assert kb_protocol.check_request({**good, "future": 1}) == []
    assert kb_protocol.check_message({**good, "future": 1}) == ["$: unknown field 'future'"]
    ready = json.loads((PROTOCOL / "ready.json").read_text())
    assert kb_protocol.check_response({**ready, "extra": 1}) == ["$: unknown field 'extra'"]
    evaluate = json.loads((PROTOCOL / "evaluate_request.json").read_text())
    assert kb_protocol.check_request({**evaluate, "precision": "fp8"}) == [
        "$.precision: expected one of ['fp32', 'fp16', 'bf16'], got 'fp8'"
    ]
    assert kb_protocol.check_request({**evaluate, "reference_runtime": {"mean": 1.0}})[0].startswith(
        "$.reference_runtime: missing field"
    )


def test_non_finite_numbers_never_reach_the_wire() -> None:
    sys.path.insert(0, str(HARNESS.parent))
    import krefine_harness

    assert (
        krefine_harness.encode_json({"a": float("nan"), "b": [float("inf"), 1.5]})
        == '{"a": null, "b": [null, 1.5]}'
    )


def test_seeds_cli_prints_the_golden_vector() -> None:
    out = subprocess.run([sys.executable, str(HARNESS), "seeds"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [734796314, 576165995, 2197670066, 839703249, 2584932063]
    assert Path(HARNESS).name == "krefine_harness.py"
