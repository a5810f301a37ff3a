"""The bounds of the leader's direct endpoint before and after a peer authenticates.

Anyone with network reach can open a TCP connection to a leader's endpoint
(:mod:`queueflow.server.endpoint`), so what a connection may cost is bounded before the peer has
proven anything (docs/operations.md, "The direct port's limits"):

* :class:`DirectLimits`: the frame sizes (small until a frame was verified), the idle and read
  timeouts and the write timeout, from the ``queueflow.direct.*`` settings.
* :class:`ConnectionGate`: how many connections are held, in total and per peer address (Kafka's
  ``max.connections`` and ``max.connections.per.ip``); it decides, the endpoint closes.

No I/O here: the endpoint does it.
"""

from __future__ import annotations

import resource
from collections import Counter
from dataclasses import dataclass
from typing import Final

from queueflow.settings import ShareGroupSettings

__all__ = [
    "MAX_IN_FLIGHT_REQUESTS",
    "ConnectionGate",
    "DirectLimits",
    "connection_cap",
    "peer_host",
]

#: Requests one connection may have under way (parked long polls included) before the endpoint
#: stops reading from it until one is answered (backpressure, not an error): a member has one
#: long poll per share-partition it fetches from this leader, plus acknowledgement flushes.
MAX_IN_FLIGHT_REQUESTS: Final = 1024


def connection_cap(configured: int, nofile_soft_limit: int | None = None) -> int:
    """The total connection cap actually used: ``configured``
    (``queueflow.direct.max.connections``), but at most half the process's soft open-file limit,
    so the endpoint can't take the file descriptors Kafka clients and RocksDB need.

    Args:
        configured: the setting's value.
        nofile_soft_limit: the soft ``RLIMIT_NOFILE``; ``None``: read it from this process
            (unlimited counts as no bound).
    """
    if nofile_soft_limit is None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        nofile_soft_limit = None if soft == resource.RLIM_INFINITY else soft
    if nofile_soft_limit is None:
        return configured
    return max(1, min(configured, nofile_soft_limit // 2))


@dataclass(frozen=True)
class DirectLimits:
    """The endpoint's per-connection bounds (sizes in bytes, times in seconds).

    Attributes:
        unauthenticated_max_frame_bytes: the largest frame read before one was verified.
        max_frame_bytes: the largest frame read after.
        unauthenticated_idle_s: wait for a new connection's first frame to start.
        idle_s: a verified connection without a frame and without a request under way.
        frame_read_timeout_s: a frame from its first byte to its last.
        write_timeout_s: an answer waiting for the peer to read earlier ones.
    """

    unauthenticated_max_frame_bytes: int
    max_frame_bytes: int
    unauthenticated_idle_s: float
    idle_s: float
    frame_read_timeout_s: float
    write_timeout_s: float

    @classmethod
    def from_settings(cls, settings: ShareGroupSettings) -> DirectLimits:
        """The limits of the ``queueflow.direct.*`` settings (docs/configuration.md)."""
        return cls(
            unauthenticated_max_frame_bytes=settings.direct_unauthenticated_max_frame_bytes,
            max_frame_bytes=max(
                settings.direct_max_frame_bytes, settings.direct_unauthenticated_max_frame_bytes
            ),
            unauthenticated_idle_s=settings.direct_unauthenticated_idle_ms / 1000,
            idle_s=settings.direct_connections_max_idle_ms / 1000,
            frame_read_timeout_s=settings.direct_frame_read_timeout_ms / 1000,
            write_timeout_s=settings.direct_write_timeout_ms / 1000,
        )

    def frame_bytes(self, verified: bool) -> int:
        """The largest frame a connection may send now."""
        return self.max_frame_bytes if verified else self.unauthenticated_max_frame_bytes

    def idle_timeout_s(self, verified: bool) -> float:
        """How long a connection may wait for its next frame to start."""
        return self.idle_s if verified else self.unauthenticated_idle_s


def peer_host(peername: object) -> str:
    """The peer address of a socket's ``peername`` (``(host, port, ...)``), as counted by the
    per-address cap; another shape (a Unix socket) counts as one address, ``""``."""
    if isinstance(peername, tuple) and peername:
        return str(peername[0])
    return ""


class ConnectionGate:
    """Counts the open connections, in total and per peer address, and admits new ones.

    Args:
        max_connections: the total cap (see :func:`connection_cap`).
        max_per_ip: the cap per peer address.
    """

    def __init__(self, max_connections: int, max_per_ip: int) -> None:
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self.open = 0
        self._by_host: Counter[str] = Counter()

    def admit(self, host: str) -> str | None:
        """Count a new connection from ``host`` and return ``None``, or return why it is
        refused (``max_connections``, ``max_connections_per_ip``) without counting it."""
        if self.open >= self.max_connections:
            return "max_connections"
        if self._by_host[host] >= self.max_per_ip:
            return "max_connections_per_ip"
        self.open += 1
        self._by_host[host] += 1
        return None

    def release(self, host: str) -> None:
        """Forget an admitted connection from ``host`` (it closed)."""
        self.open -= 1
        self._by_host[host] -= 1
        if self._by_host[host] <= 0:
            del self._by_host[host]

    def held(self, host: str) -> int:
        """Connections from ``host`` open now."""
        return self._by_host.get(host, 0)
