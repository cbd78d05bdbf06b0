"""The torchrun target: a launch script that sets the tuned variables and starts the workers.

torchrun takes no training settings, only processes and their environment: the variables are
exported before it starts (NCCL reads them once, as each process starts), and the script it
runs applies the split and the wrapping with ``train_fns.tuned``, reading the same best.yaml
(``COMMTUNE_BEST``), so nothing tuned is lost on this route.
"""

from __future__ import annotations

import shlex

from orchestrator.export.entry import Export, Tuned
from orchestrator.runfiles import BEST_YAML

BEST_VARIABLE = "COMMTUNE_BEST"
"""Where the launched script finds best.yaml (``tuned.load(os.environ[...])``)."""


def torchrun_args(tuned: Tuned, script: str) -> list[str]:
    """``torchrun`` with the size's processes: one node standalone, several by rendezvous
    (each node runs it with its own ``NODE_RANK``; ``MASTER_ADDR`` is the first node's)."""
    args = ["torchrun", "--nnodes", str(tuned.num_nodes), "--nproc-per-node", str(tuned.per_node)]
    if tuned.num_nodes == 1:
        args.append("--standalone")
    else:
        args += ["--node-rank", "$NODE_RANK", "--rdzv-backend", "c10d",
                 "--rdzv-endpoint", "$MASTER_ADDR:29500"]  # fmt: skip
    return [*args, script]


def launch_line(tuned: Tuned, command: list[str]) -> str:
    """``command`` with the tuned variables before it, as one shell line."""
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(tuned.env.items())]
    return " ".join([*env, *(a if a.startswith("$") else shlex.quote(a) for a in command)])


def split_line(tuned: Tuned) -> str:
    return (f"global batch {tuned.global_batch} = micro-batch {tuned.micro_batch} x accumulation "
            f"{tuned.accumulation_steps} x {tuned.world_size} workers")  # fmt: skip


def render(tuned: Tuned, script: str) -> Export:
    lines = [
        "#!/bin/sh",
        f"# commtune export for torchrun: {tuned.name} at {tuned.world_size} workers "
        f"({tuned.num_nodes} node(s) x {tuned.per_node}), {tuned.backend}",
        f"# {split_line(tuned)}; {tuned.line}",
        f"# The script applies the split, the buckets and the sharding from {BEST_YAML}:",
        f"#   best = tuned.load(os.environ['{BEST_VARIABLE}'])   # from train_fns import tuned",
        "#   micro_batch, accumulation = tuned.split(best, world_size)",
        "#   model = tuned.wrap(model, best)",
        *(f"export {k}={shlex.quote(v)}" for k, v in sorted(tuned.env.items())),
        f"export {BEST_VARIABLE}={shlex.quote(str(tuned.best))}",
        " ".join(a if a.startswith("$") else shlex.quote(a) for a in torchrun_args(tuned, script))
        + ' "$@"',
    ]
    settings = {"environment": {**tuned.env, BEST_VARIABLE: str(tuned.best)},
                "command": torchrun_args(tuned, script)}  # fmt: skip
    return Export("torchrun", "\n".join(lines) + "\n", settings, tuned.dropped)
