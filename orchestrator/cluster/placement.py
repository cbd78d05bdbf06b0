"""Where a worker group's ranks run: strict packing or spreading, and node-disjoint concurrency.

Ray Train's default, a soft PACK, may put 8 ranks 8+0 on one node in one group and 4+4 on two
in the next; the search would credit the difference to the knobs. So every group is placed
strictly (``cluster.placement``): ``pack`` holds it on one node when one node can (Ray's
STRICT_PACK), else fills whole nodes (each holding as many ranks as it has GPUs, or CPU slots)
with every worker's bundle held to its node; ``spread`` puts one rank per node when there are
nodes enough (STRICT_SPREAD), else as evenly as the nodes allow. A placement the cluster
cannot give is said before Ray waits for it (``PlacementError``). Each rank reports where it
ran; ``placement_label`` turns that into the trial's ``placement`` ("node0:2,node1:2").

A throughput measured beside another run is not a throughput, so by default one group owns the
cluster. With ``search.concurrency`` above 1, each group gets a set of whole nodes no running
group uses, and its workers are held to them by Ray's ``ray.io/node-id`` label. The nodes still
share the network's switches: traffic of one group can slow another's, so concurrent figures
are compared with care (re-measurement runs one group at a time).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.config.schema import PACK, SPREAD

NODE_LABEL = "ray.io/node-id"
HEAD_RESOURCE = "node:__internal_head__"
"""A resource only the head node has: each group's Tune trial (a 0.01-CPU sliver that only
waits) is held to the head, or its sliver on a worker node would leave that node short of the
whole CPUs its strictly placed workers need, and the group would wait forever (the local twin's
1-CPU nodes did, for every baseline)."""


TRIAL_CPU = 0.01
"""The CPU sliver a Tune trial holds while it drives a TorchTrainer: a whole CPU would leave
the trainer's workers waiting forever for resources on a small machine."""


def held_here() -> dict[str, float] | None:
    """The CPUs this process holds, by node: a Tune trial's sliver where Ray put it (on a worker
    node when the head has no CPU for it: its group must leave that node's last CPU alone, or
    a worker pinned there waits forever). None in a driver, whose groups (the race, the scaling
    baseline) keep ``workers_fitting``'s default: the trials' accounting."""
    import ray

    context = ray.get_runtime_context()
    if context.worker.mode != ray.WORKER_MODE:
        return None
    return {context.get_node_id(): context.get_assigned_resources().get("CPU", 0.0)}


def trial_resources(nodes: Iterable[dict[str, Any]]) -> dict[str, float]:
    """The Tune trial's own resources (its worker group asks for the rest): on the head, where
    the head has the CPU for it (a head started with --num-cpus=0 has not: then anywhere, and
    its group leaves the CPU it took alone, ``held_here``)."""
    head = next((n for n in nodes if HEAD_RESOURCE in n.get("Resources", {})), {})
    on_head = head.get("Resources", {}).get("CPU", 0) >= TRIAL_CPU
    return {"cpu": TRIAL_CPU} | ({HEAD_RESOURCE: 0.001} if on_head else {})


