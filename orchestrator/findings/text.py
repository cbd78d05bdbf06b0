"""The findings as text: what they are about (the run, the files read, the topology, the
verdict) and the findings themselves, numbered. The doctor prints these lines and the report
shows the same.
"""

from __future__ import annotations

from typing import Any

from orchestrator.findings.rules import RULES, Finding
from orchestrator.runfiles import KNOWN_FILES, REMEASURE_CSV, RunRecord
from orchestrator.verdict.decide import verdict_from_rows


def describe(record: RunRecord) -> str:
    """One line: which study, model, workers and backend the findings are about."""
    parts = [
        f"study {record.name or '?'}",
        f"model {record.model or '?'}",
        f"{record.world_size or '?'} workers",
        f"backend {record.backend or '?'}",
    ]
    return ", ".join(parts)


def topology_lines(topo: dict[str, Any]) -> list[str]:
    simple = {k: v for k, v in topo.items() if k not in ("source", "nvidia_smi_topo")}
    shown = ", ".join(f"{k}={v}" for k, v in simple.items())
    lines = [f"topology ({topo.get('source', '?')}): {shown}"]
    if topo.get("nvidia_smi_topo"):
        lines += ["  " + line for line in str(topo["nvidia_smi_topo"]).splitlines()]
    return lines


def context_lines(record: RunRecord) -> list[str]:
    """What the findings are about: the run, the files read and the topology."""
    absent = [n for n in KNOWN_FILES if n not in record.files]
    verdict = verdict_from_rows(record.remeasure) if record.remeasure else None
    return [
        describe(record),
        f"read: {', '.join(record.files) or 'nothing'}; absent: {', '.join(absent) or 'none'}",
        *(f"unreadable: {n} ({why})" for n, why in record.unreadable.items()),
        *topology_lines(record.topology),
        *([f"verdict ({REMEASURE_CSV}): {verdict.line()}"] if verdict else []),
    ]


def finding_lines(findings: list[Finding]) -> list[str]:
    """The findings as text, numbered in rank order; the HTML report shows the same words."""
    if not findings:
        return [f"no problem found ({len(RULES)} checks over the files read)"]
    lines = []
    for i, f in enumerate(findings, 1):
        lines += [
            f"{i}. [{f.severity}] {f.title}",
            f"   evidence: {f.evidence}",
            f"   fix: {f.fix}",
        ]
    return lines
