"""What a run's own numbers say: where the step time went (``steps``), the troubleshooting
tree's rules (``rules``) and their text (``text``).

The doctor prints these and the report draws them; both read the run through
``orchestrator.runfiles`` and neither imports the other.
"""

from orchestrator.findings.rules import (
    RULES,
    Finding,
    diagnose,
    link_bound,
    probe_busbw_gbps,
)
from orchestrator.findings.steps import StepParts, focus_step, training_step, trial_step
from orchestrator.findings.text import context_lines, finding_lines

__all__ = [
    "RULES",
    "Finding",
    "StepParts",
    "context_lines",
    "diagnose",
    "finding_lines",
    "focus_step",
    "link_bound",
    "probe_busbw_gbps",
    "training_step",
    "trial_step",
]
