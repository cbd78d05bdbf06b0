"""Taking back an ended group's resources: which actors and placement groups are ended, in
which order, and the bounded wait for the resources (fakes for Ray's state API)."""

from __future__ import annotations

import importlib
import os
import subprocess
import time
from types import SimpleNamespace

import pytest

from orchestrator.cluster import reclaim as r

NODE, OTHER = "n1", "n2"


def row(actor_id: str, cls: str, state: str = "ALIVE", pid: int = 0, node: str = NODE):
    return SimpleNamespace(actor_id=actor_id, class_name=cls, state=state, pid=pid, node_id=node)


def test_only_new_live_train_actors_are_chosen() -> None:
    rows = [
        row("c-old", r.CONTROLLER, pid=10),  # an earlier group's: left alone
        row("c-new", r.CONTROLLER, pid=11),
        row("c-dead", r.CONTROLLER, state="DEAD", pid=12),
        row("w-2", r.WORKER, pid=14, node=OTHER),
        row("w-1", r.WORKER, state="PENDING_CREATION"),
        row("q", "_QueueActor", pid=15),  # not a Train actor
        row("t", "ImplicitFunc", pid=16),
    ]
    controllers, workers = r.new_train_actors(rows, frozenset({"c-old"}))
    assert [a.actor_id for a in controllers] == ["c-new"]
    assert [a.actor_id for a in workers] == ["w-1", "w-2"]
    # only this node's processes are signalled; one not started yet has no pid
    assert r.local_pids(controllers + workers, NODE) == [11]
    assert r.local_pids(workers, OTHER) == [14]
    dead = row("w-0", r.WORKER, "DEAD", 17)
    _, all_workers = r.new_train_actors([*rows, dead], frozenset(), dead_too=True)
    assert [a.actor_id for a in all_workers] == ["w-0", "w-1", "w-2"], "dead, still a process"


def test_only_a_live_process_of_the_actor_class_is_killed() -> None:
    titled = subprocess.Popen(["bash", "-c", "exec -a ray::RayTrainWorker.__init__ sleep 30"])
    try:
        deadline = time.monotonic() + 5
        while not r.is_actor_process(titled.pid, r.WORKER):  # until exec has named it
            assert time.monotonic() < deadline, "never titled"
        assert not r.is_actor_process(titled.pid, r.CONTROLLER), "another class's process"
    finally:
        titled.kill()
        titled.wait()
    assert not r.is_actor_process(os.getpid(), r.WORKER)  # pytest: not a Ray worker
    assert not r.is_actor_process(titled.pid, r.WORKER), "gone (its pid may be reused)"


def test_group_need_and_shortfall() -> None:
    assert r.group_need(2, 1.0, False) == {"CPU": 2.0}
    assert r.group_need(4, 0.5, True) == {"CPU": 2.0, "GPU": 4.0}
    assert r.shortfall({"CPU": 2.0}, {"CPU": 2.99}) == {}
    assert r.shortfall({"CPU": 2.0, "GPU": 1.0}, {"CPU": 0.99}) == {"CPU": 1.01, "GPU": 1.0}
    assert r.shortfall({}, {}) == {}


def test_wait_until_is_bounded_and_asks_once_more_at_the_end() -> None:
    now, asked = [0.0], []

    def probe() -> float:
        asked.append(now[0])
        return now[0]

    def sleep(s: float) -> None:
        now[0] += s

    ok, seen = r.wait_until(probe, lambda t: t >= 1.0, 30.0, lambda: now[0], sleep)
    assert ok and seen == 1.0 and asked == [0.0, 0.5, 1.0]
    now[0], asked[:] = 0.0, []
    ok, seen = r.wait_until(probe, lambda t: False, 1.2, lambda: now[0], sleep)
    assert not ok and asked == pytest.approx([0.0, 0.5, 1.0, 1.2]) and seen == pytest.approx(1.2)


