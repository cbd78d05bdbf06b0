"""docs/architecture.md's table of packages is the house: its arrows are the imports the code
makes between packages (no more, no fewer), each runs down to a lower floor, and the floor
packages the page says never print do not."""

from __future__ import annotations

import ast
import re

import pytest
from test_house import PACKAGES, ROOT, graph, module_name, package_graph, package_of

PAGE = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\| (\d+) \| `([\w.]+)` \| [^|]+ \| ([^|]+) \|$")
SILENT = ("orchestrator.runfiles", "orchestrator.config", "orchestrator.verdict",
          "orchestrator.planning", "orchestrator.findings")  # fmt: skip
"""The floor packages the page says never print."""


def page_table(text: str) -> dict[str, tuple[int, set[str]]]:
    """Each package row of the page's table: its floor and the packages it imports."""
    rows = {}
    for line in text.splitlines():
        found = ROW.match(line.strip())
        if found:
            floor, name, cell = found.groups()
            rows[name] = (int(floor), set(re.findall(r"`([\w.]+)`", cell)))
    return rows


def arrows_against_imports(rows: dict[str, tuple[int, set[str]]], real: dict[str, set[str]]):
    """What the page and the imports disagree on, as lines (empty: the page is true)."""
    wrong = [f"{p}: a package the page does not list" for p in sorted(set(real) - set(rows))]
    wrong += [f"{p}: listed but no such package" for p in sorted(set(rows) - set(real))]
    for name, (floor, drawn) in sorted(rows.items()):
        made = real.get(name, set())
        wrong += [f"{name} -> {d}: imported, not drawn" for d in sorted(made - drawn)]
        wrong += [f"{name} -> {d}: drawn, not imported" for d in sorted(drawn - made)]
        wrong += [f"{name} -> {d}: runs up or across (floor {floor} to {rows[d][0]})"
                  for d in sorted(drawn) if d in rows and rows[d][0] >= floor]  # fmt: skip
    return wrong


def test_the_page_draws_the_imports() -> None:
    rows = page_table(PAGE.read_text())
    assert len(rows) > 5, "the page's package table was not found"
    assert arrows_against_imports(rows, package_graph(graph())) == []


@pytest.mark.parametrize(
    ("row", "why"),
    [
        ("| 3 | `orchestrator.runfiles` | x | `search_spaces`, `orchestrator.config` |",
         "orchestrator.runfiles -> orchestrator.config: drawn, not imported"),
        ("| 3 | `orchestrator.runfiles` | x | nothing |",
         "orchestrator.runfiles -> search_spaces: imported, not drawn"),
        ("| 1 | `orchestrator.runfiles` | x | `search_spaces` |",
         "orchestrator.runfiles -> search_spaces: runs up or across (floor 1 to 1)"),
    ],
)  # fmt: skip
def test_a_wrong_arrow_is_named(row: str, why: str) -> None:
    """The runfiles row as the old page drew it (above modules that import it) is caught."""
    text = PAGE.read_text()
    lines = text.splitlines()
    true_row = next(line for line in lines if line.startswith("| 3 | `orchestrator.runfiles`"))
    rows = page_table(text.replace(true_row, row))
    assert why in arrows_against_imports(rows, package_graph(graph()))


def test_the_silent_floor_never_prints() -> None:
    printing = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if package_of(module_name(path)) not in SILENT:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "print":
                    printing.append(f"{module_name(path)}:{node.lineno}")
    assert printing == []
