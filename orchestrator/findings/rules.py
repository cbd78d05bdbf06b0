"""The doctor's rules: one function per branch of the troubleshooting tree.

After a slow run people walk the same tree by hand (GPU idle -> data, CPU or sync; communication
-> bandwidth probe, EFA, NCCL settings; memory -> activations, sharding; numerics -> precision).
Each rule reads a ``RunRecord`` and returns a ``Finding`` with the run's own numbers as evidence
and a concrete fix, or None; a missing file only silences the rules that need it.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.cluster.placement import mixed_placements
from orchestrator.findings.steps import focus_step
from orchestrator.planning.costmodel import (
    EFA_400G,
    LINKS,
    NET_100G,
    NVLINK_A100,
    PCIE_V100,
    Link,
    bus_factor,
)
from orchestrator.runfiles import (
    BELOW_SEARCHED,
    BEST_YAML,
    PROBE_CSV,
    REMEASURE_CSV,
    RUN_INFO,
    SUMMARY_JSON,
    TRIALS_CSV,
    RunRecord,
    below_searched,
    num,
)
from orchestrator.verdict.decide import DELTA, verdict_from_rows
from train_fns.metrics import NONFINITE_RATE_MAX

SEVERITIES = ("high", "medium", "info")

DATA_FRACTION_MAX = 0.10
COMM_FRACTION_MAX = 0.40  # past these a share of the step is worth a finding and its fix
GPU_UTIL_MIN = 0.80
MEMORY_FRACTION_MAX = 0.90
SCALING_MIN = 0.70
BANDWIDTH_FAR_BELOW = 0.5
NOISY_SPREAD = 0.05
"""A baseline spread above this (runs or windows) is as large as the gains a search finds."""
"""Measured bandwidth under half of its bound is a link or settings problem, not noise."""


@dataclass(frozen=True)
class Finding:
    """One branch of the tree that fired, with the run's numbers and what to change."""

    severity: str
    title: str
    evidence: str
    fix: str
    score: float = 0.0
    """How far past its threshold (a ratio): ranks findings of the same severity."""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r}; use one of {SEVERITIES}")


def _pct(x: float) -> str:
    return f"{x:.0%}" if x >= 0.1 else f"{x:.1%}"


def rule_corrupt(record: RunRecord) -> Finding | None:
    """Wrong results outrank slow ones: a configuration whose losses or gradient norm left
    the baseline's computes something else, however fast it was."""
    bad = [r for r in record.trials if r.get("state") == "corrupt"]
    if not bad:
        return None
    shown = "; ".join(f"trial {r['number']}: {r.get('reason', '')}" for r in bad[:3])
    return Finding(
        "high",
        f"{len(bad)} configuration(s) computed wrong results (corrupt)",
        shown,
        "never deploy these settings: check the NCCL variables they set (forced protocols such "
        "as NCCL_PROTO=LL128, NCCL_P2P_DISABLE), comm hooks and the accumulation path; run "
        "the same configuration with NCCL_DEBUG=INFO and compare its losses with the baseline",
        1e6 + len(bad),
    )


def rule_data_wait(record: RunRecord) -> Finding | None:
    """GPU idle -> waiting for input: the cheapest branch to fix, so it is checked first."""
    step = focus_step(record)
    frac = step.data_fraction if step else None
    if frac is None or frac <= DATA_FRACTION_MAX:
        return None
    shown = (
        f"data {step.data_s * 1e3:.1f} ms of a {step.step_time_s * 1e3:.1f} ms step, "
        if (step.data_s and step.step_time_s)
        else ""
    )
    return Finding(
        "high" if frac > 3 * DATA_FRACTION_MAX else "medium",
        f"input pipeline: {_pct(frac)} of the step waits for data",
        f"{step.label}: {shown}{_pct(frac)} (threshold {_pct(DATA_FRACTION_MAX)})",
        "feed the step faster: DataLoader num_workers up to the worker's CPUs, prefetch_factor "
        "2-4, pin_memory=True with non_blocking copies; pre-tokenise the corpus once instead of "
        "tokenising per step",
        frac / DATA_FRACTION_MAX,
    )


