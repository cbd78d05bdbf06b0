"""The cluster files pass Ray's own validation and keep the properties that matter.

cluster.yaml goes through ``prepare_config`` + ``validate_config``, which is what ``ray up``
runs before it talks to AWS. cluster-local.yaml (the fake multi-node twin) is read as is by
the autoscaler that ``ray start --head --autoscaling-config=...`` runs, which calls
``validate_config`` on the raw file; ``prepare_config`` cannot be used for it because the
Ray wheel lacks the fake provider's defaults file. Ray's autoscaler planner
(``ResourceDemandScheduler``) is run in-process to check which nodes each file would
launch. Nothing here starts a Ray process or calls AWS.
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
from ray.autoscaler._private.resource_demand_scheduler import ResourceDemandScheduler
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import NODE_KIND_HEAD, TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE

from orchestrator.cluster.session import WORKER_NICENESS

ROOT = Path(__file__).resolve().parents[2]
AWS_FILE = ROOT / "cluster.yaml"
LOCAL_FILE = ROOT / "cluster-local.yaml"

MAIN_GPU_TYPE = "p4d.24xlarge"
ALTERNATIVE_GPU_TYPES = {"p3.8xlarge", "p5.48xlarge"}
# Network cards (one EFA interface each) of the EFA instance types.
EFA_NETWORK_CARDS = {"p4d.24xlarge": 4, "p5.48xlarge": 32}
# What AWS reports for each instance type; Ray fills these in at `ray up` from the EC2 API.
AWS_DETECTED = {
    "m5.2xlarge": {"CPU": 8},
    "p3.8xlarge": {"CPU": 32, "GPU": 4},
    "p4d.24xlarge": {"CPU": 96, "GPU": 8},
    "p5.48xlarge": {"CPU": 192, "GPU": 8},
}
NO_AVAILABILITY_INFO = NodeAvailabilitySummary(node_availabilities={})


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def aws() -> dict:
    return prepare_config(load(AWS_FILE))


@pytest.fixture(scope="module")
def local() -> dict:
    return load(LOCAL_FILE)


def ray_start_command(commands: list[str]) -> str:
    """The one command (list item) that runs `ray start`; its exports apply to it."""
    starts = [c for c in commands if "ray start" in c]
    assert len(starts) == 1, f"expected one `ray start` command, got {starts}"
    return starts[0]


def exported(command: str) -> dict[str, str]:
    """NAME=value assignments that an `export` in this shell command sets."""
    env: dict[str, str] = {}
    for statement in re.split(r";|\bthen\b|\bfi\b", command):
        words = shlex.split(statement)
        if words[:1] == ["export"]:
            env.update(w.split("=", 1) for w in words[1:] if "=" in w)
    return env


def gpu_types(config: dict) -> dict[str, dict]:
    head = config["head_node_type"]
    return {k: v for k, v in config["available_node_types"].items() if k != head}


class _HeadOnly(NodeProvider):
    """A cluster that holds only its head node, for the autoscaler's planner."""

    def __init__(self, head_type: str) -> None:
        super().__init__({}, "test")
        self.head_type = head_type

    def non_terminated_nodes(self, tag_filters):
        return ["head"]

    def node_tags(self, node_id):
        return {TAG_RAY_NODE_KIND: NODE_KIND_HEAD, TAG_RAY_USER_NODE_TYPE: self.head_type}

    def internal_ip(self, node_id):
        return node_id


def plan(config: dict, node_types: dict, head_resources: dict, demands: list[dict]) -> dict:
    """Which nodes Ray's autoscaler would launch for these demands on a head-only cluster."""
    scheduler = ResourceDemandScheduler(
        _HeadOnly(config["head_node_type"]),
        node_types,
        config["max_workers"],
        config["head_node_type"],
        config["upscaling_speed"],
    )
    to_launch, _ = scheduler.get_nodes_to_launch(
        ["head"],
        {},
        demands,
        {"head": head_resources},
        [],
        {"head": head_resources},
        [],
        NO_AVAILABILITY_INFO,
    )
    return to_launch


# ------------------------------------------------------------------------- cluster.yaml


def test_cluster_yaml_validates_with_rays_validator(aws: dict) -> None:
    validate_config(aws)
    assert aws["provider"]["type"] == "aws"


def test_one_availability_zone() -> None:
    zone = load(AWS_FILE)["provider"]["availability_zone"]
    assert zone and "," not in zone, "one zone: cross-zone training is slow"


