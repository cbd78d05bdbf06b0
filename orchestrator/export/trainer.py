"""The Hugging Face Trainer target: ``TrainingArguments`` keyword arguments.

Every value is written out, defaults included, where Trainer's own default differs from what
was measured: Trainer turns ``find_unused_parameters`` on for a model without checkpointing
and picks the fused AdamW on torch >= 2.8, so an omitted key would run something the search
never timed. The variables go in the launcher's environment (Trainer reads none of them).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from orchestrator.export.entry import Export, Tuned, Unexpressed
from orchestrator.export.torchrun import launch_line, split_line, torchrun_args

OPTIMS = {None: "adamw_torch", "foreach": "adamw_torch", "fused": "adamw_torch_fused"}
"""commtune's AdamW implementation as Trainer's ``optim``: ``adamw_torch`` leaves the choice to
torch (foreach where it can), as commtune's default does."""
NO_PLACE = "TrainingArguments has no argument for it"


def checkpointing_key() -> str:
    """``activation_checkpointing`` (transformers 5) or its older name ``gradient_checkpointing``:
    the installed Trainer's."""
    from transformers import TrainingArguments

    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in fields else (
        "gradient_checkpointing")  # fmt: skip


def training_arguments(tuned: Tuned) -> tuple[dict[str, Any], list[Unexpressed]]:
    """The keyword arguments, and what they cannot say."""
    args: dict[str, Any] = {
        "per_device_train_batch_size": tuned.micro_batch,
        "gradient_accumulation_steps": tuned.accumulation_steps,
        "ddp_backend": tuned.backend,
        "optim": OPTIMS[tuned.adamw_impl],
    }
    if not tuned.use_gpu:
        args["use_cpu"] = True
    if tuned.precision != "fp32":
        args[tuned.precision] = True
    missing: list[Unexpressed] = []
    if tuned.strategy == "fsdp":
        args.update(_fsdp(tuned, missing))
    else:
        args[checkpointing_key()] = tuned.activation_checkpointing
        args.update(_ddp(tuned, missing))
    return args, missing


def _ddp(tuned: Tuned, missing: list[Unexpressed]) -> dict[str, Any]:
    ddp = tuned.ddp
    bucket = int(ddp.bucket_cap_mb) if float(ddp.bucket_cap_mb).is_integer() else ddp.bucket_cap_mb
    args = {"ddp_bucket_cap_mb": bucket, "ddp_broadcast_buffers": ddp.broadcast_buffers,
            "ddp_find_unused_parameters": ddp.find_unused_parameters}  # fmt: skip
    if ddp.static_graph:
        args["ddp_static_graph"] = True
    if ddp.gradient_as_bucket_view:
        missing.append(
            Unexpressed(
                "gradient_as_bucket_view",
                True,
                f"{NO_PLACE} (Trainer builds DDP's kwargs itself); use the accelerate target",
            )
        )
    if ddp.comm_hook:
        missing.append(
            Unexpressed(
                "comm_hook",
                ddp.comm_hook,
                f"{NO_PLACE}: register "
                f"torch's {ddp.comm_hook}_compress_hook on trainer.model_wrapped",
            )
        )
    return args


def _fsdp(tuned: Tuned, missing: list[Unexpressed]) -> dict[str, Any]:
    """FSDP2 through Trainer's ``fsdp_config``: resharding as a bool, checkpointing inside."""
    fsdp, config = tuned.fsdp, {"version": 2, "activation_checkpointing":
                                tuned.activation_checkpointing}  # fmt: skip
    if isinstance(fsdp.reshard_after_forward, bool):
        config["reshard_after_forward"] = fsdp.reshard_after_forward
    else:
        missing.append(
            Unexpressed(
                "reshard_after_forward",
                fsdp.reshard_after_forward,
                "Trainer's FSDP2 reshards to all ranks or none (a bool)",
            )
        )
    for key in ("forward_prefetch", "backward_prefetch"):
        if getattr(fsdp, key):
            missing.append(
                Unexpressed(
                    key,
                    getattr(fsdp, key),
                    "Trainer's FSDP2 keeps FSDP2's implicit prefetching; it sets no prefetch depth",
                )
            )
    if fsdp.hsdp:
        missing.append(
            Unexpressed(
                "hsdp",
                True,
                "Trainer's fsdp_config has no replicate "
                "dimension; use accelerate's parallelism_config (dp_replicate)",
            )
        )
    if fsdp.reduce_dtype != "fp32":
        missing.append(
            Unexpressed(
                "reduce_dtype",
                fsdp.reduce_dtype,
                "Trainer sets FSDP2's mixed precision from bf16/fp16, not the reduce dtype alone",
            )
        )
    return {"fsdp": True, "fsdp_config": config}


LOSS_SCALING = (
    "Trainer divides each micro-batch's loss by gradient_accumulation_steps ({n}) only for a "
    "model whose forward takes no **kwargs; a model that takes them but averages its own loss, "
    "ignoring num_items_in_batch (BERT's heads do), then trains on {n} times the gradient, "
    "clipped by max_grad_norm: set `trainer.loss_is_scaled_for_ga = False` for such a model "
    "(a model whose loss divides by num_items_in_batch needs nothing)"
)
"""Accumulation is the split commtune measured, but Trainer decides the loss scale from the
model's signature; the export cannot see the user's model, so it says when to set it."""


def render(tuned: Tuned, script: str) -> Export:
    args, missing = training_arguments(tuned)
    settings = {
        "training_arguments": args,
        "environment": tuned.env,
        "launch": launch_line(tuned, torchrun_args(tuned, script)),
        "split": split_line(tuned),
        "entry": tuned.line,
        "not_expressed": [dataclasses.asdict(u) for u in (*tuned.dropped, *missing)],
    }
    text = json.dumps(settings, indent=2) + "\n"
    n = tuned.accumulation_steps
    cautions = (LOSS_SCALING.format(n=n),) if n > 1 else ()
    return Export("trainer", text, settings, (*tuned.dropped, *missing), cautions)
