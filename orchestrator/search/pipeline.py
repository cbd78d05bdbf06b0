"""Run a search on a Ray cluster: start or join it, size it, tune, write outputs."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from orchestrator.cluster.session import (
    check_capacity,
    expected_layout,
    quiet_libraries,
    resolve_gpu,
    start_ray,
    worker_topology,
)
from orchestrator.config.schema import Config, ConfigError, SearchConfig
from orchestrator.config.size_entries import fit_context
from orchestrator.config.study_storage import without_password
from orchestrator.planning.from_config import resolve_task
from orchestrator.report import write_report
from orchestrator.runfiles import (
    RunInfo,
    add_search_wall,
    read_run_info,
    storage_dir,
    update_run_info,
)
from orchestrator.search import ctrl_c, evidence, study
from orchestrator.search.context import (
    check_workers_nccl,
    context_for,
    space_of,
    spaces_error,
)
from orchestrator.search.estimate import model_size
from orchestrator.search.finalists import finalists, measure_on, noise_margin, remeasure
from orchestrator.search.group_run import slowest_start
from orchestrator.search.lease import Lease
from orchestrator.search.proposer import Proposer, make_sampler, search_seeds, seed_count
from orchestrator.search.results import (
    TrialRecord,
    baseline_failure,
    baseline_record,
    memory_capacity_info,
    overhead_line,
    records,
    write_outputs,
)
from orchestrator.search.trial import TrialContext
from orchestrator.search.tuner import build_tuner
from orchestrator.verdict.decide import Verdict
from search_spaces import SearchContext, SearchSpace, SpaceError
from train_fns.size_fit import Layout, fit

log = logging.getLogger("commtune")
INTERRUPTED_WHY = "the search was stopped (Ctrl-C) before this trial ended; --resume runs it"
DEAD_DRIVER_WHY = "the driver died during this trial; the study had its trials without it"
NOT_RUN_WHY = "queued, but the search ended (its time budget) before it ran; --resume runs it"


def search_context(
    config: Config, use_gpu: bool, workers: dict[str, Any] | None = None
) -> SearchContext:
    """What the spaces are conditioned on (``context.context_for``): the nodes a group of
    ``cluster.num_workers`` lands on under ``cluster.placement``, not the cluster's count (a
    packed group on one node of a larger cluster gets no multi-node knob, NVLSTree, PAT or
    HSDP), and what a worker read of its node (``workers``: transport, NCCL version). On a
    cluster that grows on demand, where the placement is not known yet, the workers span the
    nodes alive (those with a GPU), at most one node per worker."""
    import ray

    layout = expected_layout(config, use_gpu, config.cluster.num_workers, ray.nodes())
    return context_for(config, use_gpu, layout.nodes, even_nodes=layout.even, workers=workers)


def check_tuned_layout(config: Config, context: SearchContext) -> None:
    """A fixed ``tuned.hsdp`` needs the layout HSDP shards over (several nodes of as many
    workers each): every plan would otherwise raise in its workers' mesh."""
    if config.tuned.get("hsdp") and not (
        context.num_nodes > 1 and context.workers_per_node > 1 and context.even_nodes
    ):
        raise ConfigError("tuned.hsdp", f"HSDP needs several nodes of as many workers each; a "
                          f"group here spans {context.num_nodes} node(s) for "
                          f"{context.world_size} workers: remove it")  # fmt: skip


def run_search(
    config: Config,
    out: Path,
    faults: dict[int, str],
    resume: bool,
    verbose: bool,
    deadline: float | None = None,
    carried: tuple[dict[str, Any], ...] = (),
) -> tuple[list[str], str | None]:
    """The whole search; returns the closing lines and, when the baseline did not complete,
    why (None when it did). ``carried``: configurations another world size found best
    (``{"tuned", "env", "size"}``), tried right after the baseline, fitted to this size."""
    import ray

    quiet_libraries(verbose)
    start_ray(config, verbose)
    try:
        use_gpu = resolve_gpu(config)
        check_capacity(config, use_gpu)
        topo = worker_topology(use_gpu)  # not the driver's: it may be a CPU head
        check_workers_nccl(config, topo.get("nccl_version"))
        space = space_of(config, search_context(config, use_gpu, topo))
        check_tuned_layout(config, space.context)
        for what, why in space.dropped():
            print(f"search space: {what} dropped: {why}")
        task = resolve_task(config)
        info = update_run_info(out, _context_info(space.context, topo))
        if config.search.probe and not resume:
            evidence.measure_link(config, out)
        link = evidence.probed_link(out)
        # the trials never need the storage's password (ctx is pickled and shipped to Ray)
        ctx = TrialContext(
            without_password(config), space, use_gpu, storage_dir(out), task, faults, link
        )
        storage = study.open_storage(config, out)
        seeds = carried_seeds(ctx, carried)
        raced: list[Verdict | None] = []  # the verdict, where the search's last group raced

        def race_in(lease: Lease) -> None:
            recs = _written(ctx, storage, out)
            raced.append(_remeasure(_after(ctx, recs, resume), recs, out, deadline, lease))

        lend = race_in if config.search.remeasure_top else None
        ran = _tune(ctx, storage, resume, out, deadline, seeds, lend)
        recs = _written(ctx, storage, out)
        lines = write_outputs(recs, config, space, out)
        if ran:
            ctx = _after(ctx, recs, resume)
            verdict = raced[0] if raced else _remeasure(ctx, recs, out, deadline)
            # after the verdict: its group would otherwise start cold behind this one
            info = update_run_info(out, evidence.measure_scaling(ctx, recs, deadline))
            lines = write_outputs(recs, config, space, out, verdict)
        elif base := baseline_record(recs, space.baseline()):  # a finished study, resumed
            verdict = measure_on(ctx, base, recs, out, deadline)
            if verdict is None:  # none on record (its driver died before its race ended)
                verdict = _remeasure(ctx, recs, out, deadline)
            lines = write_outputs(recs, config, space, out, verdict)
        lines += evidence.scaling_lines(recs, space.baseline(), info)
        lines += filter(None, [overhead_line(recs, read_run_info(out))])  # the race's time too
        lines.append(write_report(out))
        return lines, baseline_failure(recs, space.baseline())
    except SpaceError as e:  # e.g. a grid too large for this cluster's context
        raise spaces_error(e) from e
    finally:
        ray.shutdown()


