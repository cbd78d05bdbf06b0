"""cluster.yaml passes Ray's own cluster-config validation (what `ray up` runs)."""

from __future__ import annotations

from pathlib import Path

import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = Path(__file__).resolve().parents[2]


def test_cluster_yaml_validates_against_rays_schema() -> None:
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    validate_config(prepare_config(config))
    assert config["provider"]["availability_zone"], "one zone: cross-zone training is slow"
    head = config["head_start_ray_commands"]
    assert any("--dashboard-host=127.0.0.1" in c for c in head), "dashboard must stay local"
