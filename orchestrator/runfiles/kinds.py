"""A JSON record read as typed: what run_info.json (``RunInfo``) and summary.json (``Summary``)
share.

A run folder may be hand-edited, copied from another version or from someone else, so a value
of the wrong kind reads as absent (None) rather than failing a rule or a figure later: a string
where a number belongs, a bool for a count (JSON's true is not 1), a list where a mapping
belongs. Numbers must be finite, and none may be negative unless the field says so (``SIGNED``):
counts, sizes, times, rates and fractions cannot be, and "-2 workers" or "nan%" printed by the
doctor is worse than nothing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

SIGNED = {"signed": True}
"""Field metadata for a number that may be negative (a loss): ``field(metadata=SIGNED)``."""


def typed_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """Each field of the dataclass ``cls`` from ``data``, of its kind or None: what a record's
    ``from_mapping`` passes to its constructor. Keys ``cls`` does not know are not read."""
    return {
        f.name: of_kind(data.get(f.name), str(f.type), bool(f.metadata.get("signed")))
        for f in dataclasses.fields(cls)
    }


def wrong_kinds(cls: type, data: dict[str, Any]) -> list[str]:
    """The fields of ``cls`` that ``data`` gives a value of the wrong kind: what a reader says
    it read as absent (one line), so a hand edit that did nothing is not silent."""
    read = typed_fields(cls, data)
    return [name for name, value in read.items() if value is None and data.get(name) is not None]


def of_kind(value: Any, kind: str, signed: bool = False) -> Any:
    """``value`` if it is of ``kind`` (a field's annotation: ``int | None``, ``list[str]``,
    ``dict[str, Any]``, ``Any``...), else None. A list is of its kind only if every item is."""
    kind = kind.removesuffix(" | None")
    if kind == "Any":
        return value
    if kind.startswith("list[") and kind.endswith("]"):
        if not isinstance(value, list):
            return None
        items = [of_kind(item, kind[5:-1], signed) for item in value]
        return None if any(item is None for item in items) else items
    if kind.startswith("dict["):
        return value if isinstance(value, dict) else None
    if kind == "bool":
        return value if isinstance(value, bool) else None
    if kind == "str":
        return value if isinstance(value, str) else None
    return _number(value, kind == "int", signed)


def _number(value: Any, whole: bool, signed: bool) -> int | float | None:
    """A finite number (an int for a whole-number field), non-negative unless ``signed``.

    An int too large for a float (a 400-digit count) is absent, not an OverflowError: every
    reader does float arithmetic on these."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        as_float = float(value)
    except OverflowError:
        return None
    if not math.isfinite(as_float) or (as_float < 0 and not signed):
        return None
    if not whole:
        return as_float
    if isinstance(value, int):
        return value
    return int(as_float) if as_float.is_integer() else None
