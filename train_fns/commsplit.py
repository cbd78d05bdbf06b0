"""Exposed communication, measured: the maths in one place, for workers and the driver alike.

A step's syncing micro-step (forward + backward with the gradient all-reduce) is timed against
a micro-step of the same work without sync (an accumulation micro-step, or a no-sync reference
when there is no accumulation). What the syncing one takes beyond it is communication that
compute did not hide; the rest of forward + backward is compute.
"""

from __future__ import annotations


def nosync_from_accumulation(fwd_bwd_s: float, sync_micro_s: float, accumulation: int) -> float:
    """One no-sync micro-step's time: the step's forward + backward without its syncing
    micro-step, over the accumulation micro-steps that did not sync (accumulation > 1)."""
    return (fwd_bwd_s - sync_micro_s) / (accumulation - 1)


def exposed_comm(
    sync_micro_s: float, nosync_micro_s: float, fwd_bwd_s: float
) -> tuple[float, float]:
    """(exposed communication, compute) of a step; communication is never below 0."""
    exposed = max(0.0, sync_micro_s - nosync_micro_s)
    return exposed, fwd_bwd_s - exposed


def comm_fraction(comm_s: float | None, compute_s: float | None) -> float | None:
    """comm / (comm + compute): the share of the work the network holds up (None: unknown)."""
    if comm_s is None or compute_s is None or comm_s + compute_s <= 0:
        return None
    return comm_s / (comm_s + compute_s)
