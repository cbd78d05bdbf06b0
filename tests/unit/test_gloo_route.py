"""commtune's gloo side group takes the interfaces NCCL was told to use: on
EFA/InfiniBand nodes gloo's own pick (the hostname's) may not route between nodes."""

from __future__ import annotations

import pytest

from train_fns.ranks import has_ipv4, matching_interfaces, route_gloo

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


def test_gloo_takes_the_first_usable_interface_nccl_would(capsys) -> None:  # noqa: ANN001
    """One name (gloo makes a device per name, and one without an address fails the group),
    the first that is up with an address."""
    up = {"lo", "eth1", "ib0"}.__contains__
    env = {"NCCL_SOCKET_IFNAME": "^docker,lo"}
    assert route_gloo(env, NAMES, up) == "eth1" == env["GLOO_SOCKET_IFNAME"]  # eth0 is down
    told = {"NCCL_SOCKET_IFNAME": "eth", "GLOO_SOCKET_IFNAME": "ib0"}
    assert route_gloo(told, NAMES, up) == "ib0"  # the user's own setting stands
    assert route_gloo({}, NAMES, up) is None  # nothing said: gloo's own pick, as torch's
    for spec in ("wlan", "=eth0"):  # no such interface; one that is down
        missing = {"NCCL_SOCKET_IFNAME": spec}
        assert route_gloo(missing, NAMES, up) is None and "GLOO_SOCKET_IFNAME" not in missing
    line = capsys.readouterr().out
    assert "NCCL_SOCKET_IFNAME=wlan matches no usable interface" in line
    assert "set GLOO_SOCKET_IFNAME" in line


def test_this_machines_loopback_has_an_address() -> None:
    assert has_ipv4("lo") and not has_ipv4("no-such-if0")
