"""Taking back what an ended worker group held: its Train controller, its workers, its
placement groups; then waiting (bounded) until the cluster has the resources back.

Ray does not do it alone for a group ended while it starts. Ray Train retries a group that
fails to start without limit (``FailureConfig.controller_failure_limit=-1``), and each retry
makes a new placement group, which its cleaner learns of only once that group has started;
a placement group outlives its creator actor while the job lives. So removing the group's
placement group lets its workers die, the controller retries at once with a new placement
group, and when the Tune trial's actor goes (taking the controller with it) that new one
stays, holding the next group's CPUs. Hence the order here: the controller first (no retry
can follow a dead one), then its workers (a frozen process cannot end itself; SIGKILL ends a
stopped one), then the placement groups made since the group began.

Only this job's actors and placement groups made since the group began are touched, so
callers use it when one group of the job runs at a time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

CONTROLLER, WORKER = "TrainController", "RayTrainWorker"
"""Ray Train's actor classes (``ray.train.v2``) that hold or make a group's resources."""
WAIT_S = 30.0
"""How long to wait for the resources to come back before saying so and going on."""
POLL_S = 0.5
T = TypeVar("T")


@dataclass(frozen=True)
class Snapshot:
    """This job's live placement groups and its actors (dead ones too) when a group began."""

    placement_groups: frozenset[str]
    actors: frozenset[str]


@dataclass
class Reclaimed:
    """What ``reclaim`` ended, and what the cluster still lacked when it stopped waiting."""

    controllers: list[str] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)
    placement_groups: list[str] = field(default_factory=list)
    missing: dict[str, float] = field(default_factory=dict)
    waited_s: float = 0.0


def group_need(world_size: int, cpus_per_worker: float, use_gpu: bool) -> dict[str, float]:
    """The resources a group of ``world_size`` workers reserves (what the next one needs)."""
    return {"CPU": world_size * cpus_per_worker} | ({"GPU": float(world_size)} if use_gpu else {})


def new_train_actors(
    rows: Iterable[Any], before: frozenset[str], dead_too: bool = False
) -> tuple[list[Any], list[Any]]:
    """(controllers, workers) among state-API actor rows: Train actors not alive before the
    group began, and not dead unless ``dead_too`` (Ray marks an actor DEAD when its owner
    goes, but a frozen process of it lives on until its raylet's kill timer fires)."""
    fresh = [r for r in rows if r.actor_id not in before and (dead_too or r.state != "DEAD")]
    by = lambda name: sorted((r for r in fresh if r.class_name == name), key=lambda r: r.actor_id)  # noqa: E731
    return by(CONTROLLER), by(WORKER)


def local_pids(rows: Iterable[Any], node_id: str) -> list[int]:
    """Process ids of the rows on this node (another node's processes are not ours to
    signal: its raylet ends them when their placement group goes)."""
    return sorted({r.pid for r in rows if r.node_id == node_id and (r.pid or 0) > 0})


def shortfall(need: dict[str, float], available: dict[str, float]) -> dict[str, float]:
    """What of ``need`` the cluster does not have available (empty: all of it)."""
    missing = {k: v - available.get(k, 0.0) for k, v in need.items()}
    return {k: v for k, v in missing.items() if v > 1e-9}


def wait_until(
    probe: Callable[[], T], ok: Callable[[T], bool], timeout_s: float,
    clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], Any] = time.sleep,
) -> tuple[bool, T]:  # fmt: skip
    """Ask ``probe()`` until ``ok`` holds or ``timeout_s`` passed: (held, last answer).
    Asked at least once, and once more at the end of the wait."""
    end = clock() + timeout_s
    while True:
        seen = probe()
        if ok(seen):
            return True, seen
        left = end - clock()
        if left <= 0:
            return False, seen
        sleep(min(POLL_S, left))


def snapshot() -> Snapshot | None:
    """This job's live placement groups and Train actors; None when the state API does not
    answer (then ``reclaim`` removes and kills nothing)."""
    pgs, actors = _placement_groups(), _actors()
    if pgs is None or actors is None:
        return None
    # dead ones too: an earlier group's dead workers must not count as this group's
    return Snapshot(frozenset(pgs), frozenset(r.actor_id for r in actors))


def reclaim(before: Snapshot | None, need: dict[str, float], wait_s: float = WAIT_S) -> Reclaimed:
    """End the group begun after ``before``: kill its controllers (and wait until they are
    dead), its workers, remove its placement groups, then wait up to ``wait_s`` until
    ``need`` is available. ``missing`` says what was not, when the wait ran out."""
    import ray
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    done, start = Reclaimed(), time.monotonic()
    here = ray.get_runtime_context().get_node_id()
    if before is not None:
        controllers, _ = new_train_actors(_actors() or [], before.actors)
        _kill(local_pids(controllers, here), CONTROLLER)  # on the caller's node
        done.controllers = [r.actor_id for r in controllers]
        gone = lambda rows: not new_train_actors(rows or [], before.actors)[0]  # noqa: E731
        wait_until(_actors, gone, wait_s / 3)  # a dead controller makes nothing more
        _, workers = new_train_actors(_actors() or [], before.actors, dead_too=True)
        _kill(local_pids(workers, here), WORKER)
        done.workers = [r.actor_id for r in workers]
        done.placement_groups = sorted((_placement_groups() or set()) - before.placement_groups)
        for pg in done.placement_groups:
            with contextlib.suppress(Exception):  # removed meanwhile (its cleaner was faster)
                remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(pg)))
    left = max(1.0, wait_s - (time.monotonic() - start))
    ok, missing = wait_until(lambda: shortfall(need, ray.available_resources()), _empty, left)
    done.missing, done.waited_s = ({} if ok else missing), time.monotonic() - start
    return done


def _empty(missing: dict[str, float]) -> bool:
    return not missing


def _kill(pids: list[int], actor_class: str) -> None:
    for pid in pids:
        if is_actor_process(pid, actor_class):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def is_actor_process(pid: int, actor_class: str) -> bool:
    """Whether ``pid`` is still a process of a Ray actor of ``actor_class`` (its title is
    ``ray::<class>`` or ``ray::<class>.<method>``): a dead actor's pid may have been given to
    another process since. False where /proc is not."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return title.split(b".")[0].strip() == f"ray::{actor_class}".encode()


def _actors() -> list[Any] | None:
    """This job's actors (state-API rows); None when the state API does not answer."""
    import ray
    from ray.util.state import list_actors

    job = ray.get_runtime_context().get_job_id()
    try:
        return list_actors(
            filters=[("job_id", "=", job)], limit=10_000, raise_on_missing_output=False
        )
    except Exception:  # no dashboard (its state API): leave the actors to Ray
        return None


def _placement_groups() -> set[str] | None:
    """Ids of this job's placement groups not yet removed (another user's on a shared
    cluster are never counted); None when Ray's state API does not answer."""
    import ray
    from ray.util.state import list_placement_groups

    job = ray.get_runtime_context().get_job_id()
    try:
        rows = list_placement_groups(
            filters=[("creator_job_id", "=", job)], limit=10_000, raise_on_missing_output=False
        )
    except Exception:  # no dashboard (its state API): leave placement groups to Ray
        return None
    return {row.placement_group_id for row in rows if row.state != "REMOVED"}
