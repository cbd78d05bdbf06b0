"""``workload.model_overrides`` checked on the driver, before Ray (issue 26).

An override transformers refuses used to surface inside a worker, a minute later, as a traceback
(``ZeroDivisionError: integer modulo by zero`` for ``num_attention_heads: 0``). Here each key is
checked against the model's config class (a typo gets the close names), each value against the
kind of that field, and then the config is built once and the model constructed on the ``meta``
device: every check the model's constructor makes (heads that do not divide the hidden size, a
negative vocabulary) runs, and nothing is allocated. Needs torch and transformers, so it runs
only when there are overrides, after every cheap check.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from orchestrator.inputs import ConfigError

COUNT_KEY = re.compile(r"^(num_|n_)|(_size|_layers|_heads|_positions|_embeddings|_dim)$")
"""Integer fields that count or size something: zero or less builds no working model."""
PROBABILITY_KEY = re.compile(r"(dropout|_prob)")
"""Float fields that are probabilities."""


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
    known = set(defaults) | set(getattr(type(base), "attribute_map", {}))
    for key, value in overrides.items():
        _check_one(str(key), value, known, defaults, base.model_type)
    _check_build(workload)


def _check_one(key: str, value: Any, known: set[str], defaults: dict, model_type: str) -> None:
    name = f"workload.model_overrides.{key}"
    if key not in known:
        close = difflib.get_close_matches(key, known, n=3)
        hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
        raise ConfigError(
            name, f"{model_type!r} models have no such config key; {hint}see the model's config "
            "class in transformers for its keys"
        )  # fmt: skip
    default = defaults.get(key)
    if isinstance(default, bool) and not isinstance(value, bool):
        raise ConfigError(name, f"got {value!r}; use true or false")
    if isinstance(default, int) and not isinstance(default, bool):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(name, f"got {value!r}; use a whole number")
        if COUNT_KEY.search(key) and default >= 1 and value < 1:
            raise ConfigError(name, f"got {value}; it counts or sizes part of the model: use 1 "
                              "or more")  # fmt: skip
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
    """Build the config with the overrides, then the model on the meta device. On a refusal,
    the key named is the first whose addition (in the user's order) makes the build fail."""
    overrides = dict(workload.model_overrides)
    error = _build_error(workload, overrides)
    if error is None:
        return
    keys = list(overrides)
    culprit = next(
        (k for i, k in enumerate(keys) if _build_error(workload, dict(
            (key, overrides[key]) for key in keys[: i + 1])) is not None),
        keys[-1],
    )  # fmt: skip
    value = overrides[culprit]
    raise ConfigError(
        f"workload.model_overrides.{culprit}",
        f"{value!r} is refused by transformers building {workload.model!r}: {error}; change this "
        "value or drop the override",
    )


def _build_error(workload: Any, overrides: dict[str, Any]) -> str | None:
    """transformers' own words (one line) if the config or model cannot be built, else None."""
    import torch
    from transformers.utils import logging as hf_logging

    from train_fns.models import default_task, model_class, resolve_model_config

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its warnings about the value would repeat the refusal
    try:
        config = resolve_model_config(workload.model, overrides)
        cls = model_class(workload.task or default_task(config))
        with torch.device("meta"):
            cls.from_config(config)
    except Exception as e:  # whatever transformers raises, the value is the user's: keep its words
        text = " ".join(str(e).split()) or type(e).__name__
        return f"{type(e).__name__}: {text[:200]}"
    finally:
        hf_logging.set_verbosity(verbosity)
    return None
