"""Which listener node leads each share-partition: what Metadata answers and where ShareFetch
sends a client (KIP-932 "ShareFetch API": a client fetches each share-partition from its
leader; KIP-951: a ``NOT_LEADER_OR_FOLLOWER`` answer names the current leader). Pure.

Every worker running the listener is a Kafka node: its id is derived from the address it
advertises (:func:`node_id_of`, the same on every worker and across restarts at that address).
The leaders are queueflow's own: each worker's share-partitions it is live on, and the others'
as their endpoint announcements name them with their listener (the coordinator's
:class:`~queueflow.server.coordinator.announcements.LeaderDirectory`). A share-partition whose
leader is unknown here, or whose leader runs no listener, is named as led by the asked node
itself (the gateway), with leader epoch -1 (unknown, which the Java client and librdkafka take
without comparing epochs): it serves that share-partition through queueflow's own path to the
leader, so a client always has somewhere to fetch from.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from queueflow.structs import TopicPartition

__all__ = ["Cluster", "Leader", "Node", "node_at", "node_id_of"]

#: The leader epoch of a share-partition whose leader is not known (Kafka: no epoch).
NO_EPOCH = -1


@dataclass(frozen=True, slots=True)
class Node:
    """A listener as a Kafka broker: its node id and the address clients connect to."""

    node_id: int
    host: str
    port: int

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{self.host}:{self.port}"


def node_id_of(address: str) -> int:
    """The Kafka node id of the listener advertised at ``address`` (``host:port``): a
    non-negative int32 from its CRC-32, the same on every worker."""
    return zlib.crc32(address.encode()) & 0x7FFF_FFFF


def node_at(address: str) -> Node | None:
    """The node advertised at ``host:port`` (None: not an address)."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit():
        return None
    return Node(node_id_of(address), host.strip("[]"), int(port))


@dataclass(frozen=True, slots=True)
class Leader:
    """The node leading a share-partition and its leader epoch (-1: unknown)."""

    node: Node
    epoch: int = NO_EPOCH


@dataclass(frozen=True, slots=True)
class Cluster:
    """The listener nodes of the app as one listener sees them.

    Attributes:
        me: the asked listener.
        leaders: the share-partitions whose leader's listener is known, with its epoch.
        gateway: name ``me`` as the leader of everything (``queueflow.kafka.listener.leaders=
            gateway``): ``leaders`` is ignored.
    """

    me: Node
    leaders: Mapping[TopicPartition, Leader] = field(default_factory=dict)
    gateway: bool = False

    @classmethod
    def build(
        cls,
        me: Node,
        local: Mapping[TopicPartition, int],
        remote: Mapping[TopicPartition, tuple[int, str]],
        gateway: bool = False,
    ) -> Cluster:
        """The view from ``me``.

        Args:
            me: this listener.
            local: the share-partitions this worker is live on, with its leader epoch.
            remote: other leaders' share-partitions: ``tp -> (leader epoch, listener
                host:port)`` (only those whose leader runs a listener); ``local`` wins.
            gateway: see :attr:`gateway`.
        """
        leaders: dict[TopicPartition, Leader] = {}
        for tp, (epoch, address) in remote.items():
            node = me if address == me.address else node_at(address)
            if node is not None:
                leaders[tp] = Leader(node, epoch)
        for tp, epoch in local.items():
            leaders[tp] = Leader(me, epoch)
        return cls(me, leaders, gateway)

    def leader_of(self, tp: TopicPartition) -> Leader:
        """The leader clients are told of: the known one, else this node (no epoch)."""
        if self.gateway:
            return Leader(self.me, 0)
        return self.leaders.get(tp) or Leader(self.me)

    def moved(self, tp: TopicPartition) -> Leader | None:
        """The leader of ``tp`` when it is another node (fetch there: ``NOT_LEADER_OR_FOLLOWER``),
        else None (this node serves it)."""
        leader = self.leader_of(tp)
        return None if leader.node == self.me else leader

    def nodes(self, tps: Iterable[TopicPartition] | None = None) -> tuple[Node, ...]:
        """This node and the leaders of ``tps`` (all known ones: None), by node id."""
        found = {self.me}
        if not self.gateway:
            chosen = self.leaders.values() if tps is None else (self.leader_of(tp) for tp in tps)
            found.update(leader.node for leader in chosen)
        return tuple(sorted(found, key=lambda n: (n.node_id, n.host, n.port)))
