"""A small run folder to export from, and the launch of an exported target.

The folder holds what a search writes for a 2-worker CPU run (best.yaml with an entry per
size, run_info.json): every tuned value differs from the default of each tool it is exported
to, so a read-back that finds the tool's default fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from orchestrator.runfiles import BEST_YAML, RUN_INFO

ROOT = Path(__file__).resolve().parents[2]
CHECK = Path(__file__).with_name("_export_check.py")
BUFFSIZE = "8388608"
BEST = {
    "name": "fixture",
    "strategy": "ddp",
    "workload": {"model": "bert-tiny", "seq_len": 16, "global_batch": 16, "precision": "fp32",
                 "model_overrides": {"vocab_size": 512, "max_position_embeddings": 64},
                 "unused_parameters": True},
    "cluster": {"num_workers": 2, "use_gpu": False},
    "env": {"NCCL_BUFFSIZE": int(BUFFSIZE)},
    "tuned": {"accumulation_steps": 2, "bucket_cap_mb": 5, "broadcast_buffers": False,
              "activation_checkpointing": True, "adamw_impl": "foreach"},
    "sizes": {1: {"tuned": {"accumulation_steps": 4, "bucket_cap_mb": 50}, "env": {}}},
}  # fmt: skip
"""At 2 workers: micro-batch 4 x accumulation 2 (Trainer's defaults: 8 x 1), 5 MB buckets
(25), no buffer broadcast (on), unused parameters found (Trainer turns it off under
checkpointing), checkpointing on, AdamW left to torch (Trainer picks the fused one)."""
MICRO_BATCH, ACCUMULATION, BUCKET_BYTES = 4, 2, 5 * 1024 * 1024
STEPS = 2


def make_run(folder: Path, best: dict | None = None) -> Path:
    """The run folder, as a search leaves it (the files export reads); ``best`` over BEST."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / BEST_YAML).write_text(yaml.safe_dump({**BEST, **(best or {})}))
    (folder / RUN_INFO).write_text(json.dumps({"backend": "gloo", "use_gpu": False,
                                               "world_size": 2}))  # fmt: skip
    return folder


def export(run: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m orchestrator.export RUN ARGS`` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "orchestrator.export", str(run), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=child_env())  # fmt: skip


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with the project importable, one thread a process (2 cores), and
    ``extra`` (an export's variables) over it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}  # fmt: skip
    return {**env, **(extra or {})}


def launch(command: list[str], env: dict[str, str], cwd: Path) -> list[dict]:
    """Run an exported launch; each rank's read-back (``_export_check.py`` writes them)."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd,
                          env=child_env(env))  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = sorted(cwd.glob("rank*.json"))
    assert len(found) == 2, (found, done.stderr[-3000:])
    return [json.loads(p.read_text()) for p in found]