def test_dashboard_and_jobs_api_on_loopback(aws: dict) -> None:
    head = ray_start_command(aws["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head
    for command in aws["head_start_ray_commands"] + aws["worker_start_ray_commands"]:
        assert "0.0.0.0" not in command


def test_token_authentication_on_every_ray_start(aws: dict) -> None:
    for commands in (aws["head_start_ray_commands"], aws["worker_start_ray_commands"]):
        assert exported(ray_start_command(commands)).get("RAY_AUTH_MODE") == "token"
    # The token reaches the nodes from the user's home, never from the repository.
    token_mounts = {r: lp for r, lp in aws["file_mounts"].items() if "auth_token" in r}
    assert token_mounts == {"/home/ubuntu/.ray/auth_token": "~/.ray/auth_token"}


def test_workers_run_at_the_niceness_of_a_local_search(aws: dict) -> None:
    for commands in (aws["head_start_ray_commands"], aws["worker_start_ray_commands"]):
        niceness = exported(ray_start_command(commands)).get("RAY_worker_niceness")
        assert niceness == str(WORKER_NICENESS), commands


def test_gpu_worker_types_grow_and_shrink(aws: dict) -> None:
    workers = gpu_types(aws)
    instance_types = {v["node_config"]["InstanceType"] for v in workers.values()}
    assert instance_types == {MAIN_GPU_TYPE} | ALTERNATIVE_GPU_TYPES
    raw = load(AWS_FILE)["available_node_types"]
    for name, node_type in workers.items():
        assert {"min_workers", "max_workers"} <= raw[name].keys(), f"{name}: explicit bounds"
        assert 0 <= node_type["min_workers"] <= node_type["max_workers"] <= aws["max_workers"]
    # Exactly one GPU type is enabled, and it is the main one: Ray would otherwise pick
    # whichever type fits best (see test_autoscaler_launches_the_main_gpu_type) and a trial
    # across GPU generations measures its slowest node.
    enabled = [v for v in workers.values() if v["max_workers"] > 0]
    assert [v["node_config"]["InstanceType"] for v in enabled] == [MAIN_GPU_TYPE]
    assert enabled[0]["max_workers"] > enabled[0]["min_workers"], "it must be able to grow"
    head = aws["available_node_types"][aws["head_node_type"]]["node_config"]["InstanceType"]
    assert AWS_DETECTED[head].get("GPU", 0) == 0, "the head is a CPU node"


def test_efa_node_types_have_one_efa_interface_per_network_card(aws: dict) -> None:
    for name, node_type in gpu_types(aws).items():
        node_config = node_type["node_config"]
        instance_type = node_config["InstanceType"]
        assert node_config.get("Placement", {}).get("GroupName"), f"{name}: placement group"
        if instance_type not in EFA_NETWORK_CARDS:
            assert "NetworkInterfaces" not in node_config
            continue
        interfaces = node_config["NetworkInterfaces"]
        cards = sorted(i["NetworkCardIndex"] for i in interfaces)
        assert cards == list(range(EFA_NETWORK_CARDS[instance_type])), name
        for interface in interfaces:
            assert interface["InterfaceType"] == "efa"
            assert interface["DeviceIndex"] == (0 if interface["NetworkCardIndex"] == 0 else 1)
            assert interface["SubnetId"] and interface["Groups"]
        # With NetworkInterfaces, Ray refuses node-level subnets and security groups.
        assert not {"SubnetId", "SubnetIds", "SecurityGroupIds"} & node_config.keys()


def test_network_interfaces_pass_rays_aws_bootstrap_step(aws: dict) -> None:
    from ray.autoscaler._private.aws.config import _configure_from_network_interfaces

    configured = _configure_from_network_interfaces(copy.deepcopy(aws))
    for name, node_type in configured["available_node_types"].items():
        assert node_type["node_config"].get("SubnetIds"), f"{name}: no subnet"
        assert node_type["node_config"].get("SecurityGroupIds"), f"{name}: no security group"
    # One subnet and one security group for all: one zone, and nodes may talk to each other.
    subnets = {
        s
        for v in configured["available_node_types"].values()
        for s in v["node_config"]["SubnetIds"]
    }
    groups = {
        g
        for v in configured["available_node_types"].values()
        for g in v["node_config"]["SecurityGroupIds"]
    }
    assert len(subnets) == 1 and len(groups) == 1


def test_efa_environment_for_the_ray_processes_on_gpu_nodes(aws: dict) -> None:
    worker = ray_start_command(aws["worker_start_ray_commands"])
    env = exported(worker)
    assert env["FI_PROVIDER"] == "efa"
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert env["NCCL_SOCKET_IFNAME"]
    # Only where an EFA device answers, so the p3 (no EFA) type keeps working.
    assert worker.index("fi_info -p efa") < worker.index("FI_PROVIDER=efa")
    head = ray_start_command(aws["head_start_ray_commands"])
    assert "FI_PROVIDER" not in head, "the head does no training"


def test_setup_installs_commtune_with_pinned_ray(aws: dict) -> None:
    assert aws["file_mounts"]["/home/ubuntu/commtune"] == "."
    for commands in (aws["head_setup_commands"], aws["worker_setup_commands"]):
        text = "\n".join(commands)
        assert "pip install -e ~/commtune" in text
        pins = re.findall(r"ray\[[a-z,]+\]==([0-9.]+)", text)
        assert pins == ["2.60.0"], pins
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"ray[default,train,tune]>=2.60,<2.61"' in pyproject, "pin and pyproject disagree"
    assert any("boto3" in c for c in aws["head_setup_commands"]), "the autoscaler needs boto3"


def test_shared_storage_mounted_on_every_node(aws: dict) -> None:
    text = "\n".join(aws["initialization_commands"])
    assert re.search(r"mount -t nfs4 .* \S+:/ /mnt/shared", text), text
    assert "mountpoint -q /mnt/shared" in text, "re-running setup must not mount twice"


def test_autoscaler_launches_the_main_gpu_type(aws: dict) -> None:
    node_types = copy.deepcopy(aws["available_node_types"])
    for node_type in node_types.values():
        node_type["resources"] = AWS_DETECTED[node_type["node_config"]["InstanceType"]]
    four_gpu_trial = [{"CPU": 4, "GPU": 1}] * 4
    head = {"CPU": 8}
    assert plan(aws, node_types, head, four_gpu_trial) == {"gpu_8x_a100_efa": 1}
    assert plan(aws, node_types, head, [{"CPU": 4, "GPU": 1}] * 40) == {"gpu_8x_a100_efa": 4}
    # Why the alternatives are off: enabled, Ray would fill 4-GPU trials with p3 nodes.
    for name in gpu_types(aws):
        node_types[name]["max_workers"] = aws["max_workers"]
        node_types[name]["min_workers"] = 0
    assert plan(aws, node_types, head, four_gpu_trial) == {"gpu_4x_v100": 1}


# ------------------------------------------------------------------ cluster-local.yaml


def test_local_twin_validates_with_rays_validator(local: dict) -> None:
    validate_config(local)  # what the autoscaler of `ray start --autoscaling-config` runs
    # The autoscaler merges no defaults into this file, so it must be complete.
    for key in (
        "file_mounts",
        "cluster_synced_files",
        "worker_setup_commands",
        "worker_start_ray_commands",
        "auth",
        "idle_timeout_minutes",
        "upscaling_speed",
    ):
        assert key in local, key
    for node_type in local["available_node_types"].values():
        assert {"min_workers", "max_workers"} <= node_type.keys()


def test_local_twin_provider(local: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.autoscaler._private.fake_multi_node.node_provider import (
        FAKE_HEAD_NODE_TYPE,
        FakeMultiNodeProvider,
    )

    provider_config = local["provider"]
    assert provider_config["type"] == "fake_multinode"
    for flag in ("use_node_id_as_ip", "disable_node_updaters", "disable_launch_config_check"):
        assert provider_config[flag] is True, flag
    # The provider hard-codes the head's node type name.
    assert local["head_node_type"] == FAKE_HEAD_NODE_TYPE
    monkeypatch.setenv("RAY_FAKE_CLUSTER", "1")
    provider = FakeMultiNodeProvider(provider_config, local["cluster_name"])  # no process
    (head,) = provider.non_terminated_nodes({})
    assert provider.node_tags(head)[TAG_RAY_USER_NODE_TYPE] == local["head_node_type"]


def test_local_twin_head_command(local: dict) -> None:
    head = ray_start_command(local["head_start_ray_commands"])
    assert head.startswith("RAY_FAKE_CLUSTER=1 ray start --head")
    assert "--dashboard-host=127.0.0.1" in head
    assert "--autoscaling-config=cluster-local.yaml" in head
    assert "--port=6379" in head or "gcs_address" in local["provider"]
    # The head's declared resources are the ones `ray start` gives it.
    cpus = re.search(r"--num-cpus=(\d+)", head)
    head_type = local["available_node_types"][local["head_node_type"]]
    assert cpus and int(cpus.group(1)) == head_type["resources"]["CPU"]


def test_local_twin_launches_two_one_cpu_workers(local: dict) -> None:
    workers = gpu_types(local)
    assert len(workers) == 1
    ((name, worker),) = workers.items()
    assert worker["resources"]["CPU"] == 1
    assert worker["min_workers"] == 2 and worker["max_workers"] in (2, 3)
    node_types = local["available_node_types"]
    head = node_types[local["head_node_type"]]["resources"]
    assert plan(local, node_types, head, []) == {name: 2}
    smoke_trial = [{"CPU": 1}, {"CPU": 1}, {"CPU": 0.01}]
    assert plan(local, node_types, head, smoke_trial) == {name: 2}
    assert plan(local, node_types, head, [{"CPU": 1}] * 10) == {name: worker["max_workers"]}


# ------------------------------------------------------------------------- both files


@pytest.mark.parametrize("path", [AWS_FILE, LOCAL_FILE], ids=lambda p: p.name)
def test_no_credentials_in_the_file(path: Path) -> None:
    text = path.read_text()
    for pattern in (
        r"AKIA[0-9A-Z]{16}",
        r"ASIA[0-9A-Z]{16}",
        r"(?i)aws_secret_access_key",
        r"(?i)aws_access_key_id",
        r"(?i)aws_session_token",
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
        r"RAY_AUTH_TOKEN\s*=",
    ):
        assert not re.search(pattern, text), f"{path.name} matches {pattern}"
    config = yaml.safe_load(text)
    key = config.get("auth", {}).get("ssh_private_key")
    assert key is None or key.startswith("~"), "a private key comes from the user's home"
