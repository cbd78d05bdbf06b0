"""``python -m orchestrator.doctor DIR [DIR2 ...]``: walk the troubleshooting tree with a run's
own numbers.

After a slow run people walk the same tree by hand (GPU idle -> data, CPU or sync; communication
-> bandwidth probe, EFA, NCCL settings; memory -> activations, sharding; numerics -> precision).
Each branch here is a small rule over the files a run wrote, so every finding carries the run's
numbers as evidence and a concrete fix. A missing file only silences the rules that need it.

Files read from each DIR (and DIR/train): trials.csv, best.yaml, study.db or study.journal,
remeasure.csv,
probe.csv, run_info.json (search side); summary.json, progress.csv, grad_norms.csv (a training
run). run_info.json keys, all optional: backend, world_size, num_nodes, use_gpu, topology,
single_worker_samples_per_s, memory_capacity_bytes, gpu_util, and link (a name in
``costmodel.LINKS``) or grad_bytes (gradient bytes per step) for the bandwidth check.

Exit codes: 0 findings printed (including "no problem found"), 2 a DIR holds none of the files.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchestrator.costmodel import (
    EFA_400G,
    LINKS,
    NET_100G,
    NVLINK_A100,
    PCIE_V100,
    Link,
    bus_factor,
)

log = logging.getLogger("commtune")

SEARCH_FILES = (
    "trials.csv",
    "best.yaml",
    "study.db",
    "study.journal",
    "remeasure.csv",
    "probe.csv",
    "run_info.json",
)
TRAIN_FILES = ("summary.json", "progress.csv", "grad_norms.csv")
KNOWN_FILES = SEARCH_FILES + TRAIN_FILES
SEVERITIES = ("high", "medium", "info")

DATA_FRACTION_MAX = 0.10
COMM_FRACTION_MAX = 0.40  # the write-up's monitoring thresholds
GPU_UTIL_MIN = 0.80
MEMORY_FRACTION_MAX = 0.90
NONFINITE_RATE_MAX = 0.001
SCALING_MIN = 0.70
BANDWIDTH_FAR_BELOW = 0.5
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


@dataclass
class RunRecord:
    """Whatever a run left behind; every field may be empty."""

    files: dict[str, Path] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)
    trials: list[dict[str, str]] = field(default_factory=list)
    param_names: list[str] = field(default_factory=list)
    best_config: dict[str, Any] = field(default_factory=dict)
    best_number: int | None = None
    """The trial best.yaml was written from (its header names it)."""
    run_info: dict[str, Any] = field(default_factory=dict)
    probe: list[dict[str, str]] = field(default_factory=list)
    remeasure: list[dict[str, str]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    progress: list[dict[str, str]] = field(default_factory=list)
    topology: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str | None:
        return self.best_config.get("name")

    @property
    def model(self) -> str | None:
        return (self.best_config.get("workload") or {}).get("model")

    @property
    def backend(self) -> str | None:
        """run_info's backend, else the probe's (same workers), else gloo for CPU-only configs."""
        probed = {r.get("backend") for r in self.probe} - {None, ""}
        if self.run_info.get("backend") or len(probed) == 1:
            return self.run_info.get("backend") or probed.pop()
        cpu_only = (self.best_config.get("cluster") or {}).get("use_gpu") is False
        return "gloo" if cpu_only else None

    @property
    def world_size(self) -> int | None:
        workers = (self.best_config.get("cluster") or {}).get("num_workers")
        trained = self.summary.get("world_sizes") or [None]  # a training run's sizes, sorted
        size = self.run_info.get("world_size") or workers or trained[-1]
        return int(size) if num(size) else None

    @property
    def env(self) -> dict[str, Any]:
        return self.best_config.get("env") or {}

    def trial(self, number: int | None) -> dict[str, str] | None:
        return next((r for r in self.trials if num(r.get("number")) == number), None)

    def completed(self) -> list[dict[str, str]]:
        return [
            r for r in self.trials if r.get("state") == "complete" and num(r.get("samples_per_s"))
        ]

    def baseline(self) -> dict[str, str] | None:
        """Trial 0 is the untouched default; if it did not complete there is no baseline."""
        row = self.trial(0)
        return row if row in self.completed() else None

    def best(self) -> dict[str, str] | None:
        """The trial best.yaml names, else the fastest completed one."""
        row = self.trial(self.best_number)
        if row in self.completed():
            return row
        done = self.completed()
        return max(done, key=lambda r: num(r["samples_per_s"])) if done else None


def num(value: Any) -> float | None:
    """A CSV cell or JSON value as a float; blanks and junk are None (absent, not zero)."""
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class StepParts:
    """Where one optimizer step's time went, for one configuration."""

    label: str
    step_time_s: float | None
    data_s: float | None = None
    compute_s: float | None = None
    exposed_comm_s: float | None = None
    optim_s: float | None = None
    fwd_bwd_s: float | None = None
    comm_fraction_given: float | None = None
    data_fraction_given: float | None = None

    @property
    def comm_fraction(self) -> float | None:
        """comm / (comm + compute): the share of the work the network holds up."""
        if self.comm_fraction_given is not None:
            return self.comm_fraction_given
        comm, compute = self.exposed_comm_s, self.compute_s
        if comm is None or compute is None or comm + compute <= 0:
            return None
        return comm / (comm + compute)

    @property
    def data_fraction(self) -> float | None:
        if self.data_fraction_given is not None:
            return self.data_fraction_given
        if self.data_s is None or not self.step_time_s:
            return None
        return self.data_s / self.step_time_s


