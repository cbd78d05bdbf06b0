"""Step timers (data, forward+backward, optimizer, total) and peak memory.

CUDA runs asynchronously: without a synchronize at each phase boundary the host clock measures
kernel launches, not work. The syncs cost a little overlap between phases; the total step time
is what the search optimises, the parts explain it.
"""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

PHASES = ("data", "fwd_bwd", "optim", "sync_micro")
"""``sync_micro`` is the forward+backward of the last micro-step alone, the one that syncs
gradients (it is also inside ``fwd_bwd``): set against a micro-step without sync, it gives
the exposed communication."""


class StepTimer:
    """Accumulates phase times within a step and keeps per-step records for one window."""

    def __init__(self, device: torch.device) -> None:
        self.sync_cuda = device.type == "cuda"
        self._steps: list[dict[str, float]] = []
        self._current: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._step_start = 0.0

    def now(self) -> float:
        if self.sync_cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    def start_step(self) -> None:
        self._current = dict.fromkeys(PHASES, 0.0)
        self._step_start = self.now()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the wall-clock of the ``with`` body to phase ``name`` of the current step."""
        start = self.now()
        try:
            yield
        finally:
            self._current[name] = self._current.get(name, 0.0) + self.now() - start

    def end_step(self) -> float:
        """Close the step; returns its total wall-clock in seconds."""
        total = self.now() - self._step_start
        self._steps.append({**self._current, "total": total})
        return total

    def take_window(self) -> dict[str, float]:
        """The median step of the steps since the last call (by total; the lower middle one
        of an even count), with its own phases: so its parts add up to its total, as medians
        taken phase by phase over different steps need not."""
        if not self._steps:
            raise RuntimeError("take_window called with no finished step")
        totals = [step["total"] for step in self._steps]
        middle = self._steps[totals.index(statistics.median_low(totals))]
        window = {key: middle.get(key, 0.0) for key in (*PHASES, "total")}
        window["num_steps"] = len(self._steps)
        self._steps = []
        return window


def peak_memory_bytes(device: torch.device) -> int:
    """Peak CUDA allocation on GPU workers; peak resident set size of the process on CPU.

    ``ru_maxrss`` is in KiB on Linux. It includes the interpreter and libraries, so on CPU it
    compares trials, not tensors.
    """
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def gpu_utilization(device: torch.device) -> float | None:
    """NVML's GPU utilization (0-1) over its last sample period; None on CPU or without NVML
    (torch reads it through pynvml, which a CUDA install may lack)."""
    if device.type != "cuda":
        return None
    try:
        return torch.cuda.utilization(device) / 100.0
    except Exception:  # no pynvml / NVML: the doctor then stays quiet about utilization
        return None
