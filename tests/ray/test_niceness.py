"""The local Ray's workers run at niceness 0, not Ray's 15: a measured window must not yield
its core to whatever else runs on the machine (orchestrator.cluster.session.WORKER_NICENESS)."""

from __future__ import annotations

import os

import pytest

from orchestrator.cluster.session import WORKER_NICENESS, start_ray
from orchestrator.config.schema import Config


def test_the_local_rays_tasks_and_actors_run_at_the_set_niceness(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    assert WORKER_NICENESS == 0 and os.nice(0) == 0  # this test's own process is not reniced

    @ray.remote(num_cpus=0.01)
    def niceness() -> int:
        return os.nice(0)

    @ray.remote(num_cpus=0.01)
    class Worker:  # Train's workers are actors
        def niceness(self) -> int:
            return os.nice(0)

    start_ray(Config(), verbose=False)
    try:
        worker = Worker.remote()
        assert ray.get([niceness.remote(), worker.niceness.remote()]) == [0, 0]
    finally:
        ray.shutdown()
