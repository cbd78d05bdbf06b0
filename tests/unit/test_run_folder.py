"""The run folder is one module's: no other product module spells a run file's name, a
run_info.json key or a summary.json key, and run_info.json and remeasure.csv read back as the
typed records they were written from.

Docstrings may name files (they document); tests may too (they check the names a user sees).
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

from orchestrator.runfiles import (
    REMEASURE_CSV,
    RUN_INFO,
    WRITTEN_FILES,
    RunInfo,
    Summary,
    add_race_time,
    add_search_wall,
    collect,
    read_run_info,
    update_run_info,
)
from orchestrator.runfiles.remeasure import (
    BASELINE,
    COLUMNS,
    FINALIST,
    GROUP,
    WINDOW,
    Remeasured,
    write_remeasure,
)

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("orchestrator", "train_fns", "search_spaces", "benchmarks", "examples")
OWNER = ROOT / "orchestrator" / "runfiles"
INFO_KEYS = {f.name for f in dataclasses.fields(RunInfo)}
SUMMARY_KEYS = {f.name for f in dataclasses.fields(Summary)}
RECORDS = (("info", INFO_KEYS), ("summary", SUMMARY_KEYS))
"""A typed record's keys, read by name from something whose name says it holds that record."""


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (module, class, function, attribute)."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                found.add(id(stmt.value))
    return found


