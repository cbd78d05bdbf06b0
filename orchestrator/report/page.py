"""``python -m orchestrator.report DIR [--train DIR2] [--out FILE]``: explain a run in one page.

Writes ``DIR/report.html`` (or FILE): one self-contained HTML file that opens offline (figures
are matplotlib PNGs drawn with Agg and embedded as base64 data URIs; no script, stylesheet or
link leaves the file), so it can be mailed or attached to a ticket as is. Sections: every
trial's throughput, best vs baseline with its spread, parameter importance, step-time parts,
bus bandwidth against message size, peak memory, gradient health and throughput by world size
(with a training run folder: ``--train DIR2`` or ``DIR/train``) and the doctor's findings. A
section whose file is missing says so in one line instead of failing the page.

Exit codes: 0 written, 2 DIR holds none of the run files (one line naming it).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

from orchestrator.report.by_size import section_by_size
from orchestrator.report.diagnosis import (
    section_bandwidth,
    section_findings,
    section_gradients,
    section_step_time,
)
from orchestrator.report.html import (
    STYLE,
    esc,
    log,
    missing,
)
from orchestrator.report.trials import (
    section_best_vs_baseline,
    section_importance,
    section_memory,
    section_throughput,
)
from orchestrator.runfiles import REPORT_HTML, TRIALS_CSV, RunRecord, collect, write_atomic

SECTIONS = (
    ("throughput", "Throughput of every trial"),
    ("best-vs-baseline", "Best vs baseline"),
    ("importance", "Parameter importance"),
    ("step-time", "Where a step's time goes"),
    ("bandwidth", "Bus bandwidth against message size"),
    ("memory", "Peak memory per configuration"),
    ("gradients", "Gradient health"),
    ("by-size", "Throughput by world size"),
    ("findings", "Findings of the doctor"),
)

BUILDERS: dict[str, Callable[[RunRecord], str]] = {
    "throughput": section_throughput,
    "best-vs-baseline": section_best_vs_baseline,
    "importance": section_importance,
    "step-time": section_step_time,
    "bandwidth": section_bandwidth,
    "memory": section_memory,
    "gradients": section_gradients,
    "by-size": section_by_size,
    "findings": section_findings,
}


def render(record: RunRecord, folder: Path) -> str:
    """The whole page; one section failing to draw is a line in that section, not a lost page."""
    sections = []
    for sid, title in SECTIONS:
        try:
            body = BUILDERS[sid](record)
        except Exception as e:  # best effort per section: said on the page, traceback in the log
            log.warning("report: section %s could not be drawn", sid, exc_info=True)
            first = str(e).partition("\n")[0]
            body = missing(f"This section could not be drawn: {type(e).__name__}: {first}")
        sections.append(f'<section>\n<h2 id="{sid}">{esc(title)}</h2>\n{body}\n</section>')
    name = record.name or folder.name
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>commtune report: {esc(name)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        f"<h1>commtune report: {esc(name)}</h1>\n"
        f'<p class="meta">{esc(_header(record, folder))}</p>\n'
        + "\n".join(sections)
        + "\n</body>\n</html>\n"
    )


def _header(record: RunRecord, folder: Path) -> str:
    cfg = record.best_config
    workload = cfg.get("workload") or {}
    bits = [
        f"generated {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
        f"from {folder}",
        f"model {record.model or '?'}",
        f"{record.world_size or '?'} workers",
        f"backend {record.backend or '?'}",
    ]
    if workload.get("global_batch"):
        bits.append(f"global batch {workload['global_batch']}, seq_len {workload.get('seq_len')}")
    if TRIALS_CSV in record.files:
        written = datetime.datetime.fromtimestamp(record.files[TRIALS_CSV].stat().st_mtime)
        bits.append(f"trials written {written:%Y-%m-%d %H:%M}")
    return "; ".join(bits)


def write_report(out: Path) -> str:
    """report.html from the output folder (and its doctor's findings); the line that says so.

    Best effort: the search's outputs stand without the report, so a failure is said (with
    the traceback in the log), never raised."""
    try:
        write_atomic(out / REPORT_HTML, render(collect([out]), out))
    except Exception as e:
        log.warning("%s could not be written", REPORT_HTML, exc_info=True)
        return f"report: not written ({type(e).__name__}: {e}); run python -m orchestrator.report"
    return f"report: {out / REPORT_HTML} (python -m orchestrator.doctor {out} for findings)"
