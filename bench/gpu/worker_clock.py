"""The worker clock of every strict result in a run folder (issue 23).

    python3 bench/gpu/worker_clock.py RUN_DIR [--factor 1.5 --slack-ms 0.5 --share 0.02]

Reads `metadata.worker_clock` from the run's events.jsonl files and prints, per strict result with a
clock: the observed span (trimmed mean), the reported mean, the serving overhead (observed - reported),
the reference's own overhead (backed out of the allowance with the bound the run used: factor x
overhead + slack + share x observed) and the allowance; first, the smallest margin (allowance -
overhead). The defaults are the GPU bound (kb_strict.CLOCK_CUDA).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def clocks(value: Any) -> Iterator[dict[str, Any]]:
    """Every `worker_clock` object anywhere inside an event."""
    if isinstance(value, dict):
        if isinstance(value.get("worker_clock"), dict):
            yield value["worker_clock"]
        for item in value.values():
            yield from clocks(item)
    elif isinstance(value, list):
        for item in value:
            yield from clocks(item)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--factor", type=float, default=1.5)
    parser.add_argument("--slack-ms", type=float, default=0.5)
    parser.add_argument("--share", type=float, default=0.02)
    args = parser.parse_args()
    rows = []
    for path in sorted(args.run_dir.rglob("events.jsonl")):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            key = str(event.get("problem") or event.get("task") or "")[:30]
            for clock in clocks(event):
                observed, reported = clock.get("observed_trimmed_ms"), clock.get("reported_mean_ms")
                if observed is None or reported is None:
                    continue
                allowance = clock.get("allowance_ms")
                reference = None
                if allowance is not None:
                    reference = (allowance - args.slack_ms - args.share * observed) / args.factor
                rows.append((key, observed, reported, observed - reported, reference, allowance))
    margins = [allowance - overhead for *_, overhead, _, allowance in rows if allowance is not None]
    smallest = f"{min(margins):.4f} ms" if margins else "none (no allowance)"
    print(f"{len(rows)} strict results with a worker clock; smallest margin (allowance - overhead): {smallest}")
    for key, observed, reported, overhead, reference, allowance in rows:
        ref = "-" if reference is None else f"{reference:.4f}"
        allow = "-" if allowance is None else f"{allowance:.4f}"
        print(
            f"{key:30} observed {observed:9.4f} reported {reported:9.4f} overhead {overhead:7.4f} "
            f"ref_overhead {ref} allowance {allow}"
        )


if __name__ == "__main__":
    main()
