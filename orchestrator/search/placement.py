"""Node-disjoint concurrency: which nodes a worker group may use while others run.

A throughput measured beside another run is not a throughput, so by default one group owns the
cluster. With ``search.concurrency`` above 1, each group gets a set of whole nodes no running
group uses, and its workers are held to them by Ray's ``ray.io/node-id`` label. The nodes still
share the network's switches: traffic of one group can slow another's, so concurrent figures
are compared with care (re-measurement runs one group at a time).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

NODE_LABEL = "ray.io/node-id"
HEAD_RESOURCE = "node:__internal_head__"
"""A resource only the head node has: with concurrency, each group's Tune trial (a 0.01-CPU
sliver that only waits) is held to the head, or its sliver on a worker node would leave that
node one CPU short of a whole group and the group would wait forever."""


def trial_resources(trial_cpu: float, concurrency: int) -> dict[str, float]:
    """The Tune trial's own resources (its worker group asks for the rest)."""
    return {"cpu": trial_cpu} | ({HEAD_RESOURCE: 0.001} if concurrency > 1 else {})


def workers_fitting(node: dict[str, Any], cpus_per_worker: float, use_gpu: bool) -> int:
    """How many trial workers one node (an entry of ``ray.nodes()``) can hold."""
    have = node.get("Resources", {})
    fit = int(have.get("CPU", 0) // cpus_per_worker) if cpus_per_worker > 0 else 1 << 30
    if use_gpu:
        fit = min(fit, int(have.get("GPU", 0)))
    return fit


def choose_nodes(
    nodes: Iterable[dict[str, Any]],
    busy: set[str],
    num_workers: int,
    cpus_per_worker: float,
    use_gpu: bool,
) -> list[str] | None:
    """The fewest free nodes (largest first, then by id) that hold ``num_workers`` workers;
    None when the free nodes cannot, for now."""
    free = [
        (workers_fitting(n, cpus_per_worker, use_gpu), n["NodeID"])
        for n in nodes
        if n.get("Alive") and n["NodeID"] not in busy
    ]
    chosen, room = [], 0
    for fit, node_id in sorted((f for f in free if f[0] > 0), key=lambda f: (-f[0], f[1])):
        if room >= num_workers:
            break
        chosen.append(node_id)
        room += fit
    return chosen if room >= num_workers else None


def label_selector(node_ids: list[str] | None) -> dict[str, str] | None:
    """Ray's label selector that keeps a group's workers on ``node_ids`` (None: anywhere)."""
    if not node_ids:
        return None
    return {NODE_LABEL: f"in({','.join(node_ids)})"}
