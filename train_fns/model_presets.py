"""Model names the driver can check without torch or transformers (importing them takes 5-15 s).

Presets state their position-table size (the transformers defaults, written out) so that a
``seq_len`` too long for the model is refused on the driver at once, not inside a worker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "bert-large": {
        "model_type": "bert",
        "max_position_embeddings": 512,
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
        "task": "mlm",
    },
    "bert-base": {"model_type": "bert", "max_position_embeddings": 512, "task": "mlm"},
    "bert-mini": {
        "model_type": "bert",
        "max_position_embeddings": 512,
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "intermediate_size": 1024,
        "task": "mlm",
    },
    "bert-tiny": {
        "model_type": "bert",
        "max_position_embeddings": 512,
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 512,
        "task": "mlm",
    },
    "gpt2": {"model_type": "gpt2", "n_positions": 1024, "task": "clm"},
}
"""Preset name -> ``model_type``, HF config kwargs and the default ``task``."""

POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len")
"""Config keys that bound the sequence length, in the order models use them."""
MAX_CONFIG_JSON_BYTES = 1 << 20


def local_dir(model: str) -> Path | None:
    path = Path(model).expanduser()
    return path if (path / "config.json").is_file() else None


def is_known_model(name: str) -> bool:
    """Cheap check for the driver's config validation: nothing is built or downloaded, and
    transformers is not imported (its model types are read from its source files)."""
    if name in MODEL_PRESETS or local_dir(name) is not None:
        return True
    from train_fns.hf_source import model_types

    types = model_types()  # read from transformers' source; imported only if that fails
    if types is None:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES as types
    return name in types


def read_config_json(folder: Path) -> dict[str, Any]:
    """A local model's config.json as a mapping; ValueError says what is wrong with it."""
    path = folder / "config.json"
    with path.open("rb") as f:
        data = f.read(MAX_CONFIG_JSON_BYTES + 1)
    if len(data) > MAX_CONFIG_JSON_BYTES:
        raise ValueError(f"{path} is larger than 1 MiB; a model config is a few KiB")
    try:
        config = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"{path} is not valid JSON ({str(e)[:120]})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ValueError(f"{path} must be a JSON object with a string 'model_type'")
    return config


def declared_positions(model: str, overrides: dict[str, Any]) -> int | None:
    """The position-table size a preset or local config states (overrides win); None when
    only transformers knows (an HF model type) or the config does not say."""
    if model in MODEL_PRESETS:
        stated = MODEL_PRESETS[model]
    else:
        folder = local_dir(model)
        stated = read_config_json(folder) if folder is not None else {}
    merged = {**stated, **overrides}
    for key in POSITION_KEYS:
        value = merged.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None
