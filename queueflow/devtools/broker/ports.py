"""Free TCP ports on the local host."""

from __future__ import annotations

import random
import socket

from queueflow.errors import BrokerError

__all__ = ["PortInUseError", "find_free_ports", "port_in_use"]


#: Where :func:`find_free_ports` looks when the kernel's ephemeral range can't be read.
_FALLBACK_EPHEMERAL_LOW = 32768
#: The lowest port it hands out.
_LOWEST = 10_000


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (``ip_local_port_range``)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_LOW


def find_free_ports(count: int = 1, host: str = "127.0.0.1") -> list[int]:
    """Return ``count`` distinct TCP ports that were free on ``host`` a moment ago.

    The ports are taken below the kernel's ephemeral range: a port from that range (what
    binding port 0 gives) can be taken, between this call and its use, as the local port of any
    outgoing connection on the host (every Kafka client opens some), and a server binding it
    then fails with "address already in use". Below the range only another explicit bind can
    take it.

    Raises:
        BrokerError: no ``count`` free ports were found.
    """
    rng = random.SystemRandom()
    high = max(_LOWEST + count, _ephemeral_low())
    ports: list[int] = []
    for _ in range(200 * count):
        port = rng.randrange(_LOWEST, high)
        if port not in ports and _bindable(port, host):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise BrokerError(f"found only {len(ports)} of {count} free TCP ports on {host}")


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Return True if ``port`` on ``host`` cannot be bound (a listener holds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


class PortInUseError(BrokerError):
    """A port the local broker needs is already bound (another broker, or a lost race)."""