def workers_fitting(
    node: dict[str, Any],
    cpus_per_worker: float,
    use_gpu: bool,
    held: dict[str, float] | None = None,
) -> int:
    """How many trial workers one node (an entry of ``ray.nodes()``) can hold, less the CPUs
    ``held`` there by the process placing them (``held_here``); without ``held``, less the
    trial's sliver on the head, where a trial is held when the head has a CPU."""
    have = node.get("Resources", {})
    if held is None:
        taken = TRIAL_CPU if HEAD_RESOURCE in have else 0.0
    else:
        taken = held.get(node["NodeID"], 0.0)
    cpus = have.get("CPU", 0) - taken
    fit = int(cpus // cpus_per_worker) if cpus_per_worker > 0 else 1 << 30
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


class PlacementError(ValueError):
    """A strict placement the cluster's nodes cannot give (it would wait forever)."""


@dataclass(frozen=True)
class Layout:
    """A worker group's placement: Ray's placement-group strategy and, where the strategy
    alone does not fix how many ranks each node gets, the node each worker's bundle is held
    to (in bundle order)."""

    strategy: str
    pinned: tuple[str, ...] = ()
    allowed: tuple[str, ...] = ()
    """The nodes the group may use (concurrency above 1); empty: any."""

    def ranks_per_node(self, world: int) -> list[int]:
        """How many of the ``world`` ranks each node it uses holds, most first."""
        if self.strategy == "STRICT_PACK":
            return [world]
        if self.strategy == "STRICT_SPREAD":
            return [1] * world
        return sorted(Counter(self.pinned).values(), reverse=True)

    def scaling(self) -> dict[str, Any]:
        """ScalingConfig arguments that place the group so."""
        if self.pinned:
            selector: Any = [{NODE_LABEL: node} for node in self.pinned]
        else:
            selector = label_selector(list(self.allowed))
        return {"placement_strategy": self.strategy, "label_selector": selector}


def choose_layout(fits: Iterable[tuple[str, int]], world: int, mode: str) -> Layout:
    """The strict placement of ``world`` ranks on nodes given as (node id, ranks it holds).

    ``pack``: one node when one holds them all, else the fewest nodes (largest first, then by
    id), each filled to what it holds. ``spread``: one rank per node when there are nodes
    enough, else round-robin over every node, so the counts differ by one at most (and never
    all on one node: that is a pack)."""
    usable = sorted(((fit, node) for node, fit in fits if fit > 0), key=lambda f: (-f[0], f[1]))
    room = sum(fit for fit, _ in usable)
    if room < world:
        held = ", ".join(f"{fit}" for fit, _ in usable) or "none"
        raise PlacementError(
            f"{world} ranks do not fit: the nodes hold {room} ({held} per node)"
        )
    if mode == SPREAD and world > 1 and len(usable) < 2:
        raise PlacementError(f"{world} ranks cannot spread over {len(usable)} node")
    if mode == PACK and usable[0][0] >= world:
        return Layout("STRICT_PACK")
    if mode == SPREAD and len(usable) >= world:
        return Layout("STRICT_SPREAD")
    counts = dict.fromkeys((node for _, node in usable), 0)
    left = world
    if mode == PACK:
        for fit, node in usable:
            counts[node] = min(fit, left)
            left -= counts[node]
    while left:  # spread: one more rank to each node with room, in turn
        for fit, node in usable:
            if left and counts[node] < fit:
                counts[node] += 1
                left -= 1
    pinned = tuple(node for node, n in counts.items() for _ in range(n))
    return Layout("PACK" if mode == PACK else "SPREAD", pinned)


def layout_for(
    nodes: Iterable[dict[str, Any]],
    only: list[str] | None,
    world: int,
    cpus_per_worker: float,
    use_gpu: bool,
    mode: str,
    held: dict[str, float] | None = None,
) -> Layout:
    """The strict placement of a group of ``world`` workers on the alive ``nodes`` (entries of
    ``ray.nodes()``), restricted to ``only`` when given (concurrency), around the CPUs the
    placing process ``held`` (``workers_fitting``)."""
    fits = [
        (n["NodeID"], workers_fitting(n, cpus_per_worker, use_gpu, held))
        for n in nodes
        if n.get("Alive") and (only is None or n["NodeID"] in only)
    ]
    return replace(choose_layout(fits, world, mode), allowed=tuple(only or ()))


def placement_label(places: Iterable[dict[str, Any]]) -> str:
    """Ranks per node, "node0:2,node1:2", from each rank's report (``rank``, ``node_id``);
    nodes are numbered by their lowest rank, so two groups of the same shape on different
    machines read the same, and 8+0 never reads like 4+4."""
    counts: dict[str, int] = {}
    for place in sorted(places, key=lambda p: p["rank"]):
        counts[place["node_id"]] = counts.get(place["node_id"], 0) + 1
    return ",".join(f"node{i}:{n}" for i, n in enumerate(counts.values()))


def group_nodes(places: Iterable[dict[str, Any]]) -> list[str]:
    """The nodes a group's ranks ran on (each rank's ``node_id``), each once, by lowest rank."""
    return list(dict.fromkeys(p["node_id"] for p in sorted(places, key=lambda p: p["rank"])))


def pinnable(places: Iterable[dict[str, Any]], alive: Iterable[str]) -> list[str] | None:
    """The nodes a re-measurement's groups are pinned to: those the baseline's ranks ran on
    (``places``), while every one is ``alive``. None where none is known or one is gone: the
    groups then go where the placement puts them, and a run on other machines does not
    compare (``finalists``)."""
    nodes = group_nodes(places)
    return nodes if nodes and set(nodes) <= set(alive) else None


def gpu_uuids(places: Iterable[dict[str, Any]]) -> str:
    """The GPUs a group's ranks ran on, in rank order ("GPU-... GPU-..."; "" on CPU workers):
    two groups on the same nodes may still hold other GPUs of them, and other links."""
    uuids = [p.get("gpu_uuid", "") for p in sorted(places, key=lambda p: p["rank"])]
    return " ".join(uuids) if any(uuids) else ""


def mixed_placements(placements: Iterable[tuple[int, str]]) -> str | None:
    """Which trials ran on which placement, "node0:2 (trials 0, 1); node0:1,node1:1 (trial 2)",
    when (trial number, placement) pairs hold more than one placement (unknown ones left out);
    None when they agree: only then do their throughputs compare."""
    by_label: dict[str, list[int]] = {}
    for number, label in placements:
        if label:
            by_label.setdefault(label, []).append(number)
    if len(by_label) < 2:
        return None
    return "; ".join(
        f"{label} (trial{'s' if len(ns) > 1 else ''} {', '.join(map(str, ns))})"
        for label, ns in by_label.items()
    )
