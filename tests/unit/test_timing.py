"""The step timer on a GPU worker, without a GPU: ``torch.cuda.synchronize`` is replaced by a
counter, so what is checked is how often the timer makes the host wait for the device (a sync
at every phase boundary would hold back the CPU and FSDP2's prefetch)."""

from __future__ import annotations

import pytest
import torch

from train_fns.timing import StepTimer, peak_memory_bytes

CUDA = torch.device("cuda")  # a device name only: nothing is placed on it
GiB = 2**30


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]

    def count() -> None:
        calls[0] += 1

    monkeypatch.setattr(torch.cuda, "synchronize", count)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (6 * GiB, 16 * GiB))
    return calls


class Clock:
    """A logical host clock: time moves only when a step's work says so, so the bounds below
    are exact whatever else the machine is doing."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def _timer(device: torch.device = CUDA) -> tuple[StepTimer, Clock]:
    clock = Clock()
    return StepTimer(device, clock=clock), clock


def _step(
    timer: StepTimer, work_s: float, profiled: bool, accumulation: int = 2, data_s: float = 0.0
) -> None:
    """A step as ``StepRunner.run_step`` times it: data, fwd_bwd (sync_micro inside the last
    micro-step), optim; each micro-step waits ``data_s`` then works ``work_s``."""
    clock = timer.clock
    timer.start_step(profiled)
    for micro in range(accumulation):
        with timer.phase("data"):
            clock.advance(data_s)
        with timer.phase("fwd_bwd"):
            if micro == accumulation - 1:
                with timer.phase("sync_micro"):
                    clock.advance(work_s)
            else:
                clock.advance(work_s)
    with timer.phase("optim"):
        pass
    timer.end_step()


def test_a_plain_cuda_step_syncs_once(syncs: list[int]) -> None:
    timer, _ = _timer()
    for _ in range(3):
        before = syncs[0]
        _step(timer, 0.0, profiled=False)
        assert syncs[0] - before == 1


def test_a_profiled_cuda_step_syncs_at_its_phase_boundaries(syncs: list[int]) -> None:
    timer, _ = _timer()
    _step(timer, 0.0, profiled=True, accumulation=2)
    # start, end, and both ends of 2 data + 2 fwd_bwd + 1 sync_micro + 1 optim phases
    assert syncs[0] == 2 + 2 * 6


def test_the_headline_comes_from_plain_steps_and_the_split_from_the_profiled_one(
    syncs: list[int],
) -> None:
    timer, _ = _timer()
    for work_s in (0.004, 0.012, 0.008):
        _step(timer, work_s, profiled=False)
    _step(timer, 0.03, profiled=True)  # the profiled step: slower (its syncs), and measured
    window = timer.take_window()
    assert window["num_steps"] == 4
    assert window["total"] == pytest.approx(0.016)  # the median plain step (2 x 8 ms of work)
    assert window["fwd_bwd"] == pytest.approx(0.06)  # the profiled step's phases, not 0
    assert window["sync_micro"] == pytest.approx(0.03) and window["data"] == 0.0


def test_on_cpu_every_step_is_profiled_and_the_window_is_its_median_step() -> None:
    """The window's phases are the median step's own, not medians taken phase by phase: the
    steps are chosen so that the two differ (phase by phase, data would be 10 ms)."""
    timer, _ = _timer(torch.device("cpu"))
    for data_s, work_s in ((0.005, 0.001), (0.0005, 0.0075), (0.006, 0.001)):
        # (data, fwd_bwd) of (10, 2), (1, 15) and (12, 2) ms: totals 12, 16, 14; median the third
        _step(timer, work_s, profiled=False, data_s=data_s)  # on CPU: phases kept anyway
    window = timer.take_window()
    assert window["total"] == pytest.approx(0.014)
    assert window["data"] == pytest.approx(0.012) and window["fwd_bwd"] == pytest.approx(0.002)
    assert window["sync_micro"] == pytest.approx(0.001)
    parts = window["data"] + window["fwd_bwd"] + window["optim"]
    assert parts == pytest.approx(window["total"])


def test_the_mean_step_is_of_the_plain_steps_and_counts_a_slow_one_the_median_ignores(
    syncs: list[int],
) -> None:
    """What training pays for a window is its mean step: one slow step of three costs it."""
    timer, _ = _timer()
    for work_s in (0.004, 0.004, 0.022):  # totals 8, 8 and 44 ms
        _step(timer, work_s, profiled=False)
    _step(timer, 0.05, profiled=True)  # its syncs are not training's: left out of both
    window = timer.take_window()
    assert window["total"] == pytest.approx(0.008)
    assert window["mean_total"] == pytest.approx(0.020)


def test_the_peak_counts_the_devices_used_memory_beside_torchs(
    syncs: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """NCCL's buffers are not torch allocations: the GPU's used memory (total - free, sampled
    at step ends) is the peak when it is the larger."""
    timer, _ = _timer()
    for free in (6, 2, 5):  # 10, 14, 11 GiB in use at the steps' ends
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None, f=free: (f * GiB, 16 * GiB))
        _step(timer, 0.0, profiled=False)
    assert timer.device_used_peak == 14 * GiB
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 9 * GiB)
    assert peak_memory_bytes(CUDA, timer.device_used_peak) == 14 * GiB
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 15 * GiB)
    assert peak_memory_bytes(CUDA, timer.device_used_peak) == 15 * GiB
