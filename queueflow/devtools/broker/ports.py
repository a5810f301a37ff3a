"""Free TCP ports on the local host."""

from __future__ import annotations

import socket

from queueflow.errors import BrokerError

__all__ = ["PortInUseError", "find_free_ports", "port_in_use"]


def find_free_ports(count: int = 1, host: str = "127.0.0.1") -> list[int]:
    """Return ``count`` distinct TCP ports that were free on ``host`` a moment ago.

    The ports are found by binding to port 0; another process may take one before it is used.
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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
