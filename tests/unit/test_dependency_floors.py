"""pyproject's lower bounds cover the APIs the code calls: a fresh install at the floor must run,
and NCCL values the workers' NCCL would misread are refused.

``train_fns.models`` builds every Hugging Face model with ``dtype=torch.float32``; transformers
took ``dtype`` (renamed from ``torch_dtype``, huggingface/transformers#39782) in 4.56.0. Before
it, ``from_config`` passes an unknown ``dtype`` on to the model's ``__init__`` (a TypeError) and
the config's own ``torch_dtype`` (bf16 in many hub configs) would set the master weights.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from search_spaces import SearchContext, SearchSpace, SpaceError, check_nccl_version, load_spaces

ROOT = Path(__file__).resolve().parents[2]
DTYPE_ARGUMENT_SINCE = (4, 56)


def _floor(package: str) -> tuple[int, ...]:
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(rf'^\s*"{re.escape(package)}>=([0-9.]+),<[0-9.]+",$', text, re.MULTILINE)
    assert found, f"{package} has no >=floor,<bound requirement in pyproject.toml"
    return tuple(int(part) for part in found.group(1).split("."))


def test_transformers_floor_accepts_the_dtype_argument() -> None:
    models = (ROOT / "train_fns" / "models.py").read_text()
    assert "dtype=torch.float32" in models and "torch_dtype" not in models
    assert _floor("transformers") >= DTYPE_ARGUMENT_SINCE


FSDP2_NONE_RESHARD_SINCE = (2, 8)
"""FSDP2's ``fully_shard(reshard_after_forward=None)`` (the root's own default, which
``train_fns.strategies`` passes) came in torch 2.8."""


def test_torch_floor_has_fsdp2s_none_reshard_and_the_range_holds_what_runs() -> None:
    assert _floor("torch") >= FSDP2_NONE_RESHARD_SINCE
    found = re.search(r'"torch>=([0-9.]+),<([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert found is not None
    ceiling = tuple(int(p) for p in found.group(2).split("."))
    for running in ((2, 11), (2, 13)):  # the GPU machine's torch, this machine's
        assert _floor("torch") <= running < ceiling


def test_prefixed_nccl_values_are_refused_below_nccl_2_24() -> None:
    for version in (None, "2.24.3", "2.27.5", "2.30.4"):  # None: unknown (CPU workers)
        check_nccl_version({"NCCL_ALGO": "allreduce:tree", "NCCL_PROTO": "^LL128"}, version)
    check_nccl_version({"NCCL_ALGO": "Ring,Tree", "NCCL_PROTO": "Simple"}, "2.21.5")
    for env in ({"NCCL_ALGO": "allreduce:tree"}, {"NCCL_PROTO": "allreduce:^LL128"}):
        with pytest.raises(SpaceError) as err:
            check_nccl_version(env, "2.23.4")
        assert err.value.key in env and "2.24" in err.value.message and "2.23.4" in str(err.value)


def test_the_space_offers_no_prefixed_value_to_workers_below_nccl_2_24() -> None:
    def algos(version: str | None) -> set:
        context = SearchContext("nccl", "ddp", True, 8, 1, 64, nccl_version=version)
        space = SearchSpace(load_spaces(["nccl"]), context)
        return {p.get("NCCL_ALGO") for p in space.grid_slice(["NCCL_ALGO"], limit=100)}

    assert "allreduce:tree" in algos("2.24.3") and "allreduce:tree" in algos(None)
    assert algos("2.23.4") == {None}


def test_run_info_records_the_workers_nccl_version_not_the_drivers() -> None:
    from orchestrator.search.pipeline import _context_info

    context = SearchContext("nccl", "ddp", True, 2, 1, 32)
    assert _context_info(context, {"nccl_version": "2.27.5"}).nccl_version == "2.27.5"
    assert _context_info(context, {}).nccl_version is None  # a CPU head has no word on it
