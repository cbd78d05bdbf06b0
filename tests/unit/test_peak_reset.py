"""The memory peak restarts when the correctness guard's warm-up ends (``StepTimer.reset_peak``)
on a GPU worker, without a GPU: torch.cuda's calls are replaced by recorders, so what is
checked is that both peaks a trial reports (torch's allocation peak and the device-used peak
sampled at step ends) start afresh, the allocator's cache emptied first (cached blocks count
as used on the device). tests/dist/test_memory_peak.py shows the same on CPU for real."""

from __future__ import annotations

import pytest
import torch

from train_fns.timing import StepTimer, peak_memory_bytes

CUDA = torch.device("cuda")  # a device name only: nothing is placed on it
GiB = 2**30


def _used(monkeypatch: pytest.MonkeyPatch, used_gib: int) -> None:
    free = (16 - used_gib) * GiB
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 16 * GiB))


def _step(timer: StepTimer) -> None:
    timer.start_step(profiled=False)
    timer.end_step()


def test_reset_peak_restarts_both_gpu_peaks(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    allocated = {"peak": 12 * GiB}

    def reset_stats(device: object = None) -> None:
        calls.append("reset_peak_memory_stats")
        allocated["peak"] = 3 * GiB  # what is allocated now: weights, optimizer state

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset_stats)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: allocated["peak"])
    timer = StepTimer(CUDA)
    _used(monkeypatch, 14)  # a guarded warm-up step: float64 gradient copies
    _step(timer)
    assert peak_memory_bytes(CUDA, timer.device_used_peak) == 14 * GiB
    timer.reset_peak()
    assert calls == ["empty_cache", "reset_peak_memory_stats"]  # the cache first: see above
    assert timer.device_used_peak == 0
    _used(monkeypatch, 9)  # a training step
    _step(timer)
    assert peak_memory_bytes(CUDA, timer.device_used_peak) == 9 * GiB
