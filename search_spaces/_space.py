"""Loaded spaces combined for one run: what is active, and how to sample it.

:class:`SearchSpace` is the define-by-run function handed to Optuna (the search's
``GroupSearch`` calls ``suggest`` on each asked trial). Everything that depends only on the
run's context (backend, fixed strategy, batch sizes) is decided once here, so each trial
only evaluates the conditions that depend on earlier samples.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # optuna is imported where a trial is rebuilt: the worker side reads
    import optuna  # the knob registry through this package and stays light

from ._domain import MAX_ENUMERATED, Param, same_value
from ._env import SpaceError, check_env, env_str, unsafe_reason
from ._expr import Condition, Constraint
from ._load import check_unique_params
from ._nccl import FUNCS, nvls_only, prefix_refusal
from ._spec import (
    CONTEXT_DOMAINS,
    SearchContext,
    SpaceSpec,
    check_algo_proto,
    check_clause,
    check_socket_rule,
    feasible_run,
)
from .knobs import PLAN_KNOBS, knob_defaults

Options = Callable[["_Entry", Mapping[str, Any]], list[Any]]


@dataclass(frozen=True, eq=False)
class _Entry:
    """A param that may be active in this context, with what is left to decide per trial."""

    param: Param
    spec: SpaceSpec
    conditions: tuple[Condition, ...]
    """Conditions the context alone could not decide."""
    constraints: tuple[Constraint, ...]
    """Constraints whose last-sampled participant is this param."""
    choices: tuple[Any, ...]
    """Fixed choices of categorical, bool and divisor params (never vary across trials)."""


def _fill(text: str, values: Mapping[str, Any]) -> str:
    """Substitute ``{name}`` placeholders of a ``why_inactive`` text (no format() tricks)."""
    return re.sub(r"\{(\w+)\}", lambda m: str(values.get(m.group(1), m.group(0))), text)


def _typed(param: Param, value: Any) -> Any:
    """``value`` as the space types it: an env variable's text (``"4"``, ``"1"``) as the choice
    NCCL reads the same way, or an integer."""
    if not (param.is_env and isinstance(value, str)):
        return value
    for choice in param.values() if param.kind in ("categorical", "bool") else ():
        if env_str(choice) == value:
            return choice
    try:
        return int(value)
    except ValueError:
        return value


def _optuna_name(param: Param) -> str:
    return f"log2({param.name})" if param.kind == "pow2" else param.name


class SearchSpace:
    """The active params of some spaces in one context; see the package docstring."""

    def __init__(self, specs: Sequence[SpaceSpec], context: SearchContext) -> None:
        check_unique_params(specs)
        self.context = context
        loaded = {p.name for s in specs for p in s.params}
        unsampled = {k: v for k, v in knob_defaults().items() if k not in loaded}
        self._static = {**unsampled, **context.values()}
        self._inactive: dict[str, None] = {}
        self._known: dict[str, Param] = {}
        self._specs = [(s.name, p) for s in specs for p in s.params]
        self._entries: list[_Entry] = []
        self._dropped: list[tuple[str, str]] = []
        dropped_specs: set[SpaceSpec] = set()  # by identity: two files may share a name
        pairs = [(s, p) for s in specs for p in s.params]
        pairs.sort(key=lambda pair: pair[1].name != "strategy")  # stable: strategy first
        for spec, param in pairs:
            self._add(spec, param, dropped_specs)
        if context.strategy_mode == "search" and "strategy" not in self.param_names:
            raise SpaceError(
                "context.strategy_mode",
                "strategy_mode=search needs the 'strategy' space; add it to the spaces list",
            )
        all_params = {p.name: p for s in specs for p in s.params}
        check_socket_rule(all_params, [c for s in specs for c in s.constraints], "spaces")
        check_algo_proto(all_params, "spaces")

    @property
    def param_names(self) -> list[str]:
        """Names of the params that may be active, in sampling order."""
        return [e.param.name for e in self._entries]

    def _drop(self, name: str, reason: str) -> None:
        self._dropped.append((name, reason))

    def _deactivate(self, name: str) -> None:
        """Later conditions see an inactive param as unset, except a fixed ``strategy``."""
        if name not in self._static:
            self._inactive[name] = None

    def _add(self, spec: SpaceSpec, param: Param, dropped_specs: set[SpaceSpec]) -> None:
        self._known[param.name] = param
        name, values = param.name, {**self._static, **self._inactive}
        if spec in dropped_specs or (param.kind == "same_as" and param.of in self._inactive):
            self._deactivate(name)
            return
        pending = []
        for cond, owner in ((spec.when, spec), (param.when, param)):
            if cond is None:
                continue
            self._check_names(cond, f"{param.key if owner is param else spec.name}.when")
            state = cond.evaluate(values)
            if state is False:
                self._deactivate(name)
                shown = ", ".join(f"{n}={values.get(n)!r}" for n in cond.names)
                why = owner.why_inactive or f"when: {cond.text} is false here ({shown})"
                if owner is spec:
                    dropped_specs.add(spec)
                self._drop(owner.name, _fill(why, values))
                return
            if state is None:
                pending.append(cond)
        if name == "strategy" and self.context.strategy_mode != "search":
            self._deactivate(name)
            mode = self.context.strategy_mode
            self._drop(name, f"the config fixes strategy={mode}; use strategy_mode=search")
            return
        self._entries.append(
            _Entry(param, spec, tuple(pending), self._last_of(spec, param), self._choices(param))
        )

    def _check_names(self, cond: Condition, key: str) -> None:
        """Names from other spaces must be sampled before the param whose condition uses them."""
        for clause in cond.clauses:
            if clause.name in CONTEXT_DOMAINS or clause.name in self._static:
                continue
            if clause.name not in self._known:
                raise SpaceError(
                    key, f"{clause.name} is not sampled before this; load its space first"
                )
            check_clause(clause, key, self._known[clause.name])

    @staticmethod
    def _last_of(spec: SpaceSpec, param: Param) -> tuple[Constraint, ...]:
        order = spec.param_names
        return tuple(c for c in spec.constraints if max(c.names, key=order.index) == param.name)

    def _why_not(self, param: Param, value: Any) -> str | None:
        """Why this context does not offer ``value`` of ``param`` (None: it does)."""
        for choice, cond, why in param.choice_when:
            if same_value(choice, value) and cond.evaluate(self._static) is not True:
                shown = ", ".join(f"{n}={self._static.get(n)!r}" for n in cond.names)
                return _fill(why, self._static) or f"when: {cond.text} is false here ({shown})"
        text = env_str(value) if param.is_env else None
        if param.name == "NCCL_ALGO" and text and self.context.fewest_per_node <= 2:
            lost = [f for f in FUNCS if nvls_only(text, f)]
            if lost:
                return (f"leaves {', '.join(lost)} only NVLS, which NCCL turns off where a node "
                        f"holds at most 2 GPUs of the group (this run has "
                        f"{self.context.fewest_per_node}): no algorithm would be left")
        if param.name in ("NCCL_ALGO", "NCCL_PROTO") and text:
            misread = prefix_refusal(text, self.context.nccl_version)
            if misread is not None:
                return misread
        unsafe = unsafe_reason(param.name, text) if text is not None else None
        if unsafe is not None and not self.context.unsafe_nccl:
            return f"{unsafe}; search.unsafe_nccl: true offers it"
        return None

    def _offered(self, param: Param) -> tuple[Any, ...]:
        """The choices this context offers, each left-out one recorded with its reason."""
        offered = []
        for value in param.values():
            why = self._why_not(param, value)
            if why is None:
                offered.append(value)
            else:
                self._drop(f"{param.name}={value}", why)
        return tuple(offered)

    def _choices(self, param: Param) -> tuple[Any, ...]:
        if param.kind in ("categorical", "bool"):
            return self._offered(param)
        enumerable = param.kind in ("int", "pow2") and param.size() <= MAX_ENUMERATED
        if enumerable and param.is_env and any(self._why_not(param, v) for v in param.values()):
            raise SpaceError(
                param.key,
                "some values are unsafe (see search.unsafe_nccl); make it categorical so "
                "that they can be left out",
            )
        if param.kind != "divisor":
            return ()
        of_value = self._static[param.of]
        choices = tuple(param.values(of_value=of_value))
        if param.default not in choices:
            raise SpaceError(
                f"{param.key}.default",
                f"default {param.default} does not divide {param.of}={of_value}",
            )
        return choices

    def misfits(
        self, params: Mapping[str, Any], given: Collection[str] = ()
    ) -> list[tuple[str, Any, str]]:
        """``(name, value, why)`` for each value of ``params`` this context cannot run: a
        tuned configuration carried to another world size or layout (``train_fns.size_fit``).
        Env values may be given as NCCL reads them (strings). A default always fits; a param
        outside these spaces is not judged; ``strategy`` and the names ``given`` are the
        caller's to fix (their values are taken as they are)."""
        reasons = dict(self._dropped)
        owners = {e.param.name: e for e in self._entries}
        out: list[tuple[str, Any, str]] = []
        for name, param in self._known.items():
            value = _typed(param, params.get(name, param.default))
            if name in owners or name in ("strategy", *given) or same_value(value, param.default):
                continue
            spec_name = next(s for s, p in self._specs if p is param)
            why = reasons.get(name) or reasons.get(spec_name) or "inactive in this context"
            out.append((name, value, why))
        seen = {**self._static, **self._inactive}
        for entry in self._entries:
            param = entry.param
            value = _typed(param, params.get(param.name, param.default))
            judged = param.kind != "same_as" and param.name not in given
            why = self._misfit(entry, value, seen) if judged else None
            if param.kind == "same_as" and any(name == param.of for name, _, _ in out):
                why = f"it goes with {param.of}, dropped here"
            if why is not None and not same_value(value, param.default):
                out.append((param.name, value, why))
                value = param.default
            seen[param.name] = value
        return out

    def _misfit(self, entry: _Entry, value: Any, seen: Mapping[str, Any]) -> str | None:
        """Why ``value`` of ``entry`` cannot run after the values ``seen`` (None: it can)."""
        param = entry.param
        if not all(c.evaluate(seen) is True for c in entry.conditions):
            return _fill(param.why_inactive or entry.spec.why_inactive, seen) or (
                "its condition is false here: " + " and ".join(c.text for c in entry.conditions)
            )
        if entry.choices and not any(same_value(c, value) for c in entry.choices):
            if param.kind == "divisor":
                top = "" if param.max is None else f" up to {param.max}"
                return f"{value} is not a divisor of {param.of}={seen.get(param.of)}{top}"
            why = self._why_not(param, value)  # None: outside the space's words, not judged
            if why is not None:
                return why
        broken = [c for c in entry.constraints if not c.holds({**seen, param.name: value})]
        return f"breaks {broken[0]}" if broken else None

    def dropped(self) -> list[tuple[str, str]]:
        """(space or param, reason) for what this context makes inactive, for the report."""
        return list(self._dropped)

    def _feasible(self, entry: _Entry, seen: Mapping[str, Any]) -> list[Any]:
        run = feasible_run(entry.param, entry.constraints, seen)
        if not run:
            shown = {n: seen.get(n) for c in entry.constraints for n in c.names}
            raise SpaceError(
                f"{entry.spec.name}.constraints",
                f"given {shown} no value of {entry.param.name} satisfies the constraints; "
                "widen its range or loosen them",
            )
        return run

    def _suggest_one(self, trial: optuna.Trial, entry: _Entry, seen: Mapping[str, Any]) -> Any:
        param = entry.param
        if entry.choices:
            return trial.suggest_categorical(param.name, entry.choices)
        low, high = param.low, param.high
        if entry.constraints:
            run = self._feasible(entry, seen)
            low, high = run[0], run[-1]
        if param.kind == "int":
            return trial.suggest_int(param.name, low, high, step=param.step)
        exponent = trial.suggest_int(
            _optuna_name(param), low.bit_length() - 1, high.bit_length() - 1
        )
        return 1 << exponent

    def _expand(self, options: Options, limit: int) -> list[dict[str, Any]]:
        """Walk the entries in sampling order, branching on each value ``options`` gives."""
        results: list[dict[str, Any]] = []
        start = {k: v for k, v in self._static.items() if k == "strategy"}

        def visit(i: int, seen: dict[str, Any], out: dict[str, Any]) -> None:
            if i == len(self._entries):
                results.append(out)
                if len(results) > limit:
                    raise SpaceError(
                        "grid",
                        f"more than {limit} points; narrow the spaces or use a tpe/random sampler",
                    )
                return
            entry = self._entries[i]
            param = entry.param
            if param.kind == "same_as":
                active = param.of in out
                candidates = [seen.get(param.of)] if active else []
            else:
                active = all(c.evaluate(seen) is True for c in entry.conditions)
                candidates = options(entry, seen) if active else []
            if not active:
                visit(i + 1, {**seen, param.name: None}, out)
            for value in candidates:
                visit(i + 1, {**seen, param.name: value}, {**out, param.name: value})

        visit(0, {**self._static, **self._inactive}, start)
        return results

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """Define-by-run: sample the active params of one trial, constraints kept.

        Returns every active param under its real name (pow2 values as bytes, not
        exponents; ``same_as`` copies included) plus ``strategy``.
        """
        return self._expand(lambda e, seen: [self._suggest_one(trial, e, seen)], 1)[0]

    def baseline(self) -> dict[str, Any]:
        """Every active param at its library default: trial 0, the untouched setup."""
        return self._expand(lambda e, seen: [e.param.default], 1)[0]

    def point(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The configuration ``values`` names (tuned knobs, variables as NCCL reads them) as
        a point of this space, each active param not named at its default; for seeding a
        search with what another size found (``misfits`` must be empty first)."""
        return self._expand(
            lambda e, seen: [_typed(e.param, values.get(e.param.name, e.param.default))], 1
        )[0]

    def _grid_values(self, entry: _Entry, seen: Mapping[str, Any], limit: int) -> list[Any]:
        if entry.choices:
            return list(entry.choices)
        if entry.constraints:
            return self._feasible(entry, seen)
        if entry.param.size() > limit:
            raise SpaceError(entry.param.key, f"over {limit} values; too many for a grid")
        return entry.param.values()

    def grid(self, limit: int = 10_000) -> list[dict[str, Any]]:
        """Every combination that respects conditions and constraints (for grid search)."""
        return self._expand(lambda e, seen: self._grid_values(e, seen, limit), limit)

    def grid_slice(
        self, vary: Collection[str], base: Mapping[str, Any] | None = None, limit: int = 10_000
    ) -> list[dict[str, Any]]:
        """The grid points whose params outside ``vary`` keep their value in ``base``.

        ``base`` defaults to the baseline; a param it lacks (inactive there) takes its
        default. A pinned value a constraint or condition rules out drops that branch, so
        every point is valid. Staged search needs such slices (the memory-shaping choices
        with the rest at defaults, one knob around the best) in spaces whose full product
        is too large to enumerate and project.
        """
        pinned = self.baseline() if base is None else base

        def options(entry: _Entry, seen: Mapping[str, Any]) -> list[Any]:
            values = self._grid_values(entry, seen, limit)
            if entry.param.name in vary:
                return values
            value = pinned.get(entry.param.name, entry.param.default)
            return [v for v in values if same_value(v, value)]

        return self._expand(options, limit)

    def env_vars(self, params: Mapping[str, Any]) -> dict[str, str]:
        """Variables a trial must set: a default is what the library does anyway, so the
        baseline sets none and ``None`` (leave unset) is never exported."""
        env: dict[str, str] = {}
        for entry in self._entries:
            param, value = entry.param, params.get(entry.param.name)
            if not param.is_env or value is None:
                continue
            is_default = value == param.default and (
                isinstance(value, bool) == isinstance(param.default, bool)
            )
            text = env_str(value)
            if not is_default and text is not None:
                env[param.name] = text
        check_env(env, self.context.unsafe_nccl)
        return env

    def knobs(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The TrialPlan fields among ``params`` (extra keys, e.g. Optuna's, are ignored)."""
        return {k: v for k, v in params.items() if k in PLAN_KNOBS}

    def optuna_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` under Optuna's names (pow2 as ``log2(NAME)`` exponents), e.g. for
        ``study.enqueue_trial``."""
        out = {}
        for entry in self._entries:
            param = entry.param
            if param.kind == "same_as" or param.name not in params:
                continue
            value = params[param.name]
            out[_optuna_name(param)] = value.bit_length() - 1 if param.kind == "pow2" else value
        return out

    def from_optuna_params(self, optuna_params: Mapping[str, Any]) -> dict[str, Any]:
        """The full params of a finished trial (``trial.params`` / ``study.best_params``)."""
        from optuna.trial import FixedTrial

        return self.suggest(FixedTrial(dict(optuna_params)))
