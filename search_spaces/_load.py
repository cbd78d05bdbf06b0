"""Reading space files: YAML with line numbers and duplicate-key detection, then validation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ._domain import Param, parse_param
from ._env import SpaceError
from ._expr import Constraint, parse_condition, parse_constraint
from ._spec import (
    SpaceSpec,
    check_algo_proto,
    check_choice_conditions,
    check_condition,
    check_constraint,
    check_feasible,
    check_socket_rule,
)
from .guarded_yaml import load_yaml, read_capped

SHIPPED_DIR = Path(__file__).parent
_TOP_KEYS = {"name", "description", "when", "why_inactive", "params", "constraints"}


def shipped_space_names() -> list[str]:
    """Names accepted by :func:`load_spaces` without a path."""
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml"))


def _read_yaml(path: Path) -> Any:
    try:
        text = read_capped(path)
    except OSError as e:
        raise SpaceError(
            str(path), f"cannot read ({e.strerror}); shipped spaces: {shipped_space_names()}"
        ) from None
    except ValueError as e:  # too large, not a regular file, not UTF-8
        raise SpaceError(str(path), f"cannot read: {e}") from None
    try:
        return load_yaml(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown line"
        raise SpaceError(str(path), f"malformed YAML at {where}: {e.problem}") from None
    except yaml.YAMLError as e:
        raise SpaceError(str(path), f"malformed YAML: {e}") from None


def _text(raw: Mapping[str, Any], field: str, key: str, default: str) -> str:
    value = raw.get(field, default)
    if not isinstance(value, str):
        raise SpaceError(f"{key}.{field}", f"must be a string, got {value!r}")
    return value


def _parse_params(raw: Any, name: str) -> tuple[Param, ...]:
    if not isinstance(raw, Mapping) or not raw:
        raise SpaceError(f"{name}.params", "must be a non-empty mapping of param name to domain")
    params: list[Param] = []
    for param_name, param_raw in raw.items():
        param = parse_param(param_name, param_raw, name, params)
        if param.when is not None:
            earlier = {p.name: p for p in params}
            later = [n for n in raw if n not in earlier]
            check_condition(param.when, f"{param.key}.when", earlier, later)
        check_choice_conditions(param)
        params.append(param)
    return tuple(params)


def _parse_constraints(raw: Any, name: str, params: Sequence[Param]) -> tuple[Constraint, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise SpaceError(f"{name}.constraints", "must be a list of strings like 'A * B <= 64'")
    constraints = tuple(
        parse_constraint(text, f"{name}.constraints[{i}]") for i, text in enumerate(raw)
    )
    groups: dict[str, list[Constraint]] = {}
    for i, con in enumerate(constraints):
        last = check_constraint(con, params, f"{name}.constraints[{i}]")
        groups.setdefault(last.name, []).append(con)
    by_name = {p.name: p for p in params}
    for last_name, cons in groups.items():
        check_feasible(by_name[last_name], cons, params, f"{name}.constraints")
    return constraints


def load_space_file(path: str | Path) -> SpaceSpec:
    """Read and validate one space file; every problem is a SpaceError naming its key."""
    path = Path(path)
    raw = _read_yaml(path)
    if not isinstance(raw, Mapping):
        raise SpaceError(str(path), "a space file is a mapping with name, params, ...")
    name = _text(raw, "name", path.stem, path.stem)
    unknown = sorted(str(k) for k in set(raw) - _TOP_KEYS)
    if unknown:
        raise SpaceError(f"{name}.{unknown[0]}", f"unknown key; allowed: {sorted(_TOP_KEYS)}")
    when = None
    if raw.get("when") is not None:
        when = parse_condition(raw["when"], f"{name}.when")
        check_condition(when, f"{name}.when", {}, list(raw.get("params") or ()))
    params = _parse_params(raw.get("params"), name)
    constraints = _parse_constraints(raw.get("constraints"), name, params)
    check_socket_rule({p.name: p for p in params}, constraints, f"{name}.constraints")
    check_algo_proto({p.name: p for p in params}, f"{name}.params")
    return SpaceSpec(
        name=name,
        description=_text(raw, "description", name, ""),
        when=when,
        params=params,
        constraints=constraints,
        source=str(path),
        why_inactive=_text(raw, "why_inactive", name, ""),
    )


def check_unique_params(specs: Sequence[SpaceSpec]) -> None:
    """One name, one meaning: a param defined in two spaces would be sampled twice."""
    owner: dict[str, SpaceSpec] = {}
    for spec in specs:
        for param in spec.params:
            first = owner.setdefault(param.name, spec)
            if first is not spec:
                raise SpaceError(
                    param.key,
                    f"{param.name} is defined in both {first.source} and {spec.source}; "
                    "keep it in one space",
                )


def load_spaces(names_or_paths: Sequence[str | Path]) -> list[SpaceSpec]:
    """Load shipped spaces by bare name (``nccl``) or user files by path, in order."""
    specs = []
    for item in names_or_paths:
        text = str(item)
        is_name = "/" not in text and "\\" not in text and not text.endswith((".yaml", ".yml"))
        path = SHIPPED_DIR / f"{text}.yaml" if is_name else Path(text)
        if is_name and not path.is_file():
            raise SpaceError(
                text,
                f"no shipped space named {text!r}; shipped: {', '.join(shipped_space_names())} "
                "(or give the path of a .yaml file)",
            )
        if not path.is_file():
            raise SpaceError(
                text,
                f"space file not found; give an existing .yaml path or a shipped name: "
                f"{', '.join(shipped_space_names())}",
            )
        specs.append(load_space_file(path))
    check_unique_params(specs)
    return specs
