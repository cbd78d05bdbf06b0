"""A forced NVLS all-reduce must run every reduction the trial issues: NCCL's
NVLS reduces Sum on every type and Max/Min on integers and half types only, so fp16 FSDP2
(GradScaler's float32 Max) and HSDP (Avg across replicas) are refused before a worker starts,
naming what cannot run; a fallback algorithm, DDP, or CPU workers are not."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.config.schema import load_config
from orchestrator.planning.from_config import plan_from_config
from search_spaces._nccl import nvls_only, unreducible
from train_fns.plan import InfeasiblePlan

NVLS = {"NCCL_ALGO": "allreduce:nvls"}


def _plan(knobs: dict[str, Any], env: dict[str, str], precision: str = "fp32",
          use_gpu: bool = True) -> Any:  # fmt: skip
    sets = ["cluster.num_workers=4", f"workload.precision={precision}"]
    config = load_config(preset="smoke", sets=sets)
    return plan_from_config(config, "mlm", use_gpu, knobs, 4, env)


def test_which_values_leave_a_collective_only_nvls() -> None:
    assert nvls_only("allreduce:nvls", "AllReduce") and nvls_only("allreduce:NVLSTree", "AllReduce")
    assert nvls_only("allreduce:nvls,nvlstree", "AllReduce")
    assert not nvls_only("allreduce:nvls,ring", "AllReduce") and not nvls_only(None, "AllReduce")
    assert not nvls_only("allreduce:^nvls", "AllReduce")
    assert not nvls_only("allgather:nvls", "AllReduce")
    assert nvls_only("reducescatter:nvls", "ReduceScatter")
    # PAT has no AllReduce and CollNet needs a plugin: neither is a fallback in practice
    assert nvls_only("allreduce:nvls,pat", "AllReduce")
    assert nvls_only("allreduce:nvls,collnetdirect", "AllReduce")


def test_nvls_runs_sum_everywhere_and_max_on_half_types_only() -> None:
    asked = [("AllReduce", "sum", "fp64", "a"), ("AllReduce", "max", "fp32", "b"),
             ("AllReduce", "max", "bf16", "c"), ("AllReduce", "avg", "fp32", "d"),
             ("ReduceScatter", "avg", "fp32", "e")]  # fmt: skip
    assert unreducible("allreduce:nvls", asked) == ["b (max fp32)", "d (avg fp32)"]
    assert unreducible("reducescatter:nvls", asked) == ["e (avg fp32)"]
    assert unreducible("allreduce:tree", asked) == []


@pytest.mark.parametrize(
    ("knobs", "precision", "named"),
    [
        ({"strategy": "fsdp"}, "fp16", "GradScaler's overflow check"),
        ({"strategy": "fsdp", "hsdp": True}, "fp32", "HSDP's all-reduce across replicas"),
    ],
)
def test_an_nvls_trial_that_cannot_reduce_is_refused_naming_it(
    knobs: dict[str, Any], precision: str, named: str
) -> None:
    with pytest.raises(InfeasiblePlan, match=named):
        _plan(knobs, NVLS, precision)


def test_a_forced_nvls_reduce_scatter_is_refused_for_fsdp_and_left_for_fp16_sums() -> None:
    """FSDP2 reduce-scatters with Avg (Sum and its own divides for an fp16 reduce)."""
    forced = {"NCCL_ALGO": "reducescatter:nvls"}
    with pytest.raises(InfeasiblePlan, match="FSDP2's gradient reduce-scatter"):
        _plan({"strategy": "fsdp"}, forced, "bf16")
    _plan({"strategy": "fsdp", "reduce_dtype": "fp16"}, forced, "fp16")  # fp16 Sum: runs there
    _plan({"strategy": "ddp"}, forced, "bf16")  # DDP reduce-scatters nothing


def test_what_nvls_can_run_is_left_alone() -> None:
    _plan({"strategy": "ddp"}, NVLS, "fp16")  # DDP: a float32 Sum
    _plan({"strategy": "ddp", "comm_hook": "bf16"}, NVLS, "bf16")  # a bf16 Sum
    _plan({"strategy": "fsdp"}, NVLS, "bf16")  # no Max, no Avg
    _plan({"strategy": "fsdp"}, {"NCCL_ALGO": "allreduce:nvls,ring"}, "fp16")  # a fallback
    _plan({"strategy": "fsdp", "hsdp": True}, NVLS, use_gpu=False)  # gloo: NCCL is inert
