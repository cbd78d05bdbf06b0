"""``run_training`` end to end on two gloo ranks: every rank reports every window."""

from __future__ import annotations

import pytest
import torch
from _spawn import run_distributed
from _tiny import CPU, tiny_plan

from train_fns import metrics as m
from train_fns.loop import run_training
from train_fns.plan import DDPOptions, TrialPlan

EXPECTED_KEYS = {
    m.GUARD,
    m.WINDOW,
    m.RANK,
    m.WORLD_SIZE,
    m.NUM_STEPS,
    m.STEP_TIME_S,
    m.MEAN_STEP_TIME_S,
    m.DATA_S,
    m.FWD_BWD_S,
    m.OPTIM_S,
    m.SYNC_MICRO_S,
    m.NOSYNC_MICRO_S,
    m.LOSS,
    m.PEAK_MEM_BYTES,
    m.ALLOCATED_PEAK_BYTES,
    m.DEVICE_USED_PEAK_BYTES,
    m.MEMORY_CAPACITY_BYTES,
    m.ENV_SEEN,
    m.SETUP_S,
    m.NUM_NONFINITE,
    m.NUM_PARAMS,
    m.GPU_UTIL,
    m.WINDOW_WALL_S,
    m.GLOBAL_STEP_TIME_S,
}
ENV_NAMES = ("NCCL_SOCKET_NTHREADS", "NCCL_UNSET_FOR_TEST")
CONFIGS = {
    "ddp-fp32-static_graph": {"ddp": DDPOptions(static_graph=True)},
    "fsdp-bf16-accum2-checkpointing": {
        "strategy": "fsdp",
        "precision": "bf16",
        "accumulation_steps": 2,
        "activation_checkpointing": True,
    },
}


def _training_worker(rank: int, world_size: int, plans: dict[str, dict]) -> dict[str, list]:
    results: dict[str, list] = {}
    for name, plan_dict in plans.items():
        reports: list[dict] = []
        run_training(TrialPlan.from_dict(plan_dict), rank, world_size, CPU, reports.append)
        results[name] = reports
    return results


@pytest.fixture(scope="module")
def reports_by_rank(monkeypatch_module: pytest.MonkeyPatch) -> list[dict[str, list]]:
    """Both configurations in one spawn (process start-up dominates on 2 cores)."""
    monkeypatch_module.setenv("NCCL_SOCKET_NTHREADS", "4")  # spawned workers inherit it
    plans = {
        name: tiny_plan(
            warmup_steps=2, measure_steps=5, num_windows=2, env_names=ENV_NAMES, **changes
        ).to_dict()
        for name, changes in CONFIGS.items()
    }
    return run_distributed(_training_worker, plans)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_rank_reports_every_window(
    config: str, reports_by_rank: list[dict[str, list]]
) -> None:
    for rank, results in enumerate(reports_by_rank):
        reports = results[config]
        assert [r[m.WINDOW] for r in reports] == [0, 1]
        assert [r[m.NUM_STEPS] for r in reports] == [3, 2]  # 5 measured steps, 2 windows
        for report in reports:
            assert report.keys() == EXPECTED_KEYS
            assert bool(report[m.GUARD]) == (report[m.WINDOW] == 0)  # the first window only
            assert report[m.RANK] == rank and report[m.WORLD_SIZE] == 2
            for key in (m.STEP_TIME_S, m.DATA_S, m.FWD_BWD_S, m.OPTIM_S, m.PEAK_MEM_BYTES):
                assert report[key] > 0, key
            assert report[m.STEP_TIME_S] >= report[m.FWD_BWD_S]
            assert report[m.NUM_NONFINITE] == 0
            # CPU: no device-level figures; capacity is the cgroup limit or the RAM
            assert report[m.ALLOCATED_PEAK_BYTES] is None is report[m.DEVICE_USED_PEAK_BYTES]
            assert report[m.PEAK_MEM_BYTES] < report[m.MEMORY_CAPACITY_BYTES]
            assert torch.isfinite(torch.tensor(report[m.LOSS]))
            assert report[m.ENV_SEEN] == {"NCCL_SOCKET_NTHREADS": "4", "NCCL_UNSET_FOR_TEST": None}
            setup = dict(report[m.SETUP_S])
            assert set(setup) == {"model_build_s", "wrap_s", "warmup_s", "reference_s"}
            # the no-sync reference step runs once (at the first window) without accumulation
            accumulation = CONFIGS[config].get("accumulation_steps", 1)
            assert (setup.pop("reference_s") > 0) == (accumulation == 1)
            assert all(seconds > 0 for seconds in setup.values())
            assert report[m.WINDOW_WALL_S] > 0 and report[m.GLOBAL_STEP_TIME_S] > 0
    # The loss is averaged across ranks, so every rank reports the same value.
    losses = [[r[m.LOSS] for r in results[config]] for results in reports_by_rank]
    assert losses[0] == losses[1]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_step_time_decomposes_into_its_measured_parts(
    config: str, reports_by_rank: list[dict[str, list]]
) -> None:
    """data + fwd_bwd + optim covers the step (medians of 2-3 steps: within a few percent), and
    the syncing micro-step and its no-sync twin are both measured."""
    from orchestrator.search.outcome import comm_split

    for results in reports_by_rank:
        for report in results[config]:
            parts = report[m.DATA_S] + report[m.FWD_BWD_S] + report[m.OPTIM_S]
            assert parts == pytest.approx(report[m.STEP_TIME_S], rel=0.05)
            assert 0 < report[m.SYNC_MICRO_S] <= report[m.FWD_BWD_S]
            assert report[m.NOSYNC_MICRO_S] > 0
    windows = [list(ranks) for ranks in zip(*(r[config] for r in reports_by_rank), strict=True)]
    for ranks in windows:  # the real reports give a split whose parts are both measured
        split = comm_split([ranks])
        assert 0 <= split[m.EXPOSED_COMM_S] <= max(w[m.SYNC_MICRO_S] for w in ranks)
        assert split[m.COMPUTE_S] > 0 and 0 <= split[m.COMM_FRACTION] < 1
