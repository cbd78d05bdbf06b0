"""Locked doors: each bad input exits 2 before Ray with one line naming the key."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator import runfiles
from orchestrator.config.bounds import BOUNDS
from orchestrator.config.inputs import check_out_dir, parse_set, read_yaml
from orchestrator.config.schema import Config, ConfigError, from_dict, load_config
from orchestrator.probe import cli as probe
from orchestrator.report import cli as report
from orchestrator.search.cli import main
from orchestrator.train import cli as train
from search_spaces.guarded_yaml import MAX_DEPTH, load_yaml, read_capped
from train_fns.model_presets import MODEL_PRESETS, declared_positions

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ["--preset", "smoke"]


def _bomb(section: str, prefix: str) -> str:
    """Billion laughs: nine levels of nine aliases each (9^9 values once expanded)."""
    lines = [f"{section}:", f"  {prefix}a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"  {prefix}{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    return "\n".join(lines) + "\n"


@pytest.fixture
def files(tmp_path: Path) -> Path:
    return make_files(tmp_path)


def make_files(tmp_path: Path) -> Path:
    """The bad files the cases name as ``{d}`` (benchmarks/calibration/bad_inputs.py builds them
    too)."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "deep.yaml").write_text("env: " + "[" * 50_000 + "]" * 50_000 + "\n")
    (tmp_path / "bomb-env.yaml").write_text(_bomb("env", "NCCL_"))
    (tmp_path / "bomb-tuned.yaml").write_text(_bomb("tuned", "x"))
    (tmp_path / "big.yaml").write_text("name: big\n# " + "x" * (2 << 20) + "\n")
    (tmp_path / "nan.yaml").write_text("search:\n  time_budget_min: .nan\n")
    (tmp_path / "dup.yaml").write_text("search:\n  trials: 3\n  trials: 300\n")
    small = json.dumps({"model_type": "bert", "max_position_embeddings": 32})
    typo = json.dumps({"model_type": "robertta"})
    for name, text in (
        ("broken", '{"model_type": "bert", '), ("nolist", "[1]"), ("small", small), ("typo", typo)
    ):  # fmt: skip
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(text)
    (tmp_path / "empty").mkdir()
    (tmp_path / "space.yaml").write_text(
        "name: bad\nparams:\n  NCCL_ALGO: {type: categorical, choices: [Ring], default: Tree}\n"
    )
    return tmp_path


