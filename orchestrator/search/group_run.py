"""One worker group measuring several configurations (warm evaluation), watched from the driver.

``fit()`` blocks, so it runs in a daemon thread while this thread takes the workers' messages
from a queue on the driver's node (``train_fns.group`` says what they send) and turns each
configuration into an outcome as soon as every rank has finished it. Only then is the next
configuration drawn from the source and put in the workers' inbox (one copy per rank), so the
source may choose it knowing every outcome so far.

Every wait is bounded here, in the driver, since a frozen worker cannot run its own watchdog:
the group's start (until every rank said it is ready) by ``search.start_timeout_s`` (sooner once
starts have been seen: ``bound_of``), each configuration by ``search.trial_timeout_s``. One that
runs past its bound is a ``hang`` with its phase and ends the group (``Fit.release``, one group
at a time): its Train controller is killed first (it would retry a failed start with a new
placement group), then its workers, then the placement groups made since it began (Ray Train
leaves one behind when a group ends while it starts), and the next group starts once the cluster
has the resources back (a line says so when they are not back within 30 s). On the driver (re-
measurement, scaling: ``owned``), the task that owns the group is killed as well. Whatever the
group did not reach is returned as None: the caller re-queues it. While it waits, a heartbeat
line says what it waits on.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from orchestrator.cluster.placement import (
    PlacementError,
    gpu_uuids,
    held_here,
    layout_for,
    placement_label,
)
from orchestrator.cluster.reclaim import group_need
from orchestrator.cluster.session import driver_queue
from orchestrator.cluster.workers import Fit, GroupSpec, Heartbeat, say, torch_trainer
from orchestrator.search.outcome import (
    classify_failure,
    failure_texts,
    summarize,
    window_throughputs,
)
from train_fns import metrics as m
from train_fns.plan import TrialPlan

Outcome = dict[str, Any]
WARM_WARMUP_STEPS = 2
"""Warm-up steps of a configuration after the group's first, and the least that leaves its
measured steps unbiased: the processes, libraries and thread pools are warm already. The first
step is the guard's (dropout off), which checks the update as well as the gradients
(``train_fns.guard.Guard``) and allocates the optimizer's state; the second is the first in
train mode (dropout, activation checkpointing as Hugging Face models run it only in training)
and the one where DDP rebuilds its buckets in the order the first backward used. Both cost
differently from the steps after them, and by a configuration's knobs; no later step does
(``benchmarks.calibration.step_noise --rebuild``; the record named step-noise-rebuild in
benchmarks/results/)."""


Source = Iterator[tuple[TrialPlan, dict[str, str]]]
"""(plan, environment variables) pairs; every environment must equal the first's."""
START, MEASURE = "start", "measure"
"""Phases of a configuration a hang is recorded in: its group's start, its measurement."""


def waiting_on(
    index: int, ready: int, world_size: int, fit_start: float, started: dict[int, float],
    dispatched: float,
) -> tuple[str, float]:  # fmt: skip
    """What configuration ``index`` waits on, and since when: the group's start until all
    ``world_size`` ranks are ready (the first only), then its measurement."""
    if index == 0 and ready < world_size:
        return START, fit_start
    return MEASURE, started.get(index, dispatched)


START_MULTIPLE, START_FLOOR_S = 4.0, 60.0
"""Once the search has seen its groups start, a start is a hang at ``START_MULTIPLE`` times
the slowest seen (never under ``START_FLOOR_S``, never over ``search.start_timeout_s``): a frozen
worker then costs a minute or two, not the full bound. The floor is above the slowest healthy
start seen on a loaded 2-core machine (trial 0's cold start, imports included, about 40 s);
a start that is merely slow stays well inside a multiple of the slowest seen."""


