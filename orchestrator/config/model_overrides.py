"""``workload.model_overrides`` checked on the driver, before Ray.

An override transformers refuses would otherwise surface inside a worker, a minute later, as a
traceback (``ZeroDivisionError: integer modulo by zero`` for ``num_attention_heads: 0``). Here each
key is checked against the model's config class (a typo gets the close names), each value against
the kind of that field (an alias such as GPT-2's ``hidden_size`` as its field), and then the config
is built once and the model constructed, and run once, on the ``meta`` device: every check its
constructor and forward make (heads that do not divide the hidden size, a negative vocabulary,
grouped heads that do not divide the heads, a tuple where a loss is read) runs, and nothing is
allocated. Needs torch and transformers, so it runs only when there are overrides, after every
cheap check.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from orchestrator.config.inputs import ConfigError

COUNTS = frozenset({
    "hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
    "num_key_value_heads", "vocab_size", "max_position_embeddings", "head_dim",
    "n_embd", "n_head", "n_layer", "n_positions", "n_inner",
})  # fmt: skip
"""Integer fields (and their aliases) that count or size the model: 1 or more. Other counts
that may be 0 (``max_window_layers``, shared experts) are left to the build."""
MAX_LAYERS = 1024
"""More layers than any model trains with: a typo'd 100000 made the meta build take minutes
and gigabytes of the driver's memory."""
PROBABILITY_KEY = re.compile(r"(dropout|_prob)")
"""Float fields that are probabilities."""
BOOKKEEPING = re.compile(r"^(_.*|transformers_version|model_type|architectures|return_dict)$")
"""Config keys that are transformers' bookkeeping, not the model's shape: never overridden
(``return_dict: false`` makes the model return a tuple with no ``.loss``)."""


def check_model_overrides(workload: Any) -> None:
    """Refuse, naming ``workload.model_overrides.KEY``, the value and the fix, any override the
    model's config class does not know, of the wrong kind, out of range, or that transformers
    would refuse while building the config or the model."""
    overrides = workload.model_overrides
    if not overrides or workload.entrypoint is not None:
        return
    from train_fns.models import resolve_model_config

    base = resolve_model_config(workload.model, {})
    defaults = {**vars(base), **base.to_dict()}
    aliases = dict(getattr(type(base), "attribute_map", {}))
    for key, value in overrides.items():
        _check_one(str(key), value, defaults, aliases, base.model_type)
    both = {str(k) for k in overrides} & {aliases.get(str(k)) for k in overrides}
    if both:
        target = sorted(both)[0]
        alias = next(a for a, t in aliases.items() if t == target and a in overrides)
        raise ConfigError(f"workload.model_overrides.{alias}", f"names the same field as "
                          f"{target!r}, which is set too; keep one")  # fmt: skip
    _check_build(workload)


def _check_one(key: str, value: Any, defaults: dict, aliases: dict, model_type: str) -> None:
    name, field = f"workload.model_overrides.{key}", aliases.get(key, key)
    if field not in defaults or BOOKKEEPING.match(field):
        known = [k for k in {*defaults, *aliases} if not BOOKKEEPING.match(k)]
        close = difflib.get_close_matches(key, known, n=3)
        hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
        raise ConfigError(
            name, f"{model_type!r} models have no such config key to set; {hint}see the "
            "model's config class in transformers for its keys"
        )  # fmt: skip
    default = defaults.get(field)
    if isinstance(default, bool) and not isinstance(value, bool):
        raise ConfigError(name, f"got {value!r}; use true or false")
    if isinstance(default, int) and not isinstance(default, bool):
        if value is None and field.endswith("_token_id"):
            return  # no such token: a model may have none
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(name, f"got {value!r}; use a whole number")
        if (field in COUNTS or key in COUNTS) and value < 1:
            raise ConfigError(name, f"got {value}; it counts or sizes part of the model: use 1 "
                              "or more")  # fmt: skip
        if field.endswith("layers") and value > MAX_LAYERS:
            raise ConfigError(name, f"got {value}; use at most {MAX_LAYERS} layers")
    if isinstance(default, float):
        if isinstance(value, str) and _is_number(value):
            raise ConfigError(name, f"got the text {value!r} (YAML reads 1e-5 as text); write "
                              "the number with a point, e.g. 1.0e-5")  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(name, f"got {value!r}; use a number")
        if PROBABILITY_KEY.search(key) and not 0 <= value <= 1:
            raise ConfigError(name, f"got {value}; it is a probability: use 0.0 to 1.0")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _check_build(workload: Any) -> None:
    """Build the config with the overrides, then the model on the meta device, and run it once
    there where the untouched model runs on meta (some models read a tensor's value, which the
    meta device cannot give). On a refusal, the key named is the first whose addition (in the
    user's order) makes the build fail."""
    overrides = dict(workload.model_overrides)
    run = _build_error(workload, {}, run=True) is None
    error = _build_error(workload, overrides, run)
    if error is None:
        return
    keys = list(overrides)
    culprit = next(
        (k for i, k in enumerate(keys) if _build_error(workload, dict(
            (key, overrides[key]) for key in keys[: i + 1]), run) is not None),
        keys[-1],
    )  # fmt: skip
    value = overrides[culprit]
    raise ConfigError(
        f"workload.model_overrides.{culprit}",
        f"{value!r} is refused by transformers building {workload.model!r}: {error}; change this "
        "value or drop the override",
    )


def _build_error(workload: Any, overrides: dict[str, Any], run: bool) -> str | None:
    """transformers' own words (one line) if the config or model cannot be built (or, with
    ``run``, run once on the meta device), else None."""
    import torch
    from transformers.utils import logging as hf_logging

    from train_fns.models import (
        ATTN_IMPLEMENTATION,
        default_task,
        model_class,
        resolve_model_config,
        training_config,
    )

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its warnings about the value would repeat the refusal
    try:
        config = resolve_model_config(workload.model, overrides)
        task = workload.task or default_task(config)
        config = training_config(config, task)
        with torch.device("meta"):  # shapes only: nothing is allocated or computed
            model = model_class(task).from_config(config, attn_implementation=ATTN_IMPLEMENTATION)
            ids = torch.zeros((1, min(workload.seq_len, 8)), dtype=torch.long)
            if run and model(input_ids=ids, labels=ids).loss is None:  # what the workload reads
                raise ValueError("the model returns no loss")
    except Exception as e:  # whatever transformers raises, the value is the user's: keep its words
        text = " ".join(str(e).split()) or type(e).__name__
        return f"{type(e).__name__}: {text if len(text) <= 240 else '...' + text[-237:]}"
    finally:
        hf_logging.set_verbosity(verbosity)
    return None
