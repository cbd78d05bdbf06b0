"""The front door cannot rot: README.md and docs/*.md are checked as code.

- Every fenced shell block (```bash, ```sh, ```shell, ```console) carries a marker in the HTML
  comments right above it: ``<!-- run -->`` (or ``<!-- run: why -->``): run here, in a scratch
  folder holding a sample ``runs/sample/trials.csv``, and it must exit 0 (keep these quick and
  without Ray); ``<!-- not run: why -->``: left alone, with the reason; the README's
  ``<!-- setup: tests -->`` block counts as run by CI (``.ci/run`` reads it). A block with neither
  fails, naming its file and line.
- Relative links resolve (the file, and the heading an anchor names); repository paths, dotted
  module names, ``python -m`` modules and "`NAME` in `file.py`" mentions name things that exist.
- docs/testing.md lists exactly the tests marked slow; docs/search-spaces.md names every param
  of the shipped spaces; docs/outputs.md every file a run folder holds and every run_info key.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELLS = ("bash", "sh", "shell", "console")
MARKER = re.compile(r"<!--\s*(run|not run|setup: \w+)\s*(?::\s*(.*?))?\s*-->")
SAMPLE_TRIALS = (
    "number,state,strategy,accumulation_steps,samples_per_s,throughput_cv,step_time_s,"
    "peak_mem_mib,reason\n"
    "0,complete,ddp,1,240,0.03,0.066,600,\n"
    "1,complete,ddp,2,260,0.02,0.061,650,\n"
    '2,oom,fsdp,1,,,,,"out of memory at micro_batch=8 (peak 1.2 GiB)"\n'
)
"""A run folder's trials.csv, for the report and doctor blocks."""
BLOCK_TIMEOUT_S = 120


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    """1-based line of the opening fence."""
    lang: str
    body: str
    markers: tuple[tuple[str, str], ...]
    """(kind, reason) of each marker in the comment lines right above the fence."""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def kind(self) -> str | None:
        kinds = {k for k, _ in self.markers}
        if "not run" in kinds:
            return "not run"
        if "run" in kinds:
            return "run"
        if "setup: tests" in kinds:
            return "ci"
        return None


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        fence = re.match(r"^(```+)\s*([\w-]*)", lines[i])
        if not fence:
            i += 1
            continue
        start, ticks, lang = i, fence.group(1), fence.group(2).lower()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == ticks), None)
        assert end is not None, f"{page.relative_to(ROOT)}:{i + 1}: a code block is not closed"
        markers, k = [], start - 1
        while k >= 0 and lines[k].strip().startswith("<!--"):
            markers += [(m.group(1), m.group(2) or "") for m in MARKER.finditer(lines[k])]
            k -= 1
        body = "\n".join(lines[start + 1 : end])
        found.append(Block(page, start + 1, lang, body, tuple(markers)))
        i = end + 1
    return found


SHELL_BLOCKS = [b for page in PAGES for b in blocks(page) if b.lang in SHELLS]
RUN_BLOCKS = [b for b in SHELL_BLOCKS if b.kind() == "run"]


def test_every_shell_block_is_run_or_says_why_not() -> None:
    unmarked = [b.where for b in SHELL_BLOCKS if b.kind() is None]
    assert not unmarked, (
        f"shell blocks without <!-- run --> or <!-- not run: why --> above them: {unmarked}"
    )
    no_reason = [b.where for b in SHELL_BLOCKS if ("not run", "") in b.markers]
    assert not no_reason, f"<!-- not run --> needs its reason (<!-- not run: why -->): {no_reason}"


def test_the_blocks_ci_runs_are_the_ones_it_reads() -> None:
    ci = [b for b in SHELL_BLOCKS if b.kind() == "ci"]
    assert [b.page.name for b in ci] == ["README.md"], [b.where for b in ci]
    assert "readme_command.py tests README.md" in (ROOT / ".ci/run").read_text()


def _commands(block: Block) -> str:
    if block.lang != "console":
        return block.body
    return "\n".join(line[2:] for line in block.body.splitlines() if line.startswith("$ "))


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=lambda b: b.where)
def test_a_run_block_exits_0(block: Block, tmp_path: Path) -> None:
    (tmp_path / "runs" / "sample").mkdir(parents=True)
    (tmp_path / "runs" / "sample" / "trials.csv").write_text(SAMPLE_TRIALS)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", _commands(block)], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, f"{block.where}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_relative_links_and_their_anchors_resolve() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            where = (page.parent / path) if path else page
            if not where.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


