"""The Ray session every command shares: start or join Ray, decide GPU use, check capacity.

Also the two small things every worker group needs from the driver's side: the queue its
workers report to (kept on the driver's node) and the backend name for its process group.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from orchestrator.cluster.placement import TRIAL_CPU, PlacementError, layout_for
from orchestrator.config.address import check_reachable
from orchestrator.config.schema import ClusterConfig, Config, ConfigError
from orchestrator.runfiles import topology
from train_fns.size_fit import Layout


def backend_name(use_gpu: bool) -> str:
    """The process-group backend: NCCL on GPU workers, gloo on CPU workers."""
    return "nccl" if use_gpu else "gloo"


def cpus_needed(cluster: ClusterConfig) -> float:
    """One trial's CPUs: its workers plus the trial driver's sliver."""
    return cluster.num_workers * cluster.cpus_per_worker + TRIAL_CPU


def ray_address(config: Config) -> str | None:
    """The cluster to join: ``cluster.address``, else RAY_ADDRESS (how ``ray job submit``
    tells a job's driver where its cluster is); None (or ``local``, as Ray reads it) starts a
    local Ray, sized for the run."""
    address = config.cluster.address or os.environ.get("RAY_ADDRESS")
    return None if address == "local" else address


def check_ray_address(config: Config, key: str = "cluster.address") -> None:
    """Exit-2 material before Ray starts: a cluster address nothing answers at (Ray would
    retry it for a minute or more). ``key`` is how the user gave it (``--address``)."""
    check_reachable(ray_address(config), *_key_and_fix(config, key))


def _key_and_fix(config: Config, key: str) -> tuple[str, str]:
    """Where the address came from, and what to do about one that is not a Ray cluster."""
    address = ray_address(config) or ""
    what = "Ray client server (10001)" if address.startswith("ray://") else "GCS"
    fix = (
        f"start the cluster with `ray start --head` and pass its {what} HOST:PORT, or omit "
        "--address (and cluster.address) for a local Ray"
    )
    return ("RAY_ADDRESS" if not config.cluster.address else key), fix


def start_ray(config: Config, verbose: bool) -> None:
    """Join ``cluster.address`` or start a local Ray sized for one trial.

    A local Ray gets enough logical CPUs for every worker plus the trial driver's
    sliver: logical CPUs are bookkeeping, and the driver mostly waits.
    """
    import ray

    cluster = config.cluster
    # The dashboard (on loopback only) serves the State API that Ray Train's placement
    # group cleaner needs: without it, the resources of a trial ended early (pruned,
    # hung) are never released and the next trial waits forever.
    kwargs = dict(
        log_to_driver=verbose,
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        logging_level=logging.INFO if verbose else logging.WARNING,
    )
    address = ray_address(config)
    if address:
        check_ray_address(config)
        try:
            ray.init(address=address, **kwargs)
        except ConnectionError as e:  # it answered, but no Ray there (or `auto` found none)
            key, fix = _key_and_fix(config, "cluster.address")
            first = (str(e).strip().splitlines() or ["no Ray cluster"])[0]
            message = f"cannot join a Ray cluster at {address} ({first}); {fix}"
            raise ConfigError(key, message) from e
        hold_coordinator_here()
        return
    needed = math.ceil(cpus_needed(cluster))
    # "local": a Ray of our own, even where `ray start --head` (or another program's Ray) left
    # its address in /tmp/ray, which a bare ray.init() would join and then refuse num_cpus for.
    ray.init(
        address="local", num_cpus=max(os.cpu_count() or 1, needed),
        _system_config={"worker_niceness": WORKER_NICENESS}, **kwargs,
    )  # fmt: skip


WORKER_NICENESS = 0
"""The niceness of the local Ray's workers (Ray's default is 15, so that its own processes
stay responsive). A worker at 15 yields nearly all of a core to any process at 0: on a
laptop with a build or a browser beside it, a measured window gets what is left, and a
search's verdict reads the neighbour's load. At 0 a worker takes a fair share, as a training
job would. cluster.yaml's `ray start` commands set RAY_worker_niceness=0 alike."""


def hold_coordinator_here() -> None:
    """Create Ray's autoscaling coordinator from the driver, so that it lives on the driver's node.

    Ray Train's elastic policy sizes every restart of a group through this detached actor,
    which Ray creates with a hard affinity to the node of whatever process asks first, and each
    Train controller keeps its handle. A search trial on a worker node (a head with no CPU to
    hold it) created it there; once that node was lost, the restart's requests failed until the
    run ended (the local twin's controller retried for five minutes). The driver's node is one
    whose loss ends the run anyway. A coordinator an earlier program left on another node is
    kept (it may serve other jobs). Best effort: where it cannot be made, Ray Train makes its
    own when it needs one, as before."""
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator,
        )

        get_or_create_autoscaling_coordinator()
    except Exception as e:  # a Ray without it, or one that refuses it: Ray Train's own way
        print(f"commtune: Ray's autoscaling coordinator left to Ray Train ({e})", flush=True)


def resolve_gpu(config: Config) -> bool:
    """``use_gpu: auto`` means GPUs when the cluster has at least one per worker."""
    import ray

    gpus = ray.cluster_resources().get("GPU", 0)
    if config.cluster.use_gpu == "auto":
        return gpus >= config.cluster.num_workers
    return bool(config.cluster.use_gpu)


