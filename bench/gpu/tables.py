"""Per-candidate tables for docs/benchmarks.md from krefine run directories (events.jsonl).

    python3 bench/gpu/tables.py runs/refeq-l1 runs/refeq-l2 ...

For every `executed` event: verdict, speedup, candidate and reference mean, the time from its `compiled`
event to its `executed` event (what the candidate waited for after it compiled: the device lease,
reference data not prepared yet, its own evaluation), the reference work inside the evaluation
(`phases.reference_s` + `ref_timing_s`: building trial data or timing inputs the candidate reached, timing
the reference), the evaluation's wall time from request to result without that work, the GPU-work floor,
and whether the wall time meets the goal wall <= 1.3 x floor + 0.5 s. Floor = 5 x (reference + candidate) for the correctness trials (the reference
runs in each trial in KernelBench) + 104 x candidate for timing (3 warm-ups, 1 discarded, 100 timed).
Compile times come from the `compiled` events.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(run: Path) -> list[str]:
    compiles: dict[tuple[str, int], str] = {}
    compiled_at: dict[tuple[str, int], int] = {}
    out = []
    for line in (run / "events.jsonl").read_text().splitlines():
        record = json.loads(line)
        event, task = record["event"], record.get("task") or ""
        if event["type"] == "compiled":
            o = event["outcome"]
            compiles[(task, event["turn"])] = "cached" if o.get("cached") else f"{o['duration_ms'] / 1000:.1f} s"
            compiled_at[(task, event["turn"])] = record["ts_ms"]
        if event["type"] != "executed":
            continue
        o, turn = event["outcome"], event["turn"]
        phases = o.get("phases") or {}
        reference_ms = 1000 * (phases.get("reference_s", 0.0) + phases.get("ref_timing_s", 0.0))
        wall = o["wall_ms"] - reference_ms
        since = compiled_at.get((task, turn))
        after_compile = f"{(record['ts_ms'] - since) / 1000:.1f}" if since is not None else "—"
        cand, ref = o.get("runtime_ms", -1), o.get("ref_runtime_ms", -1)
        problem = task.rsplit("/", 1)[0]
        if o["verdict"] == "correct" and cand > 0 and ref > 0:
            floor = 5 * (ref + cand) + 104 * cand
            ok = "yes" if wall <= 1.3 * floor + 500 else "**no**"
            nums = f"{o['speedup']:.3f} | {cand:.4f} | {ref:.4f} | {floor:.0f} | {wall:.0f} | {ok}"
        else:
            nums = f"— | — | — | — | {wall:.0f} | —"
        compile_time = compiles.get((task, turn), "—")
        out.append(
            f"| {problem} t{turn} | {o['verdict']} | {compile_time} | {after_compile} | {reference_ms / 1000:.1f} "
            f"| {nums} |"
        )
    return out


def main(argv: list[str]) -> int:
    print("| problem / turn | verdict | compile | compiled → executed s | reference work s | speedup | candidate ms "
          "| reference ms | floor ms | wall ms | within goal |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for arg in argv:
        for row in rows(Path(arg)):
            print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
