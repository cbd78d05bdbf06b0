"""What a training run's driver sees and keeps: progress lines, restarts with reasons, summary.

Reports arrive from the Train controller (``RunRelay``) through a Ray queue: rank 0's metrics
of every step, and the exceptions that ended a worker group. ``RunLog`` turns them into the
lines a user reads, ``progress.csv``, ``grad_norms.csv``, ``events.jsonl`` and ``summary.json``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray.train.v2.api.callback import UserCallback

from orchestrator.runfiles import (
    EVENTS_JSONL,
    GRAD_NORMS_CSV,
    PROGRESS_CSV,
    Board,
    Summary,
    below_searched,
    write_summary,
)
from orchestrator.train.progress import StepProgress
from orchestrator.train.tune_lines import tune_line
from train_fns import metrics as m
from train_fns.commsplit import comm_fraction

PROGRESS_COLUMNS = (
    "attempt", m.STEP, m.WALL_TIME, m.LOSS, m.SAMPLES_PER_S, m.STEP_TIME_S, m.WORLD_SIZE,
    m.ACCUMULATION_STEPS, m.MICRO_BATCH, m.GLOBAL_BATCH, m.SAMPLES_SEEN, m.DATA_S, m.OPTIM_S,
    m.EXPOSED_COMM_S, m.COMPUTE_S, m.GRAD_NORM, m.LOSS_SCALE, m.LR, m.CHECKPOINT_STEP,
    "entry_size", "searched_samples_per_s",
)  # fmt: skip
"""``entry_size``: the world size whose tuned entry the step ran
(``orchestrator.config.size_entries``);
``searched_samples_per_s``: what the search measured for that entry."""
BOARD_COLUMNS = (m.LOSS, m.SAMPLES_PER_S, m.STEP_TIME_S, m.WORLD_SIZE, m.ACCUMULATION_STEPS,
                 m.GRAD_NORM, m.LR)  # fmt: skip
"""A logged step's columns shown in TensorBoard, with the communication share of the step."""


class RunRelay(UserCallback):
    """On the Train controller: ship rank 0's report and any worker exception to the driver."""

    def __init__(self, queue: Any) -> None:
        self._queue = queue
        self._refreshed_at = -math.inf

    def after_report(self, run_context: Any, metrics: list[dict], checkpoint: Any) -> None:
        self._queue.put({"report": metrics[0], "checkpoint": getattr(checkpoint, "path", None)})

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        texts = {rank: f"{type(e).__name__}: {e}"[:500] for rank, e in worker_exceptions.items()}
        self._queue.put({"failure": texts, "time": time.time()})
        if time.monotonic() - self._refreshed_at > REFRESH_EVERY_S:  # once per failure
            self._refreshed_at = time.monotonic()
            refresh_cluster_view()  # the restart that follows is sized next


COORDINATOR = ("AutoscalingCoordinator", "AutoscalingCoordinator")
"""Ray Train's elastic policy sizes a restart from Ray's autoscaling coordinator (this named
actor, name and namespace), whose view of the nodes is refreshed every 20 s (Ray 2.60): after a
node loss it still offers the lost node's CPUs, so the restart asks for the old size and waits
``train.start_timeout_s`` before asking for the size the cluster has (10 of 18 s of a recovery
on the local twin)."""
POLICY_CACHE_S = 1.0
"""The policy asks the coordinator at most once a second (Ray 2.60) and keeps the answer."""
REFRESH_EVERY_S = 10.0
"""A failing group is reported at every poll until it is replaced (and while Ray preempts
it): the controller's loop is held for the refresh once, not at each."""


def refresh_cluster_view() -> None:
    """On the Train controller, as a worker group fails: make the coordinator re-read the
    nodes now and let the policy's cached answer expire, so that the restart is sized from the
    cluster as it is. Best effort: a Ray without this actor or method keeps its own timing."""
    import ray

    try:
        actor = ray.get_actor(*COORDINATOR)
        ray.get(actor.get_reserved_resources.remote("commtune", recompute=True), timeout=5)
    except (ValueError, AttributeError, TypeError, ray.exceptions.RayError):
        return
    time.sleep(POLICY_CACHE_S)


