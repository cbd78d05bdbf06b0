"""One local Ray per test module, shut down after it; never two at once."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import _procs
import pytest


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    """A local Ray with 3 logical CPUs: 2 one-CPU workers plus the trial driver's sliver."""
    import ray

    ray.init(
        address="local",  # our own: never a `ray start` head's (another user's) left in /tmp/ray
        num_cpus=3,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        log_to_driver=False,
        logging_level=logging.WARNING,
    )
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(autouse=True)
def _end_what_the_test_started() -> Iterator[None]:
    """After each test, whatever its commands left (a failed assert mid-run, a frozen worker)
    is ended: by their owner marks (``_procs``), never by name."""
    before = len(_procs.started)
    yield
    _end(_procs.started[before:])


def pytest_sessionfinish() -> None:
    """What module fixtures' commands left (they start before any test's own fixture)."""
    _end(_procs.started)


def _end(owners: list[str]) -> None:
    for owner in owners:
        if _procs.wait_gone(owner, timeout_s=10):
            _procs.end(owner)