def rule_comm_fraction(record: RunRecord) -> Finding | None:
    """Communication holding up the step: the motivating case (1.8x on 4 GPUs)."""
    step = focus_step(record)
    frac = step.comm_fraction if step else None
    if frac is None or frac <= COMM_FRACTION_MAX:
        return None
    parts = ""
    if step.exposed_comm_s is not None and step.compute_s is not None:
        parts = f"exposed comm {step.exposed_comm_s * 1e3:.1f} ms vs compute "
        parts += f"{step.compute_s * 1e3:.1f} ms, "
    nccl = (
        "; NCCL settings apply on GPUs only (this run is gloo)"
        if record.backend == "gloo"
        else "; NCCL: NCCL_MIN_NCHANNELS/NCCL_MAX_NCHANNELS, NCCL_ALGO (Ring/Tree), NCCL_PROTO "
        "(Simple/LL128), NCCL_SOCKET_NTHREADS with NCCL_NSOCKS_PERTHREAD on TCP"
    )
    return Finding(
        "high" if frac > 0.6 else "medium",
        f"communication takes {_pct(frac)} of compute + communication",
        f"{step.label}: {parts}comm / (comm + compute) = {_pct(frac)} "
        f"(threshold {_pct(COMM_FRACTION_MAX)}; exposed comm measures {step.comm_scope})",
        "hide the sync behind backward or make it cheaper: at a fixed global batch there is one "
        "sync per step whatever the split, so prefer fewer accumulation steps (larger "
        "micro-batches give backward more time to overlap it) as memory allows, raise DDP "
        "bucket_cap_mb (50-100), gradient_as_bucket_view=true, FSDP reshard_after_forward=false "
        f"when memory allows; more workers per node or a faster link shrink it for real{nccl}",
        frac / COMM_FRACTION_MAX,
    )


def probe_busbw_gbps(record: RunRecord, op: str = "all_reduce") -> tuple[float, int] | None:
    """The probe's bus bandwidth at large sizes: median of its three largest messages."""
    rows = [r for r in record.probe if r.get("op") == op and num(r.get("busbw_gbps")) is not None]
    rows = sorted(rows, key=lambda r: num(r.get("size_bytes")) or 0)[-3:]
    if not rows:
        return None
    gbps = statistics.median(num(r["busbw_gbps"]) for r in rows)
    return gbps, int(num(rows[0].get("size_bytes")) or 0)


def link_bound(record: RunRecord) -> Link | None:
    """The nominal link a GPU run should reach; gloo/CPU has none (it is not a NCCL fabric)."""
    named = record.run_info.link
    if named in LINKS:
        return LINKS[named]
    if record.backend != "nccl":
        return None
    if (record.run_info.num_nodes or 1) > 1:
        return EFA_400G if str(record.env.get("FI_PROVIDER", "")).lower() == "efa" else NET_100G
    topo = " ".join(str(v) for v in record.topology.values())  # nvidia-smi topo -m: NV# = NVLink
    return NVLINK_A100 if re.search(r"\bNV\d+\b", topo) else PCIE_V100


def implied_sync_gbps(record: RunRecord) -> float | None:
    """DDP gradient all-reduce bus bandwidth if all of it took the exposed comm time: an upper
    bound (hidden communication makes the real time longer), so below the probe is conclusive."""
    grad_bytes, n = record.run_info.grad_bytes, record.world_size
    step = focus_step(record)
    if not grad_bytes or not n or n < 2 or step is None or not step.exposed_comm_s:
        return None
    if (record.best_config.get("strategy") or "ddp") != "ddp":
        return None
    return bus_factor("all_reduce", n) * grad_bytes / step.exposed_comm_s / 1e9


_BANDWIDTH_FIX = (
    "check the path the traffic takes: NCCL_SOCKET_IFNAME naming the fast interface (not "
    "docker0/lo), on EFA FI_PROVIDER=efa and FI_EFA_USE_DEVICE_RDMA=1 (on InfiniBand "
    "NCCL_IB_HCA), NCCL_DEBUG=INFO to see the transport NCCL picked, nodes in one placement "
    "group; run nccl-tests all_reduce_perf to confirm, then compare `nvidia-smi topo -m`"
)


