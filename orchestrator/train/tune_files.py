"""The run folder's ``tuned_sizes.yaml``: the entry per world size a ``--tune`` training run
decided (``orchestrator.train.tune``), written as each size is decided and read back by a
``--resume``, which starts those sizes tuned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from orchestrator.config.schema import ConfigError
from orchestrator.runfiles import TUNED_SIZES_YAML, read_mapping, write_atomic
from search_spaces.knobs import BY_NAME
from train_fns.plan import BUCKETS


def write_tuned_sizes(out: Path, entries: dict[int, dict[str, Any]]) -> None:
    """The run folder's ``tuned_sizes.yaml``: ``sizes:`` and an entry per decided size."""
    text = yaml.safe_dump({"sizes": entries}, sort_keys=True)
    write_atomic(out / TUNED_SIZES_YAML, text)


def read_tuned_sizes(out: Path, global_batch: int) -> dict[int, dict[str, Any]]:
    """The entries a run before this ``--resume`` decided, per world size; none where it wrote
    no file. A file that does not hold what ``write_tuned_sizes`` writes is a ConfigError
    naming the entry (a hand edit, or another run's file)."""
    path = out / TUNED_SIZES_YAML
    if not path.exists():
        return {}
    try:
        sizes = read_mapping(path).get("sizes")
    except (OSError, ValueError, TypeError, RecursionError, yaml.YAMLError) as e:
        first = str(e).partition("\n")[0][:200]
        raise ConfigError(str(path), f"unreadable ({type(e).__name__}: {first}); remove it "
                          "to tune again") from e  # fmt: skip
    if not isinstance(sizes, dict):
        raise ConfigError(f"{path}: sizes", f"expected a mapping of world size to entry, got "
                          f"{type(sizes).__name__}; remove the file to tune again")  # fmt: skip
    return {_size_of(path, key, entry, global_batch): entry for key, entry in sizes.items()}


def _size_of(path: Path, key: Any, entry: Any, global_batch: int) -> int:
    """An entry's world size, once the entry is one ``Size.entry`` writes for it."""
    where = f"{path}: sizes.{str(key)[:40]}"
    if not isinstance(key, int) or isinstance(key, bool) or not 1 <= key <= global_batch:
        raise ConfigError(
            where,
            f"the key ({type(key).__name__}) is not a world size from 1 "
            f"to {global_batch}; remove the entry to tune that size again",
        )
    tuned = entry.get("tuned") if isinstance(entry, dict) else None
    value = tuned.get("accumulation_steps") if isinstance(tuned, dict) else None
    if not (global_batch % key == 0 and isinstance(value, int) and not isinstance(value, bool)
            and value >= 1 and (global_batch // key) % value == 0):  # fmt: skip
        raise ConfigError(where, f"{str(entry)[:120]} holds no tuned.accumulation_steps that "
                          f"splits workload.global_batch={global_batch} over {key} worker(s); "
                          "remove the entry to tune that size again")  # fmt: skip
    low, high = BY_NAME[BUCKETS].values
    buckets = tuned.get(BUCKETS, low)
    if isinstance(buckets, bool) or not isinstance(buckets, int | float) or not (
            low <= buckets <= high):  # fmt: skip
        raise ConfigError(where, f"tuned.{BUCKETS}={buckets!r} is not a bucket size in MB "
                          f"from {low:g} to {high:g}; remove the entry to tune that size "
                          "again")  # fmt: skip
    return key
