"""``orchestrator.train``: train a tuned configuration elastically, with exact resume.

Its face is ``check``: the arguments of a training run, parsed and validated as the command
would, for ``orchestrator.submit`` to run before it sends one as a job.
"""

from orchestrator.train.cli import check

__all__ = ["check"]
