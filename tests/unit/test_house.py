"""The shape of the house, read from the imports (function-local ones included): no import
circle anywhere, between modules or between packages, and the worker side never imports the
driver side."""

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


def package_of(module: str) -> str:
    """A module's package as the architecture page draws it: ``orchestrator.<sub>`` for a
    subpackage of orchestrator, else the top-level package (the face ``orchestrator`` too)."""
    parts = module.split(".")
    if (
        parts[0] == "orchestrator"
        and len(parts) > 1
        and (ROOT / "orchestrator" / parts[1]).is_dir()
    ):
        return ".".join(parts[:2])
    return parts[0]


def package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """``edges`` between modules as edges between their packages (a package's own imports of
    itself dropped)."""
    out: dict[str, set[str]] = {}
    for mod, deps in edges.items():
        out.setdefault(package_of(mod), set()).update(
            package_of(d) for d in deps if package_of(d) != package_of(mod)
        )
    for deps in list(out.values()):
        for dep in deps:
            out.setdefault(dep, set())
    return out


def test_no_package_circle() -> None:
    """Two packages that import each other are one package in two folders, whichever modules
    the imports run between (no module circle needed)."""
    assert circles(package_graph(graph())) == []


def test_a_package_circle_is_found_without_a_module_circle() -> None:
    edges = {"train_fns.a": {"search_spaces.b"}, "search_spaces.c": {"train_fns.d"},
             "train_fns.d": set(), "search_spaces.b": set()}  # fmt: skip
    assert circles(edges) == []
    assert circles(package_graph(edges)) == [["search_spaces", "train_fns"]]


def test_no_module_imports_another_packages_private_module() -> None:
    """``search_spaces._nccl`` is the package's own: another package uses its face or a public
    module (``search_spaces.knobs``, ``search_spaces.guarded_yaml``)."""
    private = {
        mod: sorted(d for d in deps if package_of(d) != package_of(mod)
                    and any(part.startswith("_") for part in d.split(".")))
        for mod, deps in graph().items()
    }  # fmt: skip
    assert {mod: deps for mod, deps in private.items() if deps} == {}


YAML_READERS = {"safe_load", "load", "full_load", "unsafe_load", "load_all", "safe_load_all"}


def test_yaml_is_read_in_one_module() -> None:
    """Every YAML file a user hands commtune is read capped and guarded, by
    ``search_spaces.guarded_yaml`` alone; other modules call its ``load_yaml``."""
    readers = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            if module_name(path) == "search_spaces.guarded_yaml":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                called = (isinstance(node, ast.Attribute) and node.attr in YAML_READERS
                          and isinstance(node.value, ast.Name) and node.value.id == "yaml")
                imported = (isinstance(node, ast.ImportFrom) and node.module == "yaml"
                            and any(a.name in YAML_READERS for a in node.names))  # fmt: skip
                if called or imported:
                    readers.append(f"{module_name(path)}:{node.lineno}")
    assert readers == []


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
