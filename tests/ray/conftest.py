"""One local Ray per test module, shut down after it; never two at once."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    """A local Ray with 3 logical CPUs: 2 one-CPU workers plus the trial driver's sliver."""
    import ray

    ray.init(
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
