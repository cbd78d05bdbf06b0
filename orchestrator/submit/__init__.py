"""``orchestrator.submit``: run commtune on a cluster as a Ray job, follow it, fetch its outputs."""