def _written(
    ctx: TrialContext, storage: optuna.storages.BaseStorage, out: Path
) -> list[TrialRecord]:
    """The study's records, their outputs written (before any re-measuring: a search whose
    verdict never ends still leaves them)."""
    recs = records(optuna.load_study(study_name=ctx.config.name, storage=storage))
    update_run_info(out, memory_capacity_info(recs))  # for the doctor's memory rule
    write_outputs(recs, ctx.config, ctx.space, out)
    return recs


def _after(ctx: TrialContext, recs: list[TrialRecord], resume: bool) -> TrialContext:
    """The context of the groups after the search: they start as fast as its own did, or are
    hangs sooner."""
    adaptive = not resume and not ctx.config.cluster.autoscaling
    seen = slowest_start(r.attrs for r in recs) if adaptive else None
    return dataclasses.replace(ctx, slowest_start_s=seen)


def _tune(
    ctx: TrialContext,
    storage: optuna.storages.BaseStorage,
    resume: bool,
    out: Path,
    deadline: float | None,
    seeds: tuple[dict[str, Any], ...] | list[dict[str, Any]] = (),
    lend: Callable[[Lease], None] | None = None,
) -> bool:
    """Run the trials still owed, ``seeds`` first after the baseline, and ``lend`` in the last
    group where it can (``tuner.build_tuner``); False when there were none (outputs are only
    rewritten)."""
    config, space = ctx.config, ctx.space
    existing = study.load(storage, config.name)
    if existing is not None and not resume:
        raise ConfigError(
            "--resume",
            f"study {config.name!r} already exists in {config.search.storage or out}; "
            "pass --resume to continue it, or set another name or storage",
        )
    done = study.counted(existing)
    remaining = max(0, config.search.trials - done)
    cfg = config.search
    if cfg.sampler == "grid":
        size = len(space.grid())
        if size > remaining + done:
            print(f"grid: {size} points, {cfg.trials} trials: only the first {cfg.trials} run "
                  "(raise search.trials to cover the grid)", flush=True)  # fmt: skip
        remaining = min(remaining, max(0, size - done))
    ended = None
    if remaining:  # the seeds and the proposer only where trials are owed
        proposer = Proposer(space, cfg.sampler, cfg.trials, [*seeds, *_seeds(ctx)],
                            cfg.early_stop)  # fmt: skip
        ended = _ended_early(existing, proposer, space)
    if not remaining or ended:  # nothing is queued again: it would stay WAITING in the study
        if existing is not None:
            study.close_interrupted(existing, DEAD_DRIVER_WHY)
        print(f"resume: the study already has {done} of {cfg.trials} trials"
              f"{f' (it ended early: {ended})' if ended else ''}; rewriting the outputs",
              flush=True)  # fmt: skip
        return False
    if existing is not None:
        for number in study.requeue_interrupted(existing):
            print(f"resume: trial {number} was interrupted; its params run again", flush=True)
    the_study = optuna.create_study(
        study_name=config.name, storage=storage, direction="maximize", load_if_exists=True,
        sampler=make_sampler(cfg.sampler, cfg.seed, cfg.trials),
    )  # fmt: skip
    baseline = space.optuna_params(space.baseline())
    queued = the_study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    if existing is None or (baseline_record(records(the_study), space.baseline()) is None
                            and all(t.params != baseline for t in queued)):  # fmt: skip
        # a new study, or one whose baseline failed: the fix is what --resume is for
        the_study.enqueue_trial(baseline)
    print(
        f"commtune: {config.name}: {remaining} trial(s) to run of {cfg.trials} "
        f"({config.workload.entrypoint or config.workload.model}, {config.cluster.num_workers} "
        f"{'GPU' if ctx.use_gpu else 'CPU'} workers, global batch {config.workload.global_batch},"
        f" strategy {cfg.sampler}, {_evaluation(cfg)}); trial 0 is the untouched baseline",
        flush=True,
    )
    started, lent_s = time.monotonic(), [0.0]

    def timed(lease: Lease) -> None:  # the search's time is its trials', not the race's
        begun = time.monotonic()
        try:
            lend(lease)
        finally:
            lent_s.append(time.monotonic() - begun)

    # Ctrl-C raises here rather than Tune's graceful stop, which would go on to re-measure.
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    try:
        build_tuner(ctx, the_study, proposer, remaining, out, deadline,
                    timed if lend else None).fit()  # fmt: skip
        ctrl_c.check()  # a Ctrl-C that Tune or Ray swallowed
    except KeyboardInterrupt:
        closed = study.close_interrupted(the_study, INTERRUPTED_WHY)
        if closed:
            shown = ", ".join(map(str, closed))
            print(f"interrupted: trial(s) {shown} recorded as interrupted", flush=True)
        raise
    left = study.close_interrupted(the_study, NOT_RUN_WHY)  # queued, never run
    if left:
        print(f"not run: trial(s) {', '.join(map(str, left))} were queued when the search "
              "ended; --resume runs them", flush=True)  # fmt: skip
    add_search_wall(out, time.monotonic() - started - sum(lent_s))
    return True


