"""Docs explain, records keep the figures: README.md, docs/ and the product's code say what,
how and why, and carry no dates or issue, stop and session numbers. A dated figure belongs in a
record under ``benchmarks/results/`` (one file per run, named by its date in ISO 8601's basic
form, ``YYYYMMDD-topic``), which a page links and a docstring names ("the record named TOPIC in
benchmarks/results/"). A record's name is not a dated line: a link to one passes as it is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
HISTORY = re.compile(r"20[0-9]{2}-[01][0-9]-[0-3][0-9]|(issue|stop|session) [0-9]+", re.I)
"""A date, or a reference to a tracker's issue, a work stop or a session."""
CODE_DIRS = ("orchestrator", "train_fns", "search_spaces", "benchmarks")
RECORD_FIELDS = ("**Date**", "**Commit", "**Machine**", "**Command")
"""What a markdown record states before its figures (``Commit``/``Commits``, ``Command``/``s``)."""


def checked_files() -> list[Path]:
    """README.md, every docs page, and the product's .py files outside the records."""
    code = [p for d in CODE_DIRS for p in sorted((ROOT / d).rglob("*.py"))]
    code = [p for p in code if RESULTS not in p.parents]
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *code]


def history_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line with a date or an issue/stop/session number."""
    return [
        (number, line.strip())
        for number, line in enumerate(text.splitlines(), 1)
        if HISTORY.search(line)
    ]


def test_the_pattern_catches_what_it_must_and_spares_record_names() -> None:
    caught = ["measured on 2026-12-04", "(issue 24 item 1)", "CI time, Stop 35", "session 12's run"]
    assert all(history_lines(line) for line in caught)
    spared = [
        "[a record](../benchmarks/results/20261204-aa-verdict.md)",
        "issue a warning at step 12",
        "a session of 5 trials",
        "`checkpoint_every: 10`",
    ]
    assert not any(history_lines(line) for line in spared)
    assert history_lines("see benchmarks/results/20261204-x.md, run 2026-12-05") == [
        (1, "see benchmarks/results/20261204-x.md, run 2026-12-05")
    ]


def test_docs_and_code_carry_no_dates_or_issue_numbers() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line}"
        for path in checked_files()
        for number, line in history_lines(path.read_text())
    ]
    assert not found, (
        "dates and issue/stop/session numbers belong in a record under benchmarks/results/ "
        "(link it, or name it in a docstring); say the rule and why instead:\n" + "\n".join(found)
    )


def test_records_named_in_code_exist() -> None:
    """A docstring's "the record named TOPIC" must name a record that is there."""
    names = {re.sub(r"^\d{8}-|-\d{6}$", "", p.stem) for p in RESULTS.glob("20*.*")}
    missing = [
        f"{path.relative_to(ROOT)}: {topic}"
        for path in checked_files()
        for topic in re.findall(r"the record named\s+([\w-]+)", path.read_text())
        if topic not in names
    ]
    assert not missing, f"no record under benchmarks/results/ with that name: {missing}"


@pytest.mark.parametrize("record", sorted(RESULTS.glob("20*.md")), ids=lambda p: p.name)
def test_a_markdown_record_says_when_what_where_and_how(record: Path) -> None:
    assert re.match(r"^\d{8}-[a-z0-9-]+\.md$", record.name), record.name
    text = record.read_text()
    missing = [field for field in RECORD_FIELDS if field not in text]
    assert not missing, f"{record.name} does not state {missing}"
    day = f"{record.name[:4]}-{record.name[4:6]}-{record.name[6:8]}"
    assert f"**Date**: {day}" in text, f"{record.name}: its date is not its name's"
