"""``benchmarks.trainer_export`` keeps its figures when a rank aborts in torch's gloo teardown
after every run was done (pytorch/pytorch#179291: CI saw it), and fails on anything else."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from benchmarks import trainer_export
from benchmarks._commands import TEARDOWN_ABORT, Ran

FIGURES = '{"defaults": [100.0, 102.0], "exported": [110.0]}'


def _measure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wrote: bool, rc: int,
             said: str) -> dict:  # fmt: skip
    """``measure`` over a torchrun that wrote the figures or not, and ended so."""
    run = tmp_path / "best.yaml"
    run.write_text(yaml.safe_dump(trainer_export.QUICK_BEST))

    def torchrun(module: str, launch: list[str], **_: object) -> Ran:
        assert module == "torch.distributed.run" and "--worker" in launch
        if wrote:
            (Path(launch[-4]) / "figures.json").write_text(FIGURES)
        return Ran(rc, said, "", 1.0)

    monkeypatch.setattr(trainer_export, "run_module", torchrun)
    return trainer_export.measure(run, rounds=1, warmup=3, steps=6)


def test_a_teardown_abort_after_the_runs_keeps_the_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    said = f"  exported: 110.0 samples/s\n{TEARDOWN_ABORT}\nChildFailedError"
    assert _measure(tmp_path, monkeypatch, True, 1, said)["exported"] == [110.0]
    assert "aborted in torch's teardown after every run was done" in capsys.readouterr().out
    assert _measure(tmp_path, monkeypatch, True, 0, "")["defaults"] == [100.0, 102.0]


def test_any_other_failure_ends_the_benchmark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SystemExit, match="torchrun exited 1"):  # the runs never finished
        _measure(tmp_path, monkeypatch, False, 1, TEARDOWN_ABORT)
    with pytest.raises(SystemExit, match="Traceback"):  # another error, figures or not
        _measure(tmp_path, monkeypatch, True, 1, "Traceback (most recent call last): boom")
