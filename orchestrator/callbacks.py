"""Callbacks: Train reports to the trial driver, finished trials to the terminal."""

from __future__ import annotations

from typing import Any

from ray.train.v2.api.callback import UserCallback
from ray.tune import Callback

from train_fns import metrics as m


def driver_queue() -> Any:
    """A Ray queue whose actor lives on this (the driver's) node, as Ray Train's controller does.

    Left to the scheduler, a 0-CPU actor may land on any node; when that node is lost, the
    reports and the failure notice that should tell of it are lost with it.
    """
    import ray
    from ray.util.queue import Queue
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})


class WindowCollector(UserCallback):
    """Forward every worker's window report to the trial driver's queue.

    In Ray Train V2 ``Result.metrics`` only keeps metrics reported with a
    checkpoint, and the built-in Tune callback keeps rank 0 only; the driver needs
    all ranks (a synchronous step is as slow as the slowest one), so it takes them
    here, on the Train controller, and ships the list through a Ray queue.
    """

    def __init__(self, reports: Any) -> None:
        self._reports = reports

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any
    ) -> None:
        self._reports.put(list(metrics))


def trial_line(number: int, result: dict[str, Any], params: dict[str, Any]) -> str:
    """One readable line per finished trial."""
    state = result.get(m.STATE, m.ERROR)
    shown = ", ".join(f"{k}={v}" for k, v in sorted(params.items()) if not k.startswith("_"))
    if state == m.COMPLETE:
        figure = (
            f"{result[m.SAMPLES_PER_S]:8.2f} samples/s (cv {result[m.THROUGHPUT_CV]:.1%}, "
            f"step {result[m.STEP_TIME_S] * 1000:.0f} ms, "
            f"peak {result[m.PEAK_MEM_BYTES] / 2**20:.0f} MiB{comm_text(result)})"
        )
    else:
        figure = f"{state.upper():>8}: {result.get(m.REASON, '')}"
    wall = result.get("trial_wall_s")
    took = f" [{wall:.0f}s]" if wall is not None else ""
    return f"trial {number:3d} {figure}{took}  {{{shown}}}"


def comm_text(result: dict[str, Any]) -> str:
    """Measured exposed communication, and the cost model's bound when a probe ran."""
    if result.get(m.EXPOSED_COMM_S) is None:
        return ""
    text = f", comm {result[m.EXPOSED_COMM_S] * 1e3:.0f} ms exposed = {result[m.COMM_FRACTION]:.0%}"
    bound = result.get("comm_bound_s")
    return text + (f", bound {bound * 1e3:.0f} ms at the probed bandwidth" if bound else "")


class ProgressPrinter(Callback):
    """Print a line as each configuration ends (Tune's own table is turned off)."""

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        from ray.tune.utils.util import unflatten_dict

        from orchestrator.trial import OUTCOME, TRIAL_NUMBER

        full = unflatten_dict(dict(result))
        outcome = full.get(OUTCOME, {})
        number = int(full.get(TRIAL_NUMBER, -1))
        print(trial_line(number, outcome, outcome.get("params", {})), flush=True)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        print(
            f"worker group {trial.trial_id}: its driver process died; see {trial.local_path}",
            flush=True,
        )
