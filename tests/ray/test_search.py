"""Real Ray: 2-worker groups measuring a small grid warm and cold, a 3-trial Tune search over
NCCL variables."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import optuna
import pytest

from orchestrator.config.schema import load_config
from orchestrator.runfiles import storage_dir
from orchestrator.search.proposer import Proposer, make_sampler
from orchestrator.search.results import records
from orchestrator.search.trial import TrialContext, derive_plan, measure_plans
from orchestrator.search.tuner import build_tuner
from search_spaces import SearchContext, SearchSpace, is_env_name, load_spaces
from train_fns import metrics as m

TINY = [
    "workload.model_overrides={vocab_size: 512, hidden_size: 32, num_hidden_layers: 1, "
    "num_attention_heads: 2, intermediate_size: 64, max_position_embeddings: 64}",
    "workload.seq_len=16",
    "workload.global_batch=8",
    "search.warmup_steps=1",
    "search.measure_steps=3",
    "search.windows=3",
    "search.step_deadline_s=60",
    "search.trial_timeout_s=180",
    "strategy=ddp",
]


def _context(spaces: list[str], backend: str, tmp_path: Path, sets: tuple = ()) -> TrialContext:
    config = load_config(preset="smoke", sets=[*TINY, *sets])
    search = SearchContext(
        backend=backend,
        strategy_mode=config.strategy,
        use_gpu=False,
        world_size=2,
        num_nodes=1,
        global_batch=config.workload.global_batch,
    )
    space = SearchSpace(load_spaces(spaces), search)
    return TrialContext(
        config, space, use_gpu=False, storage_path=storage_dir(tmp_path), task="mlm"
    )


@pytest.mark.slow  # minutes of CI time: run with -m slow
def test_a_warm_group_measures_every_configuration_in_the_same_workers(
    ray_local: None, tmp_path: Path
) -> None:
    """A small grid measured in one warm worker group, and its last configuration again with
    fresh workers: every window reported, the warm group's configurations measured in the same
    worker processes and the fresh group in its own, the start paid where a group starts. (A
    whole search with fresh workers for every configuration is ``benchmarks.overhead --quick``'s
    cold search, which the slow tier runs; whether the two rank alike is what that benchmark
    measures.)"""
    sets = ("workload.global_batch=16", "search.warmup_steps=2", "search.measure_steps=6")
    ctx = _context(["accumulation", "ddp"], "gloo", tmp_path, sets)
    grid = [{**ctx.space.baseline(), "accumulation_steps": a} for a in (1, 8)]
    items = [derive_plan(ctx, params) for params in grid]
    assert all(p.micro_batch * p.accumulation_steps * p.world_size == 16 for p, _ in items)
    warm = measure_plans(ctx, items, "warm")
    cold = measure_plans(ctx, items[-1:], "cold")
    for outcome in warm + cold:
        assert outcome[m.STATE] == m.COMPLETE, outcome
        assert outcome["num_windows"] == 3 and set(outcome[m.ENV_SEEN]) == {"0", "1"}
        assert outcome[m.STEP_TIME_S] >= outcome[m.FWD_BWD_S] > 0
        assert outcome["timings"]["measured_s"] > 0
    # the warm group's second configuration reused its first's worker processes; the fresh
    # group started its own
    pids = [o[m.RANK_PIDS] for o in warm + cold]
    assert all(set(p) == {"0", "1"} for p in pids), pids
    assert pids[0] == pids[1], f"the warm group's second configuration got new workers: {pids}"
    assert not set(pids[1].values()) & set(pids[2].values()), f"the fresh group reused: {pids}"
    assert warm[0]["timings"]["start_s"] > 0, "the warm group paid its start"
    assert warm[1]["timings"]["start_s"] == 0, "the warm group's second configuration did not"
    assert cold[0]["timings"]["start_s"] > 0, "the fresh group paid its start"


def test_tune_search_workers_see_their_trials_nccl_variables(
    ray_local: None, tmp_path: Path
) -> None:
    """Each trial's workers see exactly the variables sampled for it, and no others: a
    configuration with other variables gets fresh workers."""
    # Pruning off: what is under test is the variables, and a noisy window may prune a trial.
    sets = ("search.sampler=random", "search.prune=false")
    ctx = _context(["nccl"], "nccl", tmp_path, sets=sets)
    # the baseline and one sampled configuration: two groups (each a cold start)
    study = optuna.create_study(direction="maximize", sampler=make_sampler("random", 0, 2))
    study.enqueue_trial(ctx.space.optuna_params(ctx.space.baseline()))
    build_tuner(ctx, study, Proposer(ctx.space, "random", 2), 2, tmp_path).fit()
    recs = records(study)
    assert [r.state for r in recs] == [m.COMPLETE] * 2, [(r.state, r.reason) for r in recs]
    assert recs[0].attrs.get("env", {}) == {}, "trial 0 is the untouched baseline"
    assert recs[1].attrs["env"], "random sampling set no variable at all"
    for rec in recs:
        expected = ctx.space.env_vars(rec.params)
        assert rec.attrs.get("env", {}) == expected
        for rank, seen in rec.attrs[m.ENV_SEEN].items():
            set_seen = {k: v for k, v in seen.items() if v is not None}
            assert set_seen == expected, f"trial {rec.number} rank {rank}"
            assert {n for n in ctx.space.param_names if is_env_name(n)} <= set(seen)


def test_infeasible_plan_is_never_launched(tmp_path: Path) -> None:
    ctx = _context(["accumulation"], "gloo", tmp_path)
    ctx = dataclasses.replace(
        ctx,
        config=dataclasses.replace(
            ctx.config, workload=dataclasses.replace(ctx.config.workload, precision="fp16")
        ),
    )
    with pytest.raises(ValueError, match="fp16"):
        derive_plan(ctx, ctx.space.baseline())
