"""A user's own workload (a file in a folder outside the project, not a Hugging Face model)
searched through the CLI with DDP and FSDP2, a crash inside its loss ending its trials only,
then trained from best.yaml and resumed; and a model whose steps leave parameters
unused (examples/moe_workload.py) searched the same way (its exact restarts are
tests/dist/test_snapshots.py's)."""

from __future__ import annotations

import csv
import json
import math
import textwrap
from pathlib import Path

import _procs
import pytest
import yaml
from _procs import ROOT

WORKLOAD = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.inp, self.out = nn.Linear(8, width), nn.Linear(width, 1)
        self.layers = nn.ModuleList([nn.Linear(width, width) for _ in range(2)])

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.out(x)


def make_workload(ctx):
    def batch(indices):
        gen = lambda i: torch.Generator().manual_seed(ctx.seed * 1000 + i)
        return torch.stack([torch.randn(9, generator=gen(i)) for i in indices])

    def loss(model, data):
        if len(data) == 1:
            raise ValueError("this workload refuses micro-batches of one sample")
        return nn.functional.mse_loss(model(data[:, :8]), data[:, 8:])

    return {"model": Net(ctx.options["width"]), "batch": batch, "loss": loss}
'''


def run(module: str, *args: str) -> _procs.Finished:
    return _procs.python(module, list(args))


def search(out: Path, entrypoint: Path, options: str, spaces: str,
           trials: int) -> _procs.Finished:  # fmt: skip
    """A grid search of a workload file on the smoke preset (global batch 8, no pruning: every
    configuration of the grid's first ``trials`` runs; no single-worker baseline and no race:
    a cold group start each, and these tests are about the trials)."""
    return run(
        "orchestrator.search", "--preset", "smoke", "--out", str(out),
        "--set", f"workload.entrypoint={entrypoint}:make_workload",
        "--set", f"workload.options={options}", "--set", "workload.global_batch=8",
        "--set", f"search.spaces={spaces}", "--set", "search.sampler=grid",
        "--set", f"search.trials={trials}", "--set", "search.prune=false",
        "--set", "search.scaling_baseline=false", "--set", "search.remeasure_top=0",
    )  # fmt: skip


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, _procs.Finished]:
    outside = tmp_path_factory.mktemp("user_code")
    (outside / "my_workload.py").write_text(textwrap.dedent(WORKLOAD))
    out = tmp_path_factory.mktemp("search")
    return out, search(out, outside / "my_workload.py", "{width: 16}",
                       "[strategy, accumulation]", 8)  # fmt: skip


@pytest.fixture(scope="module")
def moe_searched(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, _procs.Finished]:
    out = tmp_path_factory.mktemp("moe")
    # the grid: ddp, then fsdp
    return out, search(out, ROOT / "examples" / "moe_workload.py", "{width: 16, experts: 4}",
                       "[strategy]", 2)  # fmt: skip


@pytest.mark.slow
def test_search_runs_a_model_that_leaves_parameters_unused(moe_searched) -> None:
    """Unused parameters are found on the driver, said in one line; every DDP plan (the
    baseline too) runs with find_unused_parameters and FSDP2 as one unit: no trial crashes or is
    corrupt."""
    out, proc = moe_searched
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "got no gradient in some micro-batches" in proc.stdout
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert len(rows) == 2 and all(r["state"] == "complete" for r in rows), rows
    assert [r["strategy"] for r in rows] == ["ddp", "fsdp"], rows
    best = yaml.safe_load((out / "best.yaml").read_text().split("\n", 2)[2])
    assert best["workload"]["unused_parameters"] is True


@pytest.mark.slow  # minutes of CI time: run with -m slow
def test_search_runs_the_users_workload_with_ddp_and_fsdp(searched) -> None:
    out, proc = searched
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = list(csv.DictReader((out / "trials.csv").open()))
    done = {(r["strategy"], r["accumulation_steps"]) for r in rows if r["state"] == "complete"}
    assert {s for s, _ in done} == {"ddp", "fsdp"}, rows
    # accumulation 4 on 2 workers of 8 samples is a micro-batch of one: the user's loss raises.
    crashed = [r for r in rows if r["accumulation_steps"] == "4"]
    assert crashed and all(r["state"] in ("crash", "error") for r in crashed), crashed
    assert all("refuses micro-batches of one sample" in r["reason"] for r in crashed), crashed
    best = yaml.safe_load((out / "best.yaml").read_text().split("\n", 2)[2])
    assert best["workload"]["entrypoint"].endswith("my_workload.py:make_workload")


@pytest.mark.slow
def test_training_the_users_workload_resumes_from_its_checkpoint(searched, tmp_path: Path) -> None:
    """That workload trains from best.yaml through the CLI, and --resume goes on from its
    checkpoint to exactly --steps. That a resumed run ends at the uninterrupted run's loss is
    proven in-process (tests/dist/test_snapshots.py, test_elastic.py), and that a resumed run
    through Ray repeats the killed attempt's losses for the built-in model (test_train.py):
    here a third cold training run would prove it again."""
    out, _ = searched
    base = ["--config", str(out / "best.yaml"), "--checkpoint-every", "2",
            "--set", "train.log_every=1", "--out", str(tmp_path / "run")]  # fmt: skip
    half = run("orchestrator.train", *base, "--steps", "2")
    assert half.returncode == 0, half.stdout[-3000:] + half.stderr[-3000:]
    resumed = run("orchestrator.train", *base, "--steps", "4", "--resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming from step 2" in resumed.stdout + resumed.stderr, resumed.stdout[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 4 and math.isfinite(summary["final_loss"]), summary
    assert not resumed.left, f"the resumed run left processes behind: {resumed.left}"
