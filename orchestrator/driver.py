"""Run a search on a Ray cluster: start or join it, size it, tune, write outputs."""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import optuna

from orchestrator.config import Config, ConfigError
from orchestrator.results import write_outputs
from orchestrator.trial import TrialContext, storage_dir
from search_spaces import SearchContext, SearchSpace, load_spaces

log = logging.getLogger("commtune")


def start_ray(config: Config, verbose: bool) -> None:
    """Join ``cluster.address`` or start a local Ray sized for one trial.

    A local Ray gets enough logical CPUs for every worker plus the trial driver's
    sliver: logical CPUs are bookkeeping, and the driver mostly waits.
    """
    import ray

    cluster = config.cluster
    kwargs = dict(
        log_to_driver=verbose,
        include_dashboard=False,
        logging_level=logging.INFO if verbose else logging.WARNING,
    )
    if cluster.address:
        ray.init(address=cluster.address, **kwargs)
        return
    needed = math.ceil(cluster.num_workers * cluster.cpus_per_worker + 0.01)
    ray.init(num_cpus=max(os.cpu_count() or 1, needed), **kwargs)


def resolve_gpu(config: Config) -> bool:
    """``use_gpu: auto`` means GPUs when the cluster has at least one per worker."""
    import ray

    gpus = ray.cluster_resources().get("GPU", 0)
    if config.cluster.use_gpu == "auto":
        return gpus >= config.cluster.num_workers
    return bool(config.cluster.use_gpu)


def check_capacity(config: Config, use_gpu: bool) -> None:
    """Fail fast when the cluster can never hold one trial, instead of waiting forever."""
    import ray

    have = ray.cluster_resources()
    cluster = config.cluster
    need = {"CPU": cluster.num_workers * cluster.cpus_per_worker + 0.01}
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


def search_context(config: Config, use_gpu: bool) -> SearchContext:
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    if use_gpu:
        alive = [n for n in alive if n.get("Resources", {}).get("GPU", 0) > 0]
    return SearchContext(
        backend="nccl" if use_gpu else "gloo",
        strategy_mode=config.strategy,
        use_gpu=use_gpu,
        world_size=config.cluster.num_workers,
        num_nodes=max(1, min(len(alive), config.cluster.num_workers)),
        global_batch=config.workload.global_batch,
    )


def open_study(config: Config, out: Path) -> tuple[optuna.storages.BaseStorage, str]:
    url = config.search.storage or f"sqlite:///{(out / 'study.db').resolve()}"
    return optuna.storages.RDBStorage(url), config.name


def quiet_libraries(verbose: bool) -> None:
    """commtune prints one line per trial; Tune's tables and Optuna's INFO lines are noise."""
    if not verbose:
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # the legacy reporter obeys verbose=0
        optuna.logging.set_verbosity(optuna.logging.WARNING)


def run_search(
    config: Config, out: Path, faults: dict[int, str], resume: bool, verbose: bool
) -> str:
    """The whole search; returns the closing summary line."""
    import ray

    from orchestrator.tuner import build_tuner

    quiet_libraries(verbose)
    start_ray(config, verbose)
    try:
        use_gpu = resolve_gpu(config)
        check_capacity(config, use_gpu)
        space = SearchSpace(load_spaces(config.search.spaces), search_context(config, use_gpu))
        for what, why in space.dropped():
            print(f"search space: {what} dropped: {why}")
        storage, study_name = open_study(config, out)
        done = _finished_trials(storage, study_name)
        remaining = max(0, config.search.trials - done)
        points = (
            []
            if done
            else [space.optuna_params(p) for p in [space.baseline(), *_grid(config, space)]]
        )
        print(
            f"commtune: {config.name}: {remaining} trial(s) to run of {config.search.trials} "
            f"({config.workload.model}, {config.cluster.num_workers} "
            f"{'GPU' if use_gpu else 'CPU'} workers, global batch {config.workload.global_batch}, "
            f"sampler {config.search.sampler}); trial 0 is the untouched baseline",
            flush=True,
        )
        if remaining:
            ctx = TrialContext(config, space, use_gpu, storage_dir(out), faults)
            build_tuner(ctx, study_name, storage, remaining, points, out).fit()
        study = optuna.load_study(study_name=study_name, storage=storage)
        return write_outputs(study, config, space, out)
    finally:
        ray.shutdown()


def _finished_trials(storage: optuna.storages.BaseStorage, study_name: str) -> int:
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return 0
    return sum(t.state.is_finished() for t in study.trials)


def _grid(config: Config, space: SearchSpace) -> list[dict]:
    if config.search.sampler != "grid":
        return []
    baseline = space.baseline()
    return [p for p in space.grid() if p != baseline]
