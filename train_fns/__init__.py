"""The worker side of commtune: what runs inside each Ray Train worker.

Importing this package is light (no torch, transformers or Ray): the driver imports it for
``TrialPlan``; the heavy modules load when a worker starts training.
"""

from train_fns.plan import InfeasiblePlan, TrialPlan
from train_fns.worker import train_loop_per_worker

__all__ = ["InfeasiblePlan", "TrialPlan", "train_loop_per_worker"]
