"""Configuration: every shipped preset loads; every bad value names its key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config.schema import (
    ConfigError,
    dump_config,
    load_config,
    parse_set,
    preset_names,
)
from orchestrator.search.cli import main, parse_faults

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_loads_and_round_trips(preset: str, tmp_path: Path) -> None:
    config = load_config(preset=preset)
    assert config.name == preset
    path = tmp_path / "again.yaml"
    path.write_text(dump_config(config))
    assert load_config(str(path), preset=None) == config


def test_presets_cover_the_documented_set() -> None:
    assert {"smoke", "cpu-demo", "bert-large"} <= set(preset_names())


def test_set_overrides_with_yaml_types() -> None:
    config = load_config(
        preset="smoke",
        sets=[
            "search.trials=7",
            "cluster.use_gpu=false",
            "workload.lr=0.001",
            "env.FI_PROVIDER=efa",
        ],
    )
    assert config.search.trials == 7
    assert config.cluster.use_gpu is False
    assert config.workload.lr == pytest.approx(1e-3)
    assert config.env == {"FI_PROVIDER": "efa"}


def test_parse_set_reads_values_as_yaml() -> None:
    assert parse_set("a.b=8") == (["a", "b"], 8)
    assert parse_set("a=true") == (["a"], True)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_set("search.trials")


BAD_SETS = [
    (["search.trails=3"], "search.trails", "did you mean 'search.trials'"),
    (["search.trials=many"], "search.trials", "expected int"),
    (["cluster.num_workers=0"], "cluster.num_workers", "from 1 to"),
    (["cluster.num_workers=-2"], "cluster.num_workers", "from 1 to"),
    (["workload.global_batch=15"], "workload.global_batch", "multiple of 2"),
    (["workload.model=bert-huge"], "workload.model", "unknown model"),
    (["workload.precision=fp8"], "workload.precision", "fp32"),
    (["search.sampler=cmaes"], "search.sampler", "tpe"),
    (["strategy=zero3"], "strategy", "search"),
    (["env.LD_PRELOAD=/tmp/x.so"], "env", "LD_PRELOAD"),
    (["env.NCCL_NCHANNELS=4"], "env", "NCCL_MIN_NCHANNELS"),
    (["env.NCCL_BUFFSIZE=-1"], "env", "NCCL_BUFFSIZE"),
    (["env.NCCL_NTHREADS=100"], "env", "NCCL_NTHREADS"),
    (["env.NCCL_SOCKET_NTHREADS=16", "env.NCCL_NSOCKS_PERTHREAD=8"], "env", "64"),
    (["search.spaces=[nccl, nope]"], "search.spaces", "nope"),
    (["search.windows=20"], "search.windows", "measure_steps"),
]


@pytest.mark.parametrize(("sets", "key", "text"), BAD_SETS)
def test_bad_values_name_the_key(sets: list[str], key: str, text: str) -> None:
    code, err = _run_main(["--preset", "smoke", *[a for s in sets for a in ("--set", s)]])
    assert code == 2
    assert err.count("\n") == 1, err
    assert key in err and text in err, err


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("workload:\n  model: bert-tiny\n  seq_len: [64\n")
    code, err = _run_main(["--config", str(path)])
    assert code == 2 and "--config" in err and "line" in err and str(path) in err


def test_unknown_preset_suggests(capsys: pytest.CaptureFixture) -> None:
    code, err = _run_main(["--preset", "smok"])
    assert code == 2 and "did you mean 'smoke'" in err


def test_missing_space_file_is_named(tmp_path: Path) -> None:
    code, err = _run_main(["--preset", "smoke", "--set", f"search.spaces={tmp_path}/none.yaml"])
    assert code == 2 and "none.yaml" in err


def test_bad_fault_spec() -> None:
    assert parse_faults("2:crash, 3:hang,4:oom") == {2: "crash", 3: "hang", 4: "oom"}
    with pytest.raises(ConfigError, match="--inject-faults"):
        parse_faults("2:explode")


def test_existing_study_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "study.db").write_text("")
    code, err = _run_main(["--preset", "smoke", "--out", str(tmp_path)])
    assert code == 2 and "--resume" in err


def test_config_error_exits_fast_without_ray(tmp_path: Path) -> None:
    """The CLI rejects bad input before anything that takes seconds: no Ray session is
    started, and neither Ray, torch nor transformers is imported."""
    cli = ("import sys, runpy\ntry:\n    runpy.run_module('orchestrator.search', "
           "run_name='__main__')\nfinally:\n    print('imported:', sorted(m for m in "
           "('ray', 'torch', 'transformers') if m in sys.modules), file=sys.stderr)\n")  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-c", cli, "--preset", "smoke", "--set", "cluster.num_workers=0",
         "--out", str(tmp_path / "out")],  # fmt: skip
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "cluster.num_workers" in proc.stderr
    assert "imported: []" in proc.stderr, proc.stderr
    assert "Started a local Ray instance" not in proc.stderr + proc.stdout
    assert not (tmp_path / "out").exists()


def _run_main(argv: list[str]) -> tuple[int, str]:
    import contextlib
    import io

    import ray

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    assert not ray.is_initialized()
    return code, err.getvalue()
