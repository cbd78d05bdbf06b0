"""The search's evidence beyond throughput: the probe before the trials and the 1-worker
scaling baseline after them, both recorded for the doctor and the report (probe.csv,
run_info.json)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from orchestrator.cluster.session import resolve_gpu
from orchestrator.planning.costmodel import GRAD_BYTES_PER_PARAM, Link, link_from_probe
from orchestrator.probe import ProbeSettings, run_probe, write_csv
from orchestrator.runfiles import PROBE_CSV, RunInfo, read_probe, storage_dir
from orchestrator.search.results import TrialRecord, baseline_record
from orchestrator.search.trial import derive_plan, measure_plans
from train_fns import metrics as m
from train_fns.plan import InfeasiblePlan, steps_per_window, with_world_size


def measure_link(config: Any, out: Path) -> None:
    """The bandwidth probe once, on the trials' workers and environment: probe.csv."""
    if config.cluster.num_workers < 2:
        print("probe: skipped: one worker has no link to measure (world size 1)", flush=True)
        return
    print("probe: all-reduce / all-gather / reduce-scatter sweep before the trials", flush=True)
    # Every other power of two: enough for the bound (latency and large-message bandwidth) at
    # half the cost of the CLI's full sweep.
    sizes = tuple(4**k for k in range(5, 15))  # 1 KiB .. 256 MiB
    gpu = resolve_gpu(config)
    rows = run_probe(config, ProbeSettings(sizes=sizes if gpu else sizes[:-1]),
                     storage_path=storage_dir(out), say=print)  # fmt: skip
    write_csv(rows, out / PROBE_CSV)
    link = probed_link(out)
    if link is not None:
        print(
            f"probe: all-reduce bus bandwidth {link.bandwidth_bytes_per_s / 1e9:.3g} GB/s at the "
            f"largest size, latency {link.latency_s * 1e6:.0f} us per step",
            flush=True,
        )


def probed_link(out: Path) -> Link | None:
    """The costmodel Link measured by probe.csv in ``out`` (None without a probe)."""
    rows = read_probe(out)
    return None if rows is None else link_from_probe(rows)


def measure_scaling(ctx: Any, recs: list[TrialRecord], deadline: float | None) -> RunInfo:
    """The baseline measured once on a single worker (skipped when off, on one worker, when
    the baseline failed, or when the time budget is spent), and the gradient bytes."""
    base = baseline_record(recs, ctx.space.baseline())
    attrs = base.attrs if base is not None else {}
    extra = RunInfo(
        grad_bytes=attrs[m.NUM_PARAMS] * GRAD_BYTES_PER_PARAM if attrs.get(m.NUM_PARAMS) else None,
        gpu_util=attrs.get(m.GPU_UTIL),  # NVML, sampled at each window's end
    )
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
    try:
        # one window: an efficiency figure needs less certainty than a verdict, and a step on
        # one worker takes N times as long
        window = steps_per_window(plan.measure_steps, plan.num_windows)
        alone = dataclasses.replace(
            with_world_size(plan, 1), measure_steps=window, num_windows=1
        )
    except InfeasiblePlan as e:  # a fixed tuned value one worker cannot take (reshard to 2)
        print(f"scaling: no single-worker baseline: {e}", flush=True)
        return extra
    (outcome,) = measure_plans(single, [(alone, env)], "scaling_1worker")
    if outcome.get(m.STATE) != m.COMPLETE:
        print(f"scaling: the 1-worker baseline did not complete: {outcome.get(m.REASON)}")
        return extra
    return dataclasses.replace(extra, single_worker_samples_per_s=outcome[m.SAMPLES_PER_S])


def scaling_lines(recs: list[TrialRecord], baseline: dict, info: RunInfo) -> list[str]:
    """One line: scaling efficiency of the baseline with its N workers."""
    single = info.single_worker_samples_per_s
    base = baseline_record(recs, baseline)
    world = info.world_size or 0
    if not single or base is None or world < 2:
        return []
    value = base.attrs[m.SAMPLES_PER_S]
    efficiency = value / (world * single)
    return [
        f"scaling: baseline {value:.2f} samples/s on {world} workers vs {single:.2f} on 1 -> "
        f"efficiency {efficiency:.0%} (throughput(N) / (N x throughput(1)))"
    ]
