"""remeasure.csv as a typed record: every column the verdict's measurements write there and
the verdict, the race, the report and the doctor read back, declared once.

One row per measurement: window-paired rows (the race: a baseline window and a finalist
window per pair, from one worker group) and group-paired rows (whole runs interleaved with the
baseline's) alike. Writers build ``Remeasured`` rows; a reader parses each text row once with
``Remeasured.from_row``: a value of the wrong kind (a hand-edited word, ``nan``, a fraction in a
whole-number column) reads as absent (None), so a hand edit is no evidence rather than a crash,
as run_info.json's keys are.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.runfiles.files import write_csv

BASELINE, FINALIST = "baseline", "finalist"
"""The ``role`` of a row: whose measurement it is."""
WINDOW, GROUP = "window", "group"
"""The ``pairing`` of a row: a window paired beside the baseline's in one worker group, or a
whole run interleaved with the baseline's (a blank pairing is a group row: older files)."""


@dataclass(frozen=True)
class Remeasured:
    """One measurement; every column is optional (absent: None)."""

    position: int | None = None
    """Its place in the order measured (a whole-run sequence position, or a window's row)."""
    repeat: int | None = None
    """A group-paired run's repeat (0: the first run; more: measured again, disturbed)."""
    trial: int | None = None
    """The measured configuration's trial number (the baseline's too)."""
    role: str | None = None
    state: str | None = None
    """How the measurement ended (``complete``, ``infeasible``, ...)."""
    samples_per_s: float | None = None
    throughput_cv: float | None = None
    windows: int | None = None
    """Windows a group-paired run measured (its cv's sample size)."""
    disturbed: str | None = None
    """Why a group-paired run reads as disturbed (blank: it does not)."""
    placement: str | None = None
    """Ranks per node, as the worker group reported them."""
    pairing: str | None = None
    pair: int | None = None
    """A window's pair number (a warm-up window has none)."""
    against: int | None = None
    """The finalist a baseline window is paired against (a finalist's window: itself)."""
    attempt: int | None = None
    """The worker group a window came from: a pair's two windows share one."""
    delta: float | None = None
    """δ, the gain worth having, the verdict is judged against."""
    floor: float | None = None
    """The noise floor the race's disturbance test assumes."""
    reference: float | None = None
    """The baseline's search figure its slow windows are judged against."""
    race: int | None = None
    """Which run of the race took the window (1: the search's own; more: measured on)."""
    gpus: str | None = None
    """The GPUs' UUIDs the measurement ran on (empty on CPU): runs on other machines are not
    compared."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Remeasured:
        """A row as the file holds it (text), each column of its kind or None."""
        return cls(**{f.name: _parse(row.get(f.name), f.type) for f in dataclasses.fields(cls)})

    def as_text(self) -> dict[str, str]:
        """The row as the file holds it: every column, text (None: empty)."""
        return {k: "" if v is None else str(v) for k, v in dataclasses.asdict(self).items()}


COLUMNS = tuple(f.name for f in dataclasses.fields(Remeasured))
"""remeasure.csv's header."""


Rows = Sequence[Mapping[str, Any] | Remeasured]
"""What a reader of remeasure.csv takes: rows as the file holds them (``runfiles.read_csv``,
``as_text`` of rows in memory) or records already read."""


def read_rows(rows: Rows) -> list[Remeasured]:
    """``rows`` as records (a record stays as it is)."""
    return [r if isinstance(r, Remeasured) else Remeasured.from_row(r) for r in rows]


def as_text(rows: Rows) -> list[dict[str, str]]:
    """The rows as remeasure.csv holds them (every column, text; None: empty): the verdict
    read from rows in memory is the one read from the file."""
    return [row.as_text() for row in read_rows(rows)]


def write_remeasure(path: Path, rows: Rows) -> None:
    """remeasure.csv, written whole (``write_csv``): a reader such as the report never sees
    half the verdict's evidence."""
    write_csv(path, list(COLUMNS), [list(row.values()) for row in as_text(rows)])


def _parse(value: Any, kind: str) -> Any:
    """``value`` (text, or a value a writer set) as ``kind`` (a field's annotation), or None."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if kind == "str | None":
        return str(value)
    try:
        number = int(value) if kind == "int | None" else float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None
