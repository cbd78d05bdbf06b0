"""``python -m orchestrator.export``: each target launched for real on two gloo ranks, reading
back from the wrapped model and the tool's state that every exported value took effect; and
bad inputs refused with the value and the fix.

Trainer, Accelerate and Lightning each import transformers and their own stack in two processes
and torchrun the project's (15-40 s on 2 cores): the slow tier; the refusals are quick.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _export_run import (
    ACCUMULATION,
    BEST,
    BUCKET_BYTES,
    BUFFSIZE,
    CHECK,
    MICRO_BATCH,
    STEPS,
    export,
    launch,
    make_run,
)

from orchestrator.runfiles import BEST_YAML


def _settings(run: Path, target: str) -> dict:
    done = export(run, "--to", target, "--json", "--script", str(CHECK))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _took_effect(ranks: list[dict], checkpointing: bool = True) -> None:
    """The tuned split and buckets, read back from each rank's run."""
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["world_size"] == 2 and r["backend"] == "gloo"
        assert r["bucket_bytes_cap"] == BUCKET_BYTES  # the default is 25 MiB
        assert r["find_unused_parameters"] is True
        assert r["broadcast_buffers"] is False
        assert r["accumulation"] == [ACCUMULATION] * r["steps"]  # micro-batches per step
        assert r["nccl_buffsize"] == BUFFSIZE  # the variables reached every process
        assert r["checkpointing"] is checkpointing
        # every micro-batch the model ran was the tuned one, ACCUMULATION per optimizer step
        assert set(r["micro_batches"]) == {MICRO_BATCH}
        assert len(r["micro_batches"]) == r["steps"] * ACCUMULATION


