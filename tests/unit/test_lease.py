"""A lent group as the race drives it (``search.lease``): each plan sent after the last one's
outcome, the group ended once the race is done or where it ended by itself. No Ray: a thread
plays the trial that measures the lent plans."""

from __future__ import annotations

import queue
import threading
from typing import Any

from orchestrator.search.lease import LABEL, PLAN, RESULTS, Lease, search_over
from train_fns import metrics as m


class Plan:
    """What a lease needs of a plan."""

    def __init__(self, name: str) -> None:
        self.name = name

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name}


def _trial(work: queue.Queue, ends_at: str | None = None, hangs_at: str | None = None) -> list:
    """A trial answering each lent plan with an outcome, and None once its group ended (when
    the driver ends it, by itself at the plan named ``ends_at``, or after ``hangs_at``'s
    outcome, a hang); what it took."""
    taken: list = []

    def serve() -> None:
        while (item := work.get()) is not None:
            taken.append(item)
            if item[PLAN]["name"] == ends_at:
                break
            item[RESULTS].put({"measured": item[PLAN]["name"], "label": item[LABEL],
                               m.STATE: m.HANG if item[PLAN]["name"] == hangs_at else m.COMPLETE})
            if item[PLAN]["name"] == hangs_at:
                break
        if taken:
            taken[-1][RESULTS].put(None)

    threading.Thread(target=serve, daemon=True).start()
    return taken


def test_a_lease_measures_each_plan_after_the_last_outcome_and_ends_the_group() -> None:
    work, results = queue.Queue(), queue.Queue()
    taken = _trial(work)
    seen: list = []

    def source():
        for name in ("b", "c"):
            yield Plan(name), {}
            assert len(seen) == len(taken), "the next plan only after the last one's outcome"

    lease = Lease(work, results, {}, bound_s=5)
    outcomes = lease.run(source(), lambda i, o: seen.append((i, o)), lambda i: f"race {i}")
    assert [o["measured"] for o in outcomes] == ["b", "c"]
    assert seen == [(0, outcomes[0]), (1, outcomes[1])]
    assert [t[LABEL] for t in taken] == ["race 0", "race 1"]
    assert lease.ended and work.empty() and results.empty(), "ended, and its end waited for"
    lease.close()  # again: nothing more is sent
    assert work.empty()


def test_a_group_that_ends_by_itself_ends_the_lease_where_it_ended() -> None:
    work, results = queue.Queue(), queue.Queue()
    _trial(work, ends_at="c")
    asked: list = []

    def source():
        for name in ("b", "c", "d"):
            asked.append(name)
            yield Plan(name), {}

    lease = Lease(work, results, {}, bound_s=5)
    outcomes = lease.run(source())
    assert [o and o["measured"] for o in outcomes] == ["b", None] and asked == ["b", "c"]
    assert lease.ended and work.empty(), "no end is sent to a group that ended"


def test_an_outcome_that_ended_the_group_ends_the_lease_there() -> None:
    work, results = queue.Queue(), queue.Queue()
    _trial(work, hangs_at="c")
    asked: list = []

    def source():
        for name in ("b", "c", "d"):
            asked.append(name)
            yield Plan(name), {}

    outcomes = Lease(work, results, {}, bound_s=5).run(source())
    assert [o[m.STATE] for o in outcomes] == [m.COMPLETE, m.HANG] and asked == ["b", "c"]


def test_a_silent_trial_ends_the_lease_after_its_bound_and_is_asked_to_end() -> None:
    work = queue.Queue()
    lease = Lease(work, queue.Queue(), {}, bound_s=0.1)
    assert lease.run(iter([(Plan("b"), {})])) == [None] and lease.ended
    assert work.get_nowait()[PLAN] == {"name": "b"} and work.get_nowait() is None


def test_a_group_is_lent_only_when_nothing_is_left_to_measure_and_it_runs_alone() -> None:
    assert search_over(pending=0, asked=12, total=12, running=1)
    assert not search_over(pending=1, asked=12, total=12, running=1)
    assert not search_over(pending=0, asked=11, total=12, running=1)
    assert not search_over(pending=0, asked=12, total=12, running=2)
