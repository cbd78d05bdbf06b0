"""The search's last worker group, lent to the verdict's race instead of ended.

A worker group costs its start (processes, imports, the process group) before it measures
anything; the race needs one group whose processes run the baseline and its finalists. When
the search's last group already runs in the baseline's environment, the race continues in it:
its processes are warm, and the race's windows are measured where the search's were.

The group stays a Tune trial (``trial.run_group``) with its own bounds and heartbeats; the
driver sends it whole plans through the trial's work queue (``lent_item``) and reads each
outcome from a queue of its own (``results``). ``Lease.run`` takes the place of
``GroupRun.run`` for the race: a window is asked for only after the last one's outcome.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from train_fns import metrics as m
from train_fns.plan import TrialPlan

PLAN, ENV, LABEL, RESULTS = "plan", "env", "label", "results"
"""Keys of a lent plan on the work queue (a search configuration is a ``Member`` dict)."""
GOES_ON = (m.COMPLETE, m.OOM, m.PRUNED)
"""Outcomes a group measures on after (``GroupRun._measured``); any other ended it."""


def search_over(pending: int, asked: int, total: int, running: int) -> bool:
    """Whether no configuration is left to measure and one group alone still runs: only
    then can the race have it (another group would wait on the cluster it holds)."""
    return pending == 0 and asked >= total and running == 1


def lent_item(plan: TrialPlan, env: dict[str, str], label: str, results: Any) -> dict:
    """A lent plan as the work queue carries it."""
    return {PLAN: plan.to_dict(), ENV: env, LABEL: label, RESULTS: results}


class Lease:
    """A running search group, lent: ``run`` measures a source's plans in it, ``close`` ends it.

    ``work``: the group's work queue; ``results``: where the trial puts each outcome, and
    None once its group ended; ``bound_s``: the longest wait for one outcome (the trial bounds
    every configuration itself, so this only catches a trial that died with its group)."""

    def __init__(self, work: Any, results: Any, env: dict[str, str], bound_s: float) -> None:
        self.work, self.results, self.env, self.bound_s = work, results, env, bound_s
        self.ended = False
        """The group ended (or its end was asked): nothing more is sent to it."""

    def run(
        self, source: Iterator[tuple[TrialPlan, dict[str, str]]],
        on_outcome: Callable[[int, dict[str, Any]], None] | None = None,
        label: Callable[[int], str] | None = None,
    ) -> list[dict[str, Any] | None]:  # fmt: skip
        """Measure the source's plans in the lent group, as ``GroupRun.run`` does; stops
        where the group ended (an outcome other than ``GOES_ON``: a hang, a crash) and ends
        the group when the source is done."""
        outcomes: list[dict[str, Any] | None] = []
        for index, (plan, env) in enumerate(source):
            name = label(index) if label else f"lent run {index + 1}"
            self.work.put(lent_item(plan, env, name, self.results))
            outcome = self._next()
            outcomes.append(outcome)
            if outcome is None:
                break
            if on_outcome is not None:
                on_outcome(index, outcome)
            if outcome.get(m.STATE) not in GOES_ON:
                break
        self.close()
        return outcomes

    def _next(self) -> dict[str, Any] | None:
        """The next outcome; None when the group ended (``ended``) or the trial stays silent
        (``close`` then still asks it to end)."""
        try:
            outcome = self.results.get(timeout=self.bound_s)
        except Exception:  # Ray's Empty and queue.Empty alike
            return None
        self.ended = outcome is None
        return outcome

    def close(self) -> None:
        """End the group (once) and wait (bounded) for it to be gone, so that the next group
        finds the cluster free."""
        if self.ended:
            return
        self.ended = True
        self.work.put(None)
        with contextlib.suppress(Exception):  # silent past the bound: the trial is gone
            while self.results.get(timeout=self.bound_s) is not None:
                pass
