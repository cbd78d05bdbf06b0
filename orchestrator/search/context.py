"""The SearchContext a config conditions its search spaces on, and the spaces: built here.

Callers differ only in what the config cannot say: the CLI checks the spaces before Ray on
CPU workers of one node, the dry run prices them on GPUs over ``--nodes`` nodes, and the
live search uses the cluster Ray found (``pipeline.search_context``).
"""

from __future__ import annotations

from typing import Any

from orchestrator.cluster.session import backend_name
from orchestrator.config.schema import Config, ConfigError
from search_spaces import (
    SearchContext,
    SearchSpace,
    SpaceError,
    check_nccl_version,
    load_spaces,
)


def context_for(
    config: Config, use_gpu: bool, num_nodes: int, even_nodes: bool = True,
    workers: dict[str, Any] | None = None,
) -> SearchContext:  # fmt: skip
    """What the spaces are conditioned on: backend, world size, the nodes a group spans and
    whether they hold as many workers each, the global batch, what the config declares of
    the hardware, the precision and the model, and what a worker read of its node
    (``workers``: ``session.worker_topology``, its network transport and NCCL version)."""
    workers = workers or {}
    return SearchContext(
        backend=backend_name(use_gpu),
        strategy_mode=config.strategy,
        use_gpu=use_gpu,
        world_size=config.cluster.num_workers,
        num_nodes=num_nodes,
        global_batch=config.workload.global_batch,
        nvswitch=config.cluster.nvswitch,
        unsafe_nccl=config.search.unsafe_nccl,
        precision=config.workload.precision,
        lossy=config.search.lossy,
        unused_parameters=bool(config.workload.unused_parameters),
        even_nodes=even_nodes,
        transport=workers.get("net_transport", "unknown"),
        nccl_version=workers.get("nccl_version"),
    )


def check_workers_nccl(config: Config, version: str | None) -> None:
    """A fixed ``env`` (or a size's) value the workers' NCCL ``version`` would misread is a
    ConfigError naming it: every trial's first collective would fail."""
    for where, env in [("env", config.env)] + [
        (f"sizes.{size}.env", entry.get("env") or {}) for size, entry in config.sizes.items()
    ]:
        try:
            check_nccl_version(env, version)
        except SpaceError as e:
            raise ConfigError(f"{where}.{e.key}", e.message) from e


def space_for(config: Config, use_gpu: bool, num_nodes: int) -> SearchSpace:
    """The config's search spaces on a context built here (``context_for``): the workers
    spread over ``num_nodes`` as evenly as they go (the dry run's --nodes, the CLI's check)."""
    even = config.cluster.num_workers % num_nodes == 0
    try:
        return space_of(config, context_for(config, use_gpu, num_nodes, even_nodes=even))
    except SpaceError as e:
        raise spaces_error(e) from e


def space_of(config: Config, context: SearchContext) -> SearchSpace:
    """The config's search spaces on ``context``; a mistake in them (a missing strategy space,
    a condition on an unknown name) is a ConfigError naming its key."""
    try:
        return SearchSpace(load_spaces(config.search.spaces), context)
    except SpaceError as e:
        raise spaces_error(e) from e


def spaces_error(e: SpaceError) -> ConfigError:
    """A SpaceError as the config key it is about (``search.spaces.<param>``)."""
    return ConfigError(f"search.spaces.{e.key}" if e.key else "search.spaces", e.message)