def _product_files() -> list[Path]:
    files = [p for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py")]
    return [p for p in files if OWNER not in p.parents]


def _spelt_names(path: Path, root: Path = ROOT) -> list[str]:
    """Each string (not a docstring) in ``path`` that holds a run file's name."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        text = _folded(node)
        if text is not None and id(node) not in docs:
            found += [f"{path.relative_to(root)}:{node.lineno} {name}"
                      for name in WRITTEN_FILES if name in text]  # fmt: skip
    return found


def _folded(node: ast.AST) -> str | None:
    """A string constant, or constants joined by ``+`` or in an f-string ("best" + ".yaml",
    f"{'trials'}.csv"); None for anything else."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _folded(node.left), _folded(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.JoinedStr):
        parts = [_folded(v.value if isinstance(v, ast.FormattedValue) else v) for v in node.values]
        return None if None in parts else "".join(parts)
    return None


def _keys_read(path: Path, root: Path = ROOT) -> list[str]:
    """``<something info>["key"]`` or ``<something info>.get("key")`` with a run_info key, and
    the same with a summary.json key on ``<something summary>``."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        target, key = None, None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            target, key = node.value, node.slice.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "get" and node.args
              and isinstance(node.args[0], ast.Constant)):  # fmt: skip
            target, key = node.func.value, node.args[0].value
        if target is None:
            continue
        held = ast.unparse(target).lower()
        if any(key in keys and word in held for word, keys in RECORDS):
            found.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_no_module_but_runfiles_spells_a_run_file_name() -> None:
    spelt = [hit for path in _product_files() for hit in _spelt_names(path)]
    assert spelt == [], "use the constants of orchestrator.runfiles"


def test_no_module_but_runfiles_reads_a_record_key_by_name() -> None:
    read = [hit for path in _product_files() for hit in _keys_read(path)]
    assert read == [], "read run_info and summary.json through RunInfo and Summary (runfiles)"


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """Both scans fire on a module that does what they forbid (they are not vacuous), and a
    key is only caught on the record it belongs to."""
    bad = tmp_path / "bad.py"
    lines = ['"""best.yaml in a docstring is fine."""', 'x = out / "best.yaml"',
             'v = "run_info" + ".json"', "u = f\"{'trials'}.csv\"",
             'y = info["search_wall_s"]', 'z = run_info.get("backend")',
             'w = cfg["backend"]', 'v = summary.get("steps")',
             'u = record.summary["world_sizes"]', 't = summary["backend"]',
             's = info["steps"]']  # fmt: skip
    bad.write_text("\n".join(lines) + "\n")
    spelt = sorted(h.split()[-1] for h in _spelt_names(bad, tmp_path))
    assert spelt == ["best.yaml", "run_info.json", "trials.csv"]  # joined ones too
    assert [h.split()[0] for h in _keys_read(bad, tmp_path)] == [
        "bad.py:5", "bad.py:6", "bad.py:8", "bad.py:9"
    ]  # fmt: skip


def test_run_info_round_trips_and_merges(tmp_path: Path) -> None:
    update_run_info(tmp_path, RunInfo(backend="gloo", world_size=2, use_gpu=False))
    info = update_run_info(tmp_path, RunInfo(grad_bytes=16e6, gpu_util=0.5))
    add_search_wall(tmp_path, 10.0)
    add_search_wall(tmp_path, 5.5)
    read = read_run_info(tmp_path)
    assert (info.backend, info.world_size, info.grad_bytes) == ("gloo", 2, 16e6)
    assert (read.use_gpu, read.gpu_util, read.search_wall_s) == (False, 0.5, 15.5)
    assert isinstance(read.topology, dict) and "cpu_count" in read.topology


def test_the_measured_share_counts_the_race_beside_the_trials(tmp_path: Path) -> None:
    """A resumed search's race adds its time as its trials do; the share is of both, each
    part's own beside it, and a search without a race says its trials alone."""
    from orchestrator.search.results import TrialRecord, overhead_line

    timings = {"measured_s": 60.0, "warmup_s": 20.0, "start_s": 10.0, "reference_s": 5.0}
    recs = [TrialRecord(0, "complete", "", {}, {"timings": timings})]
    add_search_wall(tmp_path, 100.0)
    alone = overhead_line(recs, read_run_info(tmp_path))
    assert alone is not None and alone.startswith("measured share of search time: 60% (60s of ")
    assert "race" not in alone and "trials 60% of 100s; the trials' largest overheads: " \
        "warmup 20s, start 10s, reference 5s)" in alone
    add_race_time(tmp_path, 80.0, 60.0)
    add_race_time(tmp_path, 20.0, 20.0)
    both = overhead_line(recs, read_run_info(tmp_path))
    assert both is not None
    assert both.startswith("measured share of search time: 70% (140s of measured steps in 200s:")
    assert "trials 60% of 100s, race 80% of 100s;" in both
    assert overhead_line(recs, RunInfo(race_wall_s=10.0)) is None  # no search on record


def test_a_hand_edited_run_info_reads_wrong_kinds_as_absent(tmp_path: Path) -> None:
    """A string where a number belongs, a bool for a count, a key of another version: absent,
    kept in the file, and the record built without an error."""
    raw = {"world_size": "4", "num_nodes": True, "gpu_util": 93, "link": "nvlink-a100",
           "future_key": [1, 2], "use_gpu": "yes", "memory_capacity_bytes": 2.0e9}  # fmt: skip
    (tmp_path / RUN_INFO).write_text(json.dumps(raw))
    info = read_run_info(tmp_path)
    assert (info.world_size, info.num_nodes, info.use_gpu) == (None, None, None)
    assert (info.gpu_util, info.link) == (93, "nvlink-a100")
    capacity = info.memory_capacity_bytes
    assert capacity == 2_000_000_000 and isinstance(capacity, int)
    update_run_info(tmp_path, RunInfo(backend="nccl"))
    assert json.loads((tmp_path / RUN_INFO).read_text())["future_key"] == [1, 2]
    assert collect([tmp_path]).run_info.backend == "nccl"


def test_remeasure_rows_round_trip_through_the_typed_record(tmp_path: Path) -> None:
    """The race and the group runs write ``Remeasured`` rows; the verdict, the report and the
    doctor read the same rows back, whatever column order or text the file holds."""
    rows = [
        Remeasured(position=0, repeat=0, trial=0, role=BASELINE, state="complete",
                   samples_per_s=101.5, windows=1, placement="2", pairing=WINDOW, pair=0,
                   against=5, attempt=0, delta=0.02, floor=0.01, reference=100.0, race=1),
        Remeasured(position=1, repeat=0, trial=5, role=FINALIST, state="oom", pairing=GROUP,
                   disturbed="a slow run"),
    ]  # fmt: skip
    write_remeasure(tmp_path / REMEASURE_CSV, rows)
    header = (tmp_path / REMEASURE_CSV).read_text().splitlines()[0]
    assert header.split(",") == list(COLUMNS)
    assert collect([tmp_path]).remeasure == rows


def test_a_hand_edited_remeasure_value_reads_as_absent() -> None:
    edited = {"position": "1.5", "trial": "five", "samples_per_s": "nan", "pair": " 3 ",
              "role": "", "delta": "inf", "race": "2"}  # fmt: skip
    row = Remeasured.from_row(edited)
    assert (row.position, row.trial, row.samples_per_s, row.role, row.delta) == (None,) * 5
    assert (row.pair, row.race) == (3, 2)