def _ended_early(
    existing: optuna.Study | None, proposer: Proposer, space: SearchSpace
) -> str | None:
    """Why a resumed study already ended before its budget (``search.early_stop``): it is a
    finished one. Not where its baseline never completed: running it is what --resume is for."""
    if existing is None or baseline_record(records(existing), space.baseline()) is None:
        return None
    return proposer.settled(existing)


def carried_seeds(ctx: TrialContext, carried: tuple[dict[str, Any], ...]) -> list[dict]:
    """Points of this search's space for what other sizes found best, fitted to this size's
    layout (``train_fns.size_fit``); one this space cannot hold is left out, and said."""
    context, seeds = ctx.space.context, []
    if ctx.config.search.sampler == "grid":
        return seeds  # a grid walks its points in order: no seed is tried first
    layout = Layout(context.world_size, context.num_nodes, context.even_nodes)
    for entry in carried:
        fitted = fit({entry["size"]: entry}, layout, fit_context(ctx.config, ctx.use_gpu))
        if fitted.split is None:
            continue
        values = {**fitted.tuned, **fitted.env}
        misfit = ctx.space.misfits(values)
        if misfit:
            print(f"carried from {entry['size']} workers: left out ({misfit[0][0]}="
                  f"{misfit[0][1]}: {misfit[0][2]})", flush=True)  # fmt: skip
            continue
        seeds.append(ctx.space.point(values))
        print(f"carried from {entry['size']} workers: {fitted.line(context.world_size)}",
              flush=True)  # fmt: skip
    return seeds


def _seeds(ctx: TrialContext) -> list[dict]:
    """The cost model's best-ranked configurations, on the probed link when there is one."""
    cfg = ctx.config
    if not seed_count(cfg):
        return []
    size = model_size(cfg)
    seeds = search_seeds(ctx.space, size, cfg.workload.seq_len, seed_count(cfg), ctx.link)
    shown = "the probed link" if ctx.link else "nominal figures"
    print(f"cost model ({shown}): {len(seeds)} seed configuration(s) after the baseline")
    return seeds


def _evaluation(cfg: SearchConfig) -> str:
    if cfg.warm:
        return f"warm evaluation: up to {cfg.group_size} configurations per worker group"
    return "cold evaluation: fresh workers for every configuration"


def _remeasure(
    ctx: TrialContext, recs: list, out: Path, deadline: float | None, lent: Lease | None = None
) -> Verdict | None:
    """Measure the finalists again beside the baseline (skipped when there is nothing to
    compare or the time budget is spent), racing in ``lent`` when given."""
    base = baseline_record(recs, ctx.space.baseline())
    search = ctx.config.search
    margin = noise_margin(recs, search.verdict_delta, search.windows)
    chosen = finalists(recs, base, search.remeasure_top, margin) if base else []
    if not chosen:
        if base and search.remeasure_top:
            print("no finalist to re-measure: every other trial failed or was pruned", flush=True)
        return None
    if deadline is not None and time.time() > deadline:
        print("time budget spent: the finalists are not re-measured", flush=True)
        return None
    print(
        f"finalists: {', '.join(f'trial {r.number}' for r in chosen)} (within {margin:.1%} "
        f"of the best, at most {search.remeasure_top}), measured again beside the baseline",
        flush=True,
    )
    return remeasure(ctx, base, chosen, out, recs, deadline, lent)


def _context_info(context: SearchContext, topo: dict) -> RunInfo:
    """What run_info.json records of the trials' context, for the doctor and the report."""
    return RunInfo(
        backend=context.backend,
        world_size=context.world_size,
        num_nodes=context.num_nodes,
        use_gpu=context.use_gpu,
        nccl_version=topo.get("nccl_version"),  # a worker's: the driver may be a CPU head
        topology=topo,
    )
