"""``python -m orchestrator.export RUN --to trainer|accelerate|torchrun|lightning``: the tuned
configuration in the form a tool reads.

    python -m orchestrator.export runs/<study> --to trainer [--workers N] [--nodes M]
        [--script train.py] [--adapt] [--json] [--out FILE]

RUN is a search's run folder or a best.yaml; ``--workers N`` picks that size's entry (default:
the run's own size). The output goes to stdout (or ``--out``); every tuned value the target
cannot express is printed on stderr with why, and named in the output too. Exit 0, or 2 on a
bad input (one line naming the value and the fix).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from orchestrator.config.inputs import ConfigError
from orchestrator.export import accelerate, lightning, torchrun, trainer
from orchestrator.export.entry import Export, Tuned, read_tuned
from orchestrator.runfiles import BEST_YAML, write_atomic

TARGETS: dict[str, Callable[[Tuned, str], Export]] = {
    "trainer": trainer.render,
    "accelerate": accelerate.render,
    "torchrun": torchrun.render,
    "lightning": lightning.render,
}


def export(run: str | Path, target: str, workers: int | None = None, nodes: int = 1,
           script: str = "train.py", adapt: bool = False) -> Export:  # fmt: skip
    """``run``'s entry for ``workers`` in ``target``'s form (ConfigError on a bad input)."""
    if target not in TARGETS:
        raise ConfigError("--to", f"unknown target {target!r}; use one of {', '.join(TARGETS)}")
    return TARGETS[target](read_tuned(run, workers, nodes, adapt), script)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m orchestrator.export", description=__doc__,
                                allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("run", metavar="RUN", help=f"a run folder (runs/<study>) or a {BEST_YAML}")
    p.add_argument("--to", required=True, metavar="TARGET", help=", ".join(TARGETS))
    p.add_argument("--workers", type=int, metavar="N", help="the size's entry (default: the run's)")
    p.add_argument("--nodes", type=int, default=1, metavar="M", help="nodes the workers span")
    p.add_argument("--script", default="train.py", help="your training script, for the launch")
    p.add_argument(
        "--adapt",
        action="store_true",
        help="a size with no entry: re-split the nearest one, as a resize would",
    )
    p.add_argument("--json", action="store_true", help="the output and its settings as JSON")
    p.add_argument("--out", help="write the output to this file instead of stdout")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        done = export(args.run, args.to, args.workers, args.nodes, args.script, args.adapt)
    except ConfigError as e:
        print(f"commtune export: {e}", file=sys.stderr)
        return 2
    for item in done.unexpressed:
        print(f"not expressed in {done.target}: {item.line()}", file=sys.stderr)
    for caution in done.cautions:
        print(f"caution for {done.target}: {caution}", file=sys.stderr)
    text = json.dumps(done.record(), indent=2) + "\n" if args.json else done.text
    if args.out:
        write_atomic(Path(args.out), text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
