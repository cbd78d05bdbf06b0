"""What a run tuned for one world size, read once for every target: the split at the fixed
global batch, the DDP and FSDP options, checkpointing, the optimizer and the variables.

A run folder's best.yaml is read through ``orchestrator.config.schema`` (the same checks as
``orchestrator.train``) and its entry for the size through ``train_fns.size_fit.fit`` (what a
training run at that size runs): the targets translate this one record, so none of them
re-derives the split or the knobs.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.inputs import ConfigError
from orchestrator.config.schema import Config, load_config
from orchestrator.config.size_entries import fit_context, run_entries
from orchestrator.runfiles import BEST_YAML, read_run_info
from train_fns.plan import DDPOptions, FSDPOptions, knob_fields
from train_fns.size_fit import Layout, fit


@dataclass(frozen=True)
class Unexpressed:
    """A tuned value a target has no place for: named in its output with why."""

    key: str
    value: Any
    why: str

    def line(self) -> str:
        return f"{self.key}={self.value}: {self.why}"


@dataclass(frozen=True)
class Tuned:
    """One size's tuned configuration, as every target reads it."""

    best: Path
    """The best.yaml it came from (a torchrun script loads it with ``train_fns.tuned``)."""
    name: str
    world_size: int
    num_nodes: int
    global_batch: int
    micro_batch: int
    accumulation_steps: int
    strategy: str
    ddp: DDPOptions
    fsdp: FSDPOptions
    activation_checkpointing: bool
    adamw_impl: str | None
    precision: str
    use_gpu: bool
    env: dict[str, str]
    line: str
    """Which entry runs and what was dropped from it at this layout (``Fitted.line``)."""
    dropped: tuple[Unexpressed, ...] = ()

    @property
    def backend(self) -> str:
        return "nccl" if self.use_gpu else "gloo"

    @property
    def per_node(self) -> int:
        return self.world_size // self.num_nodes

    def changed_fsdp(self) -> dict[str, Any]:
        """The FSDP2 options that differ from FSDP2's defaults (empty under DDP)."""
        if self.strategy != "fsdp":
            return {}
        default = FSDPOptions()
        return {f.name: getattr(self.fsdp, f.name) for f in dataclasses.fields(FSDPOptions)
                if getattr(self.fsdp, f.name) != getattr(default, f.name)}  # fmt: skip


def best_path(run: str | Path) -> Path:
    """``run`` as a best.yaml: the file itself, or the one in a run folder."""
    path = Path(run).expanduser()
    if path.is_dir():
        path = path / BEST_YAML
        if not path.is_file():
            raise ConfigError("RUN", f"{run} holds no {BEST_YAML}; give a search's run folder "
                              f"(runs/<name>) or a {BEST_YAML}")  # fmt: skip
    elif not path.is_file():
        raise ConfigError("RUN", f"{run} does not exist; give a search's run folder (runs/<name>)"
                          f" or a {BEST_YAML}")  # fmt: skip
    return path


def read_tuned(run: str | Path, workers: int | None = None, nodes: int = 1,
               adapt: bool = False) -> Tuned:  # fmt: skip
    """The entry for ``workers`` (default: the run's ``cluster.num_workers``) on ``nodes``
    nodes. A size with no entry of its own is a ConfigError naming the sizes there are, unless
    ``adapt``: then the nearest entry re-split, as a resized training run would run it."""
    path = best_path(run)
    try:
        config = load_config(str(path))
    except ConfigError as e:  # say which file: a run folder's best.yaml may be hand-edited
        raise ConfigError(e.key, f"{str(e).split(': ', 1)[1]} (in {path})") from e
    world = config.cluster.num_workers if workers is None else workers
    if world < 1:
        raise ConfigError("--workers", f"{world}; give a number of workers, 1 or more")
    if nodes < 1 or world % nodes:
        raise ConfigError("--nodes", f"{nodes} nodes cannot hold {world} workers evenly; give a "
                          "number of nodes that divides --workers")  # fmt: skip
    entries = run_entries(config)
    if world not in entries and not adapt:
        have = [str(size) for size in sorted(entries)]
        raise ConfigError("--workers", f"{path} has no entry for {world} workers (it has: "
                          f"{', '.join(have)}); use --workers {' or '.join(have)}, search that "
                          f"size (orchestrator.search --workers {world}), or add --adapt to "
                          "re-split the nearest entry")  # fmt: skip
    use_gpu = _use_gpu(config, path.parent)
    fitted = fit(entries, Layout(world, nodes), fit_context(config, use_gpu))
    if fitted.split is None:
        raise ConfigError(
            "--workers",
            f"{world} workers cannot carry workload.global_batch="
            f"{config.workload.global_batch} exactly; use a size that divides it",
        )
    knobs = knob_fields(fitted.tuned, config.workload.unused_parameters,
                        config.strategy.replace("search", "ddp"))  # fmt: skip
    accumulation, micro = fitted.split
    return Tuned(
        best=path.resolve(), name=config.name, world_size=world, num_nodes=nodes,
        global_batch=config.workload.global_batch, micro_batch=micro,
        accumulation_steps=accumulation, precision=config.workload.precision, use_gpu=use_gpu,
        env=dict(fitted.env), line=fitted.line(world),
        dropped=tuple(Unexpressed(k, v, f"dropped at this layout: {why}")
                      for k, v, why in fitted.dropped),
        **knobs,
    )  # fmt: skip


def _use_gpu(config: Config, folder: Path) -> bool:
    """Whether the run trained on GPUs: what its search recorded, else what the config forces,
    else whether this machine has an NVIDIA driver (``cluster.use_gpu: auto``)."""
    recorded = read_run_info(folder).use_gpu
    if recorded is not None:
        return recorded
    if isinstance(config.cluster.use_gpu, bool):
        return config.cluster.use_gpu
    return shutil.which("nvidia-smi") is not None


@dataclass(frozen=True)
class Export:
    """One target's translation: its own text (what the tool reads), the same settings as
    data, and every tuned value the target cannot take, with why."""

    target: str
    text: str
    settings: dict[str, Any]
    unexpressed: tuple[Unexpressed, ...]
    cautions: tuple[str, ...] = ()
    """What the target may do with an expressed value other than what was measured."""

    def record(self) -> dict[str, Any]:
        """Everything as one JSON-able mapping (``--json``)."""
        return {"target": self.target, "settings": self.settings, "text": self.text,
                "not_expressed": [dataclasses.asdict(u) for u in self.unexpressed],
                "cautions": list(self.cautions)}  # fmt: skip
