"""docs/configuration.md cannot drift from ``orchestrator/config/schema.py``: every key of the
Config
dataclasses has a row there with its default and range, and every row names a key that exists."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config.bounds import BOUNDS
from orchestrator.config.schema import Config

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
ROW = re.compile(r"^\| `([a-z_.]+)` \| `([^`]*)` \|([^|]*)\| .+ \|$")
"""A key's row: | `key` | `default` | range | meaning |."""


def config_keys() -> dict[str, Any]:
    """Every dotted key of the Config dataclasses with its default."""
    out: dict[str, Any] = {}

    def walk(cls: type, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            if f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = f.default
            if dataclasses.is_dataclass(value):
                walk(type(value), f"{prefix}{f.name}.")
            else:
                out[f"{prefix}{f.name}"] = value

    walk(Config, "")
    return out


def documented() -> dict[str, tuple[str, str]]:
    """Each documented key -> (default cell, range cell); a key twice is a mistake."""
    rows: dict[str, tuple[str, str]] = {}
    for number, line in enumerate(DOC.read_text().splitlines(), 1):
        match = ROW.match(line)
        if match:
            key, default, bounds = match.groups()
            assert key not in rows, f"docs/configuration.md:{number}: {key} documented twice"
            rows[key] = (default, bounds.strip())
    return rows


def shown(value: Any) -> str:
    """A default as the page shows it: YAML flow style (``null``, ``[a, b]``, ``{}``)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def test_every_config_key_is_documented_and_every_documented_key_exists() -> None:
    keys, rows = config_keys(), documented()
    missing, unknown = sorted(set(keys) - set(rows)), sorted(set(rows) - set(keys))
    assert not missing, f"add to docs/configuration.md: {missing}"
    assert not unknown, f"documented in docs/configuration.md, not in config.py: {unknown}"


def test_documented_defaults_are_the_dataclass_defaults() -> None:
    keys, rows = config_keys(), documented()
    pairs = {k: (rows[k][0], shown(v)) for k, v in keys.items() if k in rows}
    wrong = {k: pair for k, pair in pairs.items() if pair[0] != pair[1]}
    assert not wrong, f"docs/configuration.md default -> config.py default: {wrong}"


def test_documented_ranges_are_the_bounds() -> None:
    for key, (_, cell) in documented().items():
        if key not in BOUNDS:
            assert cell == "", f"{key}: a range is documented but config.BOUNDS has none"
            continue
        low, _, high = cell.partition(" to ")
        assert (float(low), float(high)) == BOUNDS[key], f"{key}: {cell!r} vs {BOUNDS[key]}"