def bound_of(
    phase: str, start_timeout_s: float, trial_timeout_s: float, slowest_start_s: float | None
) -> tuple[str, float]:
    """What bounds ``phase`` (as a reason shows it) and its seconds; a start's bound adapts to
    the slowest group start seen so far (None: none seen yet)."""
    if phase != START:
        return f"search.trial_timeout_s={trial_timeout_s:g}s", trial_timeout_s
    configured = f"search.start_timeout_s={start_timeout_s:g}s"
    if slowest_start_s is None:
        return configured, start_timeout_s
    adaptive = max(START_FLOOR_S, START_MULTIPLE * slowest_start_s)
    if adaptive >= start_timeout_s:
        return configured, start_timeout_s
    return (
        f"{adaptive:.0f}s ({START_MULTIPLE:g}x the slowest group start seen, "
        f"{slowest_start_s:.0f} s; {configured} is the most)", adaptive,
    )  # fmt: skip


def group_start_s(outcome: dict[str, Any]) -> float | None:
    """How long the group of a configuration took to start (its imports included), where it
    was the group's first and did start; None otherwise."""
    timings = outcome.get("timings")
    if outcome.get("phase") == START or not isinstance(timings, dict):
        return None
    try:
        seconds = float(timings.get("start_s") or 0.0) + float(timings.get("imports_s") or 0.0)
    except (TypeError, ValueError):  # not a record this code wrote
        return None
    return seconds if math.isfinite(seconds) and timings.get("start_s") else None


def slowest_start(
    outcomes: Iterable[dict[str, Any]], so_far: float | None = None
) -> float | None:
    """The slowest group start among ``outcomes`` and ``so_far`` (None: none seen)."""
    seen = [s for s in (so_far, *map(group_start_s, outcomes)) if s is not None]
    return max(seen, default=None)


