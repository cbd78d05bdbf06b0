"""The Optuna study as the search's memory: open it, resume it, count what counts.

A driver killed mid-trial (SIGKILL, node loss) leaves that trial RUNNING in
storage. On ``--resume`` it is marked ``interrupted`` (FAIL, with the reason) and
its params are queued again, so nothing is counted twice and the total still
reaches ``search.trials``.
"""

from __future__ import annotations

from pathlib import Path

import optuna

from orchestrator.config import Config
from orchestrator.storage import choose
from train_fns import metrics as m

INTERRUPTED = "interrupted"


def open_storage(config: Config, out: Path) -> optuna.storages.BaseStorage:
    """The storage ``orchestrator.storage.choose`` picks (its rules live there)."""
    return choose(config.search.storage, out).open()


def load(storage: optuna.storages.BaseStorage, name: str) -> optuna.Study | None:
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return None


def counted(study: optuna.Study | None) -> int:
    """Trials with a real outcome; interrupted ones are re-run, not counted."""
    if study is None:
        return 0
    return sum(
        t.state.is_finished() and t.user_attrs.get(m.STATE) != INTERRUPTED for t in study.trials
    )


def requeue_interrupted(study: optuna.Study) -> list[int]:
    """Mark trials left RUNNING by a dead driver and queue their params again."""
    numbers = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        storage, trial_id = study._storage, t._trial_id
        storage.set_trial_user_attr(trial_id, m.STATE, INTERRUPTED)
        storage.set_trial_user_attr(
            trial_id, m.REASON, "the driver died during this trial; its params were queued again"
        )
        storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
        study.enqueue_trial(t.params, skip_if_exists=False)
        numbers.append(t.number)
    return numbers
