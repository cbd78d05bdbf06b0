"""Pure functions that turn what a trial's workers did into a trial outcome.

No Ray here: the driver hands over the per-worker window reports and, on failure,
the exception; these functions return values (a summary, a classification) that
are tested on their own.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

from train_fns import metrics as m
from train_fns.commsplit import comm_fraction, exposed_comm
from train_fns.metrics import HANG_EXIT_CODE
from train_fns.plan import TrialPlan

GIB = 1024**3


def window_throughputs(windows: list[list[dict[str, Any]]], global_batch: int) -> list[float]:
    """Global samples/s of each window: a synchronous step is as slow as its slowest rank."""
    return [global_batch / max(w[m.STEP_TIME_S] for w in ranks) for ranks in windows]


def summarize(windows: list[list[dict[str, Any]]], plan: TrialPlan) -> dict[str, Any]:
    """Aggregate per-window, per-worker reports into the trial's metrics.

    A synchronous step is as slow as its slowest rank, so each window's step time
    is the maximum over ranks; throughput is the median over windows and the spread
    is their coefficient of variation. ``MEAN_SAMPLES_PER_S`` is the same from the windows'
    mean steps: the race pairs windows by it (``orchestrator.search.race``).
    """
    if not windows:
        raise ValueError("no measurement window was reported")
    throughputs = window_throughputs(windows, plan.global_batch)
    median_tp = statistics.median(throughputs)
    mean_step = statistics.median(max(w[m.MEAN_STEP_TIME_S] for w in ranks) for ranks in windows)
    cv = statistics.pstdev(throughputs) / statistics.fmean(throughputs) if len(windows) > 1 else 0.0
    parts = {
        key: statistics.median(max(w[key] for w in ranks) for ranks in windows)
        for key in (m.STEP_TIME_S, m.DATA_S, m.FWD_BWD_S, m.OPTIM_S)
    }
    last = windows[-1]
    return {
        **comm_split(windows),
        m.SAMPLES_PER_S: median_tp,
        m.MEAN_SAMPLES_PER_S: plan.global_batch / mean_step,
        m.TOKENS_PER_S: median_tp * plan.seq_len,
        m.THROUGHPUT_CV: cv,
        **parts,
        m.LOSS: statistics.fmean(w[m.LOSS] for w in last),
        m.PEAK_MEM_BYTES: max(w[m.PEAK_MEM_BYTES] for ranks in windows for w in ranks),
        **_memory(windows),
        m.ENV_SEEN: {str(w[m.RANK]): w[m.ENV_SEEN] for w in last},
        m.SETUP_S: max((w.get(m.SETUP_S) or {} for w in windows[0]), key=lambda s: sum(s.values())),
        m.NUM_NONFINITE: max(w.get(m.NUM_NONFINITE, 0) for w in last),
        m.NUM_PARAMS: max(w.get(m.NUM_PARAMS, 0) for w in last),
        m.GPU_UTIL: _median_or_none(w.get(m.GPU_UTIL) for ranks in windows for w in ranks),
        m.GUARD: windows[0][0].get(m.GUARD) or {},
        "num_windows": len(windows),
        "window_samples_per_s": throughputs,
    }


def _memory(windows: list[list[dict[str, Any]]]) -> dict[str, int | None]:
    """Both GPU peaks (the larger of the two is the trial's peak) and the smallest rank's
    capacity (the first to run out); None where the workers did not report them."""
    reports = [w for ranks in windows for w in ranks]
    out = {}
    for key, pick in ((m.ALLOCATED_PEAK_BYTES, max), (m.DEVICE_USED_PEAK_BYTES, max),
                      (m.MEMORY_CAPACITY_BYTES, min)):  # fmt: skip
        present = [w[key] for w in reports if w.get(key) is not None]
        out[key] = pick(present) if present else None
    return out


def _median_or_none(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def comm_split(windows: list[list[dict[str, Any]]]) -> dict[str, float]:
    """Exposed communication and compute of a step, measured (medians over windows).

    Per rank, exposed communication is the syncing micro-step minus one without sync (never
    below 0); a synchronous step waits for its slowest rank, so a window takes the largest.
    """
    if any(m.NOSYNC_MICRO_S not in w for ranks in windows for w in ranks):
        return {}
    exposed, compute = [], []
    for ranks in windows:
        comm = max(exposed_comm(w[m.SYNC_MICRO_S], w[m.NOSYNC_MICRO_S], 0.0)[0] for w in ranks)
        exposed.append(comm)
        compute.append(max(w[m.FWD_BWD_S] for w in ranks) - comm)
    comm_s, compute_s = statistics.median(exposed), statistics.median(compute)
    return {
        m.EXPOSED_COMM_S: comm_s,
        m.COMPUTE_S: compute_s,
        m.COMM_FRACTION: comm_fraction(comm_s, compute_s) or 0.0,
    }


def failure_texts(exc: BaseException) -> list[str]:
    """Messages of the exception, its chain and, for worker-group errors, each worker's."""
    texts, seen, todo = [], set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        texts.append(f"{type(e).__name__}: {e}")
        todo.extend([e.__cause__, e.__context__])
        todo.extend(getattr(e, "worker_failures", {}).values())
        todo.append(getattr(e, "controller_failure", None))
    return texts


NCCL_ALLOC = re.compile(
    r"Failed to CUDA (?:calloc|malloc|host alloc)[^\n]*|"
    r"(?:ncclUnhandledCudaError|unhandled cuda error)[^\n]*(?:\n[^\n]*){0,3}out of memory[^\n]*",
    re.I,
)
"""NCCL's own allocation failures (``alloc.h``, ``CUCHECK`` of cuMemCreate): its buffers are
allocated lazily, at a collective's first call, so they strike inside a measured step."""


def classify_failure(
    exc: BaseException,
    plan: TrialPlan,
    peak_mem_bytes: int | None = None,
    hang_markers: list[str] | None = None,
) -> tuple[str, str]:
    """Map a failed ``fit()`` to (state, reason), the reason fit for a log line.

    Order matters: an OOM on one rank makes the others fail in a collective, so the
    root cause is looked for first. Ray reports a worker that ended itself and one
    that was killed alike, so the watchdogs' ``hang_markers`` tell a hang apart.
    """
    text = "\n".join([*failure_texts(exc), *(hang_markers or [])])
    low = text.lower()
    peak = f"{peak_mem_bytes / GIB:.2f} GiB" if peak_mem_bytes else "unknown"
    if NCCL_ALLOC.search(text):
        return m.OOM, (
            f"out of memory in NCCL (its buffers: NCCL_BUFFSIZE per channel and peer, "
            f"allocated at a collective's first call) at micro_batch={plan.micro_batch}; peak "
            f"seen {peak}: {_one_line(NCCL_ALLOC.search(text).group())}"
        )
    if "outofmemoryerror" in low or "out of memory" in low:
        return m.OOM, (
            f"out of memory at micro_batch={plan.micro_batch} "
            f"(accumulation {plan.accumulation_steps}, {plan.strategy}); peak seen {peak}"
        )
    if "commtune watchdog" in low or f"exit code {HANG_EXIT_CODE}" in low or "timed out" in low:
        return m.HANG, (
            f"no step finished within step_deadline_s={plan.step_deadline_s:g}s; "
            "the worker group was ended"
        )
    crash_marks = ("actordiederror", "died", "sigkill", "signal", "exit code", "unexpectedly")
    if any(mark in low for mark in crash_marks):
        first = next((t for t in failure_texts(exc) if "died" in t.lower()), text)
        return m.CRASH, f"a worker process died: {_one_line(first)}"
    whose, shown = _whose(text, _user_package(plan))
    tail = traceback_tail(text, shown)
    if tail is not None:
        return m.CRASH, f"{whose} raised {_one_line(tail)}{_fix(low)}"
    return m.ERROR, _one_line(text)


_LIBRARY = re.compile(
    r"[/\\](site|dist)-packages[/\\]|[/\\]lib[/\\](python3\.\d+t?|pypy3\.\d+)[/\\]|\\Lib\\"
)
_COMMTUNE_ROOT = str(Path(__file__).resolve().parents[2])
_COMMTUNE = re.compile(
    rf"^{re.escape(_COMMTUNE_ROOT)}[/\\](train_fns|orchestrator|search_spaces)[/\\]"
    r"|[/\\](site-packages|_ray_pkg_\w+)[/\\](train_fns|orchestrator|search_spaces)[/\\]"
)
"""commtune's own files: under this checkout, an installed copy or a job's uploaded working
directory (Ray's ``_ray_pkg_*``), not any folder that happens to be called ``orchestrator``."""


def _user_package(plan: TrialPlan) -> str | None:
    """The top package of a ``package.module:function`` entrypoint: the user's code, wherever
    it is installed (site-packages included)."""
    module = str(plan.entrypoint or "").rpartition(":")[0]
    return module.split(".")[0] if module and not module.endswith(".py") else None
_DISTRIBUTED = re.compile(r"[/\\]torch[/\\](distributed|nn[/\\]parallel)[/\\]")
_REDUCER = re.compile(r"\bDDP\b|\breducer\b|ProcessGroup|NCCL error", re.I)


def _whose(text: str, package: str | None = None) -> tuple[str, int]:
    """Whose code failed, from the last traceback's frames, and which frame to show: the
    user's (their workload's or model's frames are on the stack: the innermost of those),
    torch.distributed's (DDP's reducer, FSDP, a collective, with no frame of the user's),
    commtune's own, or the model library's (the innermost frame)."""
    body = text[text.rfind("Traceback (most recent call last)") :]
    files = [f for f, _, _ in _FRAME.findall(body)]
    mine = re.compile(rf"[/\\]{re.escape(package)}[/\\]") if package else None
    users = [i for i, f in enumerate(files) if (mine and mine.search(f)) or (
        not f.startswith("<") and not _LIBRARY.search(f) and not _COMMTUNE.search(f))]
    if users:
        return "the training code", users[-1]
    innermost = files[-1] if files else ""
    raised = _RAISED.findall(body)
    # DDP's reducer raises from its C++ autograd hooks: the innermost Python frame is then
    # torch.autograd's engine, and only the message names the reducer
    if _DISTRIBUTED.search(innermost) or (raised and _REDUCER.search(raised[-1])):
        return "torch.distributed (DDP, FSDP or a collective, called by commtune's step)", -1
    if _COMMTUNE.search(innermost):
        return "commtune's worker code (a commtune bug: please report it)", -1
    return "the model's library code", -1


_FIXES = {
    "expected to have finished reduction in the prior iteration": (
        "; the model leaves parameters without a gradient in some steps: set "
        "workload.unused_parameters: true (DDP then finds them in every plan)"
    ),
}
"""Failure messages whose cause and fix are known: the fix is added to the reason."""


def _fix(low: str) -> str:
    return next((fix for mark, fix in _FIXES.items() if mark in low), "")


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_RAISED = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit)\b.*)$", re.M)