# (argv, key named, text in the message); "{d}" is the fixture folder
BAD = [
    (["--out", "{d}/afile"], "--out", "not a folder"),
    (["--out", "{d}/afile/sub"], "--out", "is a file"),
    (["--out", "/proc/commtune-x"], "--out", "cannot be created"),
    (["--set", "workload.model={d}/broken"], "workload.model", "not valid JSON"),
    (["--set", "workload.model={d}/nolist"], "workload.model", "'model_type'"),
    (["--set", "workload.model={d}/empty"], "workload.model", "config.json"),
    (["--set", "workload.model=./no-such-model"], "workload.model", "config.json"),
    (["--set", "workload.model={d}/typo"], "workload.model", "did you mean 'roberta'"),
    (["--set", "workload.model=robertta"], "workload.model", "did you mean 'roberta'"),
    (["--set", "workload.model=bert-lage"], "workload.model", "did you mean 'bert-large'"),
    (["--set", "search.seed=-1"], "search.seed", "from 0 to"),
    (["--dry-run", "--tflops", "0"], "--tflops", "0.0"),
    (["--dry-run", "--tflops", "nan"], "--tflops", "nan"),
    (["--dry-run", "--nodes", "0"], "--nodes", "from 1 to"),
    (["--dry-run", "--set", "search.spaces=[{d}/space.yaml]"], "search.spaces", "Tree"),
    (["--config", "{d}/deep.yaml"], "--config", f"deeper than {MAX_DEPTH}"),
    (["--config", "{d}/bomb-env.yaml"], "--config", "aliases"),
    (["--config", "{d}/bomb-tuned.yaml"], "--config", "aliases"),
    (["--config", "{d}/big.yaml"], "--config", "1024 KiB"),
    (["--config", "/dev/zero"], "--config", "not a regular file"),
    (["--config", "{d}/dup.yaml"], "--config", "duplicate key 'trials'"),
    (["--config", "{d}/nan.yaml"], "search.time_budget_min", "finite"),
    (["--set", "workload.lr=.inf"], "workload.lr", "finite"),
    (["--set", "workload.model_overrides={x: .nan}"], "workload.model_overrides.x", "finite"),
    (["--time-budget", "nan"], "search.time_budget_min", "float"),
    (["--set", "tuned.strategy=zero9"], "tuned.strategy", "ddp, fsdp"),
    (["--set", "tuned.zero_stage=3"], "tuned.zero_stage", "unknown knob"),
    (["--set", "tuned.bucket_cap_mb=0"], "tuned.bucket_cap_mb", "from 0.001"),
    (["--set", "tuned.static_graph=1"], "tuned.static_graph", "true or false"),
    (["--set", "tuned.accumulation_steps=3"], "tuned.accumulation_steps", "divide"),
    (
        ["--set", "tuned.accumulation_steps=2", "--set", "tuned.static_graph=true"],
        "tuned.static_graph",
        "143580",
    ),  # fmt: skip
    (["--set", "name=../../../tmp/escape"], "name", "letters, digits"),
    (["--set", "name=.hidden"], "name", "letters, digits"),
    (["--set", "name=a/b"], "name", "letters, digits"),
    (["--set", "cluster.use_gpu=1"], "cluster.use_gpu", "auto, true, false"),
    (["--set", "cluster.placement=x"], "cluster.placement", "'x'; use one of: pack, spread"),
    (["--set", "cluster.num_workers=true"], "cluster.num_workers", "expected int"),
    (["--set", "workload.global_batch=1000000000"], "workload.global_batch", "from 1 to"),
    (["--set", "search.trials=1000000000"], "search.trials", "from 1 to"),
    (["--set", "search.step_deadline_s=1.0e300"], "search.step_deadline_s", "from 1 to"),
    (["--set", "workload.seq_len=4096"], "workload.seq_len", "128 positions"),
    (
        ["--set", "workload.model={d}/small", "--set", "workload.seq_len=256"],
        "workload.seq_len",
        "128 positions",
    ),  # fmt: skip  (smoke's override wins over the 32)
    (["--set", "workload.data={d}"], "workload.data", "not a readable file"),
    (["--set", "workload.tokenizer=/no/such/dir"], "workload.tokenizer", "not a folder"),
    (["--set", "env.NCCL_X=" + "[" * 40 + "]" * 40], "--set env.NCCL_X", "nesting"),
    (["--set", "search.spaces=[strategy, {d}/bomb-tuned.yaml]"], "search.spaces", "aliases"),
    (["--set", "search.spaces=[strategy, {d}/big.yaml]"], "search.spaces", "1024 KiB"),
    (["--storage", "not-a-url"], "search.storage", "not a storage URL"),
    (["--storage", "sqlite:////no/such/dir/study.db"], "search.storage", "not a folder"),
    (["--storage", "/no/such/dir/study.log"], "search.storage", "not a folder"),
    (["--address", "no-such-host:1x"], "cluster.address", "HOST:PORT"),
    (["--address", "host:70000"], "cluster.address", "HOST:PORT"),
    (["--address", "127.0.0.1:1"], "--address", "nothing answers at 127.0.0.1:1"),
    (["--address", "ray://127.0.0.1:1"], "--address", "Ray client server"),
    (["--set", "cluster.address=127.0.0.1:1"], "cluster.address", "ray start --head"),
]


@pytest.mark.parametrize(("argv", "key", "text"), BAD, ids=[" ".join(b[0])[-60:] for b in BAD])
def test_bad_input_exits_2_naming_the_key(
    argv: list[str], key: str, text: str, files: Path
) -> None:
    code, err = _run(main, SMOKE + [a.replace("{d}", str(files)) for a in argv])
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert f"error: {key}" in err and text in err, err


def test_every_number_of_the_config_has_bounds() -> None:
    """A new int/float key without a sane range fails here (global_batch 10^9 went through)."""
    sections = {"workload": "workload", "cluster": "cluster", "search": "search", "train": "train"}
    hints = Config.__dataclass_fields__
    for section in sections:
        cls = hints[section].default_factory  # type: ignore[misc]
        for name, f in cls.__dataclass_fields__.items():
            if any(t in str(f.type) for t in ("int", "float")) and "dict" not in str(f.type):
                assert f"{section}.{name}" in BOUNDS, f"{section}.{name} has no bounds"


def test_model_dir_seq_len_and_presets_state_positions(files: Path) -> None:
    assert all(declared_positions(name, {}) for name in MODEL_PRESETS)
    assert declared_positions(str(files / "small"), {}) == 32
    with pytest.raises(ConfigError, match="workload.seq_len: 64 exceeds the 32"):
        from_dict({"workload": {"model": str(files / "small"), "seq_len": 64}})


