"""The study in optuna-dashboard: every trial shows, as its user attributes, what its row of
trials.csv says (state, reason, figures, where its wall-clock went), each a flat value the
dashboard's table can show, read here through optuna-dashboard's own WSGI app on a real
SQLite study."""

from __future__ import annotations

import json
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import optuna
from optuna_dashboard import wsgi

from orchestrator.runfiles import read_csv
from orchestrator.search.results import records, write_trials_csv
from orchestrator.search.tuner import tell
from train_fns import metrics as m

DONE = {
    m.STATE: m.COMPLETE, m.SAMPLES_PER_S: 812.5, m.TOKENS_PER_S: 52000.0,
    m.THROUGHPUT_CV: 0.031, m.STEP_TIME_S: 0.0394, m.COMM_FRACTION: 0.22,
    m.PEAK_MEM_BYTES: 3 * 2**30, m.PLACEMENT: "1 node", "trial_wall_s": 40.0,
    "timings": {"measured_s": 10.0, "start_s": 12.0, "imports_s": 3.0, "build_s": 1.0,
                "wrap_s": 0.5, "warmup_s": 4.0, "reference_s": 2.0, "free_s": 0.5,
                "other_s": 7.0},
}  # fmt: skip
OOM = {m.STATE: m.OOM, m.REASON: "CUDA out of memory at micro_batch=64", "phase": "warmup"}


def _dashboard_trials(storage: str) -> list[dict]:
    """The trials as optuna-dashboard's API serves them to its page."""
    app = wsgi(storage)
    environ: dict = {}
    setup_testing_defaults(environ)
    environ.update(PATH_INFO="/api/studies/1", QUERY_STRING="after=0")
    status: list[str] = []
    body = b"".join(app(environ, lambda s, _h, _e=None: status.append(s)))
    assert status == ["200 OK"]
    return json.loads(body)["trials"]


def test_the_dashboard_shows_each_row_of_trials_csv(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    for params, outcome in (({"bucket_cap_mb": 25}, DONE), ({"accumulation_steps": 1}, OOM)):
        tell(study, study.ask(), params, dict(outcome))
    write_trials_csv(records(study), tmp_path / "trials.csv")
    rows = read_csv(tmp_path / "trials.csv")
    shown = _dashboard_trials(storage)
    assert [t["state"] for t in shown] == ["Complete", "Fail"]
    for row, trial in zip(rows, shown, strict=True):
        attrs = {a["key"]: a["value"] for a in trial["user_attrs"]}
        params = {p["name"] for p in trial["params"]} | set(json.loads(attrs["params"]))
        for column, value in row.items():
            if column == "number" or column in params or value == "":
                continue
            assert column in attrs, f"trials.csv's {column} is not on the dashboard"
            seen = attrs[column]
            assert seen == value or float(seen) == float(value), (column, seen, value)
    assert rows[1]["reason"] == OOM[m.REASON] and rows[1]["state"] == m.OOM
    assert float(rows[0]["measured_share"]) == 0.25 and rows[0]["start_s"] == "12"
