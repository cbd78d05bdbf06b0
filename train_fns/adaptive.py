"""Adaptive accumulation: follow the measured communication/computation ratio, without flapping.

k micro-steps per gradient sync spread one sync's communication over k computes, so the
controller keeps a moving average of comm/compute over a window, targets ``round(average)``
accumulation steps (within ``[1, max_steps]``) and changes only when the target differs from
the current value by ``hysteresis`` (2) or more, so that a noisy ratio does not flap the split.
commtune holds the global batch fixed by default, so a new target is applied by re-splitting:
the valid accumulation (one that divides the per-rank batch exactly, micro-batch within the
memory cap) nearest the target. Only with ``allow_global_batch_change`` does the micro-batch
stay and the global batch move, with the learning rate scaled linearly and the clipping
threshold with the square root of the accumulation (the usual large-batch rules). Pure Python:
the maths is unit-tested without torch.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Split:
    """One way to run a step: what every rank does and what the optimizer sees."""

    accumulation_steps: int
    micro_batch: int
    world_size: int
    lr: float
    max_grad_norm: float

    @property
    def global_batch(self) -> int:
        return self.accumulation_steps * self.micro_batch * self.world_size


@dataclass
class AdaptiveAccumulation:
    """Decides when and how to change the accumulation split from observed ratios."""

    split: Split
    max_micro_batch: int
    """Memory cap: a re-split never makes the micro-batch larger than this (the tuned one)."""
    max_steps: int = 8
    window: int = 10
    hysteresis: int = 2
    allow_global_batch_change: bool = False
    history: deque = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.history = deque(self.history, maxlen=self.window)
        self._base = self.split

    def observe(self, comm_s: float, compute_s: float) -> tuple[Split, float] | None:
        """Feed one step's exposed communication and compute; returns ``(new split, the
        averaged ratio that caused it)`` when the split changes, else None."""
        if compute_s <= 0:
            return None
        self.history.append(comm_s / compute_s)
        ratio = sum(self.history) / len(self.history)
        target = min(max(round(ratio), 1), self.max_steps)
        if abs(target - self.split.accumulation_steps) < self.hysteresis:
            return None
        new = self._rescale(target) if self.allow_global_batch_change else self._resplit(target)
        if new is None or new == self.split:
            return None
        self.split = new
        self.history.clear()  # judge the new split on its own measurements
        return new, ratio

    def _resplit(self, target: int) -> Split | None:
        """Same global batch: the valid accumulation nearest ``target`` (ties: fewer steps)."""
        s = self.split
        per_rank = s.global_batch // s.world_size
        valid = [
            a
            for a in range(1, per_rank + 1)
            if per_rank % a == 0 and per_rank // a <= self.max_micro_batch and a <= self.max_steps
        ]
        if not valid:
            return None
        best = min(valid, key=lambda a: (abs(a - target), a))
        return Split(best, per_rank // best, s.world_size, s.lr, s.max_grad_norm)

    def _rescale(self, target: int) -> Split:
        """Micro-batch kept, global batch moves: linear learning-rate scaling and a clipping
        threshold that grows with the square root of accumulation."""
        base, s = self._base, self.split
        factor = target / base.accumulation_steps
        return Split(
            target,
            s.micro_batch,
            s.world_size,
            base.lr * factor,
            base.max_grad_norm * math.sqrt(factor),
        )

    def state(self) -> dict:
        """What a checkpoint keeps so a resumed run decides as the uninterrupted one would."""
        return {"split": vars(self.split).copy(), "history": list(self.history)}

    def load_state(self, state: dict) -> None:
        self.split = Split(**state["split"])
        self.history = deque(state["history"], maxlen=self.window)
