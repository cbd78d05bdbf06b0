"""The search's progress on the terminal: one line per finished configuration, and the
trials' heartbeat lines while they wait (plain lines: a log file reads like the terminal)."""

from __future__ import annotations

import time
from typing import Any

from ray.tune import Callback

from orchestrator.search import ctrl_c
from orchestrator.search.trial import OUTCOME, TRIAL_NUMBER
from train_fns import metrics as m

NOTICE_POLL_S = 1.0
"""How often the driver looks for the trials' heartbeat lines."""


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
    """Print a line as each configuration ends (Tune's own table is turned off), and the
    heartbeat lines the trials put in ``notices`` (a Ray queue; None: there are none)."""

    def __init__(self, notices: Any = None) -> None:
        self.notices, self.looked = notices, 0.0

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        ctrl_c.check()  # Tune's loop, where a swallowed Ctrl-C is raised again
        # Tune steps many times a second; a heartbeat is due every few seconds at most.
        if time.monotonic() - self.looked >= NOTICE_POLL_S:
            self._notices()

    def _notices(self) -> None:
        self.looked = time.monotonic()
        size = self.notices.qsize() if self.notices is not None else 0
        for line in self.notices.get_nowait_batch(size) if size else ():
            print(line, flush=True)

    def on_trial_result(
        self, iteration: int, trials: list, trial: Any, result: dict, **info: Any
    ) -> None:
        from ray.tune.utils.util import unflatten_dict

        self._notices()  # lines put before this result come before its line

        full = unflatten_dict(dict(result))
        outcome = full.get(OUTCOME, {})
        number = int(full.get(TRIAL_NUMBER, -1))
        print(trial_line(number, outcome, outcome.get("params", {})), flush=True)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        print(
            f"worker group {trial.trial_id}: its driver process died; see {trial.local_path}",
            flush=True,
        )


def tensorboard_loggers() -> list[Callback]:
    """Tune's TensorBoard logger, given each result's scalars only: the outcome record (with
    its lists, such as each rank's place) is commtune's own files' business, and TensorBoard
    would warn on its first list that is not a histogram. Empty without tensorboardX."""
    from ray.tune.logger import TBXLoggerCallback

    class ScalarsOnly(TBXLoggerCallback):
        def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
            scalars = {k: v for k, v in result.items() if k.split("/")[0] != OUTCOME}
            super().log_trial_result(iteration, trial, scalars)

    try:
        return [ScalarsOnly()]
    except ImportError:
        return []
