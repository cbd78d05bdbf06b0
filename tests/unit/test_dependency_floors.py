"""pyproject's lower bounds cover the APIs the code calls: a fresh install at the floor must run.

``train_fns.models`` builds every Hugging Face model with ``dtype=torch.float32``; transformers
took ``dtype`` (renamed from ``torch_dtype``, huggingface/transformers#39782) in 4.56.0. Before
it, ``from_config`` passes an unknown ``dtype`` on to the model's ``__init__`` (a TypeError) and
the config's own ``torch_dtype`` (bf16 in many hub configs) would set the master weights.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DTYPE_ARGUMENT_SINCE = (4, 56)


def _floor(package: str) -> tuple[int, ...]:
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(rf'^\s*"{re.escape(package)}>=([0-9.]+),<[0-9.]+",$', text, re.MULTILINE)
    assert found, f"{package} has no >=floor,<bound requirement in pyproject.toml"
    return tuple(int(part) for part in found.group(1).split("."))


def test_transformers_floor_accepts_the_dtype_argument() -> None:
    models = (ROOT / "train_fns" / "models.py").read_text()
    assert "dtype=torch.float32" in models and "torch_dtype" not in models
    assert _floor("transformers") >= DTYPE_ARGUMENT_SINCE