def rule_bandwidth(record: RunRecord) -> Finding | None:
    """comm -> nccl-tests: a probe far below the link, or a trial far below the probe."""
    probed, link = probe_busbw_gbps(record), link_bound(record)
    if probed and link:
        ratio = probed[0] * 1e9 / link.bandwidth_bytes_per_s
        if ratio < BANDWIDTH_FAR_BELOW:
            return Finding(
                "high" if ratio < 0.2 else "medium",
                f"all-reduce bus bandwidth is {_pct(ratio)} of the link's",
                f"{PROBE_CSV}: {probed[0]:.3g} GB/s busbw at >= {probed[1] / 2**20:.0f} MiB vs "
                f"{link.bandwidth_bytes_per_s / 1e9:.3g} GB/s nominal for {link.name}",
                _BANDWIDTH_FIX,
                BANDWIDTH_FAR_BELOW / max(ratio, 1e-6),
            )
    implied = implied_sync_gbps(record)
    if probed and implied is not None and implied < BANDWIDTH_FAR_BELOW * probed[0]:
        ratio = implied / probed[0]
        return Finding(
            "medium",
            f"gradient sync reaches {_pct(ratio)} of the probed bandwidth",
            f"{focus_step(record).label}: at most {implied:.3g} GB/s implied by the exposed "
            f"communication vs {probed[0]:.3g} GB/s measured by {PROBE_CSV}",
            "the collective is fast but the trial's sync is not: fewer, larger buckets "
            "(bucket_cap_mb), gradient_as_bucket_view=true, and the same environment for the "
            "probe and the training run; " + _BANDWIDTH_FIX,
            BANDWIDTH_FAR_BELOW / max(ratio, 1e-6),
        )
    return None


def rule_gpu_util(record: RunRecord) -> Finding | None:
    """GPU idle: only NVML knows, so only runs with gpu_util in run_info.json are judged."""
    util = record.run_info.gpu_util
    if util is None:
        return None
    util = util / 100 if util > 1 else util  # tolerate a percentage
    if util >= GPU_UTIL_MIN:
        return None
    return Finding(
        "high" if util < 0.5 else "medium",
        f"GPUs busy only {_pct(util)} of the time",
        f"{RUN_INFO} gpu_util = {util:.2f} (threshold {GPU_UTIL_MIN:.2f})",
        "find what the GPU waits for: the data-wait and communication findings above, CPU "
        "contention (cluster.cpus_per_worker), a micro-batch too small to fill the GPU (less "
        "accumulation, larger micro-batch), host syncs such as .item() in the step",
        GPU_UTIL_MIN / max(util, 1e-6),
    )


def rule_memory(record: RunRecord) -> Finding | None:
    """memory -> activations/sharding: near capacity, one longer batch away from OOM."""
    row = record.best() or record.baseline()
    # the trial's own workers' capacity (trials.csv), else the run's (run_info.json)
    capacity = num(row.get("memory_capacity_bytes")) if row else None
    capacity = capacity or record.run_info.memory_capacity_bytes
    peak_mib = num(row.get("peak_mem_mib")) if row else None
    if not capacity or peak_mib is None:
        return None
    frac = peak_mib * 2**20 / capacity
    if frac <= MEMORY_FRACTION_MAX:
        return None
    ooms = sum(r.get("state") == "oom" for r in record.trials)
    return Finding(
        "high",
        f"peak memory at {_pct(frac)} of capacity",
        f"trial {row['number']}: peak {peak_mib / 1024:.2f} GiB of {capacity / 2**30:.2f} GiB"
        + (f"; {ooms} trial(s) ran out of memory" if ooms else ""),
        "free memory before it fails: FSDP (strategy: fsdp) shards parameters, gradients and "
        "optimizer state; activation_checkpointing=true trades compute for activations; a "
        "smaller micro-batch (more accumulation steps, same global batch)",
        frac / MEMORY_FRACTION_MAX,
    )