def trial_step(row: dict[str, str], label: str) -> StepParts:
    keys = ("step_time_s", "data_s", "compute_s", "exposed_comm_s", "optim_s", "fwd_bwd_s")
    parts = {k: num(row.get(k)) for k in keys}
    return StepParts(label, comm_fraction_given=num(row.get("comm_fraction")), **parts)


def training_step(record: RunRecord) -> StepParts | None:
    """Medians over the training run's logged steps; summary fractions win where given."""
    if not record.progress and not record.summary:
        return None
    keys = ("step_time_s", "data_s", "compute_s", "exposed_comm_s", "optim_s", "fwd_bwd_s")
    parts = {}
    for key in keys:
        values = [v for r in record.progress if (v := num(r.get(key))) is not None]
        parts[key] = statistics.median(values) if values else None
    label = (
        f"training run (median of {len(record.progress)} logged steps)"
        if record.progress
        else "training run (summary.json)"
    )
    given = {
        "comm_fraction_given": num(record.summary.get("comm_fraction")),
        "data_fraction_given": num(record.summary.get("data_fraction")),
    }
    return StepParts(label, **parts, **given)


def focus_step(record: RunRecord) -> StepParts | None:
    """The configuration worth diagnosing: the training run, else the best trial, else baseline."""
    trained = training_step(record)
    if trained is not None and (trained.comm_fraction, trained.data_fraction) != (None, None):
        return trained
    best, base = record.best(), record.baseline()
    if best is not None:
        return trial_step(best, f"trial {best['number']} (best)")
    return trial_step(base, "trial 0 (baseline)") if base is not None else None


# ---------------------------------------------------------------- rules


def _pct(x: float) -> str:
    return f"{x:.0%}" if x >= 0.1 else f"{x:.1%}"


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
        f"(threshold {_pct(COMM_FRACTION_MAX)})",
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
    named = record.run_info.get("link")
    if named in LINKS:
        return LINKS[named]
    if record.backend != "nccl":
        return None
    if (num(record.run_info.get("num_nodes")) or 1) > 1:
        return EFA_400G if str(record.env.get("FI_PROVIDER", "")).lower() == "efa" else NET_100G
    topo = " ".join(str(v) for v in record.topology.values())  # nvidia-smi topo -m: NV# = NVLink
    return NVLINK_A100 if re.search(r"\bNV\d+\b", topo) else PCIE_V100


def implied_sync_gbps(record: RunRecord) -> float | None:
    """DDP gradient all-reduce bus bandwidth if all of it took the exposed comm time: an upper
    bound (hidden communication makes the real time longer), so below the probe is conclusive."""
    grad_bytes, n = num(record.run_info.get("grad_bytes")), record.world_size
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
                f"probe.csv: {probed[0]:.3g} GB/s busbw at >= {probed[1] / 2**20:.0f} MiB vs "
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
            f"communication vs {probed[0]:.3g} GB/s measured by probe.csv",
            "the collective is fast but the trial's sync is not: fewer, larger buckets "
            "(bucket_cap_mb), gradient_as_bucket_view=true, and the same environment for the "
            "probe and the training run; " + _BANDWIDTH_FIX,
            BANDWIDTH_FAR_BELOW / max(ratio, 1e-6),
        )
    return None


