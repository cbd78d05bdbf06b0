"""One way to run a Ray Train worker group from the driver: build the TorchTrainer, run
``fit()`` in a thread, and drain the queue its workers report to.

Search groups, the probe and training runs all go through here. ``fit()`` blocks until the
group ends, while the workers' messages must be read as they come (to dispatch the next
configuration, print a probe row, log a training step), so ``fit()`` runs in a daemon thread
and the calling thread drains the queue.
"""

from __future__ import annotations

import contextlib
import queue as std_queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestrator.cluster.reclaim import WAIT_S, Reclaimed, reclaim, snapshot
from orchestrator.cluster.session import backend_name

POLL_S = 0.5
"""How long one wait on the queue lasts before ``stop`` is asked again."""


@dataclass(frozen=True)
class GroupSpec:
    """What a worker group is: its entry point, size, devices, environment and run folder."""

    loop: Callable[[dict[str, Any]], None]
    loop_config: dict[str, Any]
    name: str
    storage_path: str | None
    num_workers: int | tuple[int, int]
    """A fixed size, or (min, max) for an elastic training run."""
    use_gpu: bool
    cpus_per_worker: float
    env: dict[str, str]
    """Worker environment variables: NCCL reads most of them once per process, so only fresh
    worker processes started with them see them (never set after start)."""
    timeout_s: int
    """The process group's collective timeout."""
    max_failures: int = 0
    scaling: dict[str, Any] = field(default_factory=dict)
    """Extra ScalingConfig arguments (a label selector, the elastic resize interval)."""
    run: dict[str, Any] = field(default_factory=dict)
    """Extra RunConfig arguments (checkpoints, callbacks)."""


def torch_trainer(spec: GroupSpec) -> Any:
    """The TorchTrainer of ``spec``."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    return TorchTrainer(
        spec.loop,
        train_loop_config=spec.loop_config,
        torch_config=TorchConfig(backend=backend_name(spec.use_gpu), timeout_s=spec.timeout_s),
        scaling_config=ScalingConfig(
            num_workers=spec.num_workers,
            use_gpu=spec.use_gpu,
            resources_per_worker={"CPU": spec.cpus_per_worker}
            | ({"GPU": 1} if spec.use_gpu else {}),
            **spec.scaling,
        ),
        run_config=RunConfig(
            name=spec.name,
            storage_path=spec.storage_path,
            worker_runtime_env={"env_vars": dict(spec.env)},
            failure_config=FailureConfig(max_failures=spec.max_failures),
            **spec.run,
        ),
    )


class Fit:
    """``trainer.fit()`` running in a daemon thread; ``error`` holds what it raised.

    ``owned``: the fit runs in a Ray task of its own (on this node) that owns the Train
    controller, so ``end()`` can end the whole group: killing the task ends the controller and,
    by Ray's ownership, its workers, frozen ones included (a frozen process cannot end itself).
    A Tune trial needs no such owner: ``release`` kills its controller and workers by their
    processes (Tune ending the trial's actor, which owns the group, comes too late: the
    controller retries a failed start with a new placement group meanwhile).
    """

    def __init__(
        self, trainer: Any, owned: bool = False, env: dict[str, str] | None = None
    ) -> None:
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.ref: Any = None
        """The owning task (``owned`` only)."""
        self.before = snapshot()
        """This job's placement groups and Train actors before this group (``release``
        leaves them)."""
        run = self._owned(trainer, env or {}) if owned else trainer.fit
        threading.Thread(target=self._fit, args=(run,), daemon=True).start()

    def _owned(self, trainer: Any, env: dict[str, str]) -> Callable[[], Any]:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        task = ray.remote(_fit_trainer).options(
            num_cpus=0, max_retries=0, scheduling_strategy=here,
            runtime_env={"env_vars": env} if env else None,
        )  # fmt: skip
        self.ref = task.remote(trainer)
        return lambda: ray.get(self.ref)

    def _fit(self, run: Callable[[], Any]) -> None:
        try:
            run()
        except BaseException as e:  # handed to the caller through ``error``, never lost
            self.error = getattr(e, "cause", None) or e  # a task's error: what fit() raised
        finally:
            self.done.set()

    def end(self, wait_s: float = 30.0) -> bool:
        """End an owned group now (its controller and workers); True once the fit returned."""
        import ray

        if self.ref is None:  # nothing of ours to end it: ``release`` does
            return self.done.is_set()
        if not self.done.is_set():
            ray.cancel(self.ref, force=True, recursive=True)
        return self.done.wait(wait_s)

    def drain(
        self,
        reports: Any,
        on_item: Callable[[Any], None],
        stop: Callable[[], bool] = lambda: False,
    ) -> bool:
        """Hand every report to ``on_item`` until the group ended and its queue is empty
        (True), or until ``stop()`` says to stop waiting while it still runs (False).
        ``stop`` is asked at least every ``POLL_S``: the place for bounds and heartbeats."""
        from ray.util.queue import Empty

        while not self.done.is_set() or not reports.empty():
            with contextlib.suppress(Empty, std_queue.Empty):
                on_item(reports.get(timeout=POLL_S))
            if not self.done.is_set() and stop():
                return False
        return True

    def release(self, need: dict[str, float] | None = None, wait_s: float = WAIT_S) -> Reclaimed:
        """Take back what this group held, though it never finished starting: its Train
        controller (so it cannot retry with a new placement group), its workers, the
        placement groups this job made since it began (one group at a time), then wait up
        to ``wait_s`` until ``need`` is available (``orchestrator.cluster.reclaim`` says why Ray
        alone leaves them held)."""
        return reclaim(self.before, need or {}, wait_s)


def _fit_trainer(trainer: Any) -> None:
    """An owned fit's task body (module level: Ray ships it by reference)."""
    trainer.fit()


def say(line: str) -> None:
    """A plain line, flushed at once: a log file reads like the terminal (no redraws)."""
    print(line, flush=True)


class Heartbeat:
    """A plain line after ``every_s`` of silence, so a long wait is never silent.

    ``quiet()`` says the user just saw something (a result line); ``beat(text)`` prints
    ``text()`` when nothing was shown for ``every_s``. ``text`` is only built when due.
    """

    def __init__(
        self,
        every_s: float,
        out: Callable[[str], Any] = say,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every_s, self.out, self.clock = every_s, out, clock
        self.last = clock()

    def quiet(self) -> None:
        self.last = self.clock()

    def beat(self, text: Callable[[], str]) -> bool:
        """Print ``text()`` if due; False (never stops a drain: usable as its ``stop``)."""
        now = self.clock()
        if now - self.last >= self.every_s:
            self.out(text())
            self.last = now
        return False
