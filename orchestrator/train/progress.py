"""Where a training run is, the way users expect to see it: a bar on a terminal, a line now
and then in a log (a job's output captured to a file, where a bar's carriage returns would be
noise)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

LINE_EVERY_S = 30.0
"""A log gets a progress line at most this often (and at the last step)."""


class StepProgress:
    """The steps done of ``total``, with the latest loss, throughput and world size."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total, self.stream = total, stream or sys.stdout
        self.said = time.monotonic()
        self.bar: Any = None
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="step", file=self.stream, dynamic_ncols=True)

    def update(self, step: int, loss: float | None, samples_per_s: float | None,
               world: int | None) -> None:  # fmt: skip
        figures = {"loss": f"{loss:.4g}" if loss is not None else "-",
                   "samples/s": f"{samples_per_s:.1f}" if samples_per_s else "-",
                   "workers": world or "-"}  # fmt: skip
        if self.bar is not None:
            self.bar.n = min(step, self.total)
            self.bar.set_postfix(figures, refresh=False)
            self.bar.refresh()
            return
        now = time.monotonic()
        if now - self.said < LINE_EVERY_S and step < self.total:
            return
        self.said = now
        shown = ", ".join(f"{k} {v}" for k, v in figures.items())
        print(f"progress: step {step}/{self.total} ({step / max(1, self.total):.0%}): {shown}",
              file=self.stream, flush=True)  # fmt: skip

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
