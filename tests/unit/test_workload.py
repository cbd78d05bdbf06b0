"""The workload contract without Ray: loading an entrypoint, checking what it returns, the
driver-side check that exits 2 naming ``workload.entrypoint``, and the tuned helpers."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from orchestrator.config.schema import ConfigError, load_config
from orchestrator.planning.from_config import check_entrypoint, plan_from_config, workload_fields
from train_fns import tuned
from train_fns.weights import _problem, full_state, materialise, on_meta, whole_state
from train_fns.workload import (
    WorkloadError,
    as_workload,
    default_blocks,
    load_entrypoint,
    to_device,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GOOD = """
import torch
from torch import nn

def make_workload(ctx):
    model = nn.Sequential(nn.Linear(4, 4))
    return {"model": model, "batch": lambda idx: torch.ones(len(idx), 4),
            "loss": lambda m, b: m(b).sum()}
"""


def write(tmp_path: Path, text: str, name: str = "wl.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def config_for(entrypoint: str, **workload: object):
    sets = ["cluster.num_workers=2", "workload.global_batch=8", f"workload.entrypoint={entrypoint}"]
    sets += [f"workload.{k}={v}" for k, v in workload.items()]
    return load_config(None, "smoke", sets)


def test_a_file_entrypoint_loads_and_checks(tmp_path: Path) -> None:
    make = load_entrypoint(f"{write(tmp_path, GOOD)}:make_workload")
    workload = as_workload(make(None))
    assert isinstance(workload.model, nn.Module) and workload.blocks is None
    assert workload.batch([0, 1]).shape == (2, 4)


@pytest.mark.parametrize(
    ("source", "entry", "message"),
    [
        (None, "missing.py:make_workload", "is not a file"),
        (GOOD, "{path}:other", "has no function 'other'"),
        ("import no_such_module_xyz\n", "{path}:make_workload", "importing"),
        ("def make_workload(ctx):\n    return {'model': 1}\n", "{path}:make_workload", "without"),
        (
            "def make_workload(ctx):\n    return {'model': 1, 'batch': 1, 'loss': 1}\n",
            "{path}:make_workload",
            "not a torch nn.Module",
        ),
        (GOOD, "{path}", "is not MODULE:FUNCTION"),
        (None, "no_such_package_xyz.mod:make", "importing"),
    ],
)  # fmt: skip
def test_bad_entrypoints_exit_2_naming_the_key(
    tmp_path: Path, source: str | None, entry: str, message: str
) -> None:
    path = write(tmp_path, source) if source is not None else tmp_path / "missing.py"
    with pytest.raises(ConfigError, match=message) as info:
        check_entrypoint(config_for(entry.format(path=path)))
    assert info.value.key == "workload.entrypoint"


def test_a_raising_make_workload_names_the_entrypoint(tmp_path: Path) -> None:
    path = write(tmp_path, "def make_workload(ctx):\n    raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match="make_workload raised RuntimeError: boom"):
        check_entrypoint(config_for(f"{path}:make_workload"))


META = """
import torch
from torch import nn
from train_fns.weights import full_state

def make_workload(ctx):
    def build():
        return nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with torch.device("meta"):
        model = build()
    model[1].weight = model[0].weight  # a tie the weights must keep
    real = build()
    real[1].weight = real[0].weight
    state = full_state(real) if ctx.options.get("hand_over") else None
    return {"model": model, "full_state": state, "batch": lambda idx: torch.ones(len(idx), 4),
            "loss": lambda m, b: m(b).sum()}
"""


def test_a_meta_model_is_checked_with_rank_0s_weights_or_named_without_them(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, META)
    with pytest.raises(ConfigError, match="meta-device model: .*returns `full_state`") as info:
        check_entrypoint(config_for(f"{path}:make_workload"))
    assert info.value.key == "workload.entrypoint"
    shape = check_entrypoint(config_for(f"{path}:make_workload", **{"options.hand_over": "true"}))
    assert shape is not None and shape.unused == () and not shape.probe_failed, shape


class Shared(nn.Module):
    """Two layers with a tied weight and one non-persistent buffer shared by both."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(4, 4), nn.Linear(4, 4)
        self.second.weight = self.first.weight
        scale = torch.arange(4.0)
        self.first.register_buffer("scale", scale, persistent=False)
        self.second.register_buffer("scale", scale, persistent=False)


def test_the_drivers_meta_model_takes_rank_0s_tensors_themselves_ties_kept() -> None:
    real = Shared()
    state = full_state(real)
    assert "second.scale" in state  # a shared buffer under each of its names
    with torch.device("meta"):
        model = Shared()
    materialise(model, state, torch.device("cpu"), sharded=False)  # no process group
    assert model.second.weight is model.first.weight and model.second.scale is model.first.scale
    for name, tensor in [*model.named_parameters(), ("first.scale", model.first.scale)]:
        assert tensor.data_ptr() == state[name].data_ptr(), name  # one copy, not two
    assert torch.equal(model.first.bias, real.first.bias) and not on_meta(model)


