"""The command lines of :mod:`queueflow.devtools.netns` (pure: no root needed). The commands
themselves run in tests/integration/test_partition_smoke.py and ``make partition-test``."""

from __future__ import annotations

import pytest

from queueflow.devtools import netns
from queueflow.devtools.netns import Host, NetLab, bridge_commands, drop_commands, host_commands

HOST = Host("w1", "qf-ab12-w1", "10.213.40.2", "qfab12h0", "qfab12n0", "qfab12s0", "qfab12t0")


def test_the_bridge_gets_the_gateway_address_and_comes_up() -> None:
    assert bridge_commands("qfab12br", "10.213.40.1") == [
        ["ip", "link", "add", "qfab12br", "type", "bridge"],
        ["ip", "addr", "add", "10.213.40.1/24", "dev", "qfab12br"],
        ["ip", "link", "set", "qfab12br", "up"],
    ]


def test_a_host_is_a_namespace_with_a_veth_on_the_bridge_a_route_and_a_drop_sink() -> None:
    commands = host_commands(HOST, "qfab12br", "10.213.40.1")
    assert commands[0] == ["ip", "netns", "add", "qf-ab12-w1"]
    assert ["ip", "link", "set", "qfab12n0", "netns", "qf-ab12-w1"] in commands
    assert ["ip", "link", "set", "qfab12h0", "master", "qfab12br", "up"] in commands
    inside = ["ip", "netns", "exec", "qf-ab12-w1"]
    assert [*inside, "ip", "addr", "add", "10.213.40.2/24", "dev", "qfab12n0"] in commands
    assert [*inside, "ip", "route", "add", "default", "via", "10.213.40.1"] in commands
    # the sink stays down: a packet redirected there is dropped
    assert not any(c[-2:] == ["qfab12s0", "up"] for c in commands)
    assert [*inside, "tc", "qdisc", "add", "dev", "qfab12n0", "clsact"] in commands


def test_a_drop_matches_the_destination_on_the_sender_s_egress() -> None:
    (command,) = drop_commands(HOST, "10.213.40.1", prio=10)
    assert command[:4] == ["ip", "netns", "exec", "qf-ab12-w1"]
    text = " ".join(command)
    assert "dev qfab12n0 egress protocol ip prio 10 u32 match ip dst 10.213.40.1/32" in text
    assert text.endswith("action mirred egress redirect dev qfab12s0")
    (allow,) = netns.allow_commands(HOST, prio=10)
    assert allow[4:] == ["tc", "filter", "del", "dev", "qfab12n0", "egress", "prio", "10"]


@pytest.mark.parametrize("bad", ["10.0.0", "example.com", "10.0.0.1/24", "::1"])
def test_a_drop_needs_an_ipv4_address(bad: str) -> None:
    with pytest.raises(ValueError):
        drop_commands(HOST, bad, prio=10)


@pytest.mark.parametrize("name", ["", "a" * 16, "qf ab", "qf;rm"])
def test_interface_names_are_checked(name: str) -> None:
    with pytest.raises(ValueError, match="interface name"):
        bridge_commands(name, "10.0.0.1")


def test_names_of_a_lab_fit_linux_limits_and_carry_its_tag() -> None:
    lab = NetLab(tag="ab12")
    assert lab.bridge == "qfab12br" and len(lab.bridge) <= netns.IFNAME_MAX
    with pytest.raises(netns.NetLabError, match="not created"):
        _ = lab.gateway
    with pytest.raises(netns.NetLabError, match="not created"):
        lab.add_host("w1")


def test_argv_runs_the_command_in_the_host_s_namespace() -> None:
    assert NetLab(tag="ab12").argv(HOST, ["python", "-V"]) == [
        *("ip", "netns", "exec", "qf-ab12-w1", "python", "-V")
    ]
