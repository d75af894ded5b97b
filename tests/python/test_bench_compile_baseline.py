"""bench/gpu/compile_baseline.py's arithmetic on small baseline files: ratios, the noise judgement,
the median and geometric mean, missing problems, and its command line (dry run, errors)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compile_baseline", REPO / "bench" / "gpu" / "compile_baseline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["compile_baseline"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


cb = _load()

OURS = {
    "level1": {
        "1_A.py": {"mean": 2.0, "std": 0.0},
        "2_B.py": {"mean": 1.1, "std": 0.0},
        "3_C.py": {"mean": 0.5, "std": 0.1},
        "4_D.py": {"mean": 3.0, "std": 0.0},
    }
}
THEIRS = {
    "level1": {
        "1_A.py": {"mean": 2.0, "std": 0.0},
        "2_B.py": {"mean": 1.0, "std": 0.0},
        "3_C.py": {"mean": 1.0, "std": 0.0},
        "5_E.py": {"mean": 1.0, "std": 0.0},
    }
}


def test_rows_ratios_and_noise() -> None:
    rows = cb.compare(OURS, THEIRS)
    assert [(r.problem, r.ratio) for r in rows] == [("1_A.py", 1.0), ("2_B.py", 1.1), ("3_C.py", 0.5), ("4_D.py", None)]
    # 1.1 is 10 % off with no spread: not within noise; 0.5 has a 20 % relative std, 3 x 20 % > 50 %.
    assert [r.within_noise for r in rows] == [True, False, True, None]


def test_summary_median_geomean_and_missing() -> None:
    rows = cb.compare(OURS, THEIRS)
    s = cb.summarize(rows, OURS, THEIRS)
    assert s.compared == 3
    assert s.within_noise == 2
    assert s.median_ratio == 1.0
    assert s.geomean_ratio == pytest.approx(math.exp((math.log(1.0) + math.log(1.1) + math.log(0.5)) / 3), rel=1e-12)
    assert (s.min_ratio, s.max_ratio) == (0.5, 1.1)
    assert s.only_ours == ["level1/4_D.py"]
    assert s.only_theirs == ["level1/5_E.py"]
    # An even count takes the mean of the middle two.
    even = cb.compare({"level1": {"1_A.py": OURS["level1"]["1_A.py"], "2_B.py": OURS["level1"]["2_B.py"]}}, THEIRS)
    assert cb.summarize(even, OURS, THEIRS).median_ratio == pytest.approx(1.05, rel=1e-12)


def test_rendered_table() -> None:
    rows = cb.compare(OURS, THEIRS)
    text = cb.render(rows, cb.summarize(rows, OURS, THEIRS))
    lines = text.splitlines()
    assert lines[0] == "| problem | krefine compile ms | KernelBench inductor ms | ratio | within noise |"
    assert lines[3] == "| level1/2_B.py | 1.1 | 1 | 1.100 | no |"
    assert lines[5] == "| level1/4_D.py | 3 | - | - | - |"
    assert "3 compared: ratio median 1.000, geomean 0.819, min 0.500, max 1.100; 2 of 3 within noise" in text
    assert "no KernelBench mean for: level1/4_D.py" in text


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ours, theirs = tmp_path / "ours.json", tmp_path / "theirs.json"
    ours.write_text(json.dumps(OURS))
    theirs.write_text(json.dumps(THEIRS))
    out = tmp_path / "table.json"
    assert cb.main(["--ours", str(ours), "--theirs", str(theirs), "--json", str(out)]) == 0
    assert "2 of 3 within noise" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["summary"]["median_ratio"] == 1.0 and len(saved["rows"]) == 4
    # A dry run prints the krefine command and runs nothing.
    args = ["--krefine", "kr", "--dataset", "p.jsonl", "--levels", "1", "--problems", "1-3", "--theirs", str(theirs)]
    assert cb.main([*args, "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith(
        "$ kr baseline --dataset p.jsonl --levels 1 --problems 1-3 --mode compile --compile-mode default --out "
    )
    # KernelBench's file missing: a clear error, exit 2.
    assert cb.main(["--ours", str(ours), "--theirs", str(tmp_path / "none.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cb.main(["--theirs", str(theirs)])
