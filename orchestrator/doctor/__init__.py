"""``orchestrator.doctor``: diagnose a run from its files (``python -m orchestrator.doctor``).

Its public face is also what the report draws from: the run record, the step parts, the
bandwidth bound and the findings, so the page and the command say the same words.
"""

from orchestrator.doctor.cli import context_lines, finding_lines, missing_dirs
from orchestrator.doctor.record import (
    RunRecord,
    StepParts,
    collect,
    num,
    training_step,
    trial_step,
)
from orchestrator.doctor.rules import RULES, Finding, diagnose, link_bound, probe_busbw_gbps

__all__ = [
    "RULES",
    "Finding",
    "RunRecord",
    "StepParts",
    "collect",
    "context_lines",
    "diagnose",
    "finding_lines",
    "link_bound",
    "missing_dirs",
    "num",
    "probe_busbw_gbps",
    "trial_step",
    "training_step",
]
