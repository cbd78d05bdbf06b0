"""The Ray Train entry points: what a ``TorchTrainer`` runs in every worker process.

``train_loop_per_worker`` measures the search's configurations (``group.evaluate_plans``),
``train_loop_elastic`` runs a training run (``trainer.ElasticTrainer``), and
``probe_loop_per_worker`` the bandwidth sweep (``collectives.sweep``). Ray Train has already
initialised the process group (gloo or NCCL) and set the device; these only adapt Ray's
context. Imports are deferred so that importing ``train_fns`` (the driver does, for
``TrialPlan``) stays light.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Measure the plans the driver puts in ``config["inbox"]`` (one copy per rank; None ends
    the group) one after another in this worker group (warm evaluation), sending every message
    to the driver's queue ``config["reports"]``.

    The queue, not ``ray.train.report``: a report waits for the Train controller (about 2 s a
    call in Ray 2.60), which a search would spend per window instead of measuring.
    """
    imports_start = time.perf_counter()
    import ray.train
    import ray.train.torch

    from train_fns import metrics as m
    from train_fns.group import evaluate_plans
    from train_fns.plan import TrialPlan

    imports_s = time.perf_counter() - imports_start
    inbox = config["inbox"]

    def next_plan() -> TrialPlan | None:
        data = inbox.get()
        return None if data is None else TrialPlan.from_dict(data)

    context = ray.train.get_context()
    evaluate_plans(
        next_plan,
        rank=context.get_world_rank(),
        world_size=context.get_world_size(),
        device=ray.train.torch.get_device(),
        send=config["reports"].put,
        started={"imports_s": imports_s, m.PLACE: rank_place(context)},
    )


def rank_place(context: Any) -> dict[str, Any]:
    """Where this rank runs (sent once, with its first start message): a trial's throughput
    depends on how its ranks sit on the nodes, so the driver records it with the trial."""
    import ray
    import ray.train.torch

    from train_fns.ranks import gpu_uuid

    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "node_rank": context.get_node_rank(),
        "local_rank": context.get_local_rank(),
        "gpu_uuid": gpu_uuid(ray.train.torch.get_device()),
    }


def train_loop_elastic(config: dict[str, Any]) -> None:
    """Ray Train entry point of a training run (one call per worker-group start).
    ``config["keeper"]``: the driver's snapshot keeper (an actor handle) or None;
    ``config["judge"]``: the driver's tuning judge (an actor handle) or None."""
    launched_at = time.time()
    import ray.train
    import ray.train.torch

    from train_fns.restart import RunSpec
    from train_fns.trainer import ElasticTrainer, Marks

    setup = Marks(launched_at)
    setup.mark("imports")

    def report(metrics: dict[str, Any], directory: Path | None) -> None:
        checkpoint = None if directory is None else ray.train.Checkpoint.from_directory(directory)
        ray.train.report(metrics, checkpoint=checkpoint)

    config = dict(config)
    handle = config.pop("keeper", None)
    judge = config.pop("judge", None)
    context = ray.train.get_context()
    checkpoint = ray.train.get_checkpoint()
    with contextlib.ExitStack() as stack:
        directory = None if checkpoint is None else stack.enter_context(checkpoint.as_directory())
        setup.mark("checkpoint")
        ElasticTrainer(
            RunSpec(**config),
            rank=context.get_world_rank(),
            world=context.get_world_size(),
            device=ray.train.torch.get_device(),
            report=report,
            checkpoint_dir=None if directory is None else Path(directory),
            keeper=None if handle is None else KeeperHandle(handle),
            setup=setup,
            judge=None if judge is None else JudgeHandle(judge, config["plan"]["step_deadline_s"]),
        ).run()


class KeeperHandle:
    """The driver's snapshot keeper (``orchestrator.train.snapshots``) as
    ``train_fns.snapshots.Keeper``, on rank 0: a put does not wait for its bytes to arrive (the
    step goes on); one sent while the previous is still on its way is held back instead."""

    LATEST_TIMEOUT_S = 120.0
    """A snapshot of up to ``train.snapshot_max_mb`` crossing the network to a new rank 0."""

    def __init__(self, actor: Any) -> None:
        self.actor, self.generation, self.pending = actor, 0, None

    def ready(self) -> bool:
        import ray

        return self.pending is None or bool(ray.wait([self.pending], timeout=0)[0])

    def put(self, step: int, data: bytes) -> None:
        self.pending = self.actor.put.remote(self.generation, step, data)

    def latest(self, than_step: int) -> tuple[int, bytes] | None:
        import ray

        from train_fns.snapshots import KeeperUnreachable

        try:
            call = self.actor.resume.remote(than_step)
            self.generation, found = ray.get(call, timeout=self.LATEST_TIMEOUT_S)
        except ray.exceptions.RayError as e:
            raise KeeperUnreachable(f"the keeper did not answer ({type(e).__name__})") from e
        return found


class JudgeHandle:
    """The driver's tuning judge (``orchestrator.train.tune``) as ``train_fns.online.Judge``,
    on rank 0: each call waits for its answer (one per window of steps)."""

    TIMEOUT_S = 60.0
    """A judge that does not answer in this long ends the tuning (``OnlineTuning._ask``) ..."""

    def __init__(self, actor: Any, step_deadline_s: float) -> None:
        """... or in a quarter of the step deadline, which the wait counts against."""
        self.actor, self.timeout_s = actor, min(self.TIMEOUT_S, step_deadline_s / 4)

    def begin(self, world: int, per_rank: int, running: dict[str, float],
              split_fixed: bool = False) -> dict[str, Any]:  # fmt: skip
        return self._call("begin", world, per_rank, running, split_fixed)

    def window(self, world: int, seconds: float, steps: int) -> dict[str, Any]:
        return self._call("window", world, seconds, steps)

    def checked(self, world: int, gap: float) -> dict[str, Any]:
        return self._call("checked", world, gap)

    def _call(self, method: str, *args: Any) -> dict[str, Any]:
        import ray

        return ray.get(getattr(self.actor, method).remote(*args), timeout=self.timeout_s)


def probe_loop_per_worker(config: dict[str, Any]) -> None:
    """Entry point of the bandwidth probe (``python -m orchestrator.probe``).

    Rank 0 puts each row into ``config["rows"]`` (a Ray queue) as it is measured: the driver
    prints the table as it goes and gets every row back on any cluster, with no shared storage
    (in Ray Train V2 ``Result.metrics`` would only hold metrics reported with a checkpoint).
    """
    import ray.train.torch

    from train_fns.collectives import sweep

    sweep(
        list(config["sizes"]),
        list(config["ops"]),
        int(config["iters"]),
        int(config["warmup"]),
        ray.train.torch.get_device(),
        on_row=config["rows"].put,
    )
