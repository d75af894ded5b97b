"""krefine run directories as pandas DataFrames.

The numbers are those of ``krefine report`` and ``krefine compare``, computed by the same Rust code
(the native module ``krefine._native`` wraps the krefine crate); this layer only arranges the columns
it returns into DataFrames.

>>> import krefine
>>> run = krefine.load_run("trajectories/quickstart")
>>> run.turns()        # fast_p, correct rate, geomean speedup, tokens, USD, device seconds per turn
>>> run.candidates()   # one row per finished turn of every task, with its code
>>> krefine.compare(["runs/quickstart", "runs/quickstart-sampling"], axis="tokens")
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from krefine import _native
from krefine._native import LoadError

__all__ = ["Axis", "LoadError", "Run", "compare", "load_run"]
__version__: str = _native.__version__

Axis = Literal["llm_calls", "tokens", "usd", "gpu_s"]

_FAST_P = ["fast_0", "fast_0.5", "fast_0.8", "fast_1", "fast_1.5", "fast_2"]

# Column dtypes: NaN stands for a number that does not exist (no correct candidate to take a
# geomean of, an unpriced answer, a stage never reached); "Int64" is pandas' integer with NA.
_TURN_DTYPES: dict[str, str] = {
    "turn": "int64",
    **{name: "float64" for name in _FAST_P},
    "correct_rate": "float64",
    "geomean_speedup": "float64",
    "tokens": "int64",
    "usd": "float64",
    "gpu_s": "float64",
    "compiled_rate": "float64",
    "correct": "int64",
    "compiled": "int64",
    "timed": "int64",
    "pending": "int64",
    "prompt_tokens": "int64",
    "completion_tokens": "int64",
    "cumulative_tokens": "int64",
    "cumulative_usd": "float64",
    "cumulative_gpu_s": "float64",
}

_CANDIDATE_DTYPES: dict[str, str] = {
    "problem": "int64",
    "level": "int64",
    "sample": "int64",
    "turn": "int64",
    "speedup": "float64",
    "runtime_ms": "float64",
    "ref_runtime_ms": "float64",
    "compile_ms": "Int64",
    "execute_ms": "Int64",
    "profile_ms": "Int64",
    "tokens": "Int64",
    "prompt_tokens": "Int64",
    "completion_tokens": "Int64",
    "usd": "float64",
    "gpu_s": "float64",
    "compiled": "bool",
    "counted": "bool",
}


_COMPARE_INTEGERS = ("problems", "correct", "compiled", "timed")


def _compare_dtypes(columns: Mapping[str, list[Any]]) -> dict[str, str]:
    dtypes = {name: "float64" for name in columns if name not in ("run", "exhausted")}
    dtypes.update({name: "int64" for name in _COMPARE_INTEGERS}, exhausted="bool")
    return dtypes


def _frame(columns: Mapping[str, list[Any]], dtypes: Mapping[str, str]) -> pd.DataFrame:
    frame = pd.DataFrame(dict(columns))
    return frame.astype({name: dtypes[name] for name in frame.columns if name in dtypes})


class Run:
    """A run directory, read and folded by krefine (as ``krefine report`` reads it).

    Get one with :func:`load_run`. The run is read once: a run still in progress is seen as it was
    then (load it again for newer numbers).
    """

    def __init__(self, native: _native.Run) -> None:
        self._native = native

    @property
    def path(self) -> Path:
        """The run directory as given to :func:`load_run`."""
        return Path(self._native.path)

    @property
    def name(self) -> str:
        """The run's name (``run.name`` of its config)."""
        return self._native.name

    @property
    def method(self) -> str:
        """``one_shot``, ``sampling`` or ``refine``."""
        return self._native.method

    @property
    def model(self) -> str:
        """The model name (``""`` when the config does not say)."""
        return self._native.model

    @property
    def complete(self) -> bool:
        """True when the run ended with every task finished."""
        return self._native.complete

    @property
    def problems(self) -> list[str]:
        """Every problem of the run (``"level/problem"``), sorted: the denominator of fast_p."""
        return self._native.problems

    def turns(self) -> pd.DataFrame:
        """One row per turn N (per sample count for a sampling run): the report's numbers.

        Columns: ``turn``; ``fast_0``, ``fast_0.5``, ``fast_0.8``, ``fast_1``, ``fast_1.5``,
        ``fast_2`` (share of all problems whose best correct candidate up to N is faster than p
        times the reference); ``correct_rate``; ``geomean_speedup`` (NaN when nothing correct was
        timed); ``tokens`` (prompt + completion) and ``usd`` (NaN when unpriced) of turn N's LLM
        answers; ``gpu_s``, seconds of device leases held for turn N's candidates. Then
        ``compiled_rate``, ``correct``, ``compiled``, ``timed``, ``pending``, ``prompt_tokens``,
        ``completion_tokens`` and the running totals ``cumulative_tokens``, ``cumulative_usd``,
        ``cumulative_gpu_s``. Every number is the one ``krefine report --format json`` prints.
        """
        return _frame(self._native.turn_columns(), _TURN_DTYPES)

    def candidates(self) -> pd.DataFrame:
        """One row per finished turn of every task (task, then turn order).

        Columns: ``problem`` (problem id), ``level``, ``sample``, ``turn``, ``verdict``
        (``correct``, ``incorrect``, ``compile_error``, ``no_code``, ...); ``speedup`` as measured,
        ``runtime_ms`` and ``ref_runtime_ms`` (candidate and reference mean; NaN when not
        measured); ``compile_ms``, ``execute_ms``, ``profile_ms`` (NA for stages not reached);
        ``tokens``, ``prompt_tokens``, ``completion_tokens`` of the turn's answer (NA without
        usage) and its ``usd``; ``gpu_s`` (device lease seconds of the turn); ``compiled``;
        ``counted`` (its speedup counts in fast_p and the geomean); ``device``; ``code`` (the
        extracted candidate, None when the answer had none).
        """
        return _frame(self._native.candidate_columns(), _CANDIDATE_DTYPES)

    def events(self) -> list[dict[str, Any]]:
        """The event log, one dict per record: ``{"v", "seq", "ts_ms", "task", "event"}``.

        The records are those krefine read (a torn last line left by a crash is dropped), in log
        order; ``event["type"]`` names the event (``run_started``, ``llm_answered``, ``compiled``,
        ``executed``, ...; see the README's output formats).
        """
        events: list[dict[str, Any]] = json.loads(self._native.events_json())
        return events

    def config(self) -> dict[str, Any]:
        """The frozen config of the run (``config.toml``) as a dict of its sections.

        Raises :class:`LoadError` when the file is missing or not valid TOML.
        """
        config: dict[str, Any] = json.loads(self._native.config_json())
        return config

    def report(self) -> dict[str, Any]:
        """``krefine report --format json`` of this run, parsed (ledger, provenance, integrity too)."""
        report: dict[str, Any] = json.loads(self._native.report_json())
        return report

    def __repr__(self) -> str:
        return repr(self._native)


