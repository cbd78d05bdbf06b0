"""The keeper of a training run's in-memory snapshots (``train_fns.snapshots``).

An actor on the driver's node, so that the node a worker group loses does not take the latest
snapshot with it; it holds one snapshot (the newest step it was sent) and lives as long as the
driver's Ray session: a resumed driver starts from the checkpoint.
"""

from __future__ import annotations

from typing import Any


class SnapshotKeeper:
    """Holds the newest snapshot: a put for an older step (one still in flight from a group
    that has since restarted) is ignored."""

    def __init__(self) -> None:
        self.step, self.data = 0, b""

    def put(self, step: int, data: bytes) -> None:
        if step > self.step:
            self.step, self.data = step, data

    def latest(self) -> tuple[int, bytes] | None:
        return (self.step, self.data) if self.data else None


def start_keeper() -> Any:
    """A keeper on this (the driver's) node, taking no CPU from the workers."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(SnapshotKeeper).options(num_cpus=0, scheduling_strategy=here).remote()
