"""The built-in workload: a Hugging Face masked or causal language model on synthetic tokens (or
a local text file), behind the same contract as a user's own (``train_fns.workload``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from train_fns.data import make_batch_source
from train_fns.metrics import FLOPS_PER_PARAM_TOKEN
from train_fns.models import build_model
from train_fns.plan import TrialPlan
from train_fns.weights import whole_state
from train_fns.workload import Workload, default_blocks


def hf_loss(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """The model's own loss (mean over labelled tokens; every sample labels as many)."""
    return model(**batch).loss


def hf_workload(plan: TrialPlan) -> Workload:
    """The plan's HF model (seeded random init, or local weights) and its token stream.

    In a process group the model is built on the meta device, and only rank 0 builds it for
    real, as the weights the others are given when it is wrapped (``train_fns.weights``): no
    other rank holds a copy of the whole model it would not keep."""
    distributed = torch.distributed.is_initialized()
    model = build_model(plan, meta=distributed)
    state = None
    if distributed and torch.distributed.get_rank() == 0:
        state = whole_state(lambda: build_model(plan))
    source = make_batch_source(plan, model.config)

    def batch(indices: list[int]) -> dict[str, Tensor]:
        return source.collate(indices)

    num_params = sum(p.numel() for p in model.parameters())
    return Workload(
        model=model,
        batch=batch,
        loss=hf_loss,
        blocks=default_blocks(model),
        tokens_per_sample=plan.seq_len,
        flops_per_sample=float(FLOPS_PER_PARAM_TOKEN * num_params * plan.seq_len),
        optimizer=None,
        full_state=state,
    )