class GroupRun:
    """Run the plans of a source (same environment variables, same world size) in one
    TorchTrainer, one after another."""

    def __init__(
        self, ctx: Any, name: str, nodes: list[str] | None = None,
        out: Callable[[str], Any] = say, owned: bool = False,
    ) -> None:  # fmt: skip
        self.marker_dir = Path(ctx.storage_path) / name / m.HANG_MARKER_DIR
        shutil.rmtree(self.marker_dir, ignore_errors=True)  # a rerun must not see old markers
        self.ctx, self.name, self.nodes, self.owned = ctx, name, nodes, owned
        self.plans: list[TrialPlan] = []
        self.outcomes: list[Outcome | None] = []
        self.ends: list[dict[int, dict]] = []
        self.started: dict[int, float] = {}
        self.ready: set[int] = set()
        """Ranks that said they are ready for the first configuration."""
        self.progress: dict[int, int] = {}
        """Measured windows so far, by configuration (rank 0's word)."""
        self.heartbeat = Heartbeat(ctx.config.search.heartbeat_s, out)
        self.imports_s = 0.0
        self.places: dict[int, dict[str, Any]] = {}
        """Where each rank runs, by rank, as it said when it started."""
        self.error: BaseException | None = None

    def run(
        self, source: Source, on_outcome: Callable[[int, Outcome], None] | None = None,
        label: Callable[[int], str] | None = None,
    ) -> list[Outcome | None]:  # fmt: skip
        """Measure every plan the source gives; ``on_outcome(index, outcome)`` is called as
        each one ends; ``label(index)`` names it in heartbeat lines ("trial 4"). Returns the
        outcomes in order, None for a plan the group did not reach."""
        first = next(source, None)
        if first is None:
            return []
        self.source, self.env = source, first[1]
        self.label = label or (lambda index: f"{self.name} run {index + 1}")
        reports, self.inbox = driver_queue(), driver_queue()
        self._dispatch(first)
        self.fit_start = self.boundary = time.monotonic()
        emit = on_outcome or (lambda index, outcome: None)
        try:
            spec = self._spec(reports)
        except PlacementError as e:  # the cluster lost nodes since the check: no group to wait on
            reports.shutdown()
            self.inbox.shutdown()
            reason = f"cluster.placement={self.ctx.config.cluster.placement}: {e}"
            self._finish(0, {m.STATE: m.ERROR, m.REASON: reason}, emit)
            return self.outcomes
        fit = Fit(torch_trainer(spec), owned=self.owned)
        try:
            take = lambda item: self._take(item, emit)  # noqa: E731
            if not fit.drain(reports, take, stop=lambda: self._late(emit)):
                fit.end()  # owned: the task owning the group is killed
                if self.owned or self.ctx.config.search.concurrency == 1:
                    self._release(fit)  # the whole group, though it never finished starting
                return self.outcomes  # a configuration overran its bound
        finally:
            if fit.done.is_set():  # a group ended early may still send: its queues go with it
                reports.shutdown()
                self.inbox.shutdown()
        self.error = fit.error
        current = self.current()
        if current is not None:  # the group ended during it (or, a bug, before it)
            outcome = {"phase": self._waiting(current)[0], **self._failed(current)}
            self._finish(current, outcome, emit)
        return self.outcomes

    def _release(self, fit: Fit) -> None:
        """Kill the group's controller and workers, remove its placement groups and wait
        (bounded) until a group of its size fits again; a line if it does not."""
        plan, cpus = self.plans[0], self.ctx.config.cluster.cpus_per_worker
        done = fit.release(group_need(plan.world_size, cpus, plan.use_gpu))
        if done.missing:
            short = ", ".join(f"{v:g} {k}" for k, v in sorted(done.missing.items()))
            self.heartbeat.out(
                f"{self.label(0)}'s worker group was ended, but its resources are not all back "
                f"after {done.waited_s:.0f} s ({short} short); the next group may wait for them"
            )

    def _late(self, emit: Callable[[int, Outcome], None]) -> bool:
        """True (and the configuration recorded as a hang) when the running one overran the
        bound of the phase it is in; otherwise a heartbeat line when one is due."""
        current = self.current()
        if current is None:
            return False
        phase, since = self._waiting(current)
        search = self.ctx.config.search
        bound, bound_s = bound_of(phase, search.start_timeout_s, search.trial_timeout_s,
                                  self.ctx.slowest_start_s)  # fmt: skip
        waited_s = time.monotonic() - since
        if waited_s <= bound_s:
            return self.heartbeat.beat(lambda: self._status(current, phase, waited_s))
        self._finish(current, self._hang(current, phase, bound), emit)
        return True

    def _waiting(self, index: int) -> tuple[str, float]:
        world = self.plans[index].world_size
        return waiting_on(
            index, len(self.ready), world, self.fit_start, self.started, self.dispatched
        )

    def _status(self, index: int, phase: str, waited_s: float) -> str:
        """A heartbeat line: what ``index`` waits on, for how long."""
        plan = self.plans[index]
        if phase == START:
            ready = f", {len(self.ready)} ready" if self.ready else ""
            workers = f"{plan.world_size} workers"
            return f"{self.label(index)}: starting {workers} ({waited_s:.0f} s{ready})"
        window = min(self.progress.get(index, 0) + 1, plan.num_windows)
        return f"{self.label(index)}: window {window}/{plan.num_windows} ({waited_s:.0f} s)"

    def _dispatch(self, item: tuple[TrialPlan, dict[str, str]] | None) -> None:
        """Put the next plan (or the end, None) in every rank's inbox."""
        if item is None:
            for _ in range(self.plans[0].world_size):
                self.inbox.put(None)
            return
        plan, env = item
        if env != self.env:
            raise ValueError(f"a worker group shares its environment: {env} != {self.env}")
        warmup = plan.warmup_steps if not self.plans else min(plan.warmup_steps, WARM_WARMUP_STEPS)
        plan = dataclasses.replace(plan, marker_dir=str(self.marker_dir), warmup_steps=warmup)
        self.plans.append(plan)
        self.outcomes.append(None)
        self.ends.append({})
        self.dispatched = time.monotonic()
        for _ in range(plan.world_size):
            self.inbox.put(plan.to_dict())

    def current(self) -> int | None:
        """The first configuration without an outcome (the one running, or next)."""
        return next((i for i, o in enumerate(self.outcomes) if o is None), None)

    def _spec(self, reports: Any) -> GroupSpec:
        import ray

        from train_fns.worker import train_loop_per_worker

        plan, cluster = self.plans[0], self.ctx.config.cluster
        layout = layout_for(ray.nodes(), self.nodes, plan.world_size, cluster.cpus_per_worker,
                            plan.use_gpu, cluster.placement, held_here())  # fmt: skip
        return GroupSpec(
            loop=train_loop_per_worker,
            loop_config={"inbox": self.inbox, "reports": reports},
            name=self.name,
            storage_path=self.ctx.storage_path,
            num_workers=plan.world_size,
            use_gpu=plan.use_gpu,
            cpus_per_worker=cluster.cpus_per_worker,
            env=self.env,
            timeout_s=int(plan.step_deadline_s) + 30,
            scaling=layout.scaling(),
        )

    def _take(self, item: dict[str, Any], emit: Callable[[int, Outcome], None]) -> None:
        index = item["index"]
        if item["kind"] == "window":
            self.progress[index] = item["window"]
            return
        if item["kind"] == "start":
            self._started(index, item.get("rank", 0), item.get("imports_s", 0.0))
            if item.get(m.PLACE):
                self.places[item.get("rank", 0)] = {"rank": item.get("rank", 0), **item[m.PLACE]}
            return
        self.ends[index][item["rank"]] = item
        if len(self.ends[index]) == self.plans[index].world_size:
            self._finish(index, self._measured(index), emit)
            self._dispatch(next(self.source, None))  # every rank waits for it

    def _started(self, index: int, rank: int, imports_s: float) -> None:
        """Configuration ``index`` began on ``rank``; the first counts as begun when every
        rank is ready (the group's start ends there)."""
        if index > 0:
            self.started[index] = time.monotonic()
            return
        self.ready.add(rank)
        if rank == 0:
            self.imports_s += imports_s
        if len(self.ready) == self.plans[0].world_size:
            self.started[0] = time.monotonic()

    def _finish(self, index: int, outcome: Outcome, emit: Callable[[int, Outcome], None]) -> None:
        self.heartbeat.quiet()  # its result line is what the user sees next
        now = time.monotonic()
        outcome["trial_wall_s"] = now - self.boundary
        outcome["timings"] = self._timings(index, outcome["trial_wall_s"])
        if self.places:  # every configuration of a group shares its placement
            outcome[m.RANK_PLACES] = [self.places[r] for r in sorted(self.places)]
            outcome[m.PLACEMENT] = placement_label(self.places.values())
            outcome[m.GPUS] = gpu_uuids(self.places.values())
        if self.ends[index]:  # the ranks that ended it, each in the process it ran in
            outcome[m.RANK_PIDS] = {str(r): e["pid"] for r, e in sorted(self.ends[index].items())}
        self.boundary = now
        self.outcomes[index] = outcome
        emit(index, outcome)

    def _windows(self, index: int) -> list[list[dict[str, Any]]]:
        """Window reports by window, each a list over ranks."""
        by_rank = [self.ends[index][r]["windows"] for r in sorted(self.ends[index])]
        return [list(ranks) for ranks in zip(*by_rank, strict=False)]

    def _measured(self, index: int) -> Outcome:
        plan, ends = self.plans[index], self.ends[index].values()
        ooms = [e["reason"] for e in ends if e["status"] == m.OOM]
        if ooms:
            return {m.STATE: m.OOM, m.REASON: f"out of memory ({len(ooms)} ranks): {ooms[0]}"}
        windows = self._windows(index)
        if any(e["status"] == m.PRUNED for e in ends):
            return self._pruned(plan, windows)
        return {m.STATE: m.COMPLETE, m.REASON: "", **summarize(windows, plan)}

    def _failed(self, index: int) -> Outcome:
        """The group ended while ``index`` ran: out of memory if a rank said so, else the
        classified failure of ``fit()``."""
        ooms = [e["reason"] for e in self.ends[index].values() if e["status"] == m.OOM]
        if ooms:
            return {m.STATE: m.OOM, m.REASON: f"out of memory (some ranks only): {ooms[0]}"}
        if self.error is None:
            return {m.STATE: m.ERROR, m.REASON: "the worker group ended without a result"}
        peak = max(
            (w[m.PEAK_MEM_BYTES] for e in self.ends[index].values() for w in e["windows"]),
            default=None,
        )
        markers = self._hang_markers()
        state, reason = classify_failure(self.error, self.plans[index], peak, markers)
        detail = "\n".join(failure_texts(self.error))[-4000:]
        return {m.STATE: state, m.REASON: reason, "failure": detail}

    def _hang_markers(self) -> list[str]:
        """What the workers' watchdogs left before ending themselves (empty: no hang)."""
        if not self.marker_dir.is_dir():
            return []
        markers = sorted(self.marker_dir.glob(m.HANG_MARKER.format(rank="*")))
        return [p.read_text().strip() for p in markers]

    @staticmethod
    def _pruned(plan: TrialPlan, windows: list[list[dict[str, Any]]]) -> Outcome:
        throughputs = window_throughputs(windows, plan.global_batch)
        shown = ", ".join(f"{t:.1f}" for t in throughputs)
        return {
            m.STATE: m.PRUNED,
            m.REASON: (
                f"windows at {shown} samples/s, all below {plan.prune_below:.1f} (the best so "
                "far minus 3x the measured noise, at least 5% each); stopped early"
            ),
            "window_samples_per_s": throughputs,
        }

    def _hang(self, index: int, phase: str, bound: str) -> Outcome:
        """A configuration that overran ``bound``: which phase, and what was last heard."""
        plan = self.plans[index]
        if phase == START:
            seen = f"{len(self.ready)} of {plan.world_size} workers ready"
        else:
            seen = f"{self.progress.get(index, 0)} of {plan.num_windows} windows measured"
        return {
            m.STATE: m.HANG,
            "phase": phase,
            m.REASON: (
                f"hang in phase {phase}: {seen} within {bound}; the worker group "
                "was ended and the configurations after it re-queued"
            ),
        }

    def _timings(self, index: int, wall_s: float) -> dict[str, float]:
        """Where this configuration's wall-clock went (the group's start is the first's)."""
        windows = self._windows(index) if self.ends[index] else []
        setup = max((w.get(m.SETUP_S) or {} for w in windows[0]), key=len) if windows else {}
        # a group that never started spent all of it starting
        start_end = self.started.get(0, self.fit_start + wall_s)
        parts = {
            "start_s": (start_end - self.fit_start) if index == 0 else 0.0,
            "imports_s": self.imports_s if index == 0 else 0.0,
            "build_s": setup.get("model_build_s", 0.0),
            "wrap_s": setup.get("wrap_s", 0.0),
            "warmup_s": setup.get("warmup_s", 0.0),
            "reference_s": setup.get("reference_s", 0.0),
            "measured_s": sum(max(w.get(m.WINDOW_WALL_S, 0.0) for w in r) for r in windows),
            # the workers freeing the configuration (garbage, cached memory, its groups)
            "free_s": max((e.get("free_s", 0.0) for e in self.ends[index].values()), default=0.0),
        }
        parts["start_s"] = max(0.0, parts["start_s"] - parts["imports_s"])
        parts["other_s"] = max(0.0, wall_s - sum(parts.values()))
        return parts
