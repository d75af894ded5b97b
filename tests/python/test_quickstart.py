"""The quickstart sample problems and scripted answers. The cheap checks always run; building and
evaluating every answer (8 C++ builds, several minutes on 2 cores) runs with KREFINE_QUICKSTART=1."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kb_eval
from harness_client import QUICKSTART, first_code_block, quickstart_answers, quickstart_problem
from run_quickstart import EXPECTED

MAX_COMPILED = 8


def test_every_answer_has_an_expected_status_and_three_turns_per_problem() -> None:
    answers = quickstart_answers()
    keys = [(a["problem"], a["turn"]) for a in answers]
    assert sorted(keys) == sorted(EXPECTED)
    assert all(a["sample"] == 0 for a in answers)
    for problem in {p for p, _ in keys}:
        assert sorted(t for p, t in keys if p == problem) == [1, 2, 3]


def test_problems_are_kernelbench_format_and_run_quickly_on_cpu() -> None:
    files = sorted((QUICKSTART / "problems" / "level1").glob("*.py"))
    assert [f.name for f in files] == ["1_Vector_add.py", "2_ReLU.py", "3_Scale_and_bias.py", "4_Row_sum.py"]
    for path in files:
        problem = kb_eval.load_problem(path.read_text())
        kb_eval.set_seed(42)
        model = problem.model(*problem.get_init_inputs())
        with torch.no_grad():
            output = model(*problem.get_inputs())
        assert isinstance(output, torch.Tensor) and output.numel() > 0


def test_code_blocks_parse_and_each_build_has_its_own_extension_name() -> None:
    sources = [first_code_block(a["content"]) for a in quickstart_answers()]
    assert sum(s is None for s in sources) == 1  # exactly one answer without code
    distinct = {s for s in sources if s is not None}
    assert len(distinct) <= MAX_COMPILED
    names: dict[str, str] = {}
    for source in distinct:
        compile(source, "<answer>", "exec")
        found = set(re.findall(r'name="([A-Za-z0-9_]+)"', source))
        assert len(found) == 1, "one extension name per candidate (CUDA and C++ branches share it)"
        (name,) = found
        assert names.setdefault(name, source) == source, f"extension name {name} reused by another candidate"
        assert (
            "torch.cuda.is_available()" in source and "cuda_sources=" in source and "cpp_sources=" in source
        )


def test_answers_name_their_problem() -> None:
    for answer in quickstart_answers():
        assert "class Model(" in quickstart_problem(answer["problem"])


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("KREFINE_QUICKSTART") != "1", reason="set KREFINE_QUICKSTART=1 (minutes)")
def test_every_answer_gets_its_expected_status(tmp_path: Path) -> None:
    script = Path(__file__).with_name("run_quickstart.py")
    done = subprocess.run(
        [sys.executable, str(script), "--device", "cpu", "--work", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