TOP = ("orchestrator", "train_fns", "search_spaces", "benchmarks", "examples", "tests", "docs")
REPO_PATH = re.compile(rf"^(\.ci|{'|'.join(TOP)})/[\w./-]*$")
DOTTED = re.compile(r"^(orchestrator|train_fns|search_spaces|benchmarks)(\.\w+)+$")


def inline_code(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", text)


def module_file(dotted: str) -> Path | None:
    base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def defined_names(path: Path) -> set[str]:
    """Top-level names a module defines or imports."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def dotted_problem(dotted: str) -> str | None:
    """Why ``orchestrator.x.y`` names nothing (None: a module, or a name a module defines)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        found = module_file(".".join(parts[:cut]))
        if found is None:
            continue
        if cut == len(parts) or parts[cut] in defined_names(found):
            return None
        return f"{'.'.join(parts[:cut])} defines no {parts[cut]}"
    return "no such module"


def test_named_paths_modules_and_names_exist() -> None:
    missing = []
    for page in PAGES:
        shown = page.relative_to(ROOT)
        text = page.read_text()
        for code in inline_code(page):
            token, _, test = code.partition("::")
            path = ROOT / token.rstrip("/")
            if REPO_PATH.match(token) and not path.exists():
                missing.append(f"{shown}: {code} (no such path)")
            elif REPO_PATH.match(token) and test and f"def {test}(" not in path.read_text():
                missing.append(f"{shown}: {code} (no such test)")
            elif DOTTED.match(code) and (why := dotted_problem(code)):
                missing.append(f"{shown}: {code} ({why})")
        for module in re.findall(r"python -m ((?:orchestrator|benchmarks)[\w.]*)", text):
            if module_file(module) is None and module_file(f"{module}.__main__") is None:
                missing.append(f"{shown}: python -m {module} (no such module)")
        for name, path in re.findall(r"`([\w.]+)(?:\(\))?` in `([\w/.-]+\.(?:py|yaml))`", text):
            file = ROOT / path
            last = name.split(".")[-1]
            if not file.is_file() or not re.search(rf"\b{re.escape(last)}\b", file.read_text()):
                missing.append(f"{shown}: `{name}` in `{path}` (not there)")
    assert not missing, missing


def slow_tests() -> set[str]:
    """Every test function marked slow, as path::name."""
    found = set()
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_slow = any(
            isinstance(n, ast.Assign) and "slow" in ast.unparse(n.value)
            and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
            for n in tree.body
        )  # fmt: skip
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
                "test"
            ):
                marks = " ".join(ast.unparse(d) for d in node.decorator_list)
                if module_slow or re.search(r"mark\.slow\b", marks):
                    found.add(f"{path.relative_to(ROOT)}::{node.name}")
    return found


def test_testing_md_lists_every_slow_test_and_only_those() -> None:
    text = (ROOT / "docs" / "testing.md").read_text()
    section = text.split("## The slow tests", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`(tests/[\w/]+\.py::\w+)`", section))
    actual = slow_tests()
    assert actual, "no slow test found: the finder is broken"
    assert not actual - listed, f"add to docs/testing.md's slow list: {sorted(actual - listed)}"
    assert not listed - actual, f"listed as slow, but not: {sorted(listed - actual)}"


def test_search_spaces_md_names_every_shipped_param() -> None:
    text = (ROOT / "docs" / "search-spaces.md").read_text()
    named = set(re.findall(r"`([\w]+)", text))
    missing = []
    for path in sorted((ROOT / "search_spaces").glob("*.yaml")):
        params = (yaml.safe_load(path.read_text()) or {}).get("params") or {}
        missing += [f"{path.name}: {p}" for p in params if p not in named]
    assert not missing, f"docs/search-spaces.md does not name: {missing}"


def test_outputs_md_names_every_run_file_and_run_info_key() -> None:
    from orchestrator.runfiles import WRITTEN_FILES, RunInfo

    text = "".join((ROOT / "docs" / page).read_text() for page in ("outputs.md", "elastic.md"))
    named = set(re.findall(r"`([\w.]+)`", text))
    missing = [f for f in WRITTEN_FILES if f not in named]
    keys = [f.name for f in dataclasses.fields(RunInfo)]
    missing += [f"run_info.json {key}" for key in keys if key not in named]
    assert not missing, f"docs/outputs.md (or elastic.md) does not name: {missing}"
