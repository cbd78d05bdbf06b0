"""Models: an HF config from a preset, a local directory or an HF model type; never a download.

Workers are often offline and a trial must measure communication, not a hub fetch, so models
are built from configs with a seeded random init (identical on every rank). A local directory
that holds weights is loaded from disk.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
)

from train_fns.model_presets import MODEL_PRESETS, POSITION_KEYS, local_dir
from train_fns.plan import InfeasiblePlan, TrialPlan

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
ATTN_IMPLEMENTATION = "sdpa"
"""SDPA runs on CPU and GPU and is what real runs use; eager would distort the timings."""


def resolve_model_config(model: str, overrides: dict[str, Any]) -> PretrainedConfig:
    """Return the HF config for a preset, a local directory or an HF model type.

    ``overrides`` are applied last (after the preset's keys), so a test can shrink any preset.
    """
    if model in MODEL_PRESETS:
        preset = {k: v for k, v in MODEL_PRESETS[model].items() if k != "task"}
        model_type = preset.pop("model_type")
        return AutoConfig.for_model(model_type, **{**preset, **overrides})
    local = local_dir(model)
    if local is not None:
        return AutoConfig.from_pretrained(local, local_files_only=True, **overrides)
    if model in CONFIG_MAPPING_NAMES:
        return AutoConfig.for_model(model, **overrides)
    raise ValueError(
        f"model={model!r} is neither a preset ({', '.join(MODEL_PRESETS)}), a local directory "
        "with config.json, nor an HF model type (e.g. 'bert', 'gpt2'); models are never downloaded"
    )


def default_task(config: PretrainedConfig) -> str:
    """``clm`` for decoder-only/causal models, else ``mlm`` (what the model can train on)."""
    if getattr(config, "is_decoder", False):
        return "clm"
    model_type = config.model_type
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "mlm"
    return "clm" if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else "mlm"


def max_positions(config: PretrainedConfig) -> int | None:
    """The longest sequence the position embeddings cover (None: the config does not say)."""
    for key in POSITION_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return None


def check_seq_len(config: PretrainedConfig, seq_len: int) -> None:
    """Raise InfeasiblePlan when ``seq_len`` exceeds the model's position embeddings.

    Position ids past the table index out of range, which on GPU is a device-side assert
    that kills the worker with an opaque error; say it up front instead.
    """
    limit = max_positions(config)
    if limit is not None and seq_len > limit:
        raise InfeasiblePlan(
            f"seq_len={seq_len} exceeds max_position_embeddings={limit} of model "
            f"{config.model_type!r}; lower seq_len or set model_overrides.max_position_embeddings"
        )


def model_class(task: str) -> type:
    return AutoModelForMaskedLM if task == "mlm" else AutoModelForCausalLM


def build_model(plan: TrialPlan, meta: bool = False) -> PreTrainedModel:
    """Build the plan's model in fp32 with identical weights on every rank.

    Random init is seeded by ``plan.seed``; a local directory with weights loads them (heads
    the checkpoint lacks are then initialised from the same seed). Master weights are fp32
    whatever the checkpoint says: precision is the plan's autocast/mixed-precision choice.
    ``meta``: the same model on the meta device, without weights (``train_fns.weights``).
    """
    config = training_config(resolve_model_config(plan.model, plan.model_overrides), plan.task)
    check_seq_len(config, plan.seq_len)
    torch.manual_seed(plan.seed)
    cls = model_class(plan.task)
    local = local_dir(plan.model)
    if meta:
        with torch.device("meta"):
            model = cls.from_config(
                config, dtype=torch.float32, attn_implementation=ATTN_IMPLEMENTATION
            )
    elif local is not None and any((local / name).is_file() for name in WEIGHT_FILES):
        model = cls.from_pretrained(
            local,
            config=config,
            local_files_only=True,
            dtype=torch.float32,
            attn_implementation=ATTN_IMPLEMENTATION,
        )
    else:
        model = cls.from_config(
            config, dtype=torch.float32, attn_implementation=ATTN_IMPLEMENTATION
        )
    return model.train()  # from_pretrained returns eval mode; we time training (dropout on)


def training_config(config: PretrainedConfig, task: str) -> PretrainedConfig:
    """``config`` as a training run builds it (the driver's override check builds the same)."""
    if task == "clm" and getattr(config, "is_decoder", None) is False:
        config.is_decoder = True  # encoder models (BERT) need this to train causally
    if getattr(config, "use_cache", None):
        config.use_cache = False  # training never reads a KV cache; building one costs memory
    return config
