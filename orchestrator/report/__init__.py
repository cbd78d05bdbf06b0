"""``orchestrator.report``: one self-contained HTML page that explains a run."""

from orchestrator.report.page import SECTIONS, render, write_report

__all__ = ["SECTIONS", "render", "write_report"]
