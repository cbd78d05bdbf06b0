"""One param of a space file: its domain, default and condition, validated on load.

Each domain type exists because Optuna or the training contract needs it:
``pow2`` is sampled as an integer exponent so Optuna models buffer sizes on a log
scale with an IntDistribution; ``divisor`` keeps ``global_batch`` fixed by offering
only accumulation counts that divide the per-worker batch; ``same_as`` copies a value
without sampling it (NCCL needs MIN and MAX channels equal to force a count).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._env import (
    ENV_ALLOW_PREFIXES,
    SpaceError,
    check_env_var,
    env_str,
    is_env_name,
    unsafe_reason,
)
from ._expr import Condition, parse_condition
from .knobs import BOOL, BY_NAME, CHOICE, PLAN_KNOBS, RANGE, RESHARD, shown

TYPES = ("categorical", "int", "pow2", "bool", "divisor")
_COMMON_KEYS = {"type", "default", "when", "why_inactive", "doc"}
_TYPE_KEYS = {
    "categorical": {"choices"},
    "int": {"low", "high", "step"},
    "pow2": {"low", "high"},
    "bool": set(),
    "divisor": {"of", "max"},
}
DIVISOR_OF = ("per_worker_batch", "global_batch", "world_size", "num_nodes")
"""Context values a ``divisor`` domain may divide."""
MAX_ENUMERATED = 4096
"""Int domains larger than this are not enumerated (grid, env checks, constraints)."""
_SCALARS = (str, int, float, bool, type(None))


def same_value(a: Any, b: Any) -> bool:
    """Equality that keeps ``True`` apart from ``1`` (YAML choices mix bools and ints)."""
    return type(a) is type(b) and a == b


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_pow2(value: Any) -> bool:
    return _is_int(value) and value > 0 and value & (value - 1) == 0


@dataclass(frozen=True, eq=False)
class Param:
    """A validated param. ``kind`` is a domain type or ``same_as``."""

    name: str
    kind: str
    default: Any
    key: str
    """Dotted path for error messages: ``<space>.params.<name>``."""
    choices: tuple[Any, ...] = ()
    low: int = 0
    high: int = 0
    step: int = 1
    of: str = ""
    """Context value for ``divisor``, copied param for ``same_as``."""
    max: int | None = None
    choice_when: tuple[tuple[Any, Condition, str], ...] = ()
    """Categorical choices offered only where a context condition holds: (value, when, why)."""
    when: Condition | None = None
    why_inactive: str = ""
    doc: str = ""

    @property
    def is_env(self) -> bool:
        return self.name not in PLAN_KNOBS

    @property
    def is_sampled(self) -> bool:
        return self.kind != "same_as"

    def values(self, of_value: int | None = None) -> list[Any]:
        """Every value of the domain, ascending for numeric kinds.

        ``of_value`` is the context value a ``divisor`` divides; ``same_as`` has no
        values of its own.
        """
        if self.kind == "categorical":
            return list(self.choices)
        if self.kind == "bool":
            return [False, True]
        if self.kind == "int":
            return list(range(self.low, self.high + 1, self.step))
        if self.kind == "pow2":
            return [1 << e for e in range(self.low.bit_length() - 1, self.high.bit_length())]
        if self.kind == "divisor":
            if of_value is None:
                raise ValueError(f"{self.key}: a divisor domain needs the value of {self.of}")
            top = of_value if self.max is None else min(self.max, of_value)
            return [d for d in range(1, top + 1) if of_value % d == 0]
        raise ValueError(f"{self.key}: {self.kind} has no values of its own")

    def size(self) -> int:
        """Number of values, without enumerating a large int range (not for divisor)."""
        if self.kind == "int":
            return (self.high - self.low) // self.step + 1
        return len(self.values())


def _require(raw: Mapping[str, Any], field: str, key: str, hint: str) -> Any:
    if field not in raw:
        raise SpaceError(f"{key}.{field}", f"missing; {hint}")
    return raw[field]


def _check_keys(raw: Mapping[str, Any], allowed: set[str], key: str, kind: str) -> None:
    unknown = sorted(str(k) for k in set(raw) - allowed)
    if unknown:
        raise SpaceError(
            f"{key}.{unknown[0]}",
            f"unknown key for a {kind} param; allowed: {', '.join(sorted(allowed))}",
        )


def _parse_range(raw: Mapping[str, Any], key: str, kind: str) -> tuple[int, int, int]:
    low = _require(raw, "low", key, f"a {kind} domain needs low and high")
    high = _require(raw, "high", key, f"a {kind} domain needs low and high")
    step = raw.get("step", 1)
    check = _is_pow2 if kind == "pow2" else _is_int
    for field, value in (("low", low), ("high", high)):
        if not check(value):
            what = "a power of two" if kind == "pow2" else "an integer"
            raise SpaceError(f"{key}.{field}", f"{value!r} is not {what}")
    if low > high:
        raise SpaceError(f"{key}.high", f"high={high} is below low={low}")
    if not _is_int(step) or step < 1:
        raise SpaceError(f"{key}.step", f"step={step!r} must be a positive integer")
    if (high - low) % step:
        fixed = low + (high - low) // step * step
        raise SpaceError(f"{key}.high", f"high={high} is not low + k*step; use {fixed}")
    return low, high, step


def _domain_fields(raw: Mapping[str, Any], kind: str, key: str) -> dict[str, Any]:
    if kind == "categorical":
        choices = _require(raw, "choices", key, "list the values (null: leave unset)")
        if not isinstance(choices, list) or not choices:
            raise SpaceError(f"{key}.choices", "must be a non-empty list")
        values, conditioned = _parse_choices(choices, key)
        for choice in values:
            if sum(same_value(choice, c) for c in values) > 1:
                raise SpaceError(f"{key}.choices", f"{choice!r} is listed twice")
        return {"choices": values, "choice_when": conditioned}
    if kind in ("int", "pow2"):
        low, high, step = _parse_range(raw, key, kind)
        return {"low": low, "high": high, "step": step}
    if kind == "divisor":
        of = _require(raw, "of", key, f"name the value it divides: {', '.join(DIVISOR_OF)}")
        if of not in DIVISOR_OF:
            raise SpaceError(f"{key}.of", f"{of!r}; a divisor divides one of {DIVISOR_OF}")
        top = raw.get("max")
        if top is not None and (not _is_int(top) or top < 1):
            raise SpaceError(f"{key}.max", f"max={top!r} must be a positive integer")
        return {"of": of, "max": top}
    return {}


def _parse_choices(
    raw: list[Any], key: str
) -> tuple[tuple[Any, ...], tuple[tuple[Any, Condition, str], ...]]:
    """Plain values, or ``{value: V, when: COND, why_inactive: TEXT}`` for a choice that
    applies only on some hardware or cluster shape (``allreduce:nvls`` needs NVSwitch)."""
    values, conditioned = [], []
    for i, choice in enumerate(raw):
        if isinstance(choice, Mapping):
            _check_keys(choice, {"value", "when", "why_inactive"}, f"{key}.choices[{i}]", "choice")
            value = _require(choice, "value", f"{key}.choices[{i}]", "the value offered")
            if "when" in choice:
                cond = parse_condition(choice["when"], f"{key}.choices[{i}].when")
                conditioned.append((value, cond, str(choice.get("why_inactive", ""))))
            choice = value
        if not isinstance(choice, _SCALARS):
            raise SpaceError(f"{key}.choices", f"{choice!r} is not a plain value")
        values.append(choice)
    return tuple(values), tuple(conditioned)


def _check_default(param: Param) -> None:
    """Every param starts from its library default, so the default must be a domain value."""
    default, kind = param.default, param.kind
    if kind == "divisor":
        ok = _is_int(default) and default >= 1 and (param.max is None or default <= param.max)
        shown = f"a positive integer up to max={param.max}"
    elif kind == "int":
        ok = _is_int(default) and param.low <= default <= param.high
        ok = ok and (default - param.low) % param.step == 0
        shown = f"{param.low}..{param.high} step {param.step}"
    else:
        ok = any(same_value(default, v) for v in param.values())
        shown = ", ".join(map(repr, param.values()))
    if not ok:
        raise SpaceError(f"{param.key}.default", f"default {default!r} is outside {shown}")
    if any(same_value(default, value) for value, _, _ in param.choice_when):
        raise SpaceError(f"{param.key}.default", "the default is always offered: drop its when")


def _check_name(name: Any, key: str) -> None:
    if not isinstance(name, str):
        raise SpaceError(key, f"param name {name!r} must be a string")
    if name in PLAN_KNOBS:
        return
    if name.isupper():  # looks like an environment variable
        try:
            check_env_var(name, None)
        except SpaceError as e:
            raise SpaceError(key, e.message) from None
        return
    raise SpaceError(
        key,
        f"unknown param {name!r}: use a plan knob ({', '.join(sorted(PLAN_KNOBS))}) or an "
        f"environment variable starting with {', '.join(ENV_ALLOW_PREFIXES)}",
    )


def parse_param(name: Any, raw: Any, space: str, earlier: Sequence[Param]) -> Param:
    """Validate one ``params:`` entry; ``earlier`` are the params declared before it."""
    key = f"{space}.params.{name}"
    _check_name(name, key)
    if not isinstance(raw, Mapping):
        raise SpaceError(key, "must be a mapping such as {type: int, low: 1, high: 8, default: 1}")
    if "same_as" in raw:
        return _parse_same_as(name, raw, key, earlier)
    kind = _require(raw, "type", key, f"one of {', '.join(TYPES)} (or same_as: OTHER)")
    if kind not in TYPES:
        raise SpaceError(f"{key}.type", f"unknown type {kind!r}; use one of {', '.join(TYPES)}")
    _check_keys(raw, _COMMON_KEYS | _TYPE_KEYS[kind], key, kind)
    default = _require(raw, "default", key, "give the library default (null: leave unset)")
    when = parse_condition(raw["when"], f"{key}.when") if "when" in raw else None
    param = Param(
        name=name,
        kind=kind,
        default=default,
        key=key,
        when=when,
        why_inactive=str(raw.get("why_inactive", "")),
        doc=str(raw.get("doc", "")),
        **_domain_fields(raw, kind, key),
    )
    _check_default(param)
    _check_knob(param)
    if param.is_env:
        _check_env_values(param)
    return param


def _parse_same_as(name: str, raw: Mapping[str, Any], key: str, earlier: Sequence[Param]) -> Param:
    _check_keys(raw, {"same_as", "default", "doc"}, key, "same_as")
    target = next((p for p in earlier if p.name == raw["same_as"]), None)
    if target is None or not target.is_sampled:
        raise SpaceError(
            f"{key}.same_as",
            f"{raw['same_as']!r} must be a sampled param declared earlier in the same file",
        )
    if "default" in raw and not same_value(raw["default"], target.default):
        raise SpaceError(f"{key}.default", f"must equal {target.name}'s default {target.default!r}")
    if target.is_env != is_env_name(name):
        raise SpaceError(f"{key}.same_as", "cannot copy between a plan knob and an env variable")
    return Param(
        name=name,
        kind="same_as",
        default=target.default,
        key=key,
        of=target.name,
        doc=str(raw.get("doc", "")),
    )


def _check_knob(param: Param) -> None:
    """Plan knobs become typed TrialPlan fields, so their domains are restricted to what the
    registry (``search_spaces.knobs``) says each takes."""
    name, kind, knob = param.name, param.kind, BY_NAME.get(param.name)
    if knob is None:
        return
    if name == "accumulation_steps" and kind != "divisor":
        raise SpaceError(
            f"{param.key}.type",
            "use {type: divisor, of: per_worker_batch}: other values break the fixed global batch",
        )
    if knob.takes == CHOICE:
        allowed = knob.values
        if kind != "categorical" or not all(
            any(same_value(v, a) for a in allowed) for v in param.values()
        ):
            raise SpaceError(
                param.key, f"{name} must be categorical with choices from [{shown(allowed)}]"
            )
    elif knob.takes == RANGE and kind != "divisor":
        values = [param.low, param.high] if kind == "int" else [None]
        values = param.values() if kind in ("categorical", "pow2") else values
        low, high = knob.values
        if any(not isinstance(v, (int, float)) or isinstance(v, bool) or not low <= v <= high
               for v in values):  # fmt: skip
            raise SpaceError(param.key, f"{name} values must be numbers from {low:g} to {high:g}")
    elif knob.takes == RESHARD:
        values = param.values() if kind in ("categorical", "bool") else [None]
        if any(not isinstance(v, bool) and not (isinstance(v, int) and v > 1) for v in values):
            raise SpaceError(param.key, f"{name} choices are true, false or ranks (an int > 1)")
    elif knob.takes == BOOL and kind != "bool":
        raise SpaceError(f"{param.key}.type", f"{name} is a flag; use type: bool")


def _check_env_values(param: Param) -> None:
    """Each value a worker could receive must pass the env checks (enumerated if small)."""
    if param.kind == "int" and param.size() > MAX_ENUMERATED:
        values = [param.low, param.high]
    elif param.kind == "divisor":
        values = [param.default]
    else:
        values = param.values()
    for value in values:
        try:
            check_env_var(param.name, value)
        except SpaceError as e:
            raise SpaceError(param.key, f"domain value {value!r} is invalid: {e.message}") from None
    text = env_str(param.default)
    why = unsafe_reason(param.name, text) if text is not None else None
    if why is not None:
        raise SpaceError(f"{param.key}.default", f"{param.default!r} {why}; use a safe default")
