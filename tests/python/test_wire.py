"""What the worker reads from a candidate's process (kb_wire): only the globals the harness's own
messages name resolve, so a crafted pickle runs nothing in the worker. Unit checks of the unpickler, then
the real thing: a candidate in its own process that writes a crafted pickle down the worker's pipe fails
with a clear verdict, no code of it ran in the worker (no marker file), and the worker goes on judging
honest candidates. Verdicts, findings and files only."""

from __future__ import annotations

import builtins
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import kb_candidate
import kb_eval
import kb_prepare
import kb_protocol
import kb_reference
import kb_strict
import kb_wire
from harness_client import FIXTURES, evaluate_request, prepare_request

MATMUL = (FIXTURES / "integrity" / "problem_matmul.py").read_text()
HONEST = (FIXTURES / "integrity" / "honest.py").read_text()
PIPE_PICKLE = (FIXTURES / "strict" / "pipe_pickle.py").read_text()


class _Call:
    def __init__(self, fn: Any, args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.fn, self.args)


@pytest.mark.parametrize("call", ["system", "exec", "harness"])
def test_a_crafted_pickle_names_a_global_and_nothing_runs(tmp_path: Path, call: str) -> None:
    marker = tmp_path / "ran"
    payload = {
        "system": _Call(os.system, (f"touch {marker}",)),
        "exec": _Call(builtins.exec, (f"open({str(marker)!r}, 'w').close()",)),
        "harness": _Call(kb_reference.ReferenceCache, ()),
    }[call]
    data = pickle.dumps(("result", {"status": "correct", "x": payload}))
    assert pickle.loads(pickle.dumps(_Call(len, ((),)))) == 0  # what the default unpickler would do
    with pytest.raises(kb_wire.ForbiddenMessage) as caught:
        kb_wire.loads(data)
    assert "which no harness message contains" in str(caught.value)
    assert not marker.exists()


def test_garbage_is_a_forbidden_message_too() -> None:
    with pytest.raises(kb_wire.ForbiddenMessage):
        kb_wire.loads(b"\x80\x05not a pickle")


def test_the_harness_messages_load() -> None:
    output = (torch.arange(6, dtype=torch.float32).reshape(2, 3), [torch.tensor(1.5, dtype=torch.bfloat16)])
    request = ("strict_check", 3, kb_strict.to_wire(output), 41)
    back = kb_wire.loads(pickle.dumps(request))
    got = kb_strict.from_wire(back[2])
    assert back[0] == "strict_check" and back[1] == 3 and back[3] == 41
    assert torch.equal(got[0], output[0]) and torch.equal(got[1][0], output[1][0])
    verdict = kb_correctness_verdict()
    result = ("result", kb_candidate.verdict_to_wire(verdict))
    assert kb_wire.loads(pickle.dumps(result)) == result
    ready = ("ready", os.getpid())
    assert kb_wire.loads(pickle.dumps(ready)) == ready
    # What else a result may carry: dtypes, devices, sizes.
    plain = {"dtype": torch.float16, "device": torch.device("cpu"), "size": torch.Size([2, 3])}
    assert kb_wire.loads(pickle.dumps(plain)) == plain


def kb_correctness_verdict() -> Any:
    verdict = kb_candidate.Verdict(status="incorrect", metadata={"correctness_trials": "(4 / 5)"})
    verdict.feedback.append("text")
    verdict.findings.append({"category": "c", "severity": "error", "message": "m"})
    verdict.env["pinned"] = kb_candidate.settings_snapshot()
    return verdict


@pytest.fixture(scope="module")
def worker() -> Iterator[kb_eval.Worker]:
    isolated = kb_eval.Worker(isolate=True)

    def died(exc: Any) -> None:
        raise AssertionError(f"a candidate process died: {exc}")

    isolated.on_child_death = died
    assert kb_prepare.prepare(prepare_request(1, MATMUL), isolated)["status"] == "ready"
    yield isolated
    isolated.close()


def evaluate(worker: kb_eval.Worker, root: Path, source: str, mode: str, rid: int) -> dict[str, Any]:
    request = evaluate_request(rid, MATMUL, source, root / f"c{rid}", mode=mode, timing_trials=10)
    response = kb_eval.evaluate(request, worker)
    assert kb_protocol.check_response(response) == []
    return response


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "faithful"])
@pytest.mark.parametrize("call", ["system", "exec", "harness"])
def test_a_candidate_that_writes_a_crafted_pickle_fails_and_runs_nothing_in_the_worker(
    worker: kb_eval.Worker, tmp_path: Path, mode: str, call: str
) -> None:
    marker = tmp_path / "ran-in-the-worker"
    source = PIPE_PICKLE.replace("__MARKER__", str(marker)).replace("__KIND__", call)
    response = evaluate(worker, tmp_path, source, mode, 2)
    assert response["status"] == "runtime_error", response
    assert response["correctness"] is False and response["speedup"] is None
    assert response["metadata"]["runtime_error_name"] == "forbidden_message"
    assert [f["category"] for f in response["findings"]] == ["forbidden_message"]
    assert "which no harness message contains" in response["feedback"]
    assert not marker.exists()
    honest = evaluate(worker, tmp_path, HONEST, mode, 3)
    assert honest["status"] == "correct", honest
    assert not marker.exists()


def test_a_cuda_ipc_tensor_names_only_allowed_globals() -> None:
    """The shape of torch.multiprocessing's reduction of a CUDA tensor (reduce_tensor's CUDA branch),
    built on the CPU with stand-in handles: every global it names resolves; loading then stops where
    it would open the IPC handle (no GPU here), as a ForbiddenMessage, never as a call of anything else."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    t = torch.ones(2, 3)
    storage = t._typed_storage()

    class CudaLike:
        def __reduce__(self) -> tuple[Any, ...]:
            return (rebuild_cuda_tensor, (type(t), t.size(), t.stride(), 0, type(storage), t.dtype, 0, b"h", 24, 0,
                                          False, b"r", 0, b"e", True))

    named: list[tuple[str, str]] = []

    class Probe(kb_wire.SafeUnpickler):
        def find_class(self, module: str, name: str) -> Any:
            named.append((module, name))
            return super().find_class(module, name)

    import io

    data = pickle.dumps(("strict_compare", 0, CudaLike()))
    with pytest.raises(Exception):  # noqa: B017 - the stand-in handle cannot open; what matters is before
        Probe(io.BytesIO(data)).load()
    assert ("torch.multiprocessing.reductions", "rebuild_cuda_tensor") in named
    assert ("torch.storage", "TypedStorage") in named
    for module, name in named:
        kb_wire.SafeUnpickler.find_class(Probe(io.BytesIO(b"")), module, name)  # raises if not allowed