def rule_nonfinite(record: RunRecord) -> Finding | None:
    """Numerics: skipped steps waste the run and hint at fp16 overflow or a too-high LR."""
    summary = record.summary  # typed: a count or rate of the wrong kind reads as None
    steps, bad, rate = summary.steps, summary.nonfinite_steps, summary.nonfinite_rate
    if rate is None and bad is not None and steps:
        rate = bad / steps
    if rate is None or rate <= NONFINITE_RATE_MAX:
        return None
    counted = f"{bad:.0f} of {steps:.0f} steps" if bad is not None and steps else "rate"
    scale = summary.loss_scale
    return Finding(
        "high",
        f"{_pct(rate)} of steps had non-finite loss or gradients",
        f"{SUMMARY_JSON}: {counted} = {rate:.2%} (threshold {NONFINITE_RATE_MAX:.1%})"
        + (f"; final loss scale {scale:g}" if scale is not None else ""),
        "precision: bf16 instead of fp16 (no loss scaling needed); lower the learning rate or "
        "add warm-up; keep gradient clipping (train.max_grad_norm); with fp16, a loss scale "
        "that keeps halving below 1 means overflow every step",
        rate / NONFINITE_RATE_MAX,
    )


def rule_nccl_on_gloo(record: RunRecord) -> Finding | None:
    """NCCL variables on a gloo run do nothing: any gain attributed to them is noise."""
    if record.backend != "gloo":
        return None
    nccl = ("NCCL_", "TORCH_NCCL_")
    env = [f"{k}={v}" for k, v in sorted(record.env.items()) if k.startswith(nccl)]
    tuned = {
        p: sum(bool(r.get(p)) for r in record.trials)
        for p in record.param_names
        if p.startswith(nccl)
    }
    tuned_shown = [
        f"{p} (set in {n} of {len(record.trials)} trials)" for p, n in tuned.items() if n
    ]
    if not env and not tuned_shown:
        return None
    where = [f"{BEST_YAML} env {', '.join(env)}"] if env else []
    where += [f"trial params {', '.join(tuned_shown)}"] if tuned_shown else []
    return Finding(
        "medium",
        f"{len(env) + len(tuned_shown)} NCCL setting(s) on a gloo run are inert",
        f"{'; '.join(where)}; backend = gloo",
        "drop them from env and from search.spaces on CPU (the nccl space is for GPU runs); "
        "tune them on the GPU cluster where they take effect",
        float(len(env) + len(tuned_shown)),
    )


def rule_scaling(record: RunRecord) -> Finding | None:
    """Pipeline efficiency: N workers should give close to N times one worker."""
    single = record.run_info.single_worker_samples_per_s
    base, n = record.baseline(), record.world_size
    if not single or base is None or not n or n < 2:
        return None
    eff = num(base["samples_per_s"]) / (n * single)
    if eff >= SCALING_MIN:
        return None
    best = record.best()
    best_eff = num(best["samples_per_s"]) / (n * single) if best else eff
    tuned = f"; best trial {best['number']} reaches {_pct(best_eff)}" if best else ""
    return Finding(
        ("high" if best_eff < 0.5 else "medium") if best_eff < SCALING_MIN else "info",
        f"scaling efficiency {_pct(eff)} on {n} workers",
        f"baseline {num(base['samples_per_s']):.3g} samples/s vs {n} x {single:.3g} on one "
        f"worker (threshold {_pct(SCALING_MIN)}){tuned}",
        "the gap is synchronisation or input: see the communication and data findings; "
        f"run the search with the accumulation and ddp spaces and apply {BEST_YAML}",
        SCALING_MIN / max(min(eff, best_eff), 1e-6),
    )


def _noisy_claims(record: RunRecord) -> list[str]:
    """Trials faster than the baseline by less than their own window cv: a gain inside noise."""
    base = record.baseline()
    b = num(base["samples_per_s"]) if base else None
    out = []
    for row in record.completed():
        gain, cv = num(row["samples_per_s"]) / b - 1 if b else 0.0, num(row.get("throughput_cv"))
        if row is not base and cv and 0 < gain < cv:
            out.append(f"trial {row['number']} claims +{_pct(gain)} with window cv {_pct(cv)}")
    return out


MEASURE_ON_FIX = (
    "measure the undecided verdict on from its pairs (the search command again with --resume); "
)
"""Offered while the race on record can be measured on (``Verdict.can_measure_on``)."""