def traceback_tail(text: str, frame: int = -1) -> str | None:
    """A worker traceback's last lines: the exception raised and where (the innermost frame,
    or the ``frame``-th: what a user needs first), or None when ``text`` holds no traceback."""
    last_tb = text.rfind("Traceback (most recent call last)")
    if last_tb < 0:
        return None
    body = text[last_tb:]
    frames = _FRAME.findall(body)
    raised = [r for r in _RAISED.findall(body) if not r.startswith("Traceback")]
    if not raised:
        return None
    where = f" (at {frames[frame][0]}:{frames[frame][1]} in {frames[frame][2]})" if frames else ""
    return f"{raised[-1].strip()}{where}"


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


MIN_NOISE = 0.05
"""Floor on the relative noise used for pruning. A trial's window spread understates the
run-to-run spread: on the 2-core CI machine, repeated baseline runs spread by a CV of about
5% while their windows spread by 2-8%; so no trial is pruned for being under 15% slower."""
PRUNE_SIGMAS = 3.0


def prune_threshold(best_value: float | None, best_cv: float | None) -> float | None:
    """The throughput below which a trial is clearly slower than the best so far.

    Clearly means by more than the measured noise: ``PRUNE_SIGMAS`` times the best
    trial's window spread (at least ``MIN_NOISE``). None when there is no best yet.
    """
    if best_value is None or best_value <= 0:
        return None
    noise = max(best_cv or 0.0, MIN_NOISE)
    return best_value * max(0.0, 1.0 - PRUNE_SIGMAS * noise)
