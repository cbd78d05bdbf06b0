"""The shape of the house, read from the imports (function-local ones included): no import
circle anywhere, and the worker side never imports the driver side."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "train_fns", "search_spaces")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """Project modules that ``path`` imports anywhere in it (``from a.b import c`` names
    ``a.b.c`` when that is a module, else ``a.b``; relative imports resolved)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in modules else base)
    return {m for m in found if m in modules and m != name}


def graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {module_name(p) for p in files}
    return {module_name(p): imports(p, modules) for p in files}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle() -> None:
    assert circles(graph()) == []


def test_the_circle_finder_finds_one() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_worker_side_never_imports_the_driver_side() -> None:
    crossing = {
        mod: sorted(d for d in deps if d.startswith("orchestrator"))
        for mod, deps in graph().items()
        if mod.startswith(("train_fns", "search_spaces"))
    }
    assert {mod: deps for mod, deps in crossing.items() if deps} == {}


def test_a_command_never_imports_another_commands_internals() -> None:
    """orchestrator.<command>.<module> is a command's own; others use its package's face."""
    commands = {"search", "train", "probe", "doctor", "report", "submit"}
    bad = {}
    for mod, deps in graph().items():
        parts = mod.split(".")
        own = parts[1] if len(parts) > 1 and parts[1] in commands else None
        for dep in deps:
            d = dep.split(".")
            if len(d) > 2 and d[1] in commands and d[1] != own:
                bad.setdefault(mod, []).append(dep)
    assert bad == {}


def test_submit_checks_a_job_through_each_commands_face() -> None:
    """The arrows submit -> search and submit -> train are imports the graph sees (they were
    hidden behind ``importlib`` once)."""
    assert {"orchestrator.search", "orchestrator.train"} <= graph()["orchestrator.submit.jobs"]


def test_test_modules_have_unique_basenames() -> None:
    """pytest imports test files by basename (no packages under tests/): two folders holding a
    test_x.py stop the whole run at collection."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_the_report_and_the_doctor_are_siblings() -> None:
    """Both read the run folder (orchestrator.runfiles) and the findings
    (orchestrator.findings); neither imports the other, so a figure is added in one place."""
    crossing = {
        mod: sorted(d for d in deps if d.startswith(("orchestrator.doctor", "orchestrator.report")))
        for mod, deps in graph().items()
        if mod.startswith(("orchestrator.report", "orchestrator.doctor", "orchestrator.findings",
                           "orchestrator.runfiles"))  # fmt: skip
    }
    own = {mod: [d for d in deps if d.split(".")[1] != mod.split(".")[1]]
           for mod, deps in crossing.items()}  # fmt: skip
    assert {mod: deps for mod, deps in own.items() if deps} == {}
