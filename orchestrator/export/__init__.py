"""``orchestrator.export``: a run's tuned configuration in the tools users train with
(``python -m orchestrator.export RUN --to trainer|accelerate|torchrun|lightning``).

``entry`` reads the size's entry once (``Tuned``); each target module translates it into what
its tool reads and names every tuned value the tool has no place for, with why.
"""

from orchestrator.export.cli import TARGETS, export, main
from orchestrator.export.entry import Export, Tuned, Unexpressed, read_tuned

__all__ = ["TARGETS", "Export", "Tuned", "Unexpressed", "export", "main", "read_tuned"]
