"""The keeper of a training run's in-memory snapshots (``train_fns.snapshots``).

An actor on the driver's node, so that the node a worker group loses does not take the latest
snapshot with it; it holds one snapshot (the newest step it was sent) and lives as long as the
driver's Ray session: a resumed driver starts from the checkpoint.
"""

from __future__ import annotations

from typing import Any


class SnapshotKeeper:
    """Holds the newest snapshot. Each (re)start of the worker group asks for it once
    (``resume``), which opens a new generation: a put still in flight from a group that has
    since restarted (an older generation) is ignored, so a later restart never jumps to the
    old group's steps; within a generation a put for an older step is ignored too."""

    def __init__(self) -> None:
        self.generation, self.step, self.data = 0, 0, b""

    def resume(self, than_step: int) -> tuple[int, tuple[int, bytes] | None]:
        """A new generation, and the snapshot if it is newer than ``than_step`` (the
        checkpoint's step): an older one is not sent."""
        self.generation += 1
        newer = self.data and self.step > than_step
        return self.generation, (self.step, self.data) if newer else None

    def put(self, generation: int, step: int, data: bytes) -> None:
        if generation == self.generation and step > self.step:
            self.step, self.data = step, data


def start_keeper() -> Any:
    """A keeper on this (the driver's) node, taking no CPU from the workers."""
    return driver_actor(SnapshotKeeper)


def driver_actor(cls: type, *args: Any) -> Any:
    """An actor of ``cls(*args)`` on this (the driver's) node, taking no CPU from the workers:
    what it holds lives as long as the driver, whichever worker node is lost."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(cls).options(num_cpus=0, scheduling_strategy=here).remote(*args)