@pytest.mark.parametrize(
    ("spoil", "said"),
    [
        (lambda state: {**state, "first.bias": None}, "not real tensors: first.bias"),
        (lambda state: {**state, "first.bias": object()}, "not real tensors: first.bias"),
        (lambda state: full_state(_meta(Shared)), "not real tensors: first.bias, first.scale"),
    ],
)  # fmt: skip
def test_a_full_state_of_no_real_tensors_is_refused_not_raised_on_rank_0_alone(
    spoil, said: str
) -> None:
    """None, an object or the meta model's own state dict: said as the one message every rank
    stops with (``_stop_alike``), never an exception on rank 0 while its peers wait in a
    collective."""
    state = spoil(full_state(Shared()))
    assert said in (_problem(_meta(Shared), state) or "")
    with pytest.raises(RuntimeError, match=said):
        materialise(_meta(Shared), state, torch.device("cpu"), sharded=False)


def test_rank_0s_whole_build_leaves_the_generators_as_a_meta_build_does() -> None:
    """What a workload draws after its build (synthetic data) is the same on rank 0, which
    builds the model for real too, as on the ranks that build it on meta only."""
    torch.manual_seed(0)
    _meta(Shared)
    on_meta_ranks = torch.rand(3)
    torch.manual_seed(0)
    _meta(Shared)
    state = whole_state(Shared)
    assert torch.equal(torch.rand(3), on_meta_ranks)
    torch.manual_seed(0)
    assert all(torch.equal(state[k], v) for k, v in full_state(Shared()).items())  # same weights


def _meta(build):
    with torch.device("meta"):
        return build()


def test_builtin_keys_do_not_mix_with_an_entrypoint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        config_for(f"{write(tmp_path, GOOD)}:make_workload", task="mlm")
    assert info.value.key == "workload.entrypoint"


def test_the_examples_pass_the_driver_check() -> None:
    for name in ("vision_workload.py", "mlp_workload.py"):
        shape = check_entrypoint(config_for(f"{EXAMPLES / name}:make_workload"))
        assert shape is not None and shape.num_params > 0 and shape.num_blocks > 0


def test_a_plan_ships_the_file_text_and_an_absolute_path(tmp_path: Path, monkeypatch) -> None:
    write(tmp_path, GOOD)
    monkeypatch.chdir(tmp_path)
    config = config_for("wl.py:make_workload", options="{width: 3}")
    fields = workload_fields(config)
    assert fields["entrypoint"] == f"{tmp_path / 'wl.py'}:make_workload"
    assert fields["workload_source"] == textwrap.dedent(GOOD)
    plan = plan_from_config(config, None, False, {}, 2, {})
    assert plan.options == {"width": 3} and plan.task is None
    # A worker that has never seen the file runs the text the driver read.
    make = load_entrypoint("elsewhere/wl.py:make_workload", plan.workload_source)
    assert as_workload(make(None)).batch([0]).shape == (1, 4)


def test_default_blocks_need_a_module_list() -> None:
    with pytest.raises(WorkloadError, match="return `blocks`"):
        default_blocks(nn.Sequential(nn.Linear(2, 2)))


def test_to_device_keeps_the_structure() -> None:
    batch = {"x": torch.ones(2), "pair": (torch.zeros(1), [torch.ones(1)]), "n": 3}
    moved = to_device(batch, torch.device("cpu"))
    assert moved["n"] == 3 and isinstance(moved["pair"], tuple)
    assert isinstance(moved["pair"][1], list)


BEST = {
    "strategy": "fsdp",
    "workload": {"global_batch": 32, "seq_len": 16, "precision": "fp32"},
    "cluster": {"num_workers": 4},
    "env": {"NCCL_BUFFSIZE": 8388608, "NCCL_ALGO": "allreduce:tree"},
    "tuned": {"accumulation_steps": 2, "reshard_after_forward": False},
}


def test_tuned_split_keeps_the_global_batch() -> None:
    assert tuned.split(BEST, 4) == (4, 2)  # the tuned split at the tuned world size
    assert tuned.split(BEST, 2) == (4, 4)  # micro-batch kept, accumulation raised
    assert tuned.split(BEST, 8) == (4, 1)
    with pytest.raises(ValueError, match="cannot be split over 3 workers"):
        tuned.split(BEST, 3)


def test_tuned_env_and_plan() -> None:
    assert tuned.worker_env(BEST) == {"NCCL_BUFFSIZE": "8388608", "NCCL_ALGO": "allreduce:tree"}
    with pytest.raises(ValueError, match="LD_PRELOAD"):  # a hand-edited best.yaml's door
        tuned.worker_env({**BEST, "env": {"LD_PRELOAD": "/tmp/x.so"}})
    assert tuned.worker_env({**BEST, "env": {"NCCL_IB_DISABLE": True}}) == {"NCCL_IB_DISABLE": "1"}
    plan = tuned.plan_for(BEST, 2)
    assert (plan.strategy, plan.fsdp.reshard_after_forward, plan.accumulation_steps) == (
        "fsdp", False, 4,
    )  # fmt: skip


def test_a_declared_unused_parameters_must_be_a_bool() -> None:
    """"no" is truthy: it turned find_unused_parameters on and broke best.yaml's later load."""
    base = {"model": torch.nn.Linear(2, 1), "batch": lambda i: i, "loss": lambda m, b: b}
    for value in ("no", 1):
        with pytest.raises(WorkloadError, match="unused_parameters is"):
            as_workload({**base, "unused_parameters": value})
    assert as_workload({**base, "unused_parameters": False}).unused_parameters is False
