"""``python -m orchestrator.doctor DIR [DIR2 ...]``: walk the troubleshooting tree with a run's
own numbers (``doctor.rules``), over the files a run wrote (``doctor.record``).

Exit codes: 0 findings printed (including "no problem found"), 2 a DIR holds none of the files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from orchestrator.doctor.record import RunRecord, collect
from orchestrator.doctor.rules import RULES, Finding, diagnose
from orchestrator.runfiles import KNOWN_FILES, run_files


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
    return [
        describe(record),
        f"read: {', '.join(record.files) or 'nothing'}; absent: {', '.join(absent) or 'none'}",
        *(f"unreadable: {n} ({why})" for n, why in record.unreadable.items()),
        *topology_lines(record.topology),
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


def missing_dirs(dirs: list[Path]) -> list[str]:
    """One line per DIR that is not a run folder: exit 2 says which and what was expected."""
    return [
        f"{d}: holds none of {', '.join(KNOWN_FILES)} (expected a search output folder such as "
        "runs/<name>, or a training run folder)"
        for d in dirs
        if not run_files(d)
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.doctor", description=__doc__)
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="run folders to examine")
    args = p.parse_args(argv)
    bad = missing_dirs(args.dirs)
    if bad:
        print(f"doctor: {bad[0]}", file=sys.stderr)
        return 2
    record = collect(args.dirs)
    print(f"commtune doctor: {' '.join(map(str, args.dirs))}")
    print("\n".join([*context_lines(record), "", *finding_lines(diagnose(record))]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

