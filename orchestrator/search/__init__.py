"""``orchestrator.search``: the measured search (``python -m orchestrator.search``)."""
