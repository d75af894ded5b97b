"""The `krefine` Python package against real run directories made by the krefine binary.

A quickstart run on CPU (configs/quickstart.toml, problems 1-2, with pure-PyTorch scripted answers so
no C++ extension is built: real workers, verdicts correct, incorrect, runtime_error and no_code) and
the sampling quickstart with the simulated executor. Every number the package gives is compared
with what `krefine report --format json` and `krefine compare --format json` print for the same
directories. The package must be installed (scripts/python-package; scripts/test does it) and the
binary built (`cargo test --all-targets --no-run`, or set KREFINE_BIN).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import tomllib

try:
    import krefine
except ImportError as e:  # pragma: no cover - a setup error, not a test result
    raise ImportError("the krefine package is not installed here: run scripts/python-package") from e

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "package"
TURN_COLUMNS = [
    "turn",
    "fast_0",
    "fast_0.5",
    "fast_0.8",
    "fast_1",
    "fast_1.5",
    "fast_2",
    "correct_rate",
    "geomean_speedup",
    "tokens",
    "usd",
    "gpu_s",
]
FAST_P = ["0", "0.5", "0.8", "1", "1.5", "2"]
AXES: list[krefine.Axis] = ["llm_calls", "tokens", "usd", "gpu_s"]


def krefine_bin() -> Path:
    path = Path(os.environ.get("KREFINE_BIN", REPO / "target" / "debug" / "krefine"))
    assert path.is_file(), f"no krefine binary at {path}: build it (cargo build) or set KREFINE_BIN"
    return path


def cli(*args: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(krefine_bin()), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=600, check=False
    )
    assert done.returncode == 0, f"krefine {args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def same(a: Any, b: Any) -> bool:
    """Exact equality, with JSON's null standing for pandas' NaN/NA."""
    missing_a = a is None or (not isinstance(a, str) and pd.isna(a))
    missing_b = b is None or (not isinstance(b, str) and pd.isna(b))
    if missing_a or missing_b:
        return missing_a and missing_b
    return bool(a == b)


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The two run directories, made once per session (the CPU run takes about a minute on 2 cores)."""
    work = tmp_path_factory.mktemp("package_runs")
    quickstart = work / "quickstart"
    cli(
        "run", REPO / "configs" / "quickstart.toml", "--no-tui", "--out", quickstart,
        "--set", f"resources.python={sys.executable}",
        "--set", "resources.devices=cpu",
        "--set", "resources.compile_workers=2",
        "--set", f"model.answers={FIXTURES / 'answers.jsonl'}",
        "--set", "dataset.problems=1-2",
        "--set", "eval.correct_trials=2",
        "--set", "eval.warmup=1",
        "--set", "eval.timing_trials=5",
        cwd=work,
    )  # fmt: skip
    sampling = work / "quickstart-sampling"
    cli(
        "run", REPO / "configs" / "quickstart-sampling.toml", "--no-tui", "--out", sampling,
        "--set", "eval.executor=simulated",
        "--set", "resources.devices=cpu",
        cwd=work,
    )  # fmt: skip
    return {"quickstart": quickstart, "sampling": sampling}


def log_records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines() if line.strip()]


