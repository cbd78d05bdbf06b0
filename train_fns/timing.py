"""Step timers (data, forward+backward, optimizer, total) and peak memory.

CUDA runs asynchronously: the host clock measures kernel launches, not work, unless the host
waits for the device. A device-wide ``torch.cuda.synchronize()`` at every phase boundary (3+
per micro-step) would make every step wait: the CPU can no longer run ahead queueing kernels,
and FSDP2's prefetch of the next block's all-gather (issued early so that it overlaps compute)
is held back, so the step timed would be slower than the step trained, and by an amount that
depends on the very knobs being compared. So, on CUDA:

- a *plain* step syncs once, at its end: its total is the headline step time. Its start needs
  no sync because every step ends in one and what runs between two steps ends in a host sync
  (a loss read, a reduced metric) or runs on the host only;
- a *profiled* step (one per measurement window, chosen by the caller) syncs at each phase
  boundary and gives the split (data wait, forward+backward, the syncing micro-step, optimizer).
  Its parts carry its own syncs; the window's headline total comes from its plain steps.

On CPU a sync is free (there is nothing to wait for), so every step records its phases and the
window is its median step with its own parts, as before.
"""

from __future__ import annotations

import contextlib
import os
import resource
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

PHASES = ("data", "fwd_bwd", "optim", "sync_micro")
"""``sync_micro`` is the forward+backward of the last micro-step alone, the one that syncs
gradients (it is also inside ``fwd_bwd``): set against a micro-step without sync, it gives
the exposed communication."""


class StepTimer:
    """Accumulates phase times within a step and keeps per-step records for one window."""

    def __init__(
        self, device: torch.device, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.clock = clock
        """The host clock (a test gives a logical one: no bound that a loaded machine breaks)."""
        self.sync_cuda = device.type == "cuda"
        self._steps: list[dict[str, float]] = []
        self._current: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._step_start = 0.0
        self._profiled = True
        self.device = device
        self.device_used_peak = 0
        """Peak of ``device_used_bytes`` at step ends (0 on CPU)."""

    def sync(self) -> None:
        """Wait for the device's queued work (CUDA; nothing to wait for on CPU)."""
        if self.sync_cuda:
            torch.cuda.synchronize()

    def now(self) -> float:
        """The host clock after the device caught up (for measurements outside a step)."""
        self.sync()
        return self.clock()

    def start_step(self, profiled: bool = True) -> None:
        """Open a step; ``profiled`` (CUDA) times its phases with a sync at each boundary,
        else only its total, with one sync at its end (see the module docstring)."""
        self._profiled = profiled or not self.sync_cuda
        self._current = dict.fromkeys(PHASES, 0.0)
        self._step_start = self.now() if self.sync_cuda and self._profiled else self.clock()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the wall-clock of the ``with`` body to phase ``name`` of the current step
        (a profiled step only: a plain CUDA step is not interrupted)."""
        if not self._profiled:
            yield
            return
        start = self.now()
        try:
            yield
        finally:
            self._current[name] = self._current.get(name, 0.0) + self.now() - start

    def reset_peak(self) -> None:
        """Forget the memory peak so far, both ways (``reset_peak_memory``): called once the
        correctness guard's warm-up steps are done, so that the peak a trial reports is its
        training steps', not the guard's float64 gradient copies'."""
        self.device_used_peak = 0
        reset_peak_memory(self.device)

    def end_step(self) -> float:
        """Close the step (its one sync on a plain CUDA step); returns its total in seconds."""
        total = self.now() - self._step_start
        used = device_used_bytes(self.device)
        self.device_used_peak = max(self.device_used_peak, used or 0)
        parts = self._current if self._profiled else {}
        self._steps.append({**parts, "total": total, "profiled": float(self._profiled)})
        return total

    def take_window(self) -> dict[str, float]:
        """The window's median step (by total; the lower middle one of an even count), timed
        plainly where there are plain steps, and the parts of its median profiled step: on
        CPU (every step profiled) that is the median step itself, so its parts add up to its
        total, as medians taken phase by phase over different steps need not. Beside it,
        ``mean_total``: the mean of the same steps, what training pays for them (the race's
        window figure: ``orchestrator.search.race``)."""
        if not self._steps:
            raise RuntimeError("take_window called with no finished step")
        steps, self._steps = self._steps, []
        timed = [s for s in steps if not s["profiled"]] or steps
        middle = _median_step(timed)
        profiled = [s for s in steps if s["profiled"]]
        parts = middle if middle["profiled"] else (_median_step(profiled) if profiled else {})
        window = {key: parts.get(key, 0.0) for key in PHASES}
        window["total"] = middle["total"]
        window["mean_total"] = statistics.fmean(s["total"] for s in timed)
        window["num_steps"] = len(steps)
        return window


def _median_step(steps: list[dict[str, float]]) -> dict[str, float]:
    totals = [step["total"] for step in steps]
    return steps[totals.index(statistics.median_low(totals))]


def peak_memory_bytes(device: torch.device, device_used_peak: int = 0) -> int:
    """The peak to compare with capacity: on GPU workers the larger of torch's peak allocation
    and ``device_used_peak`` (``device_used_bytes`` sampled at step ends: it includes what
    torch does not allocate, NCCL's buffers and the CUDA context); on CPU the process's peak
    resident set size (``VmHWM``; it includes the interpreter and libraries, so on CPU it
    compares trials, not tensors). Both count from the last ``reset_peak_memory``."""
    if device.type == "cuda":
        return max(int(torch.cuda.max_memory_allocated(device)), device_used_peak)
    return _resident_peak_bytes()


def reset_peak_memory(device: torch.device) -> None:
    """Start the peak afresh from what is in use now. On CUDA the allocator's cache is emptied
    first: ``device_used_bytes`` sees the driver's view, in which blocks torch freed but keeps
    cached still count, so without it the device-used peak would keep whatever the steps
    before held (one ``cudaMalloc`` per block then falls on the next step, which should be a
    warm-up one). On CPU the kernel's resident high-water mark is reset (``clear_refs``);
    where that file cannot be written the peak keeps counting from the start of the process."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak RSS (Linux >= 4.0)


def _resident_peak_bytes() -> int:
    """The process's peak resident set size since the last reset: ``VmHWM`` (which
    ``clear_refs`` resets), else ``ru_maxrss`` (KiB on Linux; never reset, and it may count the
    image the process was forked from)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def device_used_bytes(device: torch.device) -> int | None:
    """Memory in use on the whole GPU (total - free, as the driver sees it; other processes
    on the GPU count too); None on CPU. No device sync."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free)


def memory_capacity_bytes(device: torch.device, cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """What the peak is compared with: the GPU's memory; on CPU the worker's memory limit (its
    cgroup's, v2 ``memory.max`` or v1 ``memory.limit_in_bytes``) where one is set below the
    machine's RAM, else the machine's RAM."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for name in ("memory.max", "memory/memory.limit_in_bytes"):
        try:
            limit = (cgroup / name).read_text().strip()
        except OSError:
            continue
        if limit.isdigit() and 0 < int(limit) < ram:
            return int(limit)
    return int(ram)


def gpu_utilization(device: torch.device) -> float | None:
    """NVML's GPU utilization (0-1) over its last sample period; None on CPU or without NVML
    (torch reads it through pynvml, which a CUDA install may lack)."""
    if device.type != "cuda":
        return None
    try:
        return torch.cuda.utilization(device) / 100.0
    except Exception:  # no pynvml / NVML: the doctor then stays quiet about utilization
        return None
