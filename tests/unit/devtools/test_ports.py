"""queueflow.devtools.broker.ports: free ports for test brokers and workers come from below the
kernel's ephemeral range, where no outgoing connection can take them before they are bound."""

from __future__ import annotations

import socket

from queueflow.devtools.broker import ports


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    found = ports.find_free_ports(20)
    assert len(set(found)) == 20
    low = ports._ephemeral_low()
    assert all(ports._LOWEST <= p < low for p in found)
    for port in found:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("0.0.0.0", port))


def test_a_port_held_by_a_listener_is_not_bindable() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        held.listen()
        assert not ports._bindable(taken, "127.0.0.1")
        assert ports.port_in_use(taken)
