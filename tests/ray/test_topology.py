"""The run's topology is read where the workers run, not on the driver (a CPU head on a
cluster sees neither the GPUs nor their links)."""

from __future__ import annotations

import os

from orchestrator.cluster.session import worker_topology


def test_topology_is_read_in_a_ray_task_on_a_worker_node(ray_local: None) -> None:
    topo = worker_topology(use_gpu=False)
    assert topo["source"].startswith("a worker on node "), topo
    assert topo["num_nodes"] == 1 and "gpus_per_node" not in topo
    assert topo["cpu_count"] == os.cpu_count()  # the worker's machine (here: this one)
    assert topo["nccl_version"] is None  # a CPU worker has none, whatever the driver has
    assert topo["net_transport"] in ("ib", "efa", "socket")  # what the search gates knobs on


def test_without_a_gpu_worker_it_says_the_driver_answered(ray_local: None) -> None:
    topo = worker_topology(use_gpu=True, timeout_s=3)  # no GPU in this cluster: never placed
    assert topo["source"].startswith("the driver"), topo
    assert topo["num_nodes"] == 0 and topo["gpus_per_node"] == 0
    assert topo["nccl_version"] is None  # the driver's own need not be the workers'
