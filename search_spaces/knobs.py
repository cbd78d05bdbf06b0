"""Every plan knob, declared once: its name, where it lives in the ``TrialPlan``, torch's
default, what values it takes and which of them change the maths.

A knob is a param the search samples that becomes a typed plan field rather than an
environment variable. Every list of knobs derives from ``KNOBS``: the names a space may sample
(``PLAN_KNOBS``), the fixed value sets a space may offer and ``tuned`` may hold
(``KNOB_CHOICES``), the lossy values (``LOSSY_VALUES``), the values a condition sees when no
space samples a knob (``knob_defaults``), what best.yaml's ``tuned`` accepts
(``orchestrator.config.inputs.check_tuned``) and the fields of ``train_fns.plan.DDPOptions``
and ``FSDPOptions``. It sits at the bottom of the house (no imports of the project) so the
worker side, the spaces and the driver all read the same list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PLAN, DDP, FSDP = "plan", "ddp", "fsdp"
"""Where a knob lives: a ``TrialPlan`` field of its own, or a field of ``DDPOptions`` /
``FSDPOptions`` (which ``train_fns.plan`` builds from this list)."""
BOOL, CHOICE, RANGE, RESHARD = "bool", "choice", "range", "reshard"
"""What a knob takes: true/false; one of ``values``; a number from ``values[0]`` to
``values[1]``; or FSDP's reshard (true, false, or a number of ranks that divides the group)."""


@dataclass(frozen=True)
class Knob:
    """One plan knob."""

    name: str
    home: str
    default: Any
    """torch's default: what a trial runs when no space samples the knob."""
    takes: str
    values: tuple[Any, ...] = ()
    lossy: tuple[Any, ...] = ()
    """Values that change the gradients: offered and accepted only with ``search.lossy``."""
    doc: str = ""

    @property
    def kind(self) -> type | Any:
        """The Python type of the plan field this knob fills."""
        if self.takes == BOOL:
            return bool
        if self.takes == RESHARD:
            return bool | int
        if self.takes == RANGE:
            return type(self.values[0])
        kinds = {type(v) for v in self.values if v is not None}
        kind = kinds.pop() if len(kinds) == 1 else Any
        return kind | None if None in self.values else kind


KNOBS: tuple[Knob, ...] = (
    Knob("strategy", PLAN, "ddp", CHOICE, ("ddp", "fsdp"), doc="DDP or FSDP2."),
    Knob("accumulation_steps", PLAN, 1, RANGE, (1, 4096),
         doc="Micro-steps per optimizer step: the split of the fixed global batch."),
    Knob("bucket_cap_mb", DDP, 25.0, RANGE, (0.001, 65_536.0),
         doc="DDP's gradient bucket size in MB."),
    Knob("gradient_as_bucket_view", DDP, False, BOOL,
         doc="Gradients are views into DDP's buckets (saves a copy)."),
    Knob("static_graph", DDP, False, BOOL,
         doc="DDP assumes the same graph every step (not with accumulation)."),
    Knob("broadcast_buffers", DDP, True, BOOL,
         doc="Broadcast rank 0's buffers before every forward (BERT's position ids): exact "
             "when no buffer changes in training, which is what the guard checks."),
    Knob("comm_hook", DDP, None, CHOICE, (None, "bf16", "fp16"), lossy=("bf16", "fp16"),
         doc="``bf16``/``fp16``: compress gradients for the all-reduce (lossy); None: full "
             "precision."),
    Knob("find_unused_parameters", DDP, False, BOOL,
         doc="Let DDP's reducer find the parameters a step leaves without a gradient (a "
             "mixture of experts, a conditional branch): exact, a graph walk per step."),
    Knob("reshard_after_forward", FSDP, True, RESHARD,
         doc="An int reshards to that many ranks after forward (a non-trivial divisor of the "
             "shard group): backward all-gathers within the smaller group."),
    Knob("reduce_dtype", FSDP, "fp32", CHOICE, ("fp32", "bf16", "fp16"), lossy=("bf16", "fp16"),
         doc="The gradient reduce-scatter's dtype under bf16/fp16 parameters; the low one is "
             "lossy."),
    Knob("forward_prefetch", FSDP, 0, CHOICE, tuple(range(9)),
         doc="All-gather this many next blocks ahead in forward (0: FSDP2's implicit "
             "schedule)."),
    Knob("backward_prefetch", FSDP, 0, CHOICE, tuple(range(9)),
         doc="All-gather this many previous blocks ahead in backward (0: FSDP2's implicit "
             "one)."),
    Knob("hsdp", FSDP, False, BOOL,
         doc="Replicate across nodes, shard within one (a 2-D mesh from the ranks' local "
             "world)."),
    Knob("activation_checkpointing", PLAN, False, BOOL,
         doc="Recompute each block's activations in backward instead of keeping them."),
    Knob("adamw_impl", PLAN, None, CHOICE, (None, "foreach", "fused"),
         doc="``foreach`` or ``fused`` AdamW (the default optimizer only; ``fused`` runs on "
             "CUDA only); None: torch's choice."),
)  # fmt: skip

BY_NAME: dict[str, Knob] = {k.name: k for k in KNOBS}
PLAN_KNOBS = frozenset(BY_NAME)
"""Params that become ``TrialPlan`` fields rather than environment variables."""
KNOB_CHOICES: dict[str, tuple[Any, ...]] = {k.name: k.values for k in KNOBS if k.takes == CHOICE}
"""Plan knobs with a fixed set of values: a space may offer some of them, ``tuned`` may hold
one, the plan refuses any other."""
LOSSY_VALUES: dict[str, tuple[Any, ...]] = {k.name: k.lossy for k in KNOBS if k.lossy}
"""Knob values that change the maths: offered and accepted only with search.lossy."""


def shown(values: tuple[Any, ...]) -> str:
    """A knob's values as an error message says them: ``0 to 8`` for a run of whole numbers,
    else each (``null`` for None)."""
    whole = len(values) > 2 and all(type(v) is int for v in values)
    if whole and list(values) == list(range(values[0], values[-1] + 1)):
        return f"{values[0]} to {values[-1]}"
    return ", ".join("null" if v is None else str(v) for v in values)


def knobs_of(home: str) -> tuple[Knob, ...]:
    """The knobs that live in ``home`` (``PLAN``, ``DDP`` or ``FSDP``), in declaration order."""
    return tuple(k for k in KNOBS if k.home == home)


def knob_defaults() -> dict[str, Any]:
    """Each plan knob's value when no loaded space samples it (torch's defaults).

    A condition may test a knob whose space is not loaded (``static_graph`` tests
    ``accumulation_steps``); it then sees the value every trial will really use. ``strategy``
    has none here: a condition reads it from the context (the config's fixed strategy) or from
    the strategy space.
    """
    return {k.name: k.default for k in KNOBS if k.name != "strategy"}


def lossy_knobs(params: Mapping[str, Any]) -> list[str]:
    """The lossy knob values among a trial's params (``comm_hook=fp16``), for its reports."""
    return [f"{k}={params[k]}" for k, values in LOSSY_VALUES.items() if params.get(k) in values]