def test_turns_are_the_reports_numbers(runs: dict[str, Path]) -> None:
    for run_dir in runs.values():
        report = json.loads(cli("report", run_dir, "--format", "json"))
        run = krefine.load_run(run_dir)
        turns = run.turns()
        assert list(turns.columns[: len(TURN_COLUMNS)]) == TURN_COLUMNS
        assert len(turns) == len(report["turns"]) == 3
        for row, expected in zip(turns.to_dict("records"), report["turns"], strict=True):
            wanted = {
                "turn": expected["turn"],
                **{f"fast_{p}": expected["fast_p"][p] for p in FAST_P},
                "correct_rate": expected["correct_rate"],
                "geomean_speedup": expected["geomean_speedup"],
                "tokens": expected["tokens"]["total"],
                "usd": expected["cost_usd"],
                "compiled_rate": expected["compiled_rate"],
                "correct": expected["correct"],
                "compiled": expected["compiled"],
                "timed": expected["timed"],
                "pending": expected["pending"],
                "prompt_tokens": expected["tokens"]["prompt"],
                "completion_tokens": expected["tokens"]["completion"],
                "cumulative_tokens": expected["cumulative_tokens"],
                "cumulative_usd": expected["cumulative_cost_usd"],
            }
            wrong = {k: (row[k], v) for k, v in wanted.items() if not same(row[k], v)}
            assert not wrong, f"{run_dir.name} turn {expected['turn']}: (package, report) {wrong}"
        # The whole report, as the package gives it, is the command's.
        assert run.report() == report
    # The CPU run's curve, as its scripted answers make it.
    turns = krefine.load_run(runs["quickstart"]).turns()
    assert turns["correct_rate"].tolist() == [0.5, 0.5, 1.0]
    assert turns["fast_0"].tolist() == [0.5, 0.5, 1.0]
    assert turns["usd"].gt(0).all() and turns["tokens"].gt(0).all()


def test_gpu_seconds_are_the_leases_of_each_turn(runs: dict[str, Path]) -> None:
    for run_dir in runs.values():
        run = krefine.load_run(run_dir)
        held: dict[tuple[str, int], int] = Counter()
        for record in log_records(run_dir):
            event = record["event"]
            if event["type"] == "lease_released" and "task" in record:
                held[(record["task"], event["turn"])] += event["held_ms"]
        turns = run.turns()
        assert turns["gpu_s"].gt(0).all()
        for n, gpu_s in zip(turns["turn"], turns["gpu_s"], strict=True):
            # Step n: turn n of each problem (refine), or sample n - 1 (sampling); in problem order.
            keys = [
                (f"{p}/0", n) if run.method == "refine" else (f"{p}/{n - 1}", 1) for p in run.problems
            ]
            assert gpu_s == sum((held[k] / 1000 for k in keys), 0.0)
        assert turns["cumulative_gpu_s"].tolist() == turns["gpu_s"].cumsum().tolist()


def test_candidates_are_the_logged_turns(runs: dict[str, Path]) -> None:
    run_dir = runs["quickstart"]
    run = krefine.load_run(run_dir)
    candidates = run.candidates()
    assert list(candidates.columns[:8]) == [
        "problem", "level", "sample", "turn", "verdict", "speedup", "runtime_ms", "ref_runtime_ms"
    ]  # fmt: skip
    verdicts = {(r.problem, r.turn): r.verdict for r in candidates.itertuples()}
    assert verdicts == {
        (1, 1): "correct",
        (1, 2): "incorrect",
        (1, 3): "correct",
        (2, 1): "no_code",
        (2, 2): "runtime_error",
        (2, 3): "correct",
    }
    # The verdict counts per turn are the report's.
    report = run.report()
    for turn in report["turns"]:
        counts = candidates[candidates["turn"] == turn["turn"]]["verdict"].value_counts().to_dict()
        assert counts == turn["verdicts"]
    # Each row is what the log recorded for that turn.
    executed: dict[tuple[str, int], dict[str, Any]] = {}
    answered: dict[tuple[str, int], dict[str, Any]] = {}
    compiled: dict[tuple[str, int], dict[str, Any]] = {}
    for record in log_records(run_dir):
        event = record["event"]
        key = (str(record.get("task")), int(event.get("turn", 0)))
        if event["type"] == "executed":
            executed[key] = event["outcome"]
        elif event["type"] == "llm_answered":
            answered[key] = event["answer"]
        elif event["type"] == "compiled":
            compiled[key] = event["outcome"]
    for row in candidates.to_dict("records"):
        key = (f"1/{row['problem']}/0", row["turn"])
        answer = answered[key]
        assert row["tokens"] == answer["usage"]["prompt_tokens"] + answer["usage"]["completion_tokens"]
        assert row["usd"] == answer["cost_usd"]
        if row["verdict"] == "no_code":
            assert row["code"] is None or pd.isna(row["code"])
            assert pd.isna(row["compile_ms"]) and pd.isna(row["speedup"]) and not row["compiled"]
            continue
        kernel = run_dir / f"kernels/level_1_problem_{row['problem']}_sample_0_turn_{row['turn']}_kernel.py"
        assert row["code"] == kernel.read_text()
        assert row["compile_ms"] == compiled[key]["duration_ms"]
        outcome = executed[key]
        assert row["execute_ms"] == outcome["wall_ms"]
        assert row["device"] == outcome["device"] == "cpu"
        assert same(row["speedup"], outcome.get("speedup"))
        if row["verdict"] == "correct":
            assert row["runtime_ms"] == outcome["runtime_ms"] > 0
            assert row["ref_runtime_ms"] == outcome["ref_runtime_ms"] > 0
            assert row["counted"] and row["compiled"] and row["profile_ms"] > 0
        else:
            assert not row["counted"] and pd.isna(row["profile_ms"])


