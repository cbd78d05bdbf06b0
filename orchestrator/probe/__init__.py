"""``orchestrator.probe``: the all-reduce / all-gather / reduce-scatter bandwidth sweep."""

from orchestrator.probe.sweep import ProbeError, ProbeSettings, run_probe, write_csv

__all__ = ["ProbeError", "ProbeSettings", "run_probe", "write_csv"]
