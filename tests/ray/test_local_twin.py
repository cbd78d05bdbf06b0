"""The local twin (cluster-local.yaml): a head whose autoscaler starts fake worker nodes, a
smoke search submitted through the Jobs API that runs its trials on them, and a teardown that
leaves nothing behind. Slow: run with ``pytest -m slow``.

The job runs the installed commtune (``--no-upload``): the fake nodes share this machine's disk,
and each node's runtime-env agent re-extracts an uploaded working directory over the same folder
while the driver runs from it (seen here: ModuleNotFoundError halfway through a search). On real
nodes, each with its own disk, uploading is what the token-head tests exercise."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from _heads import ROOT, clean_env, start_head, stop_head, submit_cli

NODES_AND_WORKERS = """
import json, ray
from ray.util.state import list_actors, list_nodes
ray.init(address="auto", logging_level="ERROR")
nodes = [n for n in list_nodes(detail=True) if n.state == "ALIVE"]
workers = list_actors(filters=[("class_name", "=", "RayTrainWorker")], detail=True, limit=1000)
print(json.dumps({"head": [n.node_id for n in nodes if n.is_head_node],
                  "others": [n.node_id for n in nodes if not n.is_head_node],
                  "worker_nodes": sorted({a.node_id for a in workers})}))
"""


def cluster_view(env: dict[str, str]) -> dict[str, list[str]]:
    """Alive nodes and the nodes Ray Train workers ran on, as a separate driver sees them
    (empty while the head is still coming up)."""
    done = subprocess.run(
        [sys.executable, "-c", NODES_AND_WORKERS],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"head": [], "others": [], "worker_nodes": []}


@pytest.mark.slow
def test_local_twin_runs_a_submitted_search_on_its_fake_nodes(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(secrets.token_hex(32))
    env = clean_env(RAY_FAKE_CLUSTER="1", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    head = start_head(
        ["--port=6379", "--num-cpus=1", "--autoscaling-config=cluster-local.yaml"], env, 8265
    )
    try:  # submitted at once: the job waits for the nodes the autoscaler starts meanwhile
        done = submit_cli(
            ["--address", "http://127.0.0.1:8265", "search", "--follow", "--no-upload",
             "--results-root", str(tmp_path / "cluster"), "--preset", "smoke", "--trials", "2",
             "--set", "search.remeasure_top=0", "--set", "search.scaling_baseline=false",
             "--set", "cluster.autoscaling=true"],
            env,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        view = cluster_view(env)
        # A trial's 2 one-CPU workers cannot both fit on the 1-CPU head: fake nodes ran them.
        assert set(view["worker_nodes"]) & set(view["others"]), view
    finally:
        stop_head(head)
