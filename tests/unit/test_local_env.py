"""A local Ray's processes inherit commtune's defaults for one machine, never over the user's."""

from __future__ import annotations

from orchestrator.session import LOCAL_ENV, local_env_defaults


def test_a_local_ray_runs_no_preemption_watcher_unless_the_user_asks() -> None:
    environ: dict[str, str] = {}
    local_env_defaults(environ)
    assert environ == {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"} == LOCAL_ENV
    mine = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "1"}
    local_env_defaults(mine)
    assert mine == {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "1"}
