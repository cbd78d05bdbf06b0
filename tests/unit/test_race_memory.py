"""Which finalists a race keeps built side by side (``finalists.fit_together``): the allocator
caches every resident's working blocks between windows, so they must fit all at once."""

from __future__ import annotations

from orchestrator.search.finalists import RESIDENT_BYTES_PER_PARAM, fit_together
from orchestrator.search.results import TrialRecord
from train_fns import metrics as m

GB = 10**9


def _rec(number: int, peak_gb: float, held_gb: float = 10.0) -> TrialRecord:
    """A completed trial on a 100 GB device whose weights, gradients and AdamW moments hold
    ``held_gb`` and whose step peaks at ``peak_gb``."""
    attrs = {m.MEMORY_CAPACITY_BYTES: 100 * GB, m.PEAK_MEM_BYTES: peak_gb * GB,
             m.NUM_PARAMS: held_gb * GB / RESIDENT_BYTES_PER_PARAM}  # fmt: skip
    return TrialRecord(number, m.COMPLETE, "", {"strategy": "ddp"}, attrs)


def test_residents_are_admitted_on_the_sum_of_their_working_sets() -> None:
    """Three of 10 GB held and 30 GB working each: 30 + 90 GB do not fit in 90% of 100 GB,
    though 30 GB held and the largest working set (60 GB) would."""
    assert not fit_together([_rec(0, 40), _rec(1, 40), _rec(2, 40)], world_size=2)
    assert fit_together([_rec(0, 40), _rec(1, 40)], world_size=2)  # 20 + 60 GB