def rule_measurement_noise(record: RunRecord) -> Finding | None:
    """Noise decides verdicts: the baseline's spread, disturbed runs, a verdict too noisy to
    decide, gains claimed inside a trial's own window spread."""
    verdict = verdict_from_rows(record.remeasure) if record.remeasure else None
    claims = _noisy_claims(record)
    spread = verdict.baseline_spread if verdict else 0.0
    delta = verdict.delta if verdict else DELTA
    troubled = verdict is not None and (verdict.disturbed or verdict.too_noisy)
    if not claims and not troubled and spread <= NOISY_SPREAD:
        return None
    evidence = []
    if verdict:
        evidence.append(f"{REMEASURE_CSV}: {verdict.pairing}, {verdict.spread_of} spread "
                        f"{_pct(spread)}")  # fmt: skip
        evidence += [f"disturbed: {w}" for w in verdict.disturbed]
        evidence += [verdict.line().split("; what helps")[0]] if verdict.too_noisy else []
    evidence += [f"{TRIALS_CSV}: {', '.join(claims[:5])}"] if claims else []
    best = record.best()
    best_noisy = best is not None and any(c.startswith(f"trial {best['number']} ") for c in claims)
    return Finding(
        "medium" if best_noisy or (verdict and verdict.too_noisy) else "info",
        "measurement noise is as large as the gains being judged",
        "; ".join(evidence),
        "quiet the machine during the search (no other jobs on its cores or GPUs); "
        + (MEASURE_ON_FIX if verdict and verdict.can_measure_on else "")
        + f"give the verdict more pairs (search.verdict_pairs) or accept only larger gains "
        f"(search.verdict_delta, now {delta * 100:g}%); measure trials longer (search.windows, "
        "search.measure_steps)",
        max(spread / NOISY_SPREAD, float(len(claims)), 1.0),
    )


def rule_mixed_placement(record: RunRecord) -> Finding | None:
    """Trials whose ranks sat differently on the nodes (8+0 against 4+4) measured the cluster,
    not the knobs: their throughputs do not compare."""
    mixed = mixed_placements(
        (int(num(r.get("number")) or 0), r.get("placement", "")) for r in record.completed()
    )
    if mixed is None:
        return None
    return Finding(
        "high",
        "Trials ran on different placements",
        f"ranks per node differ between completed trials: {mixed}",
        "rerun with a strict cluster.placement (pack, the default, or spread) on nodes that can "
        "hold it; compare only trials of one placement",
        1.0,
    )


def rule_size_below_searched(record: RunRecord) -> Finding | None:
    """A world size of an elastic run that trained well below what the search measured for
    it there: that size runs something other than what was measured (a neighbour, a layout)."""
    low = below_searched(record.summary.by_size)
    if not low:
        return None
    worst, share = min(low, key=lambda item: item[1])
    shown = "; ".join(f"{s['world_size']:g} workers {s['samples_per_s']:.1f} vs "
                      f"{s['searched_samples_per_s']:.1f} searched" for s, _ in low)  # fmt: skip
    return Finding(
        "medium",
        f"{worst['world_size']:g} workers trained at {_pct(share)} of what the search measured "
        "there",
        f"{SUMMARY_JSON} by_size: {shown} (flagged below {BELOW_SEARCHED:.0%})",
        "look for another job on those nodes or a placement unlike the search's (the report's "
        "placement line); if it persists, search that size again (search --workers MIN:MAX)",
        (BELOW_SEARCHED - share) / BELOW_SEARCHED,
    )


RULES: list[Callable[[RunRecord], Finding | None]] = [
    rule_corrupt,
    rule_data_wait,
    rule_comm_fraction,
    rule_bandwidth,
    rule_gpu_util,
    rule_memory,
    rule_nonfinite,
    rule_nccl_on_gloo,
    rule_scaling,
    rule_measurement_noise,
    rule_mixed_placement,
    rule_size_below_searched,
]


def diagnose(record: RunRecord) -> list[Finding]:
    """Every rule that fires, most severe first (then furthest past its threshold)."""
    found = [f for rule in RULES if (f := rule(record)) is not None]
    return sorted(found, key=lambda f: (SEVERITIES.index(f.severity), -f.score))
