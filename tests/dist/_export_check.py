"""A training script a user might write, launched by each exported target: it passes the
exported settings to the tool as the export says, trains a tiny BERT for a few steps, and
writes what the tool really ran with (read from the wrapped model and the tool's own state)
to ``rank<R>.json`` in the working directory.

    _export_check.py trainer|accelerate|lightning|torchrun SETTINGS_JSON
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook
from transformers import BertConfig, BertForMaskedLM

STEPS = 2
SAMPLES = 64


def tiny_model() -> BertForMaskedLM:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=512, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=64)  # fmt: skip
    return BertForMaskedLM(config)


def samples() -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 512, (SAMPLES, 16), generator=gen)
    return [{"input_ids": row, "labels": row.clone()} for row in ids]


def collate(batch: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([s[key] for s in batch]) for key in batch[0]}


def count_forwards(model: nn.Module) -> list[int]:
    """Each forward's batch size, appended as the model runs (the tool's micro-batches); each
    optimizer step appends its position in ``STEP_MARKS`` (whichever optimizer the tool made;
    after the step, as Lightning runs the last micro-batch's forward inside ``step``)."""
    seen: list[int] = []
    model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(len(kwargs["input_ids"])),
                                    with_kwargs=True)  # fmt: skip
    register_optimizer_step_post_hook(lambda *_: STEP_MARKS.append(len(seen)))
    return seen


STEP_MARKS: list[int] = []


def per_step() -> list[int]:
    """Micro-batches each optimizer step took: the accumulation the tool really ran."""
    return [b - a for a, b in zip([0, *STEP_MARKS], STEP_MARKS, strict=False)]


def ddp_record(wrapped: nn.Module) -> dict[str, Any]:
    """What DDP was built with: the exported values land here or nowhere."""
    assert isinstance(wrapped, nn.parallel.DistributedDataParallel), type(wrapped)
    return {"bucket_bytes_cap": wrapped.bucket_bytes_cap,
            "find_unused_parameters": wrapped.find_unused_parameters,
            "broadcast_buffers": wrapped.broadcast_buffers,
            "world_size": dist.get_world_size(), "backend": dist.get_backend(),
            "rank": dist.get_rank(), "nccl_buffsize": os.environ.get("NCCL_BUFFSIZE"),
            "checkpointing": checkpointing(wrapped)}  # fmt: skip


def checkpointing(wrapped: nn.Module) -> bool:
    """Whether activations are recomputed: Hugging Face's switch (what Trainer, Accelerate and
    Lightning scripts turn on), or torch's checkpoint wrappers (what ``tuned.wrap`` inserts)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    hf = next(m for m in wrapped.modules() if isinstance(m, BertForMaskedLM))
    wrappers = any(isinstance(m, CheckpointWrapper) for m in wrapped.modules())
    return hf.is_gradient_checkpointing or wrappers


def optimizer_record(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    inner = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper
    return {"optimizer": type(inner).__name__, "fused": inner.defaults.get("fused"),
            "foreach": inner.defaults.get("foreach")}  # fmt: skip


def run_trainer(settings: dict[str, Any]) -> dict[str, Any]:
    from transformers import Trainer, TrainingArguments

    model = tiny_model()
    seen = count_forwards(model)
    args = TrainingArguments(output_dir="hf-out", max_steps=STEPS, report_to=[],
                             save_strategy="no", disable_tqdm=True,
                             **settings["training_arguments"])  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=samples(), data_collator=collate)
    trainer.train()
    return {**ddp_record(trainer.model_wrapped), **optimizer_record(trainer.optimizer),
            "accumulation": per_step(), "steps": trainer.state.global_step,
            "micro_batches": seen}  # fmt: skip


def run_accelerate(settings: dict[str, Any]) -> dict[str, Any]:
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    # the accumulation comes from the launch's environment, as the export puts it
    accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(
        **settings["ddp_kwargs"])])  # fmt: skip
    model = tiny_model()
    if settings["activation_checkpointing"]:
        model.gradient_checkpointing_enable()
    seen = count_forwards(model)
    optimizer = torch.optim.AdamW(model.parameters(), **settings["optimizer"])
    loader = torch.utils.data.DataLoader(samples(), collate_fn=collate,
                                         **settings["dataloader"])  # fmt: skip
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps = 0
    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            optimizer.step()
            optimizer.zero_grad()
        steps += accelerator.sync_gradients
        if steps == STEPS:
            break
    return {
        **ddp_record(model),
        **optimizer_record(optimizer),
        "steps": steps,
        "accumulation": per_step(),
        "micro_batches": seen,
    }


def run_torchrun(settings: dict[str, Any]) -> dict[str, Any]:
    from train_fns import tuned

    dist.init_process_group("gloo")
    best = tuned.load(os.environ["COMMTUNE_BEST"])
    micro, accumulation = tuned.split(best, dist.get_world_size())
    model = tuned.wrap(tiny_model(), best)
    seen = count_forwards(model.module)
    data = collate(samples()[: micro * accumulation])
    optimizer = torch.optim.AdamW(model.parameters())
    for i in range(accumulation):  # one optimizer step's micro-batches
        part = {k: v[i * micro : (i + 1) * micro] for k, v in data.items()}
        model(**part).loss.backward()
    optimizer.step()
    record = {**ddp_record(model), "accumulation": per_step(), "steps": 1,
              "micro_batches": seen}  # fmt: skip
    return record


def run_lightning(settings: dict[str, Any]) -> dict[str, Any]:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy

    class Module(pl.LightningModule):
        """The tiny BERT, its checkpointing and optimizer where the export says they go."""

        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_model()
            if any(u["key"] == "activation_checkpointing" for u in settings["not_expressed"]):
                self.model.gradient_checkpointing_enable()

        def training_step(self, batch: dict[str, torch.Tensor], _: int) -> torch.Tensor:
            return self.model(**batch).loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            impl = {u["value"]: True for u in settings["not_expressed"] if u["key"] == "adamw_impl"}
            return torch.optim.AdamW(self.parameters(), **impl)

    record: dict[str, Any] = {}

    class ReadBack(pl.Callback):
        def on_train_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
            record.update(ddp_record(trainer.strategy.model),
                          **optimizer_record(trainer.optimizers[0]),
                          accumulation=per_step(),
                          steps=trainer.global_step)  # fmt: skip

    module = Module()
    seen = count_forwards(module.model)
    strategy = settings["strategy"]
    assert strategy["class"] == "DDPStrategy", strategy
    trainer = pl.Trainer(**settings["trainer"], strategy=DDPStrategy(**strategy["kwargs"]),
                         max_steps=STEPS, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[ReadBack()])  # fmt: skip
    loader = torch.utils.data.DataLoader(samples(), collate_fn=collate, **settings["dataloader"])
    trainer.fit(module, loader)
    return {**record, "micro_batches": seen}


RUNNERS = {"trainer": run_trainer, "accelerate": run_accelerate, "torchrun": run_torchrun,
           "lightning": run_lightning}  # fmt: skip


def main() -> None:
    target, settings_path = sys.argv[1], sys.argv[2]
    settings = json.loads(Path(settings_path).read_text())
    try:
        record = RUNNERS[target](settings)
        Path(f"rank{record['rank']}.json").write_text(json.dumps(record))
    finally:
        # Trainer and Accelerate leave the group up; a gloo group still up at interpreter exit
        # can abort the process ("terminate called without an active exception"), an error too
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
