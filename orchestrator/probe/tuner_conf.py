"""NCCL's tuner-plugin export: the fastest algorithm and protocol per message size, as a file.

``NCCL_ALGO``/``NCCL_PROTO`` apply to every message size at once; NCCL's tuner plugin interface
chooses per size. NVIDIA/nccl's example plugin (``ext-tuner/example``) reads a CSV file named by
``NCCL_TUNER_CONFIG_FILE``, one rule a line::

    collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff

The probe sweeps each collective once per (algorithm, protocol) it can run (a fresh worker group
each: NCCL reads its variables once per process), ``choose`` keeps the fastest per size, and
``write`` turns runs of equal choices into size ranges. Channels, pipelined ops and buffer
registration are left to NCCL (-1); the rules match this run's node and rank counts only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.runfiles import write_atomic

NCCL_COLLECTIVE = {"all_reduce": "allreduce", "all_gather": "allgather",
                   "reduce_scatter": "reducescatter"}  # fmt: skip
"""The probe's op names as the tuner file spells the collective."""
CANDIDATES = {
    "all_reduce": [("ring", "simple"), ("ring", "ll"), ("tree", "simple"), ("tree", "ll")],
    "all_gather": [("ring", "simple"), ("ring", "ll")],
    "reduce_scatter": [("ring", "simple"), ("ring", "ll")],
}
"""What NCCL can run on any topology (NVLS, PAT and CollNet need hardware the probe cannot see
from here; LL128 is left out: NCCL does not validate it everywhere), forced with ``sweep_env``'s
``coll:`` prefix, which NCCL reads from 2.24 on."""
UNBOUNDED = 2**63 - 1
HEADER = ("# commtune: the fastest algorithm/protocol per size, measured by the probe\n"
          "# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,"
          "numPipeOps,regBuff\n")  # fmt: skip


@dataclass(frozen=True)
class Rule:
    """One line of the tuner file: sizes ``min_bytes..max_bytes`` of ``op`` use this choice."""

    op: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    time_s: float
    """The measured time at the range's largest size (evidence, not written)."""


def sweep_env(op: str, algorithm: str, protocol: str) -> dict[str, str]:
    """The variables that force ``algorithm``/``protocol`` on ``op`` only (NCCL's
    per-collective form, so the other collectives keep their own choice)."""
    coll = NCCL_COLLECTIVE[op]
    return {"NCCL_ALGO": f"{coll}:{algorithm}", "NCCL_PROTO": f"{coll}:{protocol}"}


def choose(sweeps: dict[tuple[str, str, str], list[dict[str, Any]]]) -> list[Rule]:
    """The fastest (algorithm, protocol) per op and size from ``{(op, algo, proto): rows}``;
    consecutive sizes with the same winner merge into one range (the first starts at 0, the
    last is open-ended)."""
    rules: list[Rule] = []
    for op in dict.fromkeys(key[0] for key in sweeps):
        times: dict[int, list[tuple[float, str, str]]] = {}
        for (row_op, algo, proto), rows in sweeps.items():
            for row in rows if row_op == op else ():
                entry = (float(row["time_s"]), algo, proto)
                times.setdefault(int(row["size_bytes"]), []).append(entry)
        previous = 0
        for size in sorted(times):
            time_s, algo, proto = min(times[size])
            last = rules[-1] if rules and rules[-1].op == op else None
            if last is not None and (last.algorithm, last.protocol) == (algo, proto):
                rules[-1] = Rule(op, last.min_bytes, size, algo, proto, time_s)
            else:
                rules.append(Rule(op, previous + 1 if previous else 0, size, algo, proto, time_s))
            previous = size
        if rules and rules[-1].op == op:
            last = rules[-1]
            rules[-1] = Rule(op, last.min_bytes, UNBOUNDED, last.algorithm, last.protocol,
                             last.time_s)  # fmt: skip
    return rules


def write(rules: list[Rule], path: Path, num_nodes: int, num_ranks: int) -> Path:
    """The tuner file for ``rules`` on ``num_nodes`` nodes and ``num_ranks`` ranks."""
    lines = [
        f"{NCCL_COLLECTIVE[r.op]},{r.min_bytes},{r.max_bytes},{r.algorithm},{r.protocol},"
        f"-1,{num_nodes},{num_ranks},-1,-1"
        for r in rules
    ]
    write_atomic(path, HEADER + "".join(line + "\n" for line in lines))
    return path


def measure(config: Any, settings: Any, storage_path: str | None, say: Any) -> dict:
    """Every candidate sweep on ``config``'s NCCL workers, one worker group each (a running
    Ray is joined): ``{(op, algorithm, protocol): rows}``."""
    import dataclasses

    from orchestrator.probe.sweep import run_probe

    sweeps = {}
    for op in settings.ops:
        for algo, proto in CANDIDATES[op]:
            env = {**config.env, **sweep_env(op, algo, proto)}
            say(f"probe: {op} with {algo}/{proto} ({env['NCCL_ALGO']}, {env['NCCL_PROTO']})")
            one = dataclasses.replace(settings, ops=(op,))
            sweeps[(op, algo, proto)] = run_probe(
                dataclasses.replace(config, env=env), one, storage_path=storage_path, say=say
            )
    return sweeps
