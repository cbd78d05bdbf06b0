"""The search loop: Ray Tune runs worker groups, Optuna chooses configurations and keeps the study.

One group at a time by default: a group owns the cluster, because throughput measured beside
another run is not throughput (``search.concurrency`` runs groups on disjoint nodes). A group
is one Tune trial; each configuration it measures is an Optuna trial of its own (ask/tell), so
the sampler learns from every one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna
from ray import tune
from ray.tune import Callback
from ray.tune.search import Searcher
from ray.tune.utils.util import unflatten_dict

from orchestrator.cluster.placement import choose_nodes, trial_resources
from orchestrator.cluster.session import driver_queue
from orchestrator.runfiles import Board
from orchestrator.search.group_run import slowest_start
from orchestrator.search.lease import Lease, search_over
from orchestrator.search.outcome import prune_threshold
from orchestrator.search.progress import ProgressPrinter, tensorboard_loggers, trial_line
from orchestrator.search.proposer import Proposer
from orchestrator.search.results import TrialRecord, derived_attrs, measured_columns
from orchestrator.search.study import INTERRUPTED, REPEAT, REQUEUE, counted
from orchestrator.search.trial import (
    NODES,
    OUTCOME,
    SLOWEST_START,
    TRIAL_NUMBER,
    WORK,
    Member,
    TrialContext,
    run_group,
    sampled_params,
)
from train_fns import metrics as m

OBJECTIVE = m.SAMPLES_PER_S
_OPTUNA_STATES = {
    m.COMPLETE: optuna.trial.TrialState.COMPLETE,
    m.PRUNED: optuna.trial.TrialState.PRUNED,
}


def systematic(outcome: dict[str, Any]) -> bool:
    """A baseline outcome every other trial would share, so the search stops after it: code
    that raised (a traceback: the user's, torch.distributed's, commtune's) or an error. Not an
    out-of-memory (another split may fit), a hang (a slow start, a stuck node) or a worker that
    died without a traceback (a lost node, the host's OOM killer)."""
    state, reason = outcome.get(m.STATE), str(outcome.get(m.REASON, ""))
    return state == m.ERROR or (state == m.CRASH and " raised " in reason)


def json_safe(value: Any) -> Any:
    """Optuna user attributes must be JSON; NaN/inf and odd types become readable values."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    try:
        json.dumps(value)
        return value
    except TypeError:
        return json.loads(json.dumps(value, default=str))


def tell(
    study: optuna.Study, trial: optuna.Trial, params: dict[str, Any], outcome: dict[str, Any]
) -> TrialRecord:
    """Finish ``trial`` with ``outcome``: every key a user attribute (the study is the record
    every output is rebuilt from), the objective where it completed; returns its record."""
    outcome.setdefault(m.STATE, m.CRASH)
    outcome.setdefault("params", params)
    record = TrialRecord(trial.number, outcome[m.STATE], outcome.get(m.REASON, ""),
                         outcome["params"], outcome)  # fmt: skip
    for key, value in {**outcome, **derived_attrs(record)}.items():
        trial.set_user_attr(key, json_safe(value))
    state = _OPTUNA_STATES.get(outcome[m.STATE], optuna.trial.TrialState.FAIL)
    value = outcome.get(OBJECTIVE) if state == optuna.trial.TrialState.COMPLETE else None
    study.tell(trial, value, state=state)
    return record


@dataclass
class Asked:
    """A configuration asked of Optuna and not yet told."""

    trial: optuna.Trial
    params: dict[str, Any]
    env: tuple[tuple[str, str], ...]


@dataclass
class Group:
    """A running worker group: its work queue and the configurations sent to it, untold."""

    work: Any
    env: tuple[tuple[str, str], ...]
    sent: list[Asked]
    nodes: list[str] | None = None
    """The nodes it owns (node-disjoint concurrency); None: the whole cluster."""
    size: int = 1
    """Configurations sent to it so far."""
    told: int = 0


class GroupSearch(Searcher):
    """Ask Optuna for configurations one at a time and feed those with the same environment
    variables to one worker group (one Tune trial), telling Optuna each one's real state as it
    ends and only then asking for the next: warm workers, and a sampler that learns from every
    configuration.

    Outcomes other than ``complete`` reach Optuna as FAIL (or PRUNED), never as a throughput
    of 0 that would mislead the sampler; the outcome is kept as user attributes so the study
    alone can rebuild every output. A configuration whose environment differs waits for the
    next group. When a group crashes or hangs on one configuration, those it did not reach go
    back to the front of the queue.
    """

    def __init__(
        self,
        ctx: TrialContext,
        study: optuna.Study,
        proposer: Proposer,
        total: int,
        make_queue: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(metric=OBJECTIVE, mode="max")
        self.make_queue = make_queue or driver_queue
        """A group's work queue: a Ray queue on the driver's node (tests pass a plain one)."""
        self.ctx, self.study, self.proposer = ctx, study, proposer
        self.total, self.asked = total, 0
        self.group_size = ctx.config.search.group_size if ctx.config.search.warm else 1
        self.pending: list[Asked] = []
        self.running: dict[str, Group] = {}
        self.deadline: float | None = None
        self.board: Board | None = None
        """Each told trial's figures as TensorBoard scalars at its number (None: none)."""
        """Wall-clock time (``time.time()``) after which no new configuration starts."""
        self.slowest_start_s: float | None = None
        """The slowest group start this run has seen (not a resumed study's older ones, from
        another cluster perhaps): a new group's start is bounded by a multiple of it."""
        self.baseline_failed: str | None = None
        """Why the baseline failed, when it did for a reason every trial shares (``systematic``):
        no trial starts after it."""
        self.ending = ""
        """Why the search ends before its budget (``Proposer.settled``), until it is said."""
        self.lend: Callable[[Lease], Any] | None = None
        """What runs in the search's last group once it is measured (the verdict's race,
        ``Handover``); None: the last group ends as the others do."""
        self.lease: Lease | None = None
        """The last group, lent and not yet handed over."""

    def suggest(self, trial_id: str) -> dict | str | None:
        self._say_ending()
        if self.baseline_failed is not None:
            self._interrupt_pending(
                "not run: the baseline failed, and every trial would fail the same way; fix "
                "it, then --resume runs it",
                f"no further trial starts: the baseline failed ({self.baseline_failed[:300]}), "
                "and every other trial would fail the same way",
            )  # fmt: skip
            return Searcher.FINISHED
        if self._out_of_time():
            self._interrupt_pending(
                "the time budget ended the search before it ran; --resume runs it",
                "time budget reached: no new trial starts",
            )
            return Searcher.FINISHED
        nodes = self._nodes()
        if nodes == []:  # no free nodes for another group now
            return None
        first = self._next(env=None)
        if first is None:
            self._say_ending()
            return None if self.running else Searcher.FINISHED
        group = Group(self.make_queue(), first.env, [], nodes)
        self.running[trial_id] = group
        self._send(group, first)
        adaptive = not self.ctx.config.cluster.autoscaling  # a group may wait for new nodes
        return {WORK: group.work, NODES: nodes,
                SLOWEST_START: self.slowest_start_s if adaptive else None}  # fmt: skip

    def _nodes(self) -> list[str] | None:
        """Nodes no running group uses, enough for one group (concurrency above 1 only)."""
        if self.ctx.config.search.concurrency == 1:
            return None
        import ray

        cluster = self.ctx.config.cluster
        busy = {n for g in self.running.values() for n in g.nodes or ()}
        found = choose_nodes(
            ray.nodes(), busy, cluster.num_workers, cluster.cpus_per_worker, self.ctx.use_gpu
        )
        return found or []

    def _next(self, env: tuple | None) -> Asked | None:
        """The first pending configuration (with environment ``env`` if given), asking Optuna
        for one more when none is pending."""
        if not self.pending and self.asked < self.total and not self._settled():
            trial, params = self._ask()
            earlier = self.proposer.repeat_of(self.study, trial)
            if earlier is not None:  # never run: the neighbour queued in its place runs
                said = {m.STATE: REPEAT, m.REASON: (
                    f"not run: trial {earlier}'s configuration, asked again; an unmeasured "
                    "neighbour of it runs instead")}  # fmt: skip
                tell(self.study, trial, params, said)
                print(trial_line(trial.number, said, params), flush=True)  # no number skipped
                trial, params = self._ask()
            env_vars = {**self.ctx.config.env, **self.ctx.space.env_vars(params)}
            self.pending.append(Asked(trial, params, tuple(sorted(env_vars.items()))))
            self.asked += 1
        match = next((a for a in self.pending if env is None or a.env == env), None)
        if match is not None:
            self.pending.remove(match)
        return match

    def _ask(self) -> tuple[optuna.Trial, dict[str, Any]]:
        """The next configuration: the proposer's queue first, else the sampler's."""
        self.proposer.refill(self.study)
        trial = self.study.ask()
        return trial, self.ctx.space.suggest(trial)

    def _settled(self) -> bool:
        """Whether the proposer says the search has stopped improving; said once, and no
        configuration is asked after it."""
        why = self.proposer.settled(self.study)
        if why is not None:
            self.ending = (f"search: ending after {counted(self.study)} of "
                           f"{self.proposer.budget} trials: {why}")  # fmt: skip
            self.total = self.asked
        return why is not None

    def _say_ending(self) -> None:
        """Print why the search ended early, once, after the last trial's own line (which
        Tune's callback prints after this searcher has seen the result)."""
        if self.ending:
            print(self.ending, flush=True)
            self.ending = ""

    def _send(self, group: Group, asked: Asked) -> None:
        baseline = asked.params == self.ctx.space.baseline()
        member = Member(
            asked.trial.number, asked.params, None if baseline else self._threshold(),
            None if baseline else self._reference(),
        )  # fmt: skip
        group.sent.append(asked)
        group.work.put(asdict(member))

    def _completed(self) -> list[optuna.trial.FrozenTrial]:
        return self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))

    def _out_of_time(self) -> bool:
        # The first configuration (the baseline) always runs: without it nothing compares.
        return self.deadline is not None and time.time() > self.deadline and bool(self._completed())

    def _reference(self) -> dict | None:
        """The completed baseline's correctness figures, for the guard (``correctness``)."""
        want = sampled_params(self.ctx.space.baseline(), self.ctx.space)
        found = (t.user_attrs.get(m.GUARD) for t in self._completed()
                 if t.user_attrs.get("params") == want)  # fmt: skip
        return next((g for g in found if g), None)

    def _threshold(self) -> float | None:
        if not self.ctx.config.search.prune:
            return None
        done = self._completed()
        if not done:
            return None
        best = max(done, key=lambda t: t.value)
        return prune_threshold(best.value, best.user_attrs.get(m.THROUGHPUT_CV))

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        group = self.running.get(trial_id)
        # Tune hands over the result flattened ("outcome/env/NCCL_ALGO"); empty dicts vanish.
        full = unflatten_dict(dict(result))
        asked = next((a for a in group.sent if a.trial.number == full.get(TRIAL_NUMBER)), None)
        if asked is None:
            return
        outcome = full.get(OUTCOME, {})
        self.slowest_start_s = slowest_start([outcome], self.slowest_start_s)
        self._tell(asked, outcome)
        if asked.params == self.ctx.space.baseline() and systematic(outcome):
            self.baseline_failed = f"{outcome[m.STATE]}: {outcome.get(m.REASON, '')}"
        group.sent.remove(asked)
        group.told += 1
        if group.sent:
            return
        nxt = None
        stop = self._out_of_time() or self.baseline_failed is not None
        if group.size < self.group_size and not stop:
            nxt = self._next(env=group.env)
        if nxt is None and not stop and self._lend(group):
            return  # the verdict's race goes on in it (``Handover``)
        if nxt is None:
            group.work.put(None)  # the group ends; a different environment needs new workers
        else:
            group.size += 1
            self._send(group, nxt)

    def _lend(self, group: Group) -> bool:
        """Keep the search's last group for the verdict's race (``lease``) where the race can
        use it: it runs in the baseline's environment, and nothing else is left to measure."""
        baseline_env = {**self.ctx.config.env, **self.ctx.space.env_vars(self.ctx.space.baseline())}
        if self.lend is None or dict(group.env) != baseline_env or not search_over(
            len(self.pending), self.asked, self.total, len(self.running)
        ):  # fmt: skip
            self.lend = None  # a later group is no longer the last one measured
            return False
        bound_s = 2 * self.ctx.config.search.trial_timeout_s  # the trial bounds each itself
        self.lease = Lease(group.work, self.make_queue(), baseline_env, bound_s)
        return True

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        self._say_ending()
        group = self.running.pop(trial_id, None)
        if group is None:
            return
        group.work.shutdown()
        left = group.sent
        if left and (error or not group.told):
            # Nothing of it was told: the configuration it was on is the casualty, not the
            # rest (and a group that can never start cannot loop forever).
            why = "the group's driver process died (node lost or killed)" if error else (
                "the worker group ended before measuring it")  # fmt: skip
            self._tell(left[0], {m.STATE: m.CRASH if error else m.ERROR, m.REASON: why})
            left = left[1:]
        if left:
            shown = ", ".join(str(a.trial.number) for a in left)
            print(f"re-queued: trial(s) {shown} (their worker group ended early)", flush=True)
            self.pending[:0] = left

    def _tell(self, asked: Asked, outcome: dict[str, Any]) -> None:
        record = tell(self.study, asked.trial, asked.params, outcome)
        if self.board is not None:
            self.board.add(measured_columns(record), record.number, "trial/")

    def _interrupt_pending(self, reason: str, line: str) -> None:
        """Configurations asked but never run when the search stops early (its time budget,
        a failed baseline): recorded as interrupted with ``reason``, their params kept for
        ``--resume`` (queued then, not now: a trial queued now would stay WAITING in the
        study after the search); ``line`` says so once."""
        if self.pending or self.asked < self.total:
            print(line, flush=True)
        for asked in self.pending:
            self._tell(asked, {m.STATE: INTERRUPTED, m.REASON: reason,
                               REQUEUE: asked.trial.params})  # fmt: skip
        self.pending = []

    def save(self, checkpoint_path: str) -> None:
        """Nothing to save: the Optuna study in its storage is this searcher's memory."""

    def restore(self, checkpoint_path: str) -> None:
        """Nothing to restore: ``--resume`` reopens the study."""


