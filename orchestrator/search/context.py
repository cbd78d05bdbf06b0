"""The SearchContext a config conditions its search spaces on, and the spaces: built here.

Callers differ only in what the config cannot say: the CLI checks the spaces before Ray on
CPU workers of one node, the dry run prices them on GPUs over ``--nodes`` nodes, and the
live search uses the cluster Ray found (``pipeline.search_context``).
"""

from __future__ import annotations

from orchestrator.cluster.session import backend_name
from orchestrator.config.schema import Config, ConfigError
from search_spaces import SearchContext, SearchSpace, SpaceError, load_spaces


def context_for(
    config: Config, use_gpu: bool, num_nodes: int, even_nodes: bool = True
) -> SearchContext:
    """What the spaces are conditioned on: backend, world size, the nodes a group spans and
    whether they hold as many workers each, the global batch, and what the config declares of
    the hardware, the precision and the model."""
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
    )


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
