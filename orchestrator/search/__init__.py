"""``orchestrator.search``: the measured search (``python -m orchestrator.search``).

Its face is ``check``: the arguments of a search, parsed and validated as the command would,
for ``orchestrator.submit`` to run before it sends one as a job.
"""

from orchestrator.search.cli import check

__all__ = ["check"]