def snapshot_line(event: dict[str, Any], max_mb: float) -> str:
    """What a failure would re-do at most: the snapshot interval, or the checkpoint's (and
    which setting turned snapshots off)."""
    every, state_mb = event.get("snapshot_every") or 0, event.get("state_mb") or 0.0
    if every:
        return (f"snapshots: every {every} steps and at each checkpoint ({state_mb:.1f} MB kept "
                "on the driver's node): a lost node re-does at most that many steps (more only "
                "where the newest snapshot was still on its way)")  # fmt: skip
    if event.get("snapshot_off") == "keeper":
        return ("snapshots: off for this start, the keeper on the driver's node did not answer: "
                "a failure re-does up to train.checkpoint_every steps")  # fmt: skip
    if event.get("snapshot_off") == "train.snapshot_max_mb":
        return (f"snapshots: off, the state weighs {state_mb:.1f} MB > train.snapshot_max_mb="
                f"{max_mb:g}: a failure re-does up to train.checkpoint_every steps")  # fmt: skip
    return ("snapshots: off (train.snapshot_every is 0, or checkpoints come every step or two): "
            "a failure re-does up to train.checkpoint_every steps")  # fmt: skip


def failure_reason(texts: dict[int, str], nodes_lost: int = 0) -> str:
    """Node lost or worker died: fewer alive nodes than before, or what Ray said."""
    joined = " ".join(texts.values()).lower()
    if nodes_lost > 0 or ("node" in joined and ("died" in joined or "lost" in joined)):
        return "node lost"
    return "worker died"


@dataclass
class Restart:
    reason: str
    failed_at: float | None
    last_step: int
    resumed_from: int
    world_before: int
    world_after: int
    first_step_at: float | None = None
    source: str = "checkpoint"
    """What it resumed from: ``checkpoint``, ``snapshot`` (``train_fns.snapshots``) or
    ``start`` (neither existed yet: it started over)."""
    launched_at: float | None = None
    """When the new group's worker function began (Ray's restart before it)."""
    started_at: float | None = None
    setup_s: dict[str, float] = field(default_factory=dict)
    """The new group's seconds from ``launched_at`` to its start, by phase."""

    @property
    def redone(self) -> int:
        return max(0, self.last_step - self.resumed_from)

    def line(self) -> str:
        where = (f"resumed from the {self.source} at step {self.resumed_from}"
                 if self.source != "start" else "started over from step 0")  # fmt: skip
        return (
            f"restart: {self.reason}; {self.world_before} -> {self.world_after} workers, {where} "
            f"({self.redone} step(s) re-done){self.wait()}"
        )

    def wait(self) -> str:
        """How long from the failure to the first step, and where that time went."""
        if not (self.failed_at and self.first_step_at):
            return ""
        text = f", first step {self.first_step_at - self.failed_at:.1f}s after the failure was seen"
        if not (self.launched_at and self.started_at):
            return text
        parts = [f"new worker group {self.launched_at - self.failed_at:.1f}s"]
        parts += [f"{name} {s:.1f}s" for name, s in self.setup_s.items() if s >= 0.05]
        parts.append(f"first step {self.first_step_at - self.started_at:.1f}s")
        return f"{text} ({', '.join(parts)})"


