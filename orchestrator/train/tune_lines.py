"""What tuning while training prints (``orchestrator.train.tune``'s events): a line per pair,
decision and size, and the closing lines from summary.json's ``tune``."""

from __future__ import annotations

from typing import Any


def tune_line(event: dict[str, Any]) -> str:
    """The line a tuning event prints (each pair, each decision, each size's end)."""
    kind, world = event["kind"], event.get("world")
    head = f"tune: step {event.get('step')}, {world} worker(s)"
    if kind == "tune_start":
        todo = ", ".join(map(str, event["candidates"])) or "none"
        return f"{head}: accumulation {event['running']} runs; candidates: accumulation {todo}"
    if kind == "tune_skip":
        return f"{head}: accumulation {event['running']} decided by {event['why']}: not tuned"
    if kind == "tune_pair":
        return (f"{head}: accumulation {event['candidate']} against {event['running']}, pair "
                f"{event['pair']}: {event['ratio']:.3f}x{_interval(event, ' so far')}")  # fmt: skip
    if kind == "tune_decision":
        measured = (f"is {event['ratio']:.3f}x accumulation {event['running']} from "
                    f"{event['pairs']} pair(s){_interval(event, '')}") if event["pairs"] else (
                    "no pair measured")  # fmt: skip
        return (f"{head}: {event['outcome']}: accumulation {event['candidate']} {measured}; "
                f"{event['steps']} steps, {event['seconds']:.1f}s")  # fmt: skip
    if kind == "tune_done":
        return (f"{head}: decided: accumulation {event['running']} ({event['outcome']}); "
                f"{_lost_text(event['lost'])}")  # fmt: skip
    return f"{head}: tuning off: {event.get('why')}"


def summary_lines(tune: dict[str, Any] | None) -> list[str]:
    """The closing lines of a run that tuned (summary.json's ``tune``): each size's split and
    what its candidates that were not kept cost."""
    lines = []
    for world, size in ((tune or {}).get("sizes") or {}).items():
        lines.append(f"tune: {world} worker(s): accumulation {size['running']} "
                     f"({size['outcome']}, {len(size['decisions'])} candidate(s) judged); "
                     f"{_lost_text(size['lost'])}")  # fmt: skip
    return lines


def _interval(event: dict[str, Any], so_far: str) -> str:
    """`` (interval{so_far} low-high)``, or nothing where the pairs give none (one or none)."""
    if event.get("high") is None:
        return ""
    return f" (interval{so_far} {event['low']:.3f}-{event['high']:.3f})"


def _lost_text(lost: dict[str, Any]) -> str:
    return (f"candidates not kept took {lost['steps']} steps, {lost['seconds']:.1f}s "
            f"({lost['extra_s']:+.1f}s against the running split)")  # fmt: skip
