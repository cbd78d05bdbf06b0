"""The Accelerate target: an ``accelerate launch --config_file`` file.

The file takes the processes, the precision and FSDP2's plugin; the accumulation and the
variables go in the launch's environment (Accelerate reads
``ACCELERATE_GRADIENT_ACCUMULATION_STEPS``; NCCL reads its own as each process starts); DDP's
bucket options have no place in the file, only in the script's
``DistributedDataParallelKwargs``, so the file's comments carry that line and ``--json`` gives
them as data. A config file with a key Accelerate does not know is refused by it, so nothing
else is added as a key.
"""

from __future__ import annotations

import dataclasses

import yaml

from orchestrator.export.entry import Export, Tuned, Unexpressed
from orchestrator.export.torchrun import launch_line, split_line

ACCUMULATION_VARIABLE = "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"
CPU_VARIABLE = "ACCELERATE_USE_CPU"
"""CPU processes under Accelerate's torchrun launcher: each then runs gloo, as the search's CPU
workers did (Accelerate's own multi-CPU launch goes through mpirun)."""
CPU_NOTE = (
    f"CPU workers: distributed_type {{MULTI_GPU, FSDP}} with use_cpu false is deliberate; "
    f"{CPU_VARIABLE}=true in the launch makes each process a CPU one on gloo, started by "
    "Accelerate's torchrun launcher (its MULTI_CPU launch would need mpirun)"
)
"""Said in the file's head on CPU, where MULTI_GPU and use_cpu false would read as a mistake."""
PRECISIONS = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}
DDP_KWARGS = ("bucket_cap_mb", "broadcast_buffers", "find_unused_parameters",
              "gradient_as_bucket_view", "static_graph")  # fmt: skip


def config_file(tuned: Tuned) -> dict:
    """Accelerate's ``ClusterConfig`` keys for the size."""
    config = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP" if tuned.strategy == "fsdp" else "MULTI_GPU",
        "num_processes": tuned.world_size,
        "num_machines": tuned.num_nodes,
        "machine_rank": 0,
        "mixed_precision": PRECISIONS[tuned.precision],
        "use_cpu": False,
        "rdzv_backend": "static" if tuned.num_nodes == 1 else "c10d",
        "same_network": True,
        "main_training_function": "main",
        "debug": False,
        "gpu_ids": "all",
    }
    if tuned.strategy == "fsdp":
        config["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_reshard_after_forward": tuned.fsdp.reshard_after_forward is not False,
            "fsdp_activation_checkpointing": tuned.activation_checkpointing,
        }
    return config


def ddp_kwargs(tuned: Tuned) -> dict:
    """``DistributedDataParallelKwargs`` for the script (DDP only), with the hook by its value
    in Accelerate's ``DDPCommunicationHookType`` (``bf16``, ``fp16``)."""
    if tuned.strategy == "fsdp":
        return {}
    kwargs = {k: getattr(tuned.ddp, k) for k in DDP_KWARGS}
    if tuned.ddp.comm_hook:
        kwargs["comm_hook"] = tuned.ddp.comm_hook
    return kwargs


def fsdp_missing(tuned: Tuned) -> list[Unexpressed]:
    """FSDP2 options Accelerate's plugin has no field for."""
    if tuned.strategy != "fsdp":
        return []
    fsdp, missing = tuned.fsdp, []
    if not isinstance(fsdp.reshard_after_forward, bool):
        missing.append(
            Unexpressed(
                "reshard_after_forward",
                fsdp.reshard_after_forward,
                "fsdp_reshard_after_forward is a bool; resharding to all ranks",
            )
        )
    for key in ("forward_prefetch", "backward_prefetch", "hsdp"):
        if getattr(fsdp, key):
            missing.append(
                Unexpressed(key, getattr(fsdp, key), "Accelerate's FSDP2 plugin has no such field")
            )
    if fsdp.reduce_dtype != "fp32":
        missing.append(
            Unexpressed(
                "reduce_dtype",
                fsdp.reduce_dtype,
                "the plugin takes the reduce dtype only with a whole mixed_precision_policy",
            )
        )
    return missing


def _in_script(tuned: Tuned, kwargs: dict) -> list[Unexpressed]:
    """What the config file has no key for and the script sets, each with the line to write."""
    out = []
    if kwargs:
        out.append(
            Unexpressed(
                "ddp_kwargs",
                kwargs,
                "no config file key: in your script, "
                "Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
                "**ddp_kwargs)])",
            )
        )
    if tuned.adamw_impl:
        out.append(
            Unexpressed(
                "adamw_impl",
                tuned.adamw_impl,
                "no config file key: in your "
                f"script, torch.optim.AdamW(..., {tuned.adamw_impl}=True)",
            )
        )
    if tuned.strategy != "fsdp" and tuned.activation_checkpointing:
        out.append(
            Unexpressed(
                "activation_checkpointing",
                True,
                "no config file key under DDP:"
                " in your script, model.gradient_checkpointing_enable()",
            )
        )
    return out


def render(tuned: Tuned, script: str) -> Export:
    config = config_file(tuned)
    kwargs = ddp_kwargs(tuned)
    missing = [*tuned.dropped, *fsdp_missing(tuned)]
    env = {**tuned.env, ACCUMULATION_VARIABLE: str(tuned.accumulation_steps)}
    if not tuned.use_gpu:
        env[CPU_VARIABLE] = "true"
    launch = dataclasses.replace(tuned, env=env)
    command = launch_line(launch, ["accelerate", "launch", "--config_file", "accelerate.yaml",
                                   script])  # fmt: skip
    missing += _in_script(tuned, kwargs)
    head = [
        f"commtune export for Accelerate: {tuned.name} at {tuned.world_size} workers "
        f"({tuned.backend}); {split_line(tuned)}",
        f"launch: {command}",
        f"your DataLoader: batch_size={tuned.micro_batch} (per process)",
    ]
    if not tuned.use_gpu:
        head.append(CPU_NOTE)
    head += [f"not expressed: {u.line()}" for u in missing]
    text = "".join(f"# {line}\n" for line in head) + yaml.safe_dump(config, sort_keys=False)
    settings = {"config_file": config, "environment": env, "launch": command,
                "ddp_kwargs": kwargs, "dataloader": {"batch_size": tuned.micro_batch},
                "optimizer": {tuned.adamw_impl: True} if tuned.adamw_impl else {},
                "activation_checkpointing": tuned.activation_checkpointing}  # fmt: skip
    return Export("accelerate", text, settings, tuple(missing))
