"""Leader announcements: where share-partition leaders serve, and their lag.

Every leader announces (:mod:`queueflow.server.endpoint`: on a change, a changed lag within 2 s,
every 10 s otherwise) the address of its direct
endpoint for the share-partitions it is live on, and the lag of those share-partitions (KIP-1226's
definition, the ``lag`` assignor's input). :class:`LeaderDirectory` keeps both; the membership
handlers (:mod:`.membership`) hand the addresses to members in heartbeat answers and the lag to
the groups' assignors. :func:`handle_announcement` is the pure handler.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from queueflow.protocol import messages as protocol
from queueflow.server.coordinator.results import NOTHING, CoordinatorResult, LogEvent
from queueflow.structs import TopicPartition

__all__ = ["LAG_TTL_MS", "LEADER_ADDRESS_TTL_MS", "LeaderDirectory", "handle_announcement"]

#: A leader address not announced again within this many ms is no longer handed out (leaders
#: repeat an unchanged announcement every 10 s; see :mod:`queueflow.server.endpoint`).
LEADER_ADDRESS_TTL_MS = 30_000
#: A share-partition's lag not reported again within this many ms counts as unknown (a changed
#: lag is reported within 2 s, an unchanged one every 10 s).
LAG_TTL_MS = 30_000


class LeaderDirectory:
    """What leaders announced, with when (wall ms) it was received.

    Attributes:
        addresses: ``(topic, partition) -> (leader epoch, "host:port", received ms)``.
        lag: ``group -> (topic, partition) -> (lag, received ms)``.
        kafka_listeners: direct endpoint ``host:port`` -> the ``host:port`` of the same
            worker's Kafka-protocol listener (``queueflow.kafka.listener``), for the workers
            that announced one.
        coordinators: coordinator partition -> (coordinator epoch, direct endpoint
            ``host:port`` of the worker serving it, received ms).
    """

    def __init__(self) -> None:
        self.addresses: dict[tuple[str, int], tuple[int, str, int]] = {}
        self.lag: dict[str, dict[tuple[str, int], tuple[int, int]]] = {}
        self.kafka_listeners: dict[str, str] = {}
        self.coordinators: dict[int, tuple[int, str, int]] = {}

    def kafka_coordinator(self, partition: int, now_ms: int) -> str | None:
        """``host:port`` of the Kafka-protocol listener of the worker serving coordinator
        ``partition`` as known at ``now_ms`` (wall ms), None: unknown, or it runs none."""
        known = self.coordinators.get(partition)
        if known is None or _expired(known, now_ms):
            return None
        return self.kafka_listeners.get(known[1])

    def kafka_leaders(self, now_ms: int) -> dict[tuple[str, int], tuple[int, str]]:
        """``(topic, partition) -> (leader epoch, host:port)`` of the Kafka-protocol listener
        of each share-partition's leader known at ``now_ms`` (wall ms), for the leaders that
        run one."""
        out = {}
        for key, known in self.addresses.items():
            listener = self.kafka_listeners.get(known[1])
            if listener and not _expired(known, now_ms):
                out[key] = (known[0], listener)
        return out

    def addresses_of(
        self, assignment: Iterable[TopicPartition], now_ms: int
    ) -> list[tuple[str, int, str]]:
        """``(topic, partition, address)`` of the share-partitions' leaders known at
        ``now_ms`` (wall ms)."""
        out = []
        for tp in assignment:
            known = self.addresses.get((tp.topic, tp.partition))
            if known is not None and not _expired(known, now_ms):
                out.append((tp.topic, tp.partition, known[1]))
        return out

    def fresh_lag(self, group_id: str, now_ms: int) -> dict[TopicPartition, int]:
        """The lag of ``group_id``'s share-partitions reported within :data:`LAG_TTL_MS`
        (older reports, or none: the share-partition's lag is unknown to the assignors)."""
        reports = self.lag.get(group_id, {})
        return {
            TopicPartition(t, p): lag
            for (t, p), (lag, at) in reports.items()
            if now_ms - at <= LAG_TTL_MS
        }

    def forget_lag(self, which: Callable[[str], bool]) -> None:
        """Drop the lag reports of the groups ``which`` selects."""
        for group_id in [g for g in self.lag if which(g)]:
            del self.lag[group_id]


def _expired(known: tuple[int, str, int], now_ms: int) -> bool:
    # Not refreshed for three keepalive periods: its worker is gone or no longer leads.
    return now_ms - known[2] > LEADER_ADDRESS_TTL_MS


def handle_announcement(
    directory: LeaderDirectory, message: protocol.LeaderAnnouncement, now_ms: int
) -> CoordinatorResult:
    """Remember a leader's direct endpoint; a higher leader epoch (a later Faust generation)
    replaces a lower one, an equal one refreshes it, and any replaces one expired. Its lag
    reports are kept. Logs ``share_partition_leader`` when a share-partition's address changes.
    """
    if message.kafka_listener:
        directory.kafka_listeners[message.address] = message.kafka_listener
    else:
        directory.kafka_listeners.pop(message.address, None)
    for partition, epoch in message.coordinator_partitions:
        owner = directory.coordinators.get(partition)
        if owner is None or epoch >= owner[0] or _expired(owner, now_ms):
            directory.coordinators[partition] = (epoch, message.address, now_ms)
    for group_id, partition, lag in message.lag:
        directory.lag.setdefault(group_id, {})[(message.topic, partition)] = (lag, now_ms)
    events = []
    for partition in message.partitions:
        key = (message.topic, partition)
        known = directory.addresses.get(key)
        if known is None or message.leader_epoch >= known[0] or _expired(known, now_ms):
            if known is None or known[1] != message.address:
                events.append(
                    LogEvent.info(
                        "share_partition_leader",
                        topic=message.topic,
                        partition=partition,
                        address=message.address,
                        leader_epoch=message.leader_epoch,
                    )
                )
            directory.addresses[key] = (message.leader_epoch, message.address, now_ms)
    return CoordinatorResult(events=tuple(events)) if events else NOTHING