@dataclass
class RunLog:
    out: Path
    steps: int
    log_every: int
    progress_file: Path | None = None
    alive_nodes: Callable[[], int] | None = None
    """Counts the cluster's alive nodes: a failure with fewer of them is a lost node."""
    nodes: int = 0
    attempt: int = 0
    world: int = 0
    last_step: int = 0
    pending_failure: dict[str, Any] | None = None
    restarts: list[Restart] = field(default_factory=list)
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    entry: dict[str, Any] = field(default_factory=dict)
    """The running start's entry: its size and what the search measured for it."""
    snapshot_max_mb: float = 0.0
    """train.snapshot_max_mb, named where a state too large for snapshots is said."""
    snapshot_s: list[float] = field(default_factory=list)
    """The seconds of every snapshot taken, as the steps came (a re-done step's row replaces
    the first one's; its snapshot counts again)."""
    held_back: int = 0
    """Snapshots not sent: the previous one was still on its way."""

    def __post_init__(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self._progress = self._csv(PROGRESS_CSV, PROGRESS_COLUMNS)
        self._norms = self._csv(GRAD_NORMS_CSV, ("step", "layer", "norm"))
        self._events = (self.out / EVENTS_JSONL).open("a")
        self._board = Board(self.out, "train")
        self._view = StepProgress(self.steps)

    def _csv(self, name: str, columns: tuple) -> Any:
        """``name`` opened to append rows of ``columns``; a file an older version wrote with
        other columns (a resumed run) is rewritten under these first, its rows kept."""
        path = self.out / name
        old = list(csv.DictReader(path.open(newline=""))) if path.exists() else None
        if old is not None and old and list(old[0]) == list(columns):
            old = None  # the same columns: append
        handle = path.open("a" if old is None and path.exists() else "w", newline="")
        writer = csv.writer(handle)
        if handle.mode == "w":
            writer.writerow(columns)
            writer.writerows([[row.get(c) for c in columns] for row in old or []])
        return handle, writer

    def take(self, item: dict[str, Any]) -> None:
        if "failure" in item:
            self._on_failure(item)
            return
        for row in item["report"].get(m.ROWS, []):
            for event in row.get(m.EVENTS, []):
                self._on_event(event, row)
            if m.STEP in row:
                self._on_step(row)

    def _on_failure(self, item: dict[str, Any]) -> None:
        """Remember the failure for the restart that follows; the last finished step comes from
        rank 0's progress file (reports arrive in batches)."""
        if self.progress_file is not None and self.progress_file.exists():
            self.last_step = max(self.last_step, int(self.progress_file.read_text() or 0))
        nodes = self.alive_nodes() if self.alive_nodes else self.nodes
        item["reason"] = failure_reason(item["failure"], self.nodes - nodes)
        self.nodes = nodes
        self.pending_failure = item
        self._event({"kind": "failure", "step": self.last_step, **item})
        text = next(iter(item["failure"].values()), "")[:200]
        print(f"failure after step {self.last_step}: {item['reason']}: {text}", flush=True)

    def _on_event(self, event: dict[str, Any], report: dict[str, Any]) -> None:
        self._event(event)
        kind = event["kind"]
        if kind == "start":
            self._on_start(event, report)
        elif kind == "resplit":
            print(f"step {event['step']}: comm/compute {event['ratio']:.2f} -> accumulation "
                  f"{event['from'][0]} -> {event['to'][0]}, micro-batch {event['to'][1]}, "
                  f"global batch {event['to'][2]}, lr {event['lr']:.3g}", flush=True)  # fmt: skip
        elif kind == "no_split":
            print(f"waiting: {event['message']}", flush=True)
        elif kind.startswith("tune_"):
            print(tune_line(event), flush=True)

    def _on_start(self, event: dict[str, Any], report: dict[str, Any]) -> None:
        self.attempt += 1
        if self.alive_nodes is not None:
            self.nodes = self.alive_nodes()
        world, resumed = event["world_size"], event.get("resumed_from_step")
        self.entry = {k: event.get(k) for k in ("entry_size", "searched_samples_per_s")}
        if event.get("entry_line"):
            print(f"entry: {event['entry_line']}", flush=True)
        if self.attempt == 1:
            where = f"resuming from step {resumed}" if resumed else "from step 0"
            print(f"training on {world} worker(s), {where}: accumulation "
                  f"{event['accumulation_steps']} x micro-batch {event['micro_batch']} x "
                  f"{world} = global batch {event['global_batch']}", flush=True)  # fmt: skip
            print(snapshot_line(event, self.snapshot_max_mb), flush=True)
        else:
            self._restart(event, world, resumed or 0)
        self.world = world

    def _restart(self, event: dict[str, Any], world: int, resumed: int) -> None:
        failure = self.pending_failure
        if failure is not None:
            reason = failure["reason"]
        else:
            reason = "node added: scaled up" if world > self.world else "resized"
        restart = Restart(reason, failure and failure["time"], self.last_step, resumed,
                          self.world, world, source=event.get("resumed_from") or "start",
                          launched_at=event.get("launched_at"), started_at=event.get("started_at"),
                          setup_s=event.get("setup_s") or {})  # fmt: skip
        self.restarts.append(restart)
        self.pending_failure = None
        split = f"accumulation {event['accumulation_steps']} x micro-batch {event['micro_batch']}"
        print(f"{restart.line()}; {split} (global batch {event['global_batch']})", flush=True)

    def _on_step(self, report: dict[str, Any]) -> None:
        step = report[m.STEP]
        if self.restarts and self.restarts[-1].first_step_at is None:
            restart = self.restarts[-1]
            restart.first_step_at = report[m.WALL_TIME]
            if restart.failed_at:
                print(f"recovered: {restart.redone} step(s) re-done{restart.wait()}", flush=True)
        self.last_step = step
        self._count_snapshot(report, step)
        self.rows[step] = report = {**report, **self.entry}
        handle, writer = self._progress
        writer.writerow([self.attempt, *(report.get(c) for c in PROGRESS_COLUMNS[1:])])
        handle.flush()
        share = comm_fraction(report.get(m.EXPOSED_COMM_S), report.get(m.COMPUTE_S))
        self._board.add({**{k: report.get(k) for k in BOARD_COLUMNS}, "comm_share": share},
                        step, "train/")  # fmt: skip
        self._view.update(step, report.get(m.LOSS), report.get(m.SAMPLES_PER_S),
                          report.get(m.WORLD_SIZE))  # fmt: skip
        for layer, norm in (report.get(m.LAYER_GRAD_NORMS) or {}).items():
            self._norms[1].writerow([step, layer, norm])
        if step % self.log_every == 0 or step == self.steps or report.get(m.CHECKPOINT_STEP):
            saved = " [checkpoint]" if report.get(m.CHECKPOINT_STEP) else ""
            print(f"step {step:>6}/{self.steps}  loss {report[m.LOSS]:.4f}  "
                  f"{report[m.SAMPLES_PER_S]:8.1f} samples/s  world {report[m.WORLD_SIZE]}{saved}",
                  flush=True)  # fmt: skip

    def _count_snapshot(self, report: dict[str, Any], step: int) -> None:
        """A step's snapshot, taken (its seconds) or held back (said the first time)."""
        if report.get(m.SNAPSHOT_S) is not None:
            self.snapshot_s.append(report[m.SNAPSHOT_S])
        if not report.get(m.SNAPSHOT_HELD_BACK):
            return
        self.held_back += 1
        if self.held_back == 1:
            print(f"snapshots: the one at step {step} was held back, the previous still on its "
                  "way to the driver's node (a link slower than one snapshot every "
                  "train.snapshot_every steps): a failure may re-do more", flush=True)  # fmt: skip

    def _event(self, event: dict[str, Any]) -> None:
        self._events.write(json.dumps(event, default=str) + "\n")
        self._events.flush()

    def summary(self, wall_s: float, error: str | None,
                tune: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
        """The run's summary, written whole to summary.json (``runfiles.Summary``); returned as
        the mapping written (``Summary.from_mapping`` reads it back typed). ``tune``: the
        tuning judge's account (``orchestrator.train.tune``), where the run tuned."""
        totals = dataclasses.replace(self.totals(wall_s, error), tune=tune)
        write_summary(self.out, totals)
        return totals.as_mapping()

    def totals(self, wall_s: float, error: str | None) -> Summary:
        """The run's totals over its logged steps; warns above 0.1% non-finite steps."""
        rows = [self.rows[s] for s in sorted(self.rows)]
        nonfinite = sum(1 for r in rows if not _finite(r.get(m.GRAD_NORM)))
        rate = nonfinite / len(rows) if rows else 0.0
        if rate > m.NONFINITE_RATE_MAX:
            self.warnings.append(
                f"{nonfinite} of {len(rows)} steps ({rate:.2%}) had non-finite gradients and were"
                " skipped (above 0.1%): check precision (bf16 rather than fp16), the learning "
                "rate and clipping"
            )
        return Summary(
            steps=self.last_step,
            steps_wanted=self.steps,
            final_loss=rows[-1][m.LOSS] if rows else None,
            wall_s=wall_s,
            samples_per_s=_median([r[m.SAMPLES_PER_S] for r in rows]),
            wall_samples_per_s=wall_samples_per_s(rows),
            comm_fraction=_fraction(rows, m.EXPOSED_COMM_S),
            data_fraction=_share(rows, m.DATA_S),
            nonfinite_steps=nonfinite,
            nonfinite_rate=rate,
            loss_scale=rows[-1].get(m.LOSS_SCALE) if rows else None,
            world_sizes=sorted({r[m.WORLD_SIZE] for r in rows}),
            by_size=self._by_size(rows),
            restarts=[vars(r) | {"line": r.line()} for r in self.restarts],
            snapshots=_snapshots(self.snapshot_s, self.held_back),
            warnings=list(self.warnings),
            error=error,
        )

    def _by_size(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Per world size: the steps trained, their median samples/s, the entry that ran and
        what the search measured for it; a size well below its own figure is warned about."""
        out = []
        for world in sorted({r[m.WORLD_SIZE] for r in rows}):
            mine = [r for r in rows if r[m.WORLD_SIZE] == world]
            entry = {k: mine[-1].get(k) for k in ("entry_size", "searched_samples_per_s")}
            out.append(
                {
                    "world_size": world,
                    "steps": len(mine),
                    "samples_per_s": _median([r[m.SAMPLES_PER_S] for r in mine]),
                    **entry,
                }
            )
        for size, share in below_searched(out):
            self.warnings.append(
                f"{size['world_size']:g} workers trained at {size['samples_per_s']:.1f} samples/s, "
                f"{share:.0%} of the {size['searched_samples_per_s']:.1f} the search measured "
                "there: another job on the nodes, a different placement, or a configuration "
                "worth searching again"
            )
        return out

    def close(self) -> None:
        for handle in (self._progress[0], self._norms[0], self._events):
            handle.close()
        self._board.close()
        self._view.close()


def _snapshots(took: list[float], held_back: int) -> dict[str, Any] | None:
    """How many snapshots the run took (a re-done step's too), what one cost, how many were
    held back (None: none taken or held)."""
    if not took and not held_back:
        return None
    return {"taken": len(took), "median_s": _median(took), "total_s": sum(took),
            "held_back": held_back}  # fmt: skip


def wall_samples_per_s(rows: list[dict[str, Any]]) -> float | None:
    """Samples trained over the wall-clock from the first row's step start to the last row's
    step end: what a user pays, the reports, checkpoints, snapshots, no-sync references and
    restarts between steps included, which the per-step figure leaves out. Each row is one
    step (a re-done one once), its samples its step's global batch (samples/s x seconds)."""
    keys = (m.WALL_TIME, m.STEP_TIME_S, m.SAMPLES_PER_S)
    if not rows or any(r.get(k) is None for r in rows for k in keys):
        return None
    first, last = rows[0], rows[-1]
    span = last[m.WALL_TIME] - (first[m.WALL_TIME] - first[m.STEP_TIME_S])
    samples = sum(r[m.SAMPLES_PER_S] * r[m.STEP_TIME_S] for r in rows)
    return samples / span if span > 0 else None


def _finite(value: Any) -> bool:
    return value is None or math.isfinite(value)


def _median(values: list[float]) -> float | None:
    values = sorted(values)
    return values[len(values) // 2] if values else None


def _fraction(rows: list[dict[str, Any]], key: str) -> float | None:
    comm = sum(r.get(key) or 0.0 for r in rows)
    return comm_fraction(comm, sum(r.get(m.COMPUTE_S) or 0.0 for r in rows))


def _share(rows: list[dict[str, Any]], key: str) -> float | None:
    """``key``'s share of the step time over the rows that measured it: only profiled steps
    split their time into phases (train_fns.trainer), the others leave it blank."""
    rows = [r for r in rows if r.get(key) is not None]
    total = sum(r[m.STEP_TIME_S] for r in rows)
    return sum(r[key] for r in rows) / total if total else None
