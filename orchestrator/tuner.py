"""The search loop: Ray Tune runs trials, Optuna chooses them and keeps the study.

One trial at a time by default: a trial owns the cluster, because throughput
measured beside another trial is not throughput.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import optuna
from ray import tune
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch
from ray.tune.utils.util import unflatten_dict

from orchestrator.callbacks import ProgressPrinter
from orchestrator.outcome import prune_threshold
from orchestrator.trial import OUTCOME, PRUNE_BELOW, TRIAL_NUMBER, TrialContext, run_trial
from search_spaces import SearchSpace
from train_fns import metrics as m

OBJECTIVE = m.SAMPLES_PER_S
TRIAL_CPU = 0.01
"""The trial driver only waits on its workers; a whole CPU for it would starve them."""
_OPTUNA_STATES = {
    m.COMPLETE: optuna.trial.TrialState.COMPLETE,
    m.PRUNED: optuna.trial.TrialState.PRUNED,
}


def json_safe(value: Any) -> Any:
    """Optuna user attributes must be JSON; NaN/inf and odd types become readable values."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    try:
        json.dumps(value)
        return value
    except TypeError:
        return json.loads(json.dumps(value, default=str))


class StudySearch(OptunaSearch):
    """OptunaSearch that tells Optuna each trial's real state and records why.

    Stock OptunaSearch marks any trial with a metric COMPLETE and any without one
    PRUNED; commtune trials end with a classified state (oom, hang, crash,
    infeasible...), which must reach Optuna as FAIL, never as a throughput of 0
    that would mislead the sampler. The outcome is kept as user attributes so the
    study alone can rebuild every output.
    """

    deadline: float | None = None
    """Wall-clock time (``time.time()``) after which no new trial starts."""

    def suggest(self, trial_id: str) -> dict | str | None:
        # The first trial (the baseline) always runs: without it nothing can be compared.
        if self.deadline is not None and time.time() > self.deadline and self._ot_trials:
            if trial_id not in self._ot_trials:
                print("time budget reached: no new trial starts", flush=True)
            return Searcher.FINISHED
        return super().suggest(trial_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """Nothing to tell: a trial reports one record, at its end. Pruning happens inside
        the trial against the measured noise, not through Optuna's pruner."""

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        if trial_id in self._completed_trials or trial_id not in self._ot_trials:
            return
        ot_trial = self._ot_trials[trial_id]
        # Tune hands over the result flattened ("outcome/env/NCCL_ALGO"); empty dicts vanish.
        outcome = unflatten_dict(dict(result or {})).get(OUTCOME, {})
        if error or m.STATE not in outcome:
            outcome.setdefault(m.STATE, m.CRASH)
            outcome.setdefault(m.REASON, "the trial's driver process died (node lost or killed)")
        state = outcome[m.STATE]
        for key, value in outcome.items():
            ot_trial.set_user_attr(key, json_safe(value))
        ot_state = _OPTUNA_STATES.get(state, optuna.trial.TrialState.FAIL)
        value = outcome.get(self.metric) if ot_state == optuna.trial.TrialState.COMPLETE else None
        self._ot_study.tell(ot_trial, value, state=ot_state)
        self._completed_trials.add(trial_id)


def make_sampler(name: str, seed: int, trials: int) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(3, trials // 4))
    # grid runs enqueued points (conditional spaces do not fit GridSampler); random fills in
    return optuna.samplers.RandomSampler(seed=seed)


class DefineByRun:
    """The define-by-run function OptunaSearch calls for each new trial.

    Besides the sampled params it hands the trial the pruning threshold of the
    study so far (the trial cannot read the study: it may run on another node).
    A class, not a closure: Tune checkpoints the searcher with plain pickle.
    """

    def __init__(self, space: SearchSpace, prune: bool) -> None:
        self.space = space
        self.prune = prune

    def __call__(self, trial: optuna.Trial) -> dict[str, Any]:
        sampled = self.space.suggest(trial)
        params = {**sampled, TRIAL_NUMBER: trial.number}
        if self.prune and sampled != self.space.baseline():  # the baseline is never pruned
            params[PRUNE_BELOW] = study_prune_threshold(trial.study)
        return params


def study_prune_threshold(study: optuna.Study) -> float | None:
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not done:
        return None
    best = max(done, key=lambda t: t.value)
    return prune_threshold(best.value, best.user_attrs.get(m.THROUGHPUT_CV))


def build_tuner(
    ctx: TrialContext,
    study_name: str,
    storage: optuna.storages.BaseStorage,
    num_samples: int,
    points: list[dict[str, Any]],
    out_dir: Path,
    deadline: float | None = None,
) -> tune.Tuner:
    """A Tuner over ``num_samples`` new trials; ``points`` are enqueued first (baseline, grid)."""
    cfg = ctx.config.search
    searcher = StudySearch(
        space=DefineByRun(ctx.space, cfg.prune),
        metric=OBJECTIVE,
        mode="max",
        points_to_evaluate=points or None,
        sampler=make_sampler(cfg.sampler, cfg.seed, cfg.trials),
        seed=cfg.seed,
        study_name=study_name,
        storage=storage,
    )
    searcher.deadline = deadline
    trainable = tune.with_resources(tune.with_parameters(run_trial, ctx=ctx), {"cpu": TRIAL_CPU})
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            num_samples=num_samples,
            max_concurrent_trials=1,
        ),
        run_config=tune.RunConfig(
            name="tune",
            storage_path=str(out_dir.resolve()),
            verbose=0,
            callbacks=[ProgressPrinter()],
        ),
    )
