"""Tuning while training against searching first: three ways to train the same steps, side by
side in one run, each a fresh command as a user types it.

- (a) ``orchestrator.train`` untuned (the preset's default configuration);
- (b) ``orchestrator.search``, then ``orchestrator.train --config best.yaml``: its wall-clock
  counted from the search's start;
- (c) ``orchestrator.train --tune`` from the untuned default.

``--rounds`` rounds, the arms' order rotated each round (a b c, b c a, c a b) so that a slow
drift of the machine weighs on each alike. Per round it prints each arm's wall-clock, (c)'s
against (a)'s and (b)'s, the speed (c) trains at once every size it met is decided (its steps
after the last ``tune_done``) against the speed (b) trains at, and (c)'s final loss against
(a)'s. Then the ratios over the rounds, with an interval from two rounds on
(``orchestrator.verdict.paired``), and what tuning cost (summary.json's ``tune``).

    python -m benchmarks.tune_online                    # cpu-demo, 300 steps, 3 rounds
    python -m benchmarks.tune_online --rounds 1 --steps 200
    python -m benchmarks.tune_online --quick            # smoke, (a) and (c), 1 round of 30 steps

The quick mode leaves (b) out (a search alone takes longer than a minute) and tunes in windows of
one step: it checks that the benchmark runs, it measures nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks._commands import run_module
from benchmarks._record import add_results_option, recording
from benchmarks.delivered import described
from orchestrator.runfiles import (
    BEST_YAML,
    EVENTS_JSONL,
    PROGRESS_CSV,
    SUMMARY_JSON,
    Summary,
    read_csv,
    setting_text,
)
from orchestrator.verdict.paired import PairedRatio

QUICK_TUNE = ["--set", "train.tune_window=1", "--set", "search.verdict_pairs=3"]
"""The quick mode's tuning: windows of one step, three pairs a candidate at most."""
ARMS = ("a", "b", "c")
NAMES = {"a": "untuned", "b": f"search, then train {BEST_YAML}", "c": "train --tune"}


def train_args(args: argparse.Namespace, out: Path, *more: str) -> list[str]:
    """One training run's arguments: the preset, the steps, a checkpoint at the end only."""
    return ["--preset", args.preset, "--steps", str(args.steps), "--checkpoint-every",
            str(args.steps), "--out", str(out), *args.set, *more]  # fmt: skip


def run_arm(arm: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One arm's run(s): wall-clock from its first command's start, and its training folder."""
    out = work / f"{arm}-train"
    if arm == "a":
        seconds = run_module("orchestrator.train", train_args(args, out)).seconds
    elif arm == "c":
        quick = QUICK_TUNE if args.quick else []
        seconds = run_module("orchestrator.train", train_args(args, out, "--tune", *quick)).seconds
    else:
        search = work / "b-search"
        seconds = run_module("orchestrator.search", ["--preset", args.preset, "--out",
                                                     str(search), *args.set]).seconds  # fmt: skip
        config = ["--config", str(search / BEST_YAML)]
        seconds += run_module("orchestrator.train", [*config, *train_args(args, out)[2:]]).seconds
    return {"wall_s": seconds, **trained(out)}


def trained(out: Path) -> dict[str, Any]:
    """A training folder's final loss, the speed of its steps after tuning ended (every step
    where it did not tune), and what tuning cost."""
    summary = Summary.from_mapping(json.loads((out / SUMMARY_JSON).read_text()))
    events = [json.loads(line) for line in (out / EVENTS_JSONL).read_text().splitlines()]
    tuned_at = max((e["step"] for e in events if e["kind"] == "tune_done"), default=0)
    speeds = [float(r["samples_per_s"]) for r in read_csv(out / PROGRESS_CSV)
              if int(r["step"]) > tuned_at]  # fmt: skip
    tune = summary.tune or {}
    return {"final_loss": summary.final_loss, "tuned_at": tuned_at,
            "speed": statistics.harmonic_mean(speeds) if speeds else None,
            "kept": {w: setting_text(s["running"]) for w, s in (tune.get("sizes") or {}).items()},
            "lost": tune.get("lost")}  # fmt: skip


def one_round(k: int, args: argparse.Namespace, work: Path) -> dict[str, dict[str, Any]]:
    """Round ``k``: every arm once, in the order rotated by ``k``; its lines printed."""
    arms = [a for a in ARMS if a in args.arms]
    turn = k % len(arms)
    order = arms[turn:] + arms[:turn]
    got = {}
    for arm in order:
        got[arm] = run_arm(arm, args, work / f"round{k}")
        print(f"round {k + 1}, ({arm}) {NAMES[arm]}: {got[arm]['wall_s']:.0f}s, trained at "
              f"{got[arm]['speed']:.2f} samples/s, final loss {got[arm]['final_loss']:.4f}",
              flush=True)  # fmt: skip
    c = got["c"]
    print(f"round {k + 1}: (c) kept {c['kept']} by step {c['tuned_at']}; candidates "
          f"not kept: {c['lost']}", flush=True)  # fmt: skip
    return got


def ratios(rounds: list[dict[str, dict[str, Any]]], arms: str) -> dict[str, PairedRatio]:
    """Over the rounds: (c)'s wall-clock against (a)'s and (b)'s (above 1: (c) is faster) and
    (c)'s trained speed after tuning against (b)'s."""
    out = {"a/c wall": PairedRatio(tuple(r["a"]["wall_s"] / r["c"]["wall_s"] for r in rounds))}
    if "b" in arms:
        out["b/c wall"] = PairedRatio(tuple(r["b"]["wall_s"] / r["c"]["wall_s"] for r in rounds))
        out["c/b speed"] = PairedRatio(tuple(r["c"]["speed"] / r["b"]["speed"] for r in rounds))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu-demo", help="the preset every arm runs")
    ap.add_argument("--steps", type=int, default=300, help="optimizer steps each training run")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every arm")
    ap.add_argument("--arms", default="abc", help="which arms: a, c and optionally b")
    ap.add_argument("--set", action="append", default=[], type=lambda s: f"--set={s}",
                    metavar="KEY=VALUE", help="a config override for every command")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="smoke, (a) and (c), 1 round of 30 steps")
    add_results_option(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.preset, args.steps, args.rounds, args.arms = "smoke", 30, 1, "ac"
    if args.rounds < 1 or args.steps < 1 or not {"a", "c"} <= set(args.arms) <= set(ARMS):
        ap.error("--rounds and --steps at least 1; --arms holds a and c, and b or not")
    with (recording(__spec__.name, argv, args.results, args.quick) as figures,
          tempfile.TemporaryDirectory(prefix="commtune-tune-online-") as tmp):  # fmt: skip
        rounds = [one_round(k, args, Path(tmp)) for k in range(args.rounds)]
        for name, paired in ratios(rounds, args.arms).items():
            print(f"{name}: {described(paired)}", flush=True)
        losses = [r["c"]["final_loss"] / r["a"]["final_loss"] - 1 for r in rounds]
        print(f"(c)'s final loss against (a)'s: {', '.join(f'{x:+.2%}' for x in losses)}")
        figures.update(rounds=rounds, preset=args.preset, steps=args.steps, arms=args.arms)


if __name__ == "__main__":
    main()