def load_run(path: str | os.PathLike[str]) -> Run:
    """Read the run directory ``path`` (the folder holding ``events.jsonl``).

    Raises :class:`LoadError`, whose message names the path and what is wrong, when the directory
    does not exist, is not a run directory, or its log cannot be read or folded. What reading
    warned about (a torn last line dropped, a damaged ``provenance.json``) is issued as a
    :class:`UserWarning`.
    """
    native = _native.load_run(os.fspath(path))
    for message in native.warnings:
        warnings.warn(message, UserWarning, stacklevel=2)
    return Run(native)


def compare(
    runs: Sequence[str | os.PathLike[str] | Run],
    axis: Axis = "llm_calls",
    *,
    resamples: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> pd.DataFrame:
    """``krefine compare``'s comparison of ``runs`` at matched budgets along ``axis``.

    ``runs`` are run directories or loaded :class:`Run` objects (the first is the one ``delta_*``
    columns are taken against); ``axis`` is ``llm_calls``, ``tokens``, ``usd`` or ``gpu_s``;
    ``resamples``, ``seed`` and ``level`` set the bootstrap intervals as the command's options do.

    One row per (budget, run): ``budget`` (per problem, in the axis's unit), ``run``, ``problems``
    (shared problems, the denominator), ``attempts`` (mean attempts within the budget),
    ``exhausted`` (every attempt fit); ``fast_<p>``, ``correct_rate``, ``geomean_speedup``, each
    with ``_lo``/``_hi`` interval bounds (NaN without intervals); ``compiled_rate``, ``correct``,
    ``compiled``, ``timed``; ``delta_fast_<p>`` and ``delta_correct_rate`` (this run minus the
    first, with paired interval bounds; NaN for the first run). ``DataFrame.attrs`` holds
    ``axis``, ``axis_title``, ``runs``, ``shared_problems``, ``dropped`` (problems each run lost),
    ``differs`` and ``same`` (the settings that differ between the runs, and those that do not),
    ``settings``, and ``reference_time_warnings`` (problems whose reference took more than twice as
    long in one run as in another, as ``krefine compare`` warns: each a dict with ``problem``,
    ``ref_ms`` by run, ``ratio`` and ``message``; each is also issued as a :class:`UserWarning`).

    Raises :class:`ValueError` for an unknown axis, an axis these runs cannot be compared on (say,
    no prices for ``usd``), runs with the same name, runs that share no problem, or a level outside
    (0, 1); :class:`LoadError` for a run directory that cannot be read.
    """
    loaded = [run if isinstance(run, Run) else load_run(run) for run in runs]
    columns, meta = _native.compare_columns(
        [run._native for run in loaded], axis, resamples, seed, level
    )
    frame = _frame(columns, _compare_dtypes(columns))
    frame.attrs.update(meta)
    # As the command warns: a problem whose reference took very different times in the runs (a
    # shared device while one of them timed it) has speedups that do not compare.
    for warning in meta["reference_time_warnings"]:
        warnings.warn(warning["message"], UserWarning, stacklevel=2)
    return frame
