"""Autocast, fp16 loss scaling and non-finite step accounting.

bf16 has fp32's exponent range and needs no loss scaling; fp16 does, and GradScaler is a CUDA
feature (TrialPlan already rejects fp16 on CPU workers).
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor

from train_fns.plan import TrialPlan

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
BF16_MIN_CAPABILITY = (8, 0)
"""Ampere: the first GPUs with bf16 tensor cores. Before it torch emulates bf16, slower than
fp32, so a bf16 trial on a V100 measures the emulation, not the configuration."""


def prepare_device(precision: str, device: torch.device) -> None:
    """Refuse bf16 where the GPU would emulate it, and let fp32 matmuls use TF32 tensor cores
    (as every GPU training recipe does; without it compute is slow enough to hide the
    communication the search is tuning)."""
    if device.type != "cuda":
        return
    capability = torch.cuda.get_device_capability(device)
    if precision == "bf16" and capability < BF16_MIN_CAPABILITY:
        raise ValueError(
            f"workload.precision=bf16 needs a GPU of compute capability 8.0 or newer; this one "
            f"is {capability[0]}.{capability[1]} (bf16 would be emulated): use fp16 or fp32"
        )
    if precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


class Precision:
    """The plan's precision policy for one worker: autocast, backward scaling, optimizer step.

    Non-finite steps are counted on the device without a host sync per step (a sync would
    serialise the step and distort the timing); ``num_nonfinite`` reads the count once
    per window.
    """

    def __init__(self, plan: TrialPlan, device: torch.device) -> None:
        if plan.precision == "fp16" and device.type != "cuda":
            raise ValueError("precision=fp16 needs a CUDA device (GradScaler is CUDA-only)")
        prepare_device(plan.precision, device)
        self.device = device
        self.dtype = AUTOCAST_DTYPES.get(plan.precision)
        self.scaler = torch.amp.GradScaler("cuda") if plan.precision == "fp16" else None
        self.max_grad_norm = plan.max_grad_norm
        self.last_grad_norm: float | None = None
        self._num_nonfinite = torch.zeros((), dtype=torch.int64, device=device)

    def autocast(self) -> AbstractContextManager:
        """The forward's autocast region (a no-op for fp32)."""
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def backward(self, loss: Tensor) -> None:
        """Backward of ``loss``, scaled for fp16 so small gradients do not flush to zero."""
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        loss.backward()

    def step(self, optimizer: torch.optim.Optimizer, loss: Tensor) -> None:
        """Optimizer step; counts the step as non-finite when the loss or gradients were.

        With GradScaler a step with inf/NaN gradients is skipped (and the scale lowered);
        without it a non-finite loss is only counted, as there is nothing to skip to.
        """
        if self.max_grad_norm is not None:
            self._clipped_step(optimizer)
            return
        if self.scaler is None:
            optimizer.step()
            self._num_nonfinite += (~torch.isfinite(loss.detach())).to(torch.int64)
            return
        # Compared on the device: get_scale() reads the scale to the host, a sync inside the
        # measured step, twice a step. update() lowers the scale (in place) on inf/NaN.
        scale_before = self.scaler._scale.clone()
        self.scaler.step(optimizer)
        self.scaler.update()
        self._num_nonfinite += (self.scaler._scale < scale_before).to(torch.int64)

    def _clipped_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Training runs: clip to ``max_grad_norm`` and skip a step whose gradient norm is
        inf/NaN (one host sync per step, which a training run can afford)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        self.last_grad_norm = norm
        finite = math.isfinite(norm)
        if self.scaler is not None:
            self.scaler.step(optimizer)  # skips by itself on inf/NaN and lowers the scale
            self.scaler.update()
        elif finite:
            optimizer.step()
        if not finite:
            self._num_nonfinite += 1

    def loss_scale(self) -> float | None:
        """The fp16 loss scale (None without loss scaling)."""
        return None if self.scaler is None else float(self.scaler.get_scale())

    def scaler_state(self) -> dict | None:
        return None if self.scaler is None else self.scaler.state_dict()

    def load_scaler_state(self, state: dict | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)

    def num_nonfinite(self) -> int:
        """Non-finite steps since the last reset (one host sync)."""
        return int(self._num_nonfinite.item())

    def reset_num_nonfinite(self) -> None:
        self._num_nonfinite.zero_()
