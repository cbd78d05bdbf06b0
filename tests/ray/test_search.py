"""Real Ray: a 2-worker TorchTrainer, a 3-trial Tune search over NCCL variables."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import optuna
import pytest

from orchestrator.config import load_config
from orchestrator.results import records
from orchestrator.trial import TrainerRun, TrialContext, derive_plan, storage_dir
from orchestrator.tuner import build_tuner
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


def test_two_worker_trainer_reports_every_window(ray_local: None, tmp_path: Path) -> None:
    ctx = _context(["accumulation", "ddp"], "gloo", tmp_path)
    params = {**ctx.space.baseline(), "accumulation_steps": 2}
    plan, env = derive_plan(ctx, params)
    assert plan.micro_batch * plan.accumulation_steps * plan.world_size == plan.global_batch
    outcome = TrainerRun(plan, env, ctx, name="smoke").run(deadline_s=180)
    assert outcome[m.STATE] == m.COMPLETE, outcome
    assert outcome["num_windows"] == 3
    assert outcome[m.SAMPLES_PER_S] > 0
    assert set(outcome[m.ENV_SEEN]) == {"0", "1"}
    assert outcome[m.STEP_TIME_S] >= outcome[m.FWD_BWD_S] > 0


def test_tune_search_workers_see_their_trials_nccl_variables(
    ray_local: None, tmp_path: Path
) -> None:
    """Each trial's workers see exactly the variables sampled for it, and no others."""
    ctx = _context(["nccl"], "nccl", tmp_path, sets=("search.sampler=random",))
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    tuner = build_tuner(
        ctx, "env-check", storage, 3, [ctx.space.optuna_params(ctx.space.baseline())], tmp_path
    )
    tuner.fit()
    recs = records(optuna.load_study(study_name="env-check", storage=storage))
    assert [r.state for r in recs] == [m.COMPLETE] * 3, [(r.state, r.reason) for r in recs]
    assert recs[0].attrs.get("env", {}) == {}, "trial 0 is the untouched baseline"
    assert any(r.attrs["env"] for r in recs[1:]), "random sampling set no variable at all"
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
