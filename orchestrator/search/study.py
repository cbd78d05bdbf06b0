"""The Optuna study as the search's memory: open it, resume it, count what counts.

A driver killed mid-trial (SIGKILL, node loss) leaves that trial RUNNING in
storage. On ``--resume`` it is marked ``interrupted`` (FAIL, with the reason) and
its params are queued again, so nothing is counted twice and the total still
reaches ``search.trials``. A search stopped by Ctrl-C closes its open trials itself
(``close_interrupted``: no RUNNING or WAITING trial stays behind, which optuna-dashboard
would show as work under way); ``--resume`` queues those again too.
"""

from __future__ import annotations

from pathlib import Path

import optuna

from orchestrator.config.schema import Config
from orchestrator.config.study_storage import choose
from train_fns import metrics as m

INTERRUPTED = "interrupted"
REPEAT = "repeat"
"""State of a trial never run: the sampler asked for a configuration the study already judged
(``Proposer.repeat_of``), and an unmeasured neighbour of it ran instead."""
NOT_RUN = (INTERRUPTED, REPEAT)
"""States of trials that do not count against the budget."""
REQUEUE = "requeue"
"""User attribute of an interrupted trial whose params ``--resume`` must queue again."""


def open_storage(config: Config, out: Path) -> optuna.storages.BaseStorage:
    """The storage ``orchestrator.config.study_storage.choose`` picks (its rules live there)."""
    return choose(config.search.storage, out).open()


def load(storage: optuna.storages.BaseStorage, name: str) -> optuna.Study | None:
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None


def counted(study: optuna.Study | None) -> int:
    """Trials with a real outcome; interrupted ones are re-run and repeats never ran: neither
    is counted."""
    if study is None:
        return 0
    return sum(
        t.state.is_finished() and t.user_attrs.get(m.STATE) not in NOT_RUN for t in study.trials
    )


def close_interrupted(study: optuna.Study, why: str) -> list[int]:
    """Mark every RUNNING or WAITING trial ``interrupted`` (FAIL, with ``why``), its params
    kept for ``--resume``; returns their numbers."""
    open_states = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)
    numbers = []
    for t in study.get_trials(deepcopy=False, states=open_states):
        study._storage.set_trial_user_attr(t._trial_id, REQUEUE, queued_params(t))
        _fail(study, t, why)  # last: a finished trial takes no more attributes
        numbers.append(t.number)
    return numbers


def requeue_interrupted(study: optuna.Study) -> list[int]:
    """Mark trials left RUNNING by a dead driver and queue their params again, with those of
    trials a stopped search closed (``close_interrupted``)."""
    numbers = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        _fail(study, t, "the driver died during this trial; its params were queued again")
        study.enqueue_trial(t.params, skip_if_exists=False)
        numbers.append(t.number)
    trials = study.get_trials(deepcopy=False)
    for t in trials:
        params = t.user_attrs.get(REQUEUE)
        # queued once: a later trial with its params (a second --resume must not queue it again)
        if params and not any(u.number > t.number and queued_params(u) == params for u in trials):
            study.enqueue_trial(params, skip_if_exists=False)
            numbers.append(t.number)
    return numbers


def queued_params(trial: optuna.trial.FrozenTrial) -> dict:
    """A trial's params; a waiting one has none yet, only the fixed ones it was enqueued with."""
    return {**trial.system_attrs.get("fixed_params", {}), **trial.params}


def _fail(study: optuna.Study, trial: optuna.trial.FrozenTrial, why: str) -> None:
    storage, trial_id = study._storage, trial._trial_id
    storage.set_trial_user_attr(trial_id, m.STATE, INTERRUPTED)
    storage.set_trial_user_attr(trial_id, m.REASON, why)
    storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
