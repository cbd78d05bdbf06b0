"""Outputs of a search, rebuilt from the Optuna study alone.

The study is the source of truth (it survives a killed driver), so every file
here can be rewritten from it at any time: ``best.yaml``, ``best.env`` and
``trials.csv``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import shlex
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from orchestrator.cluster.placement import mixed_placements
from orchestrator.config.schema import Config, dump_config
from orchestrator.config.study_storage import without_password
from orchestrator.runfiles import (
    BEST_ENV,
    BEST_YAML,
    TRIALS_CSV,
    TUNER_CONF,
    RunInfo,
    write_atomic,
)
from orchestrator.search.study import INTERRUPTED, REPEAT
from orchestrator.verdict.decide import Verdict
from search_spaces import SearchSpace, lossy_knobs
from train_fns import metrics as m

MEASURED = (
    "global samples/s = global_batch / median step time; the step time of a window is the "
    "slowest rank's median, and the trial's figure is the median over its windows "
    "(warm-up excluded); cv = stdev/mean over windows"
)
_CSV_METRICS = (
    m.SAMPLES_PER_S,
    m.TOKENS_PER_S,
    m.THROUGHPUT_CV,
    m.STEP_TIME_S,
    m.DATA_S,
    m.FWD_BWD_S,
    m.OPTIM_S,
    m.EXPOSED_COMM_S,
    m.COMPUTE_S,
    m.COMM_FRACTION,
    "comm_bound_s",
    m.LOSS,
)


TIMING_PARTS = (
    "measured_s", "start_s", "imports_s", "build_s", "wrap_s", "warmup_s", "reference_s",
    "free_s", "other_s",
)  # fmt: skip
"""Where a trial's wall-clock went (``trial_wall_s``): its measured steps, then the overhead:
its worker group's start (processes, process group; the group's first trial pays it) and
imports, model build, wrap (the first collective inits NCCL's communicators), warm-up steps,
the no-sync compute reference, freeing it (garbage, cached memory, its process groups), and
the rest (driver, queue)."""


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """One finished trial as the outputs see it."""

    number: int
    state: str
    reason: str
    params: dict[str, Any]
    attrs: dict[str, Any]

    @property
    def value(self) -> float | None:
        return self.attrs.get(m.SAMPLES_PER_S) if self.state == m.COMPLETE else None


def records(study: optuna.Study) -> list[TrialRecord]:
    """Finished trials in order; a trial still RUNNING in storage was interrupted."""
    out = []
    started = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)
    for t in study.get_trials(deepcopy=False, states=started):
        if t.datetime_start is None:  # queued, never run (closed when the search ended)
            continue
        attrs = dict(t.user_attrs)
        state = attrs.get(m.STATE)
        if state is None:
            state = m.CRASH if t.state.is_finished() else INTERRUPTED
        out.append(
            TrialRecord(t.number, state, attrs.get(m.REASON, ""), attrs.get("params") or {}, attrs)
        )
    return out


def baseline_record(recs: list[TrialRecord], defaults: dict[str, Any]) -> TrialRecord | None:
    """The first completed trial that ran the untouched defaults."""
    return next((r for r in recs if r.params == defaults and r.value is not None), None)


def baseline_failure(recs: list[TrialRecord], defaults: dict[str, Any]) -> str | None:
    """Why the baseline did not complete (its last run's state and reason); None when it did."""
    if baseline_record(recs, defaults) is not None:
        return None
    runs = [r for r in recs if r.params == defaults and r.state != REPEAT]  # one never run
    return f"{runs[-1].state}: {runs[-1].reason}" if runs else "it never ran"


def best_record(recs: list[TrialRecord]) -> TrialRecord | None:
    done = [r for r in recs if r.value is not None]
    return max(done, key=lambda r: r.value) if done else None


def write_trials_csv(recs: list[TrialRecord], path: Path) -> None:
    names = sorted({k for r in recs for k in r.params})
    header = ["number", "state", *names, *measured_columns(TrialRecord(0, "", "", {}, {}))]
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(header)
    for r in recs:
        columns = measured_columns(r).values()
        writer.writerow([r.number, r.state, *(r.params.get(n, "") for n in names),
                         *(_fmt(v) for v in columns)])  # fmt: skip
    write_atomic(path, text.getvalue())


def measured_columns(rec: TrialRecord) -> dict[str, Any]:
    """trials.csv's columns after the params, by name (None: blank): the figures, where the
    wall-clock went, the placement, the phase a failure happened in, lossy knobs, the reason."""
    peak, parts = rec.attrs.get(m.PEAK_MEM_BYTES), timings(rec)
    return {
        **{k: rec.attrs.get(k) for k in _CSV_METRICS},
        "peak_mem_mib": None if peak is None else round(peak / 2**20, 1),
        m.MEMORY_CAPACITY_BYTES: rec.attrs.get(m.MEMORY_CAPACITY_BYTES) or None,
        "trial_wall_s": rec.attrs.get("trial_wall_s"),
        "measured_share": measured_share(rec),
        **{k: parts.get(k) for k in TIMING_PARTS},
        m.PLACEMENT: rec.attrs.get(m.PLACEMENT),
        "phase": rec.attrs.get("phase") if rec.state != m.COMPLETE else None,
        "lossy": " ".join(lossy_knobs(rec.params)) or None,
        "reason": rec.reason,
    }


def derived_attrs(rec: TrialRecord) -> dict[str, Any]:
    """The columns of ``rec``'s trials.csv row that its outcome holds under no flat key of its
    own (memory in MiB, the measured share, each part of the wall-clock, lossy knobs): set as
    user attributes too, optuna-dashboard's table shows what trials.csv does."""
    return {k: v for k, v in measured_columns(rec).items()
            if v not in (None, "") and k not in rec.attrs}  # fmt: skip


def memory_capacity_info(recs: list[TrialRecord]) -> RunInfo:
    """run_info.json's ``memory_capacity_bytes``: the smallest any trial's worker reported
    (absent when none did, e.g. a run from before it was recorded)."""
    capacities = [r.attrs[m.MEMORY_CAPACITY_BYTES] for r in recs
                  if r.attrs.get(m.MEMORY_CAPACITY_BYTES)]  # fmt: skip
    return RunInfo(memory_capacity_bytes=min(capacities) if capacities else None)


def timings(rec: TrialRecord) -> dict[str, float]:
    """Where the trial's wall-clock went (``TIMING_PARTS``); empty for trials without."""
    return rec.attrs.get("timings") or {}


def measured_share(rec: TrialRecord) -> float | None:
    """Measured steps over the trial's wall-clock (None when it has no timings)."""
    wall, measured = rec.attrs.get("trial_wall_s"), timings(rec).get("measured_s")
    if not wall or measured is None:
        return None
    return measured / wall


def overhead_line(recs: list[TrialRecord], info: RunInfo) -> str | None:
    """The search summary's "measured share of search time": the measured steps of every trial
    and of the race's paired windows, over the wall-clock of the trials (worker group starts,
    set-up, scheduling included) and of the race (its warm-ups included); each part's own
    share beside it, and the trials' largest overheads."""
    if not info.search_wall_s:
        return None
    measured = sum(timings(r).get("measured_s", 0.0) for r in recs)
    parts = [("trials", measured, info.search_wall_s)]
    if info.race_wall_s:
        parts.append(("race", info.race_measured_s or 0.0, info.race_wall_s))
    overheads = {k: sum(timings(r).get(k, 0.0) for r in recs) for k in TIMING_PARTS[1:-1]}
    top = sorted(overheads.items(), key=lambda kv: -kv[1])[:3]
    shown = ", ".join(f"{k.removesuffix('_s')} {v:.0f}s" for k, v in top)
    measured_s, wall_s = (sum(part[i] for part in parts) for i in (1, 2))
    each = ", ".join(f"{name} {m_s / w_s:.0%} of {w_s:.0f}s" for name, m_s, w_s in parts)
    return (
        f"measured share of search time: {measured_s / wall_s:.0%} ({measured_s:.0f}s of "
        f"measured steps in {wall_s:.0f}s: {each}; the trials' largest overheads: {shown})"
    )


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def best_config(config: Config, space: SearchSpace, best: TrialRecord) -> Config:
    """A complete config that runs the best trial's configuration as is."""
    knobs = space.knobs(best.params)
    strategy = knobs.pop("strategy", config.strategy)
    return dataclasses.replace(
        config,
        strategy=strategy,
        env={**config.env, **space.env_vars(best.params)},
        tuned={**config.tuned, **knobs},
    )


VERDICT_HEADER = "# verdict, measured beside the baseline: "
"""best.yaml's header line that carries the verdict, for readers of it (a benchmark's record)."""


def write_outputs(
    recs: list[TrialRecord],
    config: Config,
    space: SearchSpace,
    out: Path,
    verdict: Verdict | None = None,
) -> list[str]:
    """Write trials.csv, best.yaml and best.env; return the closing summary lines.

    The best config is the re-measured finalist the verdict chooses (the highest lower end of
    its interval, above 1 + δ), the baseline itself when it chooses none, and the search's fastest
    trial when nothing was re-measured.
    """
    write_trials_csv(recs, out / TRIALS_CSV)
    best = best_record(recs)
    if best is None:
        return [f"no trial completed: see {TRIALS_CSV} for each trial's reason"]
    base = baseline_record(recs, space.baseline())
    lines = [summary_line(recs, best, base, verdict)]
    mixed = mixed_placements((r.number, r.attrs.get(m.PLACEMENT, "")) for r in recs if r.value)
    if mixed:
        lines.append(f"warning: trials ran on different placements, {mixed}: their throughputs"
                     " do not compare (cluster.placement holds them to one)")  # fmt: skip
    header = ""
    if verdict is not None and verdict.comparisons:
        lines.append("verdict: " + verdict.line())
        header = f"{VERDICT_HEADER}{verdict.line()}\n"
        if verdict.chosen is not None:
            best = next(r for r in recs if r.number == verdict.chosen.number)
        elif base is not None:
            best = base
    chosen = best_config(config, space, best)
    lossy = lossy_knobs(best.params)
    if lossy:  # opted in (search.lossy), and within their declared tolerance: still say so
        header += f"# lossy: {', '.join(lossy)} (changes the gradients, within its tolerance)\n"
    header = (
        f"# commtune best configuration: trial {best.number}, {best.value:.2f} samples/s\n"
        f"{header}# measured: {MEASURED}\n"
    )
    write_atomic(out / BEST_YAML, header + dump_config(without_password(chosen)))
    env_lines = [f"export {k}={shlex.quote(str(v))}" for k, v in sorted(chosen.env.items())]
    write_atomic(
        out / BEST_ENV,
        "# environment of the best trial (source it before torchrun or another launcher)\n"
        + "".join(line + "\n" for line in env_lines + tuner_lines(out)),
    )
    return lines


def tuner_lines(out: Path) -> list[str]:
    """best.env's NCCL tuner-plugin setting when the probe wrote nccl_tuner.conf in ``out``:
    NCCL_ALGO/NCCL_PROTO fix one choice for every size, the plugin picks per size. The plugin
    is a shared library commtune does not build, so a user's own NCCL_TUNER_PLUGIN (a path)
    wins, and ``example`` makes NCCL load libnccl-tuner-example.so from LD_LIBRARY_PATH."""
    conf = out / TUNER_CONF
    if not conf.is_file():
        return []
    return [
        f"# NCCL's tuner plugin: the probe's fastest algorithm/protocol per size ({TUNER_CONF});",
        "# build NVIDIA/nccl ext-tuner/example and put libnccl-tuner-example.so on LD_LIBRARY_PATH",
        "# (or set NCCL_TUNER_PLUGIN to its path first); its rules match this run's rank count",
        'export NCCL_TUNER_PLUGIN="${NCCL_TUNER_PLUGIN:-example}"',
        f"export NCCL_TUNER_CONFIG_FILE={shlex.quote(str(conf.resolve()))}",
    ]


def summary_line(
    recs: list[TrialRecord], best: TrialRecord, base: TrialRecord | None,
    verdict: Verdict | None = None,
) -> str:  # fmt: skip
    """One figure per claim: the ratio the race measured side by side for the configuration it
    kept, and the search's own fastest figure named as a ranking. Each trial is measured once,
    minutes apart, while the group warms up, so the search's fastest can be one the race finds
    no better than another: a user reading both must know which one decides."""
    counts: dict[str, int] = {}
    for r in recs:
        counts[r.state] = counts.get(r.state, 0) + 1
    tally = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    if base is None:
        return (
            f"best: trial {best.number} at {best.value:.2f} samples/s "
            f"(baseline did not complete; {tally})"
        )
    ranked = (
        f"trial {best.number} at {best.value:.2f} samples/s = {best.value / base.value:.2f}x "
        f"baseline (trial {base.number}, {base.value:.2f} samples/s)"
    )
    if verdict is None or not verdict.comparisons:
        return (
            f"best: {ranked}; {tally}; search figures: each trial measured once, minutes apart, "
            "and no race measured it beside the baseline (search.remeasure_top): they rank the "
            "trials, they do not claim a gain"
        )
    chosen = verdict.chosen
    kept = (
        f"trial {chosen.number} at {chosen.ratio:.2f}x baseline, measured beside it"
        if chosen else "the baseline, the race kept no finalist"
    )
    return (
        f"kept: {kept} (the verdict below); {tally}; the search's own figures rank the trials, "
        f"they do not claim: its fastest, {ranked}, measured once, minutes apart"
    )