def rule_gpu_util(record: RunRecord) -> Finding | None:
    """GPU idle: only NVML knows, so only runs with gpu_util in run_info.json are judged."""
    util = num(record.run_info.get("gpu_util"))
    if util is None:
        return None
    util = util / 100 if util > 1 else util  # tolerate a percentage
    if util >= GPU_UTIL_MIN:
        return None
    return Finding(
        "high" if util < 0.5 else "medium",
        f"GPUs busy only {_pct(util)} of the time",
        f"run_info.json gpu_util = {util:.2f} (threshold {GPU_UTIL_MIN:.2f})",
        "find what the GPU waits for: the data-wait and communication findings above, CPU "
        "contention (cluster.cpus_per_worker), a micro-batch too small to fill the GPU (less "
        "accumulation, larger micro-batch), host syncs such as .item() in the step",
        GPU_UTIL_MIN / max(util, 1e-6),
    )


def rule_memory(record: RunRecord) -> Finding | None:
    """memory -> activations/sharding: near capacity, one longer batch away from OOM."""
    capacity = num(record.run_info.get("memory_capacity_bytes"))
    row = record.best() or record.baseline()
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
    steps = num(record.summary.get("steps"))
    bad = num(record.summary.get("nonfinite_steps"))
    rate = num(record.summary.get("nonfinite_rate"))
    if rate is None and bad is not None and steps:
        rate = bad / steps
    if rate is None or rate <= NONFINITE_RATE_MAX:
        return None
    counted = f"{bad:.0f} of {steps:.0f} steps" if bad is not None and steps else "rate"
    scale = num(record.summary.get("loss_scale"))
    return Finding(
        "high",
        f"{_pct(rate)} of steps had non-finite loss or gradients",
        f"summary.json: {counted} = {rate:.2%} (threshold {NONFINITE_RATE_MAX:.1%})"
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
    where = [f"best.yaml env {', '.join(env)}"] if env else []
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
    single = num(record.run_info.get("single_worker_samples_per_s"))
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
        "run the search with the accumulation and ddp spaces and apply best.yaml",
        SCALING_MIN / max(min(eff, best_eff), 1e-6),
    )


RULES: list[Callable[[RunRecord], Finding | None]] = [
    rule_data_wait,
    rule_comm_fraction,
    rule_bandwidth,
    rule_gpu_util,
    rule_memory,
    rule_nonfinite,
    rule_nccl_on_gloo,
    rule_scaling,
]


def diagnose(record: RunRecord) -> list[Finding]:
    """Every rule that fires, most severe first (then furthest past its threshold)."""
    found = [f for rule in RULES if (f := rule(record)) is not None]
    return sorted(found, key=lambda f: (SEVERITIES.index(f.severity), -f.score))


# ---------------------------------------------------------------- reading a run


def run_files(folder: Path) -> dict[str, Path]:
    """The known files in ``folder`` or its ``train`` subfolder (a training run kept beside)."""
    found: dict[str, Path] = {}
    for where in (folder, folder / "train"):
        for name in KNOWN_FILES:
            if name not in found and (where / name).is_file():
                found[name] = where / name
    return found


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _read_mapping(path: Path) -> dict[str, Any]:
    data = (
        json.loads(path.read_text()) if path.suffix == ".json" else yaml.safe_load(path.read_text())
    )
    if not isinstance(data, dict):
        raise ValueError(f"expected a mapping, got {type(data).__name__}")
    return data


_READERS: dict[str, tuple[str, Callable[[Path], Any]]] = {
    "trials.csv": ("trials", read_csv),
    "best.yaml": ("best_config", _read_mapping),
    "run_info.json": ("run_info", _read_mapping),
    "probe.csv": ("probe", read_csv),
    "remeasure.csv": ("remeasure", read_csv),
    "summary.json": ("summary", _read_mapping),
    "progress.csv": ("progress", read_csv),
}


