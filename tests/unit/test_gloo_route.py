"""commtune's gloo side group takes the interfaces NCCL was told to use (issue 24 item 6): on
EFA/InfiniBand nodes gloo's own pick (the hostname's) may not route between nodes."""

from __future__ import annotations

import pytest

from train_fns.ranks import matching_interfaces, route_gloo

NAMES = ["lo", "docker0", "eth0", "eth1", "ens5", "ib0"]


@pytest.mark.parametrize(
    ("spec", "chosen"),
    [
        ("eth", ["eth0", "eth1"]),  # a prefix, as NCCL reads it
        ("=eth0", ["eth0"]),  # exact
        ("ens,ib", ["ens5", "ib0"]),
        ("^docker,lo", ["eth0", "eth1", "ens5", "ib0"]),  # exclusion
        ("^=eth0", ["lo", "docker0", "eth1", "ens5", "ib0"]),
        ("wlan", []),
    ],
)
def test_nccl_socket_ifname_is_read_by_nccls_grammar(spec: str, chosen: list[str]) -> None:
    assert matching_interfaces(spec, NAMES) == chosen


def test_gloo_follows_nccls_interfaces_unless_told_otherwise(capsys) -> None:  # noqa: ANN001
    env = {"NCCL_SOCKET_IFNAME": "^docker,lo"}
    assert route_gloo(env, NAMES) == "eth0,eth1,ens5,ib0" == env["GLOO_SOCKET_IFNAME"]
    told = {"NCCL_SOCKET_IFNAME": "eth", "GLOO_SOCKET_IFNAME": "ib0"}
    assert route_gloo(told, NAMES) == "ib0"  # the user's own setting stands
    assert route_gloo({}, NAMES) is None  # nothing said: gloo's own pick, as torch's
    missing = {"NCCL_SOCKET_IFNAME": "wlan"}
    assert route_gloo(missing, NAMES) is None and "GLOO_SOCKET_IFNAME" not in missing
    line = capsys.readouterr().out
    assert "NCCL_SOCKET_IFNAME=wlan matches no interface" in line and "GLOO_SOCKET_IFNAME" in line
