"""What the server side is given: settings, the clock, metrics, and the host runtime's seams.

:class:`ServerContext` is built once per app by the host (:mod:`queueflow.faust_app` for Faust
workers, :mod:`queueflow.testing.inprocess` for unit tests) and passed to the coordinator, the
share-partition leaders and the ticker. They never see the host itself, which is what makes
them unit-testable without Kafka.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from queueflow.clock import SYSTEM_CLOCK, Clock
from queueflow.metrics import Metrics
from queueflow.settings import ShareGroupSettings
from queueflow.structs import TopicPartition

__all__ = [
    "ControlSender",
    "LogOffsetsSource",
    "PartitionCounts",
    "RequestHandler",
    "ServerContext",
    "ServerRuntime",
]


#: How the host hands a leader or the coordinator one record of its request topic, in log order:
#: ``await handle(partition, offset, value)`` (``ShareLeader.handle``,
#: ``ShareGroupCoordinator.handle``).
RequestHandler = Callable[[int, int, bytes], Awaitable[None]]


class ControlSender(Protocol):
    """Appends control messages (replies, fences, ticks, releases) to internal topics."""

    async def send(
        self, topic: str, partition: int, value: bytes, key: bytes | None = None
    ) -> None:
        """Produce ``value`` to ``topic[partition]``.

        Raises:
            Exception: the client's error when the record could not be produced.
        """
        ...


class ServerRuntime(Protocol):
    """What the host runtime knows about this worker's membership of the leaders' group."""

    @property
    def generation(self) -> int:
        """The current consumer-group generation (the leader epoch of new assignments)."""
        ...

    @property
    def rebalancing(self) -> bool:
        """True while the host's consumer group rebalances."""
        ...

    @property
    def streams_active(self) -> bool:
        """True when the host delivers request records (not rebalancing, flow active): a
        record produced now will be read back, so a fence sent now is seen."""
        ...

    def assigned(self) -> set[TopicPartition]:
        """The request and coordinator partitions this worker owns."""
        ...


class LogOffsetsSource(Protocol):
    """Log start and end offsets of source partitions (see :mod:`queueflow.server.log_offsets`)."""

    def cached_end(self, tp: TopicPartition) -> int | None:
        """The last known high watermark, or ``None``; keeps it refreshed for a while."""
        ...

    async def log_end(self, tp: TopicPartition) -> int:
        """The current high watermark."""
        ...

    async def log_start(self, tp: TopicPartition) -> int:
        """The log start offset."""
        ...


class PartitionCounts(Protocol):
    """Partition counts of the existing topics among ``names`` (unknown ones are left out)."""

    async def partition_counts(self, names: list[str]) -> dict[str, int]: ...


@dataclass(slots=True)
class ServerContext:
    """Everything the coordinator, the leaders and the ticker of one app share.

    Args:
        namespace: the app id; it names the internal topics.
        settings: the share-group settings.
        sender: produces control messages.
        runtime: the host's consumer-group membership.
        log_offsets: source-partition offsets.
        topic_metadata: partition counts of source topics.
        stall_limit_ms: a stall longer than this (ms) makes leaders step down
            (:mod:`queueflow.engine.fencing`): the host's session timeout plus heartbeat.
        clock: wall and monotonic time.
        metrics: where server metrics go.
    """

    namespace: str
    settings: ShareGroupSettings
    sender: ControlSender
    runtime: ServerRuntime
    log_offsets: LogOffsetsSource
    topic_metadata: PartitionCounts
    stall_limit_ms: int
    clock: Clock = SYSTEM_CLOCK
    metrics: Metrics = field(default_factory=Metrics)
