"""What ``orchestrator.train --tune`` may switch in a live worker group, and in what order it
tries each knob's values.

Two knobs switch without new processes and without changing what a step computes beyond the
order of summation: the accumulation split (an exact re-split of the per-rank batch) and, under
DDP on more than one worker, the gradient bucket size (the model re-wrapped in DDP with the new
buckets between two steps, ``train_fns.strategies.rebucket``). A setting is a mapping of knob
to value, as best.yaml's ``tuned`` holds them; a candidate changes one knob of the running
setting.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.config.schema import ConfigError
from train_fns.plan import ACCUMULATION, BUCKETS

Setting = dict[str, float]
Candidate = tuple[str, float]


def candidates_of(per_rank: int, running: int, max_accumulation: int) -> list[int]:
    """Accumulation values a size may try, nearest first: divisors of the per-rank batch with
    more micro-batches than ``running`` (so a smaller micro-batch), at most
    ``max_accumulation``."""
    return [a for a in range(running + 1, min(per_rank, max_accumulation) + 1) if per_rank % a == 0]


def bucket_candidates(running: float, choices: Iterable[float]) -> list[float]:
    """The space's bucket sizes other than ``running``, nearest first on a log scale (the
    smaller of two as near): a neighbour's effect is the likelier to be real, and a budget
    that runs out has tried those."""
    others = {float(c) for c in choices if c is not None and float(c) > 0} - {float(running)}
    return sorted(others, key=lambda mb: (abs(math.log(mb / running)), mb))


def space_bucket_choices(spaces: list[str]) -> tuple[float, ...]:
    """The bucket sizes the run's spaces (``search.spaces``) offer; none where no space has
    ``bucket_cap_mb`` as a categorical knob (then buckets are not tuned online). Read on the
    driver before Ray starts: a space that does not load is a ConfigError naming it."""
    from search_spaces import SpaceError, load_spaces

    try:
        specs = load_spaces(spaces)
    except SpaceError as e:
        raise ConfigError("search.spaces", f"{e} (train --tune reads the bucket sizes the "
                          "spaces offer)") from e  # fmt: skip
    for spec in specs:
        for param in spec.params:
            if param.name == BUCKETS and param.kind == "categorical":
                return tuple(float(c) for c in param.choices)
    return ()


def with_candidate(running: Mapping[str, float], candidate: Candidate | None) -> Setting:
    """The setting a candidate's windows train with: the running one, one knob changed."""
    setting = dict(running)
    if candidate is not None:
        setting[candidate[0]] = candidate[1]
    return setting


def tuned_entry(setting: Mapping[str, float], start: Mapping[str, float]) -> dict[str, Any]:
    """A setting as best.yaml's ``tuned`` holds it: the split (an int), and each other knob
    tuning moved from the size's ``start`` (one left at it is not written: the next start at
    the size runs it as its config has it)."""
    moved = {k: float(v) for k, v in setting.items() if k != ACCUMULATION and start.get(k) != v}
    return {ACCUMULATION: int(setting[ACCUMULATION]), **dict(sorted(moved.items()))}
