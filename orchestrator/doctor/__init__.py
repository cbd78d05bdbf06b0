"""``orchestrator.doctor``: diagnose a run from its files (``python -m orchestrator.doctor``).

The command only: the run record is ``orchestrator.runfiles``'s and the rules are
``orchestrator.findings``', which the report draws from too.
"""

from orchestrator.doctor.cli import main

__all__ = ["main"]
