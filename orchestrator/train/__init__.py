"""``orchestrator.train``: train a tuned configuration elastically, with exact resume."""