def check_capacity(config: Config, use_gpu: bool, placed: bool = True) -> None:
    """Fail fast when the cluster can never hold one trial, instead of waiting forever; with
    ``placed``, also when its nodes cannot give the strict ``cluster.placement`` (a training
    run, whose group changes size, is left to Ray's packing)."""
    import ray

    have = ray.cluster_resources()
    cluster = config.cluster
    need = {"CPU": cpus_needed(cluster)}
    if use_gpu:
        need["GPU"] = cluster.num_workers
    short = {k: v for k, v in need.items() if have.get(k, 0) < v}
    if short and not cluster.autoscaling:
        there = ", ".join(f"{k}={have.get(k, 0):g}" for k in need)
        raise ConfigError(
            "cluster.num_workers",
            f"{cluster.num_workers} workers need {', '.join(f'{k}={v:g}' for k, v in need.items())}"
            f" but the cluster has {there}; lower cluster.num_workers or cluster.cpus_per_worker"
            " (or set cluster.autoscaling=true if the cluster grows on demand)",
        )
    if placed and not cluster.autoscaling:
        check_placement(ray.nodes(), cluster, use_gpu)


def check_placement(nodes: list[dict[str, Any]], cluster: ClusterConfig, use_gpu: bool) -> None:
    """The strict placement of one trial's workers on ``nodes`` (``ray.nodes()``), or the
    config error that says why there is none: Ray would wait for it forever."""
    try:
        layout_for(nodes, None, cluster.num_workers, cluster.cpus_per_worker, use_gpu,
                   cluster.placement)  # fmt: skip
    except PlacementError as e:
        per = "GPUs" if use_gpu else f"CPUs / cluster.cpus_per_worker={cluster.cpus_per_worker:g}"
        other = "spread" if cluster.placement == "pack" else "pack"
        raise ConfigError(
            "cluster.placement",
            f"{cluster.placement} of {cluster.num_workers} workers: {e} (a node holds its "
            f"{per}); add nodes, lower cluster.num_workers or set cluster.placement={other}",
        ) from e


def alive_nodes() -> int:
    """Nodes Ray sees alive now (a training run counts them to tell node loss)."""
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


def worker_topology(use_gpu: bool, timeout_s: float = 120.0) -> dict[str, Any]:
    """The topology the trials run on, read in a Ray task on a worker node (one that holds a
    GPU when the trials use GPUs), with the cluster's node and GPU counts: the driver may be
    a CPU head that sees neither the GPUs nor their links. Falls back to the driver's own,
    said as such, when no worker slot frees up in ``timeout_s``."""
    import ray

    task = ray.remote(num_cpus=0, num_gpus=1 if use_gpu else 0)(_node_topology)
    ref = task.remote()
    try:
        topo = ray.get(ref, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(ref)  # still queued: it must not take a GPU from the first trial later
        topo = {**topology(), "source": f"the driver: no worker answered in {timeout_s:g}s"}
        topo["nccl_version"] = None  # the driver's own may not be the workers' (a CPU head)
    alive = [node for node in ray.nodes() if node.get("Alive")]
    nodes = [node for node in alive if node["Resources"].get("GPU") or not use_gpu]
    topo["num_nodes"] = len(nodes)
    if use_gpu:
        topo["gpus_per_node"] = int(max((n["Resources"]["GPU"] for n in nodes), default=0))
    return topo


def _node_topology() -> dict[str, Any]:
    import ray

    from train_fns.ranks import nccl_version

    here = f"a worker on node {ray.util.get_node_ip_address()}"
    return {**topology(), "nccl_version": nccl_version(), "source": here}


def quiet_libraries(verbose: bool) -> None:
    """commtune prints its own lines; Tune's tables and Optuna's INFO lines are noise."""
    if not verbose:
        import optuna

        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the legacy reporter obeys verbose=0
        optuna.logging.set_verbosity(optuna.logging.WARNING)


def driver_queue() -> Any:
    """A Ray queue whose actor lives on this (the driver's) node, as Ray Train's controller does.

    Left to the scheduler, a 0-CPU actor may land on any node; when that node is lost, the
    reports and the failure notice that should tell of it are lost with it.
    """
    import ray
    from ray.util.queue import Queue
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})


def expected_layout(
    config: Config, use_gpu: bool, world: int, nodes: list[dict[str, Any]]
) -> Layout:
    """Where ``world`` ranks will sit on ``nodes`` (``ray.nodes()``) under the config's strict
    placement. On a cluster that grows on demand, where the nodes it will place on are not up
    yet, the ranks span the nodes alive (those with a GPU), at most one node per rank."""
    cluster = config.cluster
    try:
        layout = layout_for(nodes, None, world, cluster.cpus_per_worker, use_gpu, cluster.placement)
    except PlacementError:
        alive = [n for n in nodes if n.get("Alive")]
        if use_gpu:
            alive = [n for n in alive if n.get("Resources", {}).get("GPU", 0) > 0]
        return Layout(world, max(1, min(len(alive), world)))
    counts = layout.ranks_per_node(world)
    return Layout(world, len(counts), len(set(counts)) == 1)
