"""Every plan knob is declared once (``search_spaces.knobs.KNOBS``) and every list derives
from it; what is checked here is what the registry cannot say by itself: that each of its knobs
reaches the plan field a worker reads, and that every TrialPlan field is either a registry knob
or says where its value comes from (docs/recipes.md, "Add a plan knob")."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.config.schema import Config, WorkloadConfig
from orchestrator.planning.from_config import plan_from_config
from search_spaces.knobs import CHOICE, KNOBS, PLAN, RANGE, RESHARD, Knob, knobs_of
from train_fns.plan import TrialPlan

NOT_KNOBS = {
    # what is trained, from the config's workload section (the same in every trial)
    "model": "workload.model (or the entrypoint's label)",
    "task": "workload.task, or inferred from the model",
    "seq_len": "workload.seq_len",
    "global_batch": "workload.global_batch: fixed, the search picks the split, never the total",
    "precision": "workload.precision",
    "model_overrides": "workload.model_overrides",
    "data": "workload.data",
    "tokenizer": "workload.tokenizer",
    "lr": "workload.lr",
    "entrypoint": "workload.entrypoint",
    "options": "workload.options",
    "workload_source": "the entrypoint file's text, read on the driver",
    "unused_parameters": "workload.unused_parameters, declared or found on the driver",
    # where and how it is measured, from the cluster and search sections
    "world_size": "the worker group's size (cluster.num_workers, or an elastic run's size now)",
    "micro_batch": "derived: global_batch / (world_size x accumulation_steps)",
    "use_gpu": "cluster.use_gpu as the cluster resolves it",
    "seed": "search.seed",
    "warmup_steps": "search.warmup_steps",
    "measure_steps": "search.measure_steps",
    "num_windows": "search.windows",
    "step_deadline_s": "search.step_deadline_s",
    "env_names": "the env variables the workers echo back (env knobs travel in the runtime env)",
    "marker_dir": "where a hung worker leaves its marker",
    "resident": "the verdict's paired windows: which built configuration to measure on",
    "fault": "--inject-faults, a testing aid",
    "max_grad_norm": "train.max_grad_norm (training runs only)",
    "prune_below": "set per configuration by the pruner from the best so far",
    "first_step": "a training run's data position",
    "first_sample": "a training run's data position",
    # the two option groups whose fields are the knobs themselves
    "ddp": "DDPOptions: every field is a knob",
    "fsdp": "FSDPOptions: every field is a knob",
}
"""TrialPlan fields that are not knobs, each with where its value comes from instead."""


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_every_trial_plan_field_is_a_knob_or_says_where_it_comes_from() -> None:
    stale = set(NOT_KNOBS) - _names(TrialPlan)
    assert not stale, f"NOT_KNOBS names fields TrialPlan no longer has: {sorted(stale)}"
    own = _names(TrialPlan) - set(NOT_KNOBS)
    registry = {k.name for k in knobs_of(PLAN)}
    assert own == registry, (
        f"TrialPlan fields that are no registry knob (add to search_spaces.knobs or NOT_KNOBS): "
        f"{sorted(own - registry)}; registry knobs of home 'plan' TrialPlan lacks: "
        f"{sorted(registry - own)}"
    )


def test_each_knob_takes_its_default() -> None:
    """A knob's default is among the values it takes, so an unsampled knob runs."""
    for knob in KNOBS:
        if knob.values and knob.takes == CHOICE:
            assert knob.default in knob.values, knob.name
        elif knob.values:
            assert knob.values[0] <= knob.default <= knob.values[1], knob.name
        assert set(knob.lossy) <= set(knob.values), knob.name


def other_value(knob: Knob) -> object:
    """A value of ``knob`` other than its default, valid on 4 GPU workers in bf16: the second
    choice, twice a range's default, the other flag, or 2 ranks to reshard to."""
    if knob.takes == CHOICE:
        return next(v for v in knob.values if v != knob.default)
    if knob.takes == RANGE:
        return type(knob.default)(knob.default * 2)
    if knob.takes == RESHARD:
        return 2
    return not knob.default


SAMPLE = {k.name: other_value(k) for k in KNOBS}
"""A value other than the default for each registry knob."""


@pytest.mark.parametrize("knob", sorted(SAMPLE))
def test_a_tuned_knob_reaches_its_plan_field(knob: str) -> None:
    """The driver's plan_from_config carries each knob into the field a worker reads."""
    config = Config(workload=WorkloadConfig(precision="bf16"))
    value = SAMPLE[knob]
    plan = plan_from_config(config, None, True, {knob: value}, 4, {})
    default = plan_from_config(config, None, True, {}, 4, {})
    assert _field(plan, knob) == value != _field(default, knob), knob


def _field(plan: TrialPlan, knob: str) -> object:
    for group in ("ddp", "fsdp"):
        if knob in _names(type(getattr(plan, group))):
            return getattr(getattr(plan, group), knob)
    return getattr(plan, knob)
