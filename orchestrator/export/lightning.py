"""The Lightning target: ``lightning.pytorch.Trainer`` arguments and its strategy's.

``DDPStrategy`` passes its extra keyword arguments to DDP, so every bucket option has a place;
the accumulation is the Trainer's ``accumulate_grad_batches`` and the micro-batch is the
DataLoader's. Lightning starts its processes itself (or under torchrun) with the launching
environment, so the variables go there. Checkpointing under DDP and the optimizer are the
LightningModule's code, and FSDP2 is applied in its ``configure_model``: those are named with
where they go.
"""

from __future__ import annotations

import dataclasses
import json

from orchestrator.export.accelerate import DDP_KWARGS
from orchestrator.export.entry import Export, Tuned, Unexpressed
from orchestrator.export.torchrun import launch_line, split_line

PRECISIONS = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


def _strategy(tuned: Tuned, missing: list[Unexpressed]) -> dict:
    if tuned.strategy == "fsdp":
        changed = {"activation_checkpointing": tuned.activation_checkpointing,
                   **tuned.changed_fsdp()}  # fmt: skip
        for key, value in changed.items():
            if value:
                missing.append(
                    Unexpressed(
                        key,
                        value,
                        "ModelParallelStrategy leaves FSDP2 to "
                        "your configure_model: pass it to fully_shard there",
                    )
                )
        return {"class": "ModelParallelStrategy", "kwargs": {}}
    kwargs = {k: getattr(tuned.ddp, k) for k in DDP_KWARGS}
    kwargs["process_group_backend"] = tuned.backend
    if tuned.ddp.comm_hook:
        missing.append(
            Unexpressed(
                "comm_hook",
                tuned.ddp.comm_hook,
                "a callable, not an "
                "argument: DDPStrategy(ddp_comm_hook=torch's default_hooks."
                f"{tuned.ddp.comm_hook}_compress_hook)",
            )
        )
    if tuned.activation_checkpointing:
        missing.append(
            Unexpressed(
                "activation_checkpointing",
                True,
                "DDPStrategy has none: call model.gradient_checkpointing_enable() in your module",
            )
        )
    return {"class": "DDPStrategy", "kwargs": kwargs}


def render(tuned: Tuned, script: str) -> Export:
    missing = list(tuned.dropped)
    strategy = _strategy(tuned, missing)
    if tuned.adamw_impl:
        missing.append(
            Unexpressed(
                "adamw_impl",
                tuned.adamw_impl,
                "the optimizer is your "
                "configure_optimizers': torch.optim.AdamW(..., "
                f"{tuned.adamw_impl}=True)",
            )
        )
    trainer = {
        "accelerator": "gpu" if tuned.use_gpu else "cpu",
        "devices": tuned.per_node,
        "num_nodes": tuned.num_nodes,
        "accumulate_grad_batches": tuned.accumulation_steps,
        "precision": PRECISIONS[tuned.precision],
    }
    settings = {
        "trainer": trainer,
        "strategy": strategy,
        "dataloader": {"batch_size": tuned.micro_batch},
        "environment": tuned.env,
        "launch": launch_line(tuned, ["python", script]),
        "split": split_line(tuned),
        "entry": tuned.line,
        "not_expressed": [dataclasses.asdict(u) for u in missing],
    }
    return Export("lightning", json.dumps(settings, indent=2) + "\n", settings, tuple(missing))
