"""TensorBoard event files in the run folder: what Ray and PyTorch users watch during a run.

A search writes each trial's figures as it ends (``search``: throughput, its spread and the
step's parts, at the trial's number) and each race pair as it is judged (``race``); a training
run writes each logged step (``train``: loss, samples/s, the communication share, the world
size). The run folder's CSV files stay the record; these are the live view of the same
numbers. Writing needs the ``tensorboard`` package (``pip install -e ".[tools]"``): without it
a board writes nothing and says so once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.runfiles.files import TENSORBOARD_DIR

log = logging.getLogger("commtune")
_said: list[bool] = []


class Board:
    """One folder of event files under the run folder's ``tensorboard/``, written as the
    numbers come (each add flushed: a TensorBoard open beside the run sees it at once). It
    pickles as its folder (Tune saves the searcher that holds one); the writer is opened on
    the first add."""

    def __init__(self, out: Path, part: str) -> None:
        self.folder = out / TENSORBOARD_DIR / part
        self._writer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "_writer": None}

    def _open(self) -> Any:
        if self._writer is None and not _said:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                _said.append(True)
                log.warning("no TensorBoard event files: the tensorboard package is not "
                            "installed (pip install -e \".[tools]\")")  # fmt: skip
                return None
            self._writer = SummaryWriter(log_dir=str(self.folder))
        return self._writer

    def add(self, values: Mapping[str, Any], step: int, prefix: str = "") -> None:
        """Each finite number of ``values`` as the scalar ``prefix + name`` at ``step``."""
        writer = self._open()
        if writer is None:
            return
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if math.isfinite(value):
                writer.add_scalar(f"{prefix}{name}", value, step)
        writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