def test_events_and_config_are_the_run_directorys(runs: dict[str, Path]) -> None:
    run_dir = runs["quickstart"]
    run = krefine.load_run(run_dir)
    events = run.events()
    assert events == log_records(run_dir)
    assert list(events[0]) == ["v", "seq", "ts_ms", "event"]
    assert events[0]["event"]["type"] == "run_started" and events[-1]["event"]["type"] == "run_ended"
    config = run.config()
    assert config == tomllib.loads((run_dir / "config.toml").read_text())
    assert config["method"]["turns"] == 3 and config["dataset"]["problems"] == "1-2"
    assert (run.name, run.method, run.model, run.complete) == ("quickstart", "refine", "scripted", True)
    assert run.problems == ["1/1", "1/2"]
    assert run.path == run_dir


def test_compare_is_the_commands_comparison(runs: dict[str, Path]) -> None:
    dirs = [runs["quickstart"], runs["sampling"]]
    expected = json.loads(cli("compare", *dirs, "--format", "json", "--resamples", "200", "--seed", "7"))
    loaded = [krefine.load_run(d) for d in dirs]
    for axis in AXES:
        table = next(a for a in expected["axes"] if a["axis"] == axis)
        assert table["unavailable"] is None, table
        # Paths and loaded runs give the same comparison.
        frame = krefine.compare(dirs, axis, resamples=200, seed=7)
        pd.testing.assert_frame_equal(frame, krefine.compare(loaded, axis, resamples=200, seed=7))
        cells = [(row["budget"], r) for row in table["rows"] for r in row["runs"]]
        assert len(frame) == len(cells) > 0
        for row, (budget, r) in zip(frame.to_dict("records"), cells, strict=True):
            ci, delta = r["ci"], r["vs_first"]
            wanted: dict[str, Any] = {
                "budget": budget,
                "run": r["run"],
                "problems": len(expected["shared_problems"]),
                "attempts": r["attempts"],
                "exhausted": r["exhausted"],
                "correct_rate": r["correct_rate"],
                "correct_rate_lo": ci["correct_rate"]["lo"],
                "correct_rate_hi": ci["correct_rate"]["hi"],
                "geomean_speedup": r["geomean_speedup"],
                "compiled_rate": r["compiled_rate"],
                "correct": r["correct"],
                "compiled": r["compiled"],
                "timed": r["timed"],
                "delta_correct_rate": delta and delta["correct_rate"],
            }
            for p in FAST_P:
                wanted[f"fast_{p}"] = r["fast_p"][p]
                wanted[f"fast_{p}_lo"] = ci["fast_p"][p]["lo"]
                wanted[f"fast_{p}_hi"] = ci["fast_p"][p]["hi"]
                wanted[f"delta_fast_{p}"] = delta and delta["fast_p"][p]
                wanted[f"delta_fast_{p}_lo"] = delta and delta["fast_p_ci"][p] and delta["fast_p_ci"][p]["lo"]
            geo_ci = ci["geomean_speedup"]
            wanted["geomean_speedup_hi"] = geo_ci and geo_ci["hi"]
            wrong = {k: (row[k], v) for k, v in wanted.items() if not same(row[k], v)}
            assert not wrong, f"{axis} budget {budget} {r['run']}: (package, command) {wrong}"
        assert frame.attrs["shared_problems"] == expected["shared_problems"] == ["1/1", "1/2"]
        assert frame.attrs["dropped"] == {"quickstart": 0, "quickstart-sampling": 2}
        assert frame.attrs["differs"] == {d["field"]: d["values"] for d in expected["differs"]}
        assert frame.attrs["settings"] == {"resamples": 200, "seed": 7, "level": 0.95}
    # The command's defaults are the function's.
    expected = json.loads(cli("compare", *dirs, "--format", "json"))
    frame = krefine.compare(dirs)
    calls = next(a for a in expected["axes"] if a["axis"] == "llm_calls")
    assert frame["fast_1_lo"].tolist() == [r["ci"]["fast_p"]["1"]["lo"] for row in calls["rows"] for r in row["runs"]]


