"""Models whose steps leave parameters unused, on the driver: found by a few
micro-batches, or declared; then DDP finds them in every plan (the baseline too), static_graph
and FSDP are not offered, and best.yaml's own loop (train_fns.tuned) applies the same."""

from __future__ import annotations

from pathlib import Path

from orchestrator.config.schema import load_config
from orchestrator.planning.from_config import absolute_paths, check_model, plan_from_config
from search_spaces import SearchContext, SearchSpace, load_spaces
from train_fns import tuned

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _config(example: str, *sets: str):
    return absolute_paths(load_config(None, "smoke", [
        f"workload.entrypoint={EXAMPLES / example}:make_workload", *sets]))  # fmt: skip


def test_a_model_that_leaves_experts_unused_is_found_and_said() -> None:
    config, notes = check_model(_config("moe_workload.py", "workload.options={width: 8}"))
    assert config.workload.unused_parameters is True
    (note,) = notes
    assert "got no gradient in some micro-batches (experts." in note
    assert "find_unused_parameters=True in every plan, the baseline too" in note
    plan = plan_from_config(config, None, False, {}, 2, {})  # the baseline's knobs: none
    assert plan.ddp.find_unused_parameters and not plan.ddp.static_graph


def test_a_model_that_uses_every_parameter_keeps_ddps_default() -> None:
    config, notes = check_model(_config("mlp_workload.py", "workload.options={width: 8}"))
    assert config.workload.unused_parameters is False and notes == []
    assert not plan_from_config(config, None, False, {}, 2, {}).ddp.find_unused_parameters


def test_a_declaration_wins_and_fsdp_runs_such_a_model_as_one_unit() -> None:
    declared = _config("mlp_workload.py", "workload.unused_parameters=true")
    config, notes = check_model(declared)
    assert config.workload.unused_parameters is True and notes == []
    config, notes = check_model(_config("moe_workload.py", "strategy=fsdp"))
    assert "FSDP2 shards the model as one unit" in notes[0]
    plan = plan_from_config(config, None, False, {"strategy": "fsdp"}, 2, {})
    assert plan.strategy == "fsdp" and plan.unused_parameters


def test_a_probe_that_raises_is_said_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "w.py"
    path.write_text(
        "import torch\n"
        "def make_workload(ctx):\n"
        "    def loss(model, batch):\n"
        "        raise ValueError('not on the driver')\n"
        "    return {'model': torch.nn.Linear(2, 1), 'batch': lambda i: i, 'loss': loss}\n"
    )
    entry = f"workload.entrypoint={path}:make_workload"
    config = absolute_paths(load_config(None, "smoke", [entry]))
    settled, (note,) = check_model(config)
    assert settled.workload.unused_parameters is None
    assert "could not tell" in note and "ValueError: not on the driver" in note


def test_the_space_keeps_fsdp_as_one_unit_and_drops_what_cannot_act() -> None:
    """static_graph (the used set changes), and FSDP's per-block knobs: the model is one unit."""
    context = SearchContext("gloo", "search", False, 4, 1, 16, unused_parameters=True)
    space = SearchSpace(load_spaces(["strategy", "accumulation", "ddp", "fsdp"]), context)
    assert "static_graph" not in space.param_names
    assert not {"reshard_after_forward", "forward_prefetch", "backward_prefetch"} & set(
        space.param_names
    )
    assert {p["strategy"] for p in space.grid()} == {"ddp", "fsdp"}


def test_tuned_wrap_applies_the_same_setting() -> None:
    best = {"workload": {"global_batch": 8, "unused_parameters": True}, "tuned": {}}
    assert tuned.plan_for(best, 2).ddp.find_unused_parameters
    best["workload"]["unused_parameters"] = False
    assert not tuned.plan_for(best, 2).ddp.find_unused_parameters


def test_a_workload_that_declares_it_is_taken_at_its_word(tmp_path: Path) -> None:
    path = tmp_path / "w.py"
    path.write_text(
        "import torch\n"
        "def make_workload(ctx):\n"
        "    def loss(model, batch):\n"
        "        raise AssertionError('not probed when declared')\n"
        "    return {'model': torch.nn.Linear(2, 1), 'batch': lambda i: i, 'loss': loss,\n"
        "            'unused_parameters': True}\n"
    )
    entry = f"workload.entrypoint={path}:make_workload"
    config, (note,) = check_model(absolute_paths(load_config(None, "smoke", [entry])))
    assert config.workload.unused_parameters is True and "it declares unused_parameters" in note
