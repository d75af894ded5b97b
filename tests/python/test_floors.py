"""The harness's floors (krefine_harness.py's docstring) hold: every module is on the table, every import
(module level or inside a function) runs down it, and the binary ships every harness file."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import krefine_harness

HARNESS = Path(krefine_harness.__file__).resolve().parent
REPO = HARNESS.parent.parent
# Imports that run up the floors: none.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _floor_order() -> list[str]:
    """The modules in the order the table names them, top floor first."""
    doc = krefine_harness.__doc__
    assert doc is not None
    table = doc.split("From the top:", 1)[1].split("\n\n", 2)[1]
    table = re.sub(r"\([^()]*\)", "", table)  # the notes in parentheses name no module
    names = re.findall(r"\b(?:kb_\w+|krefine_harness)\b", table)
    assert len(names) == len(set(names)), f"a module is on two floors: {names}"
    return names


def _imports(path: Path, modules: set[str]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return (found & modules) - {path.stem}


def test_every_harness_module_is_on_a_floor() -> None:
    on_disk = {p.stem for p in HARNESS.glob("*.py")}
    assert set(_floor_order()) == on_disk


def test_imports_run_down_the_floors() -> None:
    order = _floor_order()
    rank = {name: i for i, name in enumerate(order)}
    upward = [
        f"{name} imports {target}"
        for name in order
        for target in sorted(_imports(HARNESS / f"{name}.py", set(order)))
        if rank[target] < rank[name] and (name, target) not in KNOWN_UPWARD
    ]
    assert upward == []


def test_the_binary_ships_every_harness_file() -> None:
    listed = re.findall(r'include_str!\("\.\./harness/([\w.]+)"\)', (REPO / "src/worker/harness.rs").read_text())
    shipped = [p.name for p in HARNESS.iterdir() if p.suffix in (".py", ".cpp")]
    assert sorted(listed) == sorted(shipped)