@pytest.mark.slow
def test_torchrun_script_runs_the_tuned_configuration(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run")
    script = export(run, "--to", "torchrun", "--script", str(CHECK))
    assert script.returncode == 0, script.stderr
    (tmp_path / "launch.sh").write_text(script.stdout)
    (tmp_path / "settings.json").write_text("{}")
    ranks = launch(["sh", "launch.sh", "torchrun", "settings.json"], {}, tmp_path)
    _took_effect(ranks)


@pytest.mark.slow
def test_trainer_runs_with_the_exported_arguments(tmp_path: Path) -> None:
    settings = _settings(make_run(tmp_path / "run"), "trainer")["settings"]
    args = settings["training_arguments"]
    assert args["per_device_train_batch_size"] == MICRO_BATCH
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    command = ["torchrun", "--nproc-per-node", "2", "--standalone", str(CHECK), "trainer",
               "settings.json"]  # fmt: skip
    assert settings["launch"].startswith(f"NCCL_BUFFSIZE={BUFFSIZE} torchrun")
    ranks = launch(command, settings["environment"], tmp_path)
    _took_effect(ranks)
    assert {r["optimizer"] for r in ranks} == {"AdamW"}
    assert not any(r["fused"] for r in ranks)  # Trainer's own default is the fused AdamW
    assert all(r["steps"] == STEPS for r in ranks)


@pytest.mark.slow
def test_accelerate_launch_runs_with_the_exported_config(tmp_path: Path) -> None:
    record = _settings(make_run(tmp_path / "run"), "accelerate")
    (tmp_path / "accelerate.yaml").write_text(record["text"])
    (tmp_path / "settings.json").write_text(json.dumps(record["settings"]))
    settings = record["settings"]
    command = ["accelerate", "launch", "--config_file", "accelerate.yaml", str(CHECK),
               "accelerate", "settings.json"]  # fmt: skip
    ranks = launch(command, settings["environment"], tmp_path)
    _took_effect(ranks)
    assert all(r["foreach"] is True for r in ranks)


@pytest.mark.slow
def test_lightning_trains_with_the_exported_strategy(tmp_path: Path) -> None:
    record = _settings(make_run(tmp_path / "run"), "lightning")
    settings = record["settings"]
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    ranks = launch(["python", str(CHECK), "lightning", "settings.json"],
                   settings["environment"], tmp_path)  # fmt: skip
    _took_effect(ranks)
    assert all(r["steps"] == STEPS for r in ranks)


def test_trainer_is_told_when_its_loss_scaling_would_multiply_the_gradient(
    tmp_path: Path,
) -> None:
    """Trainer skips dividing by the accumulation for a model that takes ``**kwargs`` (BERT's
    heads, which ignore ``num_items_in_batch``): the export says so, and what to set."""
    done = export(make_run(tmp_path / "run"), "--to", "trainer", "--json")
    assert done.returncode == 0, done.stderr
    (caution,) = json.loads(done.stdout)["cautions"]
    assert f"gradient_accumulation_steps ({ACCUMULATION})" in caution
    assert "loss_is_scaled_for_ga = False" in caution
    assert f"caution for trainer: {caution}" in done.stderr


def test_what_a_target_cannot_say_is_named(tmp_path: Path) -> None:
    """Lightning's DDPStrategy has no checkpointing nor optimizer: both named on stderr and in
    the output, with where they go instead."""
    done = export(make_run(tmp_path / "run"), "--to", "lightning")
    assert done.returncode == 0, done.stderr
    named = {u["key"] for u in json.loads(done.stdout)["not_expressed"]}
    assert named == {"activation_checkpointing", "adamw_impl"}
    assert "not expressed in lightning: activation_checkpointing=True" in done.stderr


def test_fsdp_options_a_target_lacks_are_named(tmp_path: Path) -> None:
    """Resharding to a group of 2 and a prefetch depth: FSDP2 knobs neither Accelerate's plugin
    nor Lightning's strategy takes; each names them rather than dropping them."""
    from orchestrator.export import export as export_to

    fsdp = {"strategy": "fsdp", "cluster": {"num_workers": 4, "use_gpu": False},
            "workload": {**BEST["workload"], "unused_parameters": False}, "sizes": {},
            "tuned": {"accumulation_steps": 2, "reshard_after_forward": 2,
                      "forward_prefetch": 1}}  # fmt: skip
    run = make_run(tmp_path / "run", fsdp)
    accelerate = export_to(run, "accelerate")
    assert accelerate.settings["config_file"]["distributed_type"] == "FSDP"
    # on CPU the file says why it names a GPU type and use_cpu false (the launch's variable)
    assert "# CPU workers: distributed_type {MULTI_GPU, FSDP} with use_cpu false is" in (
        accelerate.text
    )
    assert accelerate.settings["environment"]["ACCELERATE_USE_CPU"] == "true"
    assert accelerate.settings["config_file"]["fsdp_config"]["fsdp_version"] == 2
    named = {u.key for u in accelerate.unexpressed}
    assert {"reshard_after_forward", "forward_prefetch"} <= named
    assert "# not expressed: reshard_after_forward=2: " in accelerate.text
    lightning = export_to(run, "lightning")
    assert lightning.settings["strategy"]["class"] == "ModelParallelStrategy"
    assert {"reshard_after_forward", "forward_prefetch"} <= {u.key for u in lightning.unexpressed}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--to", "deepspeed"], "--to: unknown target 'deepspeed'; use one of trainer"),
        (["--to", "trainer", "--workers", "4"],
         "has no entry for 4 workers (it has: 1, 2); use --workers 1 or 2"),
        (["--to", "trainer", "--workers", "3", "--adapt"],
         "3 workers cannot carry workload.global_batch=16 exactly"),
        (["--to", "trainer", "--nodes", "3"], "--nodes: 3 nodes cannot hold 2 workers"),
        (["--to", "torchrun", "--workers", "0"], "--workers: 0; give a number of workers"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_with_the_fix(tmp_path: Path, args: list[str], said: str) -> None:
    done = export(make_run(tmp_path / "run"), *args)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert done.stdout == ""


def test_a_missing_run_is_named(tmp_path: Path) -> None:
    done = export(tmp_path / "nowhere", "--to", "trainer")
    assert done.returncode == 2
    assert f"RUN: {tmp_path / 'nowhere'} does not exist" in done.stderr
    (tmp_path / "empty").mkdir()
    done = export(tmp_path / "empty", "--to", "trainer")
    assert done.returncode == 2 and f"holds no {BEST_YAML}" in done.stderr
    run = make_run(tmp_path / "edited", {"tuned": {"bucket_cap": 5}})
    done = export(run, "--to", "torchrun")
    assert done.returncode == 2 and "tuned.bucket_cap: unknown knob; did you mean " in done.stderr
    assert f"(in {run / BEST_YAML})" in done.stderr  # which file holds it


def test_a_size_without_its_entry_is_re_split_on_request(tmp_path: Path) -> None:
    """--adapt at 4 workers runs the 2-worker entry re-split, as a resized run would: the
    micro-batch kept, the accumulation halved to hold the global batch."""
    done = export(make_run(tmp_path / "run"), "--to", "lightning", "--workers", "4", "--adapt")
    settings = json.loads(done.stdout)
    assert settings["dataloader"]["batch_size"] == MICRO_BATCH
    assert settings["trainer"]["accumulate_grad_batches"] == 1
    one = json.loads(export(tmp_path / "run", "--to", "lightning", "--workers", "1").stdout)
    assert one["strategy"]["kwargs"]["bucket_cap_mb"] == 50  # the 1-worker entry's own
