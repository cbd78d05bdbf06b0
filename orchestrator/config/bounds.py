"""The sane range of every number in the config: a typo'd 10^9 batch is refused, not run."""

from __future__ import annotations

import dataclasses
from typing import Any

from orchestrator.config.inputs import check_range

_DAY_S, _MAX_WORKERS, _MAX_STEPS = 86_400, 16_384, 10**9
BOUNDS: dict[str, tuple[float, float]] = {
    "workload.seq_len": (1, 1 << 20),
    "workload.global_batch": (1, 1 << 20),
    "workload.lr": (1e-12, 10.0),
    "cluster.num_workers": (1, _MAX_WORKERS),
    "cluster.cpus_per_worker": (0.01, 1024.0),
    "search.trials": (1, 100_000),
    "search.seed": (0, 2**32 - 1),  # what numpy (Optuna's samplers) accepts
    "search.warmup_steps": (1, 100_000),  # >= 1: start-up costs are never measured
    "search.measure_steps": (1, 1_000_000),
    "search.windows": (1, 10_000),
    "search.trial_timeout_s": (1.0, 7.0 * _DAY_S),
    "search.step_deadline_s": (1.0, 7.0 * _DAY_S),
    "search.start_timeout_s": (1.0, float(_DAY_S)),
    "search.heartbeat_s": (1.0, float(_DAY_S)),
    "search.time_budget_min": (0.01, 365.0 * 24 * 60),
    "search.remeasure_top": (0, 1000),
    "search.remeasure_repeats": (0, 10),
    "search.verdict_delta": (0.0, 0.5),
    "search.verdict_pairs": (3, 1000),  # three: the fewest pairs a decision is taken on
    "search.group_size": (1, 10_000),
    "search.concurrency": (1, 1024),
    "search.cost_model_seeds": (0, 1000),
    "search.world_sizes": (1, _MAX_WORKERS),  # each of them
    "train.steps": (1, _MAX_STEPS),
    "train.checkpoint_every": (1, _MAX_STEPS),
    "train.min_workers": (1, _MAX_WORKERS),
    "train.max_workers": (1, _MAX_WORKERS),
    "train.max_failures": (0, 10_000),
    "train.max_grad_norm": (1e-6, 1e6),
    "train.max_accumulation": (1, 4096),
    "train.adaptive_window": (1, 1_000_000),
    "train.tune_budget": (0.0, 1.0),
    "train.tune_window": (1, 1_000),
    "train.resize_check_s": (0.1, float(_DAY_S)),
    "train.start_timeout_s": (1.0, float(_DAY_S)),
    "train.first_report_timeout_s": (1.0, 7.0 * _DAY_S),
    "train.stall_timeout_s": (1.0, 7.0 * _DAY_S),
    "train.grad_norm_every": (1, _MAX_STEPS),
    "train.log_every": (1, _MAX_STEPS),
    "train.snapshot_every": (0, _MAX_STEPS),
    "train.snapshot_max_mb": (0.0, 1e9),
}
"""Sane range of every number in the config (ints where both ends are ints)."""


def check_bounds(section: Any, name: str) -> None:
    """Every number of a section within BOUNDS (a typo'd 10^9 batch is refused, not run)."""
    for f in dataclasses.fields(section):
        key, value = f"{name}.{f.name}", getattr(section, f.name)
        for i, item in enumerate(value if isinstance(value, list) else [value]):
            if key in BOUNDS and item is not None:
                check_range(f"{key}[{i}]" if isinstance(value, list) else key, item, *BOUNDS[key])