def test_guarded_yaml_limits(files: Path) -> None:
    assert load_yaml("a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}  # aliases still work
    with pytest.raises(yaml.MarkedYAMLError, match="recursive alias"):
        load_yaml("a: &x [1, *x]\n")
    with pytest.raises(ValueError, match="1024 KiB"):
        read_capped(files / "big.yaml")
    with pytest.raises(ConfigError, match="--config: .*deeper"):
        read_yaml(files / "deep.yaml", "--config")
    assert parse_set("a.b=[1, 2]") == (["a", "b"], [1, 2])


def test_out_dir_checks_leave_nothing_behind(files: Path) -> None:
    check_out_dir(files / "new" / "deeper")
    assert not (files / "new").exists() and not list(files.glob(".commtune-check-*"))
    with pytest.raises(ConfigError, match="--out: .* not a folder"):
        check_out_dir(files / "afile")


def test_train_probe_report_doctor_refuse_bad_inputs(files: Path) -> None:
    assert _run(train.main, SMOKE + ["--out", str(files / "afile")])[0] == 2
    code, err = _run(train.main, SMOKE + ["--steps", "0"])
    assert code == 2 and "train.steps" in err
    state = files / "run" / train.TRAIN_RUN_NAME / "checkpoint_1"
    state.mkdir(parents=True)
    (state / "train_state.json").write_text("{not json")
    code, err = _run(train.main, SMOKE + ["--out", str(files / "run"), "--resume"])
    assert code == 2 and "--out" in err and "unreadable" in err
    assert _run(probe.main, ["--out", str(files / "afile")])[0] == 2
    fp16_on_cpu = ["--set", "workload.precision=fp16", "--set", "cluster.use_gpu=false"]
    code, err = _run(train.main, [*SMOKE, *fp16_on_cpu, "--out", str(files / "fp16")])
    assert code == 2 and "--config: the tuned configuration cannot run here" in err, err
    for entry, argv in ((train.main, SMOKE), (probe.main, [])):
        code, err = _run(entry, [*argv, "--address", "127.0.0.1:1", "--out", str(files / "x")])
        assert code == 2 and "--address: nothing answers at 127.0.0.1:1" in err, err
    run = files / "searched"
    run.mkdir()
    (run / "trials.csv").write_text("number,state\n")
    (run / "best.yaml").write_text(_bomb("tuned", "x"))
    code, err = _run(report.main, [str(run), "--out", str(files)])
    assert code == 2 and "--out" in err and "is a folder" in err
    for evidence in (run / "trials.csv", files / "afile"):  # a run's own file, any non-page
        before = evidence.read_bytes()
        code, err = _run(report.main, [str(run), "--out", str(evidence)])
        assert code == 2 and "would be overwritten" in err and evidence.read_bytes() == before
    record = runfiles.collect([run])  # the bomb is skipped as unreadable, never expanded
    assert "best.yaml" in record.unreadable and "aliases" in record.unreadable["best.yaml"]


def test_load_config_rejects_what_from_dict_rejects() -> None:
    with pytest.raises(ConfigError, match="search.seed"):
        load_config(preset="smoke", sets=["search.seed=-1"])


def test_slowest_bad_input_exits_fast_without_ray(tmp_path: Path) -> None:
    """The deepest cheap check (a dry run's --nodes, after the whole config, the spaces and
    --out have passed) through the real CLI: exit 2 before anything that takes seconds: no
    Ray started, and neither Ray, torch nor transformers imported (the model is built after
    this check)."""
    cli = ("import sys, runpy\ntry:\n    runpy.run_module('orchestrator.search', "
           "run_name='__main__')\nfinally:\n    print('imported:', sorted(m for m in "
           "('ray', 'torch', 'transformers') if m in sys.modules), file=sys.stderr)\n")  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", cli, *SMOKE, "--dry-run", "--nodes", "0",
         "--out", str(tmp_path / "out")],  # fmt: skip
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "--nodes" in proc.stderr, proc.stderr
    assert "imported: []" in proc.stderr, proc.stderr
    assert "Started a local Ray instance" not in proc.stderr + proc.stdout
    assert not (tmp_path / "out").exists()


def test_dry_run_options_without_dry_run_are_refused(tmp_path: Path) -> None:
    from orchestrator.search import cli as search_cli

    code, err = _run(search_cli.main, [*SMOKE, "--nodes", "2", "--out", str(tmp_path / "o")])
    assert code == 2 and "--nodes: prices a dry run only" in err


def _run(entry, argv: list[str]) -> tuple[int, str]:  # noqa: ANN001
    import ray

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = entry(argv)
    assert not ray.is_initialized()
    return code, err.getvalue()