class Cluster:
    """A controller that retries its group's start (a new placement group each time it is
    looked at) until its process is killed; 3 CPUs, 2 of them in each live placement group."""

    def __init__(self) -> None:
        self.actors = [
            row("c-old", r.CONTROLLER, state="DEAD", pid=9),
            row("w-old", r.WORKER, state="DEAD", pid=8),  # an earlier group's; pid reused since
            row("c1", r.CONTROLLER, pid=20),
            row("w1", r.WORKER, pid=21),  # frozen: ends only when killed
            row("w0", r.WORKER, state="DEAD", pid=23),  # its owner went; its process did not
            row("w2", r.WORKER, pid=22, node=OTHER),  # its raylet ends it with its group
        ]
        self.pgs = {"00" * 17 + "01": "old", "00" * 17 + "02": "ours"}
        self.killed: list[int] = []
        self.removed: list[str] = []

    def list_actors(self) -> list:
        if any(a.actor_id == "c1" and a.state == "ALIVE" for a in self.actors):
            self.pgs[f"{len(self.pgs) + 1:036x}"] = "a retry"
        return list(self.actors)

    def kill(self, pids: list[int], actor_class: str) -> None:
        self.killed += pids
        for a in self.actors:
            if a.pid in pids:
                a.state = "DEAD"

    def remove(self, pg) -> None:
        self.removed.append(pg.id.hex())
        self.pgs.pop(pg.id.hex())

    def available(self) -> dict[str, float]:
        return {"CPU": 3.0 - 2.0 * (len(self.pgs) - 1)}


@pytest.fixture
def cluster(monkeypatch) -> Cluster:
    import ray

    c = Cluster()
    pgs = importlib.import_module("ray.util.placement_group")  # the module, not its function
    monkeypatch.setattr(pgs, "remove_placement_group", c.remove)
    monkeypatch.setattr(r, "_actors", c.list_actors)
    monkeypatch.setattr(r, "_placement_groups", lambda: set(c.pgs))
    monkeypatch.setattr(r, "_kill", c.kill)
    monkeypatch.setattr(ray, "available_resources", c.available)
    context = SimpleNamespace(get_node_id=lambda: NODE)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: context)
    return c


def test_reclaim_kills_the_controller_before_it_removes_placement_groups(cluster) -> None:
    before = r.Snapshot(frozenset({"00" * 17 + "01"}), frozenset({"c-old", "w-old"}))
    cluster.list_actors()  # the controller retried once before the bound ran out
    done = r.reclaim(before, {"CPU": 2.0}, wait_s=3.0)
    assert done.controllers == ["c1"] and cluster.killed[0] == 20  # the controller first
    assert set(done.workers) == {"w0", "w1", "w2"} and {21, 23} <= set(cluster.killed)
    assert 22 not in cluster.killed  # another node's: its raylet ends it
    assert 8 not in cluster.killed and 9 not in cluster.killed  # an earlier group's
    # every placement group made since the group began, the retries' too, and only those
    assert set(cluster.pgs) == {"00" * 17 + "01"} and "00" * 17 + "01" not in cluster.removed
    assert done.missing == {}


def test_reclaim_says_what_is_still_short_when_the_wait_runs_out(cluster, monkeypatch) -> None:
    import ray

    monkeypatch.setattr(r, "POLL_S", 0.01)
    monkeypatch.setattr(ray, "available_resources", lambda: {"CPU": 0.5})  # another user's
    done = r.reclaim(None, {"CPU": 2.0}, wait_s=1.0)  # no state API: nothing is killed
    assert done.missing == {"CPU": 1.5} and done.waited_s >= 1.0
    assert cluster.killed == [] and cluster.removed == []


def test_a_snapshot_holds_dead_actors_too(monkeypatch) -> None:
    """An earlier group's dead workers are in it, so ``reclaim`` never takes them (and their
    pids, reused since) for this group's."""
    rows = [row("w-old", r.WORKER, state="DEAD", pid=8), row("q", "_QueueActor", pid=15)]
    monkeypatch.setattr(r, "_actors", lambda: rows)
    monkeypatch.setattr(r, "_placement_groups", lambda: {"pg"})
    assert r.snapshot() == r.Snapshot(frozenset({"pg"}), frozenset({"w-old", "q"}))
    monkeypatch.setattr(r, "_actors", lambda: None)  # no state API: nothing to go by
    assert r.snapshot() is None
