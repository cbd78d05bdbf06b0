"""What tuning while training prints (``orchestrator.train.tune``'s events): a line per pair,
decision and size, and the closing lines from summary.json's ``tune``."""

from __future__ import annotations

from typing import Any

from orchestrator.runfiles import candidates_text
from orchestrator.runfiles import setting_text as text
from orchestrator.train.tune import GUARD


def tune_line(event: dict[str, Any]) -> str:
    """The line a tuning event prints (each pair, each decision, each size's end)."""
    kind, world = event["kind"], event.get("world")
    head = f"tune: step {event.get('step')}, {world} worker(s)"
    if kind == "tune_start":
        todo = candidates_text(event["candidates"]) or "none"
        return f"{head}: {text(event['running'])} runs; candidates: {todo}"
    if kind == "tune_skip":
        return f"{head}: {text(event['running'])} decided by {event['why']}: not tuned"
    if kind == "tune_pair":
        return (f"{head}: {text(event['candidate'])} against {text(event['running'])}, pair "
                f"{event['pair']}: {event['ratio']:.3f}x{_interval(event, ' so far')}")  # fmt: skip
    if kind == "tune_check":
        gap = "not finite" if event["gap"] is None else f"{event['gap']:.1e}"
        verdict = "within" if event["gap"] is not None and event["gap"] <= event["tolerance"] \
            else "beyond"  # fmt: skip
        return (f"{head}: guard: {text(event['candidate'])} gives gradients at {gap} (relative) "
                f"from {text(event['running'])}'s, {verdict} the tolerance "
                f"{event['tolerance']:g}")  # fmt: skip
    if kind == "tune_decision":
        return (f"{head}: {event['outcome']}: {text(event['candidate'])} {_measured(event)}; "
                f"{event['steps']} steps, {event['seconds']:.1f}s")  # fmt: skip
    if kind == "tune_done":
        return (f"{head}: decided: {text(event['running'])} ({event['outcome']}); "
                f"{_lost_text(event['lost'])}")  # fmt: skip
    return f"{head}: tuning off: {event.get('why')}"


def summary_lines(tune: dict[str, Any] | None) -> list[str]:
    """The closing lines of a run that tuned (summary.json's ``tune``): each size's split and
    what its candidates that were not kept cost."""
    lines = []
    for world, size in ((tune or {}).get("sizes") or {}).items():
        lines.append(f"tune: {world} worker(s): {text(size['running'])} "
                     f"({size['outcome']}, {len(size['decisions'])} candidate(s) judged); "
                     f"{_lost_text(size['lost'])}")  # fmt: skip
    return lines


def _measured(event: dict[str, Any]) -> str:
    """What a decision rests on: the pairs' ratio (the guard's line is its own)."""
    if event["outcome"] == GUARD:
        return "changes the gradients"
    if not event["pairs"]:
        return "no pair measured"
    return (f"is {event['ratio']:.3f}x {text(event['running'])} from {event['pairs']} "
            f"pair(s){_interval(event, '')}")  # fmt: skip


def _interval(event: dict[str, Any], so_far: str) -> str:
    """`` (interval{so_far} low-high)``, or nothing where the pairs give none (one or none)."""
    if event.get("high") is None:
        return ""
    return f" (interval{so_far} {event['low']:.3f}-{event['high']:.3f})"


def _lost_text(lost: dict[str, Any]) -> str:
    return (f"candidates not kept took {lost['steps']} steps, {lost['seconds']:.1f}s "
            f"({lost['extra_s']:+.1f}s against the running split)")  # fmt: skip