def collect(dirs: list[Path]) -> RunRecord:
    """A RunRecord from whatever files the folders hold; the first folder holding a file wins.

    An unreadable file is noted and skipped (with a warning): the other rules still run.
    """
    record = RunRecord()
    for folder in dirs:
        for name, path in run_files(Path(folder)).items():
            record.files.setdefault(name, path)
    for name, (attr, reader) in _READERS.items():
        if name not in record.files:
            continue
        try:
            setattr(record, attr, reader(record.files[name]))
        except (OSError, ValueError, csv.Error, yaml.YAMLError) as e:
            log.warning("doctor: skipping unreadable %s: %s", record.files[name], e)
            record.unreadable[name] = str(e).splitlines()[0] if str(e) else type(e).__name__
    if record.trials:
        header = list(record.trials[0])
        end = header.index("samples_per_s") if "samples_per_s" in header else len(header)
        record.param_names = header[2:end]  # number, state, then the params (results.py)
    if record.best_config:  # results.py's header line names the trial it was written from
        head = record.files["best.yaml"].read_text().partition("\n")[0]
        match = re.match(r"# commtune best configuration: trial (\d+)", head)
        record.best_number = int(match[1]) if match else None
    record.topology = _recorded_topology(record.run_info.get("topology"))
    return record


def _recorded_topology(recorded: Any) -> dict[str, Any]:
    """The run's own topology when the driver kept it; else this machine's, said as such."""
    if isinstance(recorded, dict) and recorded:
        return {"source": "run_info.json", **recorded}
    if recorded:
        return {"source": "run_info.json", "description": str(recorded)}
    return {"source": "this machine at diagnosis time; run_info.json has none", **topology()}


def topology(node_root: Path = Path("/sys/devices/system/node")) -> dict[str, Any]:
    """GPU links (``nvidia-smi topo -m``), NUMA nodes and CPU count of this machine: what
    decides whether traffic crosses PCIe, NVLink or a socket boundary."""
    info: dict[str, Any] = {"cpu_count": os.cpu_count()}
    numa = {p.parent.name: p.read_text().strip() for p in sorted(node_root.glob("node*/cpulist"))}
    if numa:
        info["numa_nodes"] = numa
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            done = subprocess.run(
                [smi, "topo", "-m"], capture_output=True, text=True, timeout=30, check=True
            )
            info["nvidia_smi_topo"] = done.stdout.rstrip()
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("doctor: nvidia-smi topo -m failed", exc_info=True)
            info["nvidia_smi_topo_error"] = str(e)
    return info


# ---------------------------------------------------------------- output


def describe(record: RunRecord) -> str:
    """One line: which study, model, workers and backend the findings are about."""
    parts = [
        f"study {record.name or '?'}",
        f"model {record.model or '?'}",
        f"{record.world_size or '?'} workers",
        f"backend {record.backend or '?'}",
    ]
    return ", ".join(parts)


def topology_lines(topo: dict[str, Any]) -> list[str]:
    simple = {k: v for k, v in topo.items() if k not in ("source", "nvidia_smi_topo")}
    shown = ", ".join(f"{k}={v}" for k, v in simple.items())
    lines = [f"topology ({topo.get('source', '?')}): {shown}"]
    if topo.get("nvidia_smi_topo"):
        lines += ["  " + line for line in str(topo["nvidia_smi_topo"]).splitlines()]
    return lines


def context_lines(record: RunRecord) -> list[str]:
    """What the findings are about: the run, the files read and the topology."""
    absent = [n for n in KNOWN_FILES if n not in record.files]
    return [
        describe(record),
        f"read: {', '.join(record.files) or 'nothing'}; absent: {', '.join(absent) or 'none'}",
        *(f"unreadable: {n} ({why})" for n, why in record.unreadable.items()),
        *topology_lines(record.topology),
    ]


def finding_lines(findings: list[Finding]) -> list[str]:
    """The findings as text, numbered in rank order; the HTML report shows the same words."""
    if not findings:
        return [f"no problem found ({len(RULES)} checks over the files read)"]
    lines = []
    for i, f in enumerate(findings, 1):
        lines += [
            f"{i}. [{f.severity}] {f.title}",
            f"   evidence: {f.evidence}",
            f"   fix: {f.fix}",
        ]
    return lines


def missing_dirs(dirs: list[Path]) -> list[str]:
    """One line per DIR that is not a run folder: exit 2 says which and what was expected."""
    return [
        f"{d}: holds none of {', '.join(KNOWN_FILES)} (expected a search output folder such as "
        "runs/<name>, or a training run folder)"
        for d in dirs
        if not run_files(d)
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m orchestrator.doctor", description=__doc__)
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="run folders to examine")
    args = p.parse_args(argv)
    bad = missing_dirs(args.dirs)
    if bad:
        print(f"doctor: {bad[0]}", file=sys.stderr)
        return 2
    record = collect(args.dirs)
    print(f"commtune doctor: {' '.join(map(str, args.dirs))}")
    print("\n".join([*context_lines(record), "", *finding_lines(diagnose(record))]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