def test_compare_warns_when_a_problems_reference_time_differs_between_runs(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """As ``krefine compare`` warns (issue 37): the same run against a copy whose reference timings were
    ten times slower (a shared device) names each problem, in ``attrs`` and as a UserWarning."""
    slowed = tmp_path / "slowed"
    shutil.copytree(runs["quickstart"], slowed)
    log = (slowed / "events.jsonl").read_text()
    times = re.compile(r'"ref_runtime_ms":\s*([0-9.eE+-]+)')
    assert times.search(log), "the CPU run timed its references"
    (slowed / "events.jsonl").write_text(times.sub(lambda m: f'"ref_runtime_ms":{float(m.group(1)) * 10}', log))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alike = krefine.compare([runs["quickstart"], runs["quickstart"]], resamples=0)
    assert alike.attrs["reference_time_warnings"] == []
    with pytest.warns(UserWarning, match=r"problem 1/1: the reference took .* \(10\.0x apart\)"):
        frame = krefine.compare([runs["quickstart"], slowed], resamples=0)
    expected = json.loads(cli("compare", runs["quickstart"], slowed, "--format", "json", "--resamples", "0"))
    got = frame.attrs["reference_time_warnings"]
    assert [w["problem"] for w in got] == [w["problem"] for w in expected["reference_time_warnings"]]
    assert [w["ref_ms"] for w in got] == [w["ref_ms"] for w in expected["reference_time_warnings"]]
    assert "1/1" in {w["problem"] for w in got}
    # Keyed by the runs' labels, the same as the rows'.
    assert all(set(w["ref_ms"]) == set(frame["run"]) for w in got)


def test_bad_paths_raise_errors_that_name_them(runs: dict[str, Path], tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(krefine.LoadError, match=f"{missing}: no such directory"):
        krefine.load_run(missing)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(krefine.LoadError, match=f"{a_file} is not a directory"):
        krefine.load_run(a_file)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(krefine.LoadError, match=rf"{empty} is not a run directory \(no events.jsonl\)"):
        krefine.load_run(empty)
    assert list(empty.iterdir()) == [], "reading creates nothing"

    # A damaged log: a malformed line in the middle names the file and line.
    broken = tmp_path / "broken"
    broken.mkdir()
    lines = (runs["quickstart"] / "events.jsonl").read_text().splitlines()
    (broken / "events.jsonl").write_text("\n".join([lines[0], '{"v": 1, "seq": "x"}', *lines[1:]]) + "\n")
    with pytest.raises(krefine.LoadError, match=f"{broken / 'events.jsonl'}:2: "):
        krefine.load_run(broken)
    (broken / "events.jsonl").write_text(lines[-1] + "\n")
    with pytest.raises(krefine.LoadError, match=f"{broken / 'events.jsonl'}: the log has no run_started record"):
        krefine.load_run(broken)

    # A torn last line (a crash mid-write) is dropped with a warning, as `krefine report` does.
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "events.jsonl").write_text("\n".join(lines) + '\n{"v": 1, "seq": 99')
    with pytest.warns(UserWarning, match="torn"):
        run = krefine.load_run(torn)
    assert len(run.events()) == len(lines)
    # Without config.toml the numbers are there; the config itself raises, naming the file.
    assert len(run.turns()) == 3
    with pytest.raises(krefine.LoadError, match=f"{torn / 'config.toml'}: cannot read it"):
        run.config()
    (torn / "config.toml").write_text("[method\n")
    with pytest.raises(krefine.LoadError, match=f"{torn / 'config.toml'}: not valid TOML"):
        run.config()

    with pytest.raises(ValueError, match="unknown axis 'dollars'"):
        krefine.compare([runs["quickstart"], runs["sampling"]], "dollars")  # type: ignore[arg-type]
    # Runs sharing a name are told apart, never refused (issue 27).
    same = krefine.compare([runs["quickstart"], runs["quickstart"]])
    assert same.attrs["runs"] == ["quickstart", "quickstart#2"]
    with pytest.raises(ValueError, match="coverage level 1.5"):
        krefine.compare([runs["quickstart"], runs["sampling"]], level=1.5)
    with pytest.raises(krefine.LoadError, match="no such directory"):
        krefine.compare([runs["quickstart"], missing])


def test_the_wheel_installs_into_a_fresh_venv(runs: dict[str, Path], tmp_path: Path) -> None:
    """The wheel scripts/python-package built, in a new venv with only pandas (and its
    dependencies) from the package index: the version pins of this environment, so pip's cache
    serves them."""
    wheel = os.environ.get("KREFINE_WHEEL") or next(iter(sorted((REPO / "target/wheels-dev").glob("*.whl"))), None)
    assert wheel, "no wheel: run scripts/python-package, or set KREFINE_WHEEL"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    pins = [f"pandas=={pd.__version__}", f"numpy=={__import__('numpy').__version__}"]
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel), *pins],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    script = (
        "import json, sys, krefine\n"
        "run = krefine.load_run(sys.argv[1])\n"
        "print(json.dumps({'turns': run.turns().to_dict('list'), 'file': krefine.__file__}))\n"
    )
    done = subprocess.run(
        [str(python), "-c", script, str(runs["quickstart"])],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert Path(out["file"]).is_relative_to(venv)
    expected = krefine.load_run(runs["quickstart"]).turns()
    for column in TURN_COLUMNS:
        assert all(same(a, b) for a, b in zip(out["turns"][column], expected[column], strict=True)), column
    report = json.loads(cli("report", runs["quickstart"], "--format", "json"))
    assert out["turns"]["fast_1"] == [t["fast_p"]["1"] for t in report["turns"]]
    # Torch is not in that venv: the package needs only pandas.
    assert subprocess.run([str(python), "-c", "import torch"], capture_output=True, check=False).returncode != 0


def test_the_bindings_resolve_dependencies_as_cargo_test_does() -> None:
    """python/Cargo.toml mirrors the root's dev-dependencies behind `reuse-test-build`, so the dev
    wheel reuses `cargo test`'s compiled crates instead of building them again (a CI-time matter)."""
    root = tomllib.loads((REPO / "Cargo.toml").read_text())["dev-dependencies"]
    bindings = tomllib.loads((REPO / "python" / "Cargo.toml").read_text())
    deps, feature = bindings["dependencies"], bindings["features"]["reuse-test-build"]
    assert sorted(feature) == sorted(f"dep:{name}" for name in root)
    for name, spec in root.items():
        spec = {"version": spec} if isinstance(spec, str) else spec
        mirror = deps[name]
        assert mirror["optional"] is True and mirror["version"] == spec["version"], name
        assert set(spec.get("features", [])) <= set(mirror.get("features", [])), name
