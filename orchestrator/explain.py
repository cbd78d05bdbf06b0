"""The search's evidence beyond throughput: run_info.json, the probe, scaling, the report.

``run_info.json`` tells the doctor and the report what the trials ran on (backend, workers,
nodes, topology, gradient bytes, the single-worker baseline); ``report.html`` is rebuilt from
the output folder at the end of every search.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

from orchestrator.results import TrialRecord, baseline_record
from search_spaces import SearchContext
from train_fns import metrics as m
from train_fns.ranks import nccl_version

log = logging.getLogger("commtune")
RUN_INFO = "run_info.json"
GRAD_BYTES_PER_PARAM = 4
"""Gradients are fp32 (autocast keeps fp32 parameters): what DDP all-reduces per parameter."""


def write_run_info(out: Path, context: SearchContext, extra: dict[str, Any]) -> dict[str, Any]:
    """Merge what is known now into run_info.json; returns the whole record."""
    from orchestrator.doctor import topology

    path = out / RUN_INFO
    info = json.loads(path.read_text()) if path.exists() else {}
    info.update(
        backend=context.backend,
        world_size=context.world_size,
        num_nodes=context.num_nodes,
        use_gpu=context.use_gpu,
        nccl_version=nccl_version(),  # the driver's torch, the workers' too (one install)
    )
    info.setdefault("topology", topology())
    info.update(extra)
    path.write_text(json.dumps(info, indent=1, default=str))
    return info


def add_search_wall(out: Path, wall_s: float) -> None:
    """Add a search's wall-clock (from its first trial's start to its last's end; a resumed
    search adds its own) to run_info.json, for the measured share of search time."""
    path = out / RUN_INFO
    info = json.loads(path.read_text()) if path.exists() else {}
    info["search_wall_s"] = info.get("search_wall_s", 0.0) + wall_s
    path.write_text(json.dumps(info, indent=1, default=str))


def probe(config: Any, out: Path) -> None:
    """The bandwidth probe once, on the trials' workers and environment: probe.csv."""
    from orchestrator.driver import resolve_gpu
    from orchestrator.probe import ProbeSettings, run_probe, write_csv
    from orchestrator.trial import storage_dir

    if config.cluster.num_workers < 2:
        print("probe: skipped: one worker has no link to measure (world size 1)", flush=True)
        return
    print("probe: all-reduce / all-gather / reduce-scatter sweep before the trials", flush=True)
    # Every other power of two: enough for the bound (latency and large-message bandwidth) at
    # half the cost of the CLI's full sweep.
    sizes = tuple(4**k for k in range(5, 15))  # 1 KiB .. 256 MiB
    gpu = resolve_gpu(config)
    rows = run_probe(config, ProbeSettings(sizes=sizes if gpu else sizes[:-1]),
                     storage_path=storage_dir(out))  # fmt: skip
    write_csv(rows, out / "probe.csv")
    link = probed_link(out)
    if link is not None:
        print(
            f"probe: all-reduce bus bandwidth {link.bandwidth_bytes_per_s / 1e9:.3g} GB/s at the "
            f"largest size, latency {link.latency_s * 1e6:.0f} us per step",
            flush=True,
        )


def probed_link(out: Path) -> Any:
    """The costmodel Link measured by probe.csv in ``out`` (None without a probe)."""
    import csv

    from orchestrator.costmodel import link_from_probe

    path = out / "probe.csv"
    if not path.exists():
        return None
    with path.open() as f:
        return link_from_probe(list(csv.DictReader(f)))


def comm_bound(plan: Any, num_params: int, link: Any) -> dict[str, Any]:
    """What the cost model says this trial's gradient traffic costs on the probed link: the
    time it cannot beat (a bound for the measured exposed communication) and the bytes."""
    from orchestrator.costmodel import comm_per_step

    if link is None or not num_params or plan.world_size < 2:
        return {}
    traffic = comm_per_step(
        plan.strategy, num_params, GRAD_BYTES_PER_PARAM, plan.world_size,
        plan.accumulation_steps, plan.fsdp.reshard_after_forward, link,
        bucket_bytes=int(plan.ddp.bucket_cap_mb * 2**20),
        gather_bytes=2 if plan.precision in ("bf16", "fp16") else None,  # FSDP2 param_dtype
    )  # fmt: skip
    return {"comm_bound_s": traffic.comm_s, "comm_traffic": traffic.summary()}


def scaling(ctx: Any, recs: list[TrialRecord], deadline: float | None) -> dict[str, Any]:
    """The baseline measured once on a single worker (skipped when off, on one worker, when
    the baseline failed, or when the time budget is spent), and the gradient bytes."""
    from orchestrator.trial import derive_plan, measure_plans
    from train_fns.plan import with_world_size

    base = baseline_record(recs, ctx.space.baseline())
    extra: dict[str, Any] = {}
    if base is not None and base.attrs.get(m.NUM_PARAMS):
        extra["grad_bytes"] = base.attrs[m.NUM_PARAMS] * GRAD_BYTES_PER_PARAM
    if base is not None and base.attrs.get(m.GPU_UTIL) is not None:
        extra["gpu_util"] = base.attrs[m.GPU_UTIL]  # NVML, sampled at each window's end
    config = ctx.config
    if not config.search.scaling_baseline or config.cluster.num_workers == 1 or base is None:
        return extra
    if deadline is not None and time.time() > deadline:
        print("time budget spent: no single-worker baseline", flush=True)
        return extra
    one = dataclasses.replace(config, cluster=dataclasses.replace(config.cluster, num_workers=1))
    single = dataclasses.replace(ctx, config=one)
    print("scaling: measuring the baseline on 1 worker", flush=True)
    plan, env = derive_plan(ctx, base.params)  # the baseline's micro-batch, kept on 1 worker
    (outcome,) = measure_plans(single, [(with_world_size(plan, 1), env)], "scaling_1worker")
    if outcome.get(m.STATE) != m.COMPLETE:
        print(f"scaling: the 1-worker baseline did not complete: {outcome.get(m.REASON)}")
        return extra
    return extra | {"single_worker_samples_per_s": outcome[m.SAMPLES_PER_S]}


def scaling_lines(recs: list[TrialRecord], baseline: dict, info: dict[str, Any]) -> list[str]:
    """One line: scaling efficiency of the baseline with its N workers."""
    single = info.get("single_worker_samples_per_s")
    base = baseline_record(recs, baseline)
    world = info.get("world_size") or 0
    if not single or base is None or world < 2:
        return []
    value = base.attrs[m.SAMPLES_PER_S]
    efficiency = value / (world * single)
    return [
        f"scaling: baseline {value:.2f} samples/s on {world} workers vs {single:.2f} on 1 -> "
        f"efficiency {efficiency:.0%} (throughput(N) / (N x throughput(1)))"
    ]


def write_report(out: Path) -> str:
    """report.html from the output folder (and its doctor's findings); the line that says so."""
    from orchestrator.doctor import collect
    from orchestrator.report import render

    try:
        (out / "report.html").write_text(render(collect([out]), out))
    except Exception as e:  # the search's outputs stand without the report; say why
        log.warning("report.html could not be written", exc_info=True)
        return f"report: not written ({type(e).__name__}: {e}); run python -m orchestrator.report"
    return f"report: {out / 'report.html'} (python -m orchestrator.doctor {out} for findings)"