class Handover(Callback):
    """Hands the search's last group, once lent (``GroupSearch.lease``), to ``lend`` and ends
    it afterwards; Tune's loop waits meanwhile, its trial running the lent plans. At a step's
    end, not on the last result: the trial's ``tune.report`` returns only once Tune has asked
    it to go on, which it does after the result's callbacks (the last trial's line printed).
    At the experiment's end it closes the search's TensorBoard board."""

    def __init__(self, searcher: GroupSearch) -> None:
        self.searcher = searcher

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        lease, lend = self.searcher.lease, self.searcher.lend
        if lease is None or lend is None:
            return
        self.searcher.lease = self.searcher.lend = None
        self.searcher._say_ending()  # an early end is the search's, said before the race
        try:
            lend(lease)
        finally:
            lease.close()

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        if self.searcher.board is not None:  # its event file complete, its writer thread ended
            self.searcher.board.close()


def build_tuner(
    ctx: TrialContext, study: optuna.Study, proposer: Proposer, total: int, out_dir: Path,
    deadline: float | None = None, lend: Callable[[Lease], Any] | None = None,
) -> tune.Tuner:  # fmt: skip
    """A Tuner over ``total`` new configurations, grouped into worker groups; ``lend`` (the
    verdict's race) runs in the last group where it can (``GroupSearch._lend``)."""
    notices = driver_queue()  # the trials' heartbeat lines, printed by the driver
    ctx = dataclasses.replace(ctx, notices=notices)
    searcher = GroupSearch(ctx, study, proposer, total)
    searcher.deadline, searcher.lend = deadline, lend
    searcher.board = Board(out_dir, "search")
    import ray

    resources = trial_resources(ray.nodes())
    trainable = tune.with_resources(tune.with_parameters(run_group, ctx=ctx), resources)
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            num_samples=total,  # at most one group per configuration
            max_concurrent_trials=ctx.config.search.concurrency,
        ),
        run_config=tune.RunConfig(
            name="tune",
            storage_path=str(out_dir.resolve()),
            verbose=0,
            callbacks=[ProgressPrinter(notices), Handover(searcher), *tensorboard_loggers()],
        ),
    )
