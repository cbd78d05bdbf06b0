"""The validated form of a space file, the search context, and checks across params.

A user's space file is validated completely on load (before Ray starts), so a typo
is one line naming the key and the fix instead of a failed trial an hour later.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._domain import MAX_ENUMERATED, Param, same_value
from ._env import SpaceError, check_env
from ._expr import Clause, Condition, Constraint
from .knobs import PLAN_KNOBS

CONTEXT_DOMAINS: dict[str, Any] = {
    "backend": ("nccl", "gloo"),
    "strategy_mode": ("ddp", "fsdp", "search"),
    "strategy": ("ddp", "fsdp"),
    "use_gpu": bool,
    "world_size": int,
    "num_nodes": int,
    "global_batch": int,
    "per_worker_batch": int,
    "workers_per_node": int,
    "even_nodes": bool,
    "fewest_per_node": int,
    "transport": ("ib", "efa", "socket", "unknown"),
    "nvswitch": bool,
    "unsafe_nccl": bool,
    "precision": ("fp32", "bf16", "fp16"),
    "lossy": bool,
    "unused_parameters": bool,
}
"""Names a condition may test besides params: a str tuple lists the allowed values."""
_MAX_FEASIBILITY_POINTS = 100_000
_SOCKET_VARS = ("NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD")


@dataclass(frozen=True, eq=False)
class SpaceSpec:
    """One validated space file. ``params`` keep declaration order (the sampling order)."""

    name: str
    description: str
    when: Condition | None
    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...]
    source: str
    why_inactive: str = ""

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"space {self.name!r} has no param {name!r}")


@dataclass(frozen=True)
class SearchContext:
    """What a run fixes before any sampling: conditions test these names."""

    backend: str
    """``nccl`` or ``gloo``: NCCL variables are inert on gloo."""
    strategy_mode: str
    """``ddp`` or ``fsdp`` (fixed) or ``search`` (sample ``strategy``)."""
    use_gpu: bool
    world_size: int
    num_nodes: int
    global_batch: int
    nvswitch: bool = False
    """The workers' GPUs share an NVSwitch with NVLink SHARP (HGX/DGX H100 and later): the
    hardware NCCL's NVLS algorithms need. Declared by the config (cluster.nvswitch), since
    the driver may run on a CPU head that cannot see the workers' topology."""
    unsafe_nccl: bool = False
    """Offer NCCL settings that NCCL says can corrupt data (search.unsafe_nccl)."""
    precision: str = "fp32"
    """The workload's precision (workload.precision): FSDP's reduce dtype acts only below fp32."""
    lossy: bool = False
    """Offer knobs that change the maths (gradient compression, a low reduce dtype), each
    judged by the guard against its own declared tolerance (search.lossy)."""
    unused_parameters: bool = False
    """The model leaves parameters without a gradient in some steps (workload.unused_parameters,
    declared or found on the driver): DDP must find them in every plan."""
    even_nodes: bool = True
    """Every node of a group holds as many workers (HSDP needs it: 8 + 6 cannot be a 2-D
    mesh); False where the placement fills nodes unevenly."""
    transport: str = "unknown"
    """The network NCCL carries traffic between nodes on, as the workers' node shows it
    (``runfiles.files.net_transport``): ``ib`` (InfiniBand or RoCE verbs), ``efa`` (AWS EFA
    through the OFI plugin), ``socket`` (TCP), ``unknown`` (not read: every knob stays)."""
    nccl_version: str | None = None
    """The workers' NCCL (``2.27.5``; None: not known): NCCL before 2.24 misreads a
    ``coll:`` prefix, so no prefixed NCCL_ALGO/NCCL_PROTO value is offered there."""

    def __post_init__(self) -> None:
        for field in ("backend", "strategy_mode", "precision", "transport"):
            allowed = CONTEXT_DOMAINS[field]
            if getattr(self, field) not in allowed:
                raise SpaceError(f"context.{field}", f"{getattr(self, field)!r}; use {allowed}")
        for field in ("world_size", "num_nodes", "global_batch"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise SpaceError(f"context.{field}", f"{value!r} must be a positive integer")
        if self.global_batch % self.world_size:
            raise SpaceError(
                "context.global_batch",
                f"{self.global_batch} does not divide over world_size={self.world_size}; "
                "pick a global batch that is a multiple of the number of workers",
            )

    @property
    def per_worker_batch(self) -> int:
        """Samples per worker per optimizer step; accumulation splits this."""
        return self.global_batch // self.world_size

    @property
    def workers_per_node(self) -> int:
        """Most workers on one node; 1 means one GPU per node (where NCCL's PAT applies)."""
        return -(-self.world_size // self.num_nodes)

    @property
    def fewest_per_node(self) -> int:
        """Fewest workers on one node: NCCL turns NVLS off for the whole communicator when a
        node holds at most 2 of its GPUs. Where nodes hold unequal counts the fewest is not
        known here, so it is taken as 1."""
        return self.world_size // self.num_nodes if self.even_nodes else 1

    def values(self) -> dict[str, Any]:
        """The names conditions may test; ``strategy`` only when the config fixes it."""
        values = {name: getattr(self, name) for name in CONTEXT_DOMAINS if hasattr(self, name)}
        if self.strategy_mode != "search":
            values["strategy"] = self.strategy_mode
        return values


def check_clause(clause: Clause, key: str, param: Param | None = None) -> None:
    """Check a condition clause against the context value or the param it tests."""
    if clause.modulo is not None:
        whole = CONTEXT_DOMAINS.get(clause.name) is int if param is None else param.kind in (
            "int", "pow2", "divisor")  # fmt: skip
        if not whole or not isinstance(clause.literal, int) or isinstance(clause.literal, bool):
            raise SpaceError(key, f"{clause.name} % {clause.modulo} needs a whole-number name "
                             "and a whole-number right side")  # fmt: skip
        return
    if param is None:
        domain = CONTEXT_DOMAINS[clause.name]
        values = list(domain) if isinstance(domain, tuple) else None
        values = [False, True] if domain is bool else values
    elif param.kind in ("categorical", "bool"):
        values = param.values()
    else:
        values = None  # numeric ranges: any number may be compared
    if clause.is_ordering:
        numeric = values is None or all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values if v is not None
        )
        ok = numeric and isinstance(clause.literal, (int, float))
        ok = ok and not isinstance(clause.literal, bool)
        if not ok:
            raise SpaceError(key, f"{clause.name} cannot be ordered against {clause.literal!r}")
    elif values is not None and not any(same_value(clause.literal, v) for v in values):
        shown = ", ".join("null" if v is None else str(v) for v in values)
        raise SpaceError(key, f"{clause.name} is never {clause.literal!r}; its values: {shown}")


def check_condition(
    cond: Condition, key: str, earlier: Mapping[str, Param], later: Sequence[str] = ()
) -> None:
    """Names must be context values or params sampled before; other spaces' params are
    checked when spaces are combined (:class:`SearchSpace`)."""
    for clause in cond.clauses:
        if clause.name in CONTEXT_DOMAINS:
            check_clause(clause, key)
        elif clause.name in earlier:
            check_clause(clause, key, earlier[clause.name])
        elif clause.name in later:
            raise SpaceError(key, f"{clause.name} is declared after this condition; move it up")
        elif not (clause.name in PLAN_KNOBS or clause.name.isupper()):
            raise SpaceError(
                key,
                f"unknown name {clause.name!r}: test a context value "
                f"({', '.join(CONTEXT_DOMAINS)}) or a param declared earlier",
            )


def feasible_run(
    param: Param, constraints: Sequence[Constraint], values: Mapping[str, Any]
) -> list[Any]:
    """The values of an int/pow2 ``param`` that satisfy ``constraints`` given ``values``.

    Optuna's IntDistribution may change its range between trials, so restricting the
    last participant of a constraint is how sampling never violates one. The result is
    the first contiguous run of feasible values (an IntDistribution is a range); empty
    means earlier choices left nothing feasible.
    """
    run: list[Any] = []
    for value in param.values():
        point = {**values, param.name: value}
        if all(c.holds(point) for c in constraints):
            run.append(value)
        elif run:
            break
    return run


def check_constraint(con: Constraint, params: Sequence[Param], key: str) -> Param:
    """Return the constraint's last-sampled participant after checking it can be enforced."""
    by_name = {p.name: p for p in params}
    for name in con.names:
        param = by_name.get(name)
        if param is None:
            raise SpaceError(key, f"{name!r} is not a param of this space file")
        target = by_name[param.of] if param.kind == "same_as" else param
        numeric = target.kind in ("int", "pow2", "divisor") or (
            target.kind == "categorical"
            and all(
                isinstance(v, (int, float)) and not isinstance(v, bool)
                for v in target.choices
                if v is not None
            )
        )
        if not numeric:
            raise SpaceError(key, f"{name} is not numeric; constraints compare numbers")
    last = max((by_name[n] for n in con.names), key=params.index)
    if last.kind not in ("int", "pow2") or last.size() > MAX_ENUMERATED:
        raise SpaceError(
            key,
            f"{last.name} is sampled last among {', '.join(con.names)}, so sampling restricts "
            f"its range to keep the constraint; make it an int (at most {MAX_ENUMERATED} "
            "values) or pow2 param, or declare an int/pow2 participant last",
        )
    if not con.holds({p.name: p.default for p in params}):
        raise SpaceError(key, f"the defaults violate {con.text!r}; defaults must be feasible")
    return last


def check_feasible(
    last: Param, cons: Sequence[Constraint], params: Sequence[Param], key: str
) -> None:
    """Every choice of the other participants must leave ``last`` a feasible value,
    because define-by-run sampling cannot go back and change them."""
    names = sorted({n for c in cons for n in c.names} - {last.name})
    others = [next(p for p in params if p.name == n) for n in names]
    if any(p.kind in ("divisor", "same_as") for p in others):
        return  # domain known only with a context; sampling reports it if it ever happens
    grids = [p.values() for p in others]
    if math.prod(len(g) for g in grids) > _MAX_FEASIBILITY_POINTS:
        return
    for combo in itertools.product(*grids):
        point = dict(zip(names, combo, strict=True))
        if not feasible_run(last, cons, point):
            raise SpaceError(
                key,
                f"with {point} no value of {last.name} satisfies "
                f"{'; '.join(c.text for c in cons)}; widen {last.name}'s range or loosen it",
            )


def check_socket_rule(
    specs_params: Mapping[str, Param], constraints: Sequence[Constraint], key: str
) -> None:
    """NCCL rejects more than 64 sockets per peer; a space must not be able to sample that."""
    params = [specs_params.get(name) for name in _SOCKET_VARS]
    if any(p is None or p.kind not in ("int", "pow2", "categorical") for p in params):
        return
    tops = [max(v for v in p.values() if v is not None) for p in params]
    covered = any(set(_SOCKET_VARS) <= set(c.names) for c in constraints)
    if tops[0] * tops[1] > 64 and not covered:
        raise SpaceError(
            key,
            "add the constraint `NCCL_NSOCKS_PERTHREAD * NCCL_SOCKET_NTHREADS <= 64` in the "
            "space that declares both (NCCL refuses more than 64 sockets per peer)",
        )


def check_choice_conditions(param: Param) -> None:
    """A choice's condition may test only context values: Optuna forbids a categorical
    whose choices change between trials, so a choice is decided once per run."""
    for value, cond, _ in param.choice_when:
        index = next(i for i, c in enumerate(param.choices) if same_value(c, value))
        key = f"{param.key}.choices[{index}].when"
        for clause in cond.clauses:
            if clause.name not in CONTEXT_DOMAINS:
                raise SpaceError(
                    key,
                    f"{clause.name} is not a context value; a choice's when may test only "
                    f"{', '.join(CONTEXT_DOMAINS)} (choices are fixed for a run)",
                )
            check_clause(clause, key)


def check_algo_proto(params: Mapping[str, Param], key: str) -> None:
    """Every NCCL_ALGO choice with every NCCL_PROTO choice must leave each collective an
    algorithm and protocol NCCL implements (``allgather:pat`` with ``LL`` leaves none)."""
    algo, proto = params.get("NCCL_ALGO"), params.get("NCCL_PROTO")
    if algo is None or proto is None or {algo.kind, proto.kind} != {"categorical"}:
        return
    for a, p in itertools.product(algo.choices, proto.choices):
        try:
            check_env({"NCCL_ALGO": a, "NCCL_PROTO": p}, unsafe_nccl=True)
        except SpaceError as e:
            raise SpaceError(
                key, f"the choices NCCL_ALGO={a!r}, NCCL_PROTO={p!r}: {e.message}"
            ) from None
