"""What the server side is given: settings, the clock, metrics, and the host runtime's seams.

:class:`ServerContext` is built once per app by the host (:mod:`queueflow.faust_app` for Faust
workers, :mod:`queueflow.testing.inprocess` for unit tests) and passed to the coordinator, the
share-partition leaders and the ticker. They never see the host itself, which is what makes
them unit-testable without Kafka.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from queueflow.clock import SYSTEM_CLOCK, Clock
from queueflow.metrics import Metrics
from queueflow.protocol import topics
from queueflow.server.auth_health import AuthHealth
from queueflow.server.record_cache import BatchSource
from queueflow.settings import ShareGroupSettings
from queueflow.structs import TopicPartition

__all__ = [
    "ControlSender",
    "LogOffsetsSource",
    "PartitionCounts",
    "RequestHandler",
    "RequestLog",
    "ServerContext",
    "ServerRuntime",
    "StateScope",
    "no_flush",
    "no_state_scope",
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

    def lease_remaining_ms(self) -> int | None:
        """How long (ms; ``<= 0``: not now) this worker's group membership is proven to last
        (:class:`~queueflow.engine.fencing.MembershipLease`), or ``None`` for hosts whose
        membership can't lapse. The direct path serves only within it."""
        ...


class LogOffsetsSource(Protocol):
    """Log start and end offsets of source partitions (see :mod:`queueflow.server.log_offsets`)."""

    def known_end(self, tp: TopicPartition) -> int | None:
        """The last known high watermark, or ``None`` (raised by :meth:`log_end` and, for
        long polls, by :meth:`wait_end_beyond` as records arrive)."""
        ...

    async def log_end(self, tp: TopicPartition) -> int:
        """The current high watermark."""
        ...

    def known_stable_end(self, tp: TopicPartition) -> int | None:
        """The last known last stable offset, or ``None`` (raised by :meth:`stable_end`)."""
        ...

    async def stable_end(self, tp: TopicPartition) -> int:
        """The current last stable offset (a ``read_committed`` ListOffsets)."""
        ...

    async def log_start(self, tp: TopicPartition) -> int:
        """The log start offset."""
        ...

    async def wait_end_beyond(self, tp: TopicPartition, offset: int, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` seconds until the high watermark of ``tp`` is above
        ``offset`` (a record at ``offset`` exists); returns the last known high watermark
        either way (the long-poll ShareFetch's wake-up)."""
        ...

    async def offset_for_time(self, tp: TopicPartition, timestamp_ms: int) -> int | None:
        """The first offset of ``tp`` whose record timestamp is at or after ``timestamp_ms``
        (ListOffsets by timestamp), or ``None`` when there is none
        (``share.auto.offset.reset=by_duration:...``)."""
        ...


#: ``state_scope(request_topic, partition)``: a context in which the leader may write the state
#: table of ``partition`` outside a stream event of it (the direct path; see
#: :mod:`queueflow.server.endpoint`). The host provides it; dict-backed tables need none.
StateScope = Callable[[str, int], AbstractContextManager[object]]


def no_state_scope(request_topic: str, partition: int) -> AbstractContextManager[object]:
    """The :data:`StateScope` of hosts whose tables may be written anywhere (dicts)."""
    return contextlib.nullcontext()


async def no_flush() -> None:
    """The ``flush_state`` of hosts whose state writes are durable at once (dicts)."""


class RequestLog(Protocol):
    """Reads requests back from a request topic by offset (see ``ShareLeader.handle``)."""

    async def read(
        self, topic: str, partition: int, start: int, end: int
    ) -> list[tuple[int, bytes]]:
        """The records of ``topic[partition]`` with ``start <= offset < end``, in order, as
        ``(offset, value)`` (offsets deleted by retention are missing).

        Raises:
            Exception: the host's error when the log could not be read.
        """
        ...


class KeyTail(Protocol):
    """Reads the keys of one source partition, in order (see :class:`KeySource`); the offsets
    it passes without a record are the partition's holes (:mod:`queueflow.server.leader.holes`).
    """

    async def read(
        self, start: int, max_records: int, wait_ms: int
    ) -> tuple[list[tuple[int, bytes | None]], int]:
        """``(records, next)``: up to ``max_records`` records ``(offset, key)`` from ``start``
        on, waiting at most ``wait_ms`` for one, and the offset to read from next (>=
        ``start``: offsets below it without a record hold none)."""
        ...

    async def close(self) -> None:
        """Release the reader."""
        ...


class KeySource(Protocol):
    """Opens key readers of source partitions (key-ordered sharing: docs/architecture.md
    "Key-ordered sharing"; holes: docs/architecture.md "Holes")."""

    async def open(self, tp: TopicPartition, *, read_committed: bool = False) -> KeyTail:
        """A reader of ``tp``'s keys (``read_committed``: committed records only, so aborted
        ones are passed like transaction markers). Raises what the client raises when it
        can't start."""
        ...


class PartitionCounts(Protocol):
    """Partition counts of the existing topics among ``names`` (unknown ones are left out)."""

    async def partition_counts(self, names: list[str]) -> dict[str, int]: ...


@dataclass(slots=True)
class ServerContext:
    """Everything the coordinator, the leaders and the ticker of one app share.

    Args:
        app_id: the app id; it names the internal topics.
        settings: the share-group settings.
        sender: produces control messages.
        runtime: the host's consumer-group membership.
        log_offsets: source-partition offsets.
        topic_metadata: partition counts of source topics.
        stall_limit_ms: a stall longer than this (ms) makes leaders step down
            (:mod:`queueflow.engine.fencing`): the host's session timeout plus heartbeat.
        clock: wall and monotonic time.
        metrics: where server metrics go.
        state_scope: lets the direct path write a partition's state outside a stream event.
        flush_state: waits until every state write so far is acknowledged by the broker (the
            direct path's ``queueflow.leader.state.durability=acked``).
        request_log: reads request topics back (``None``: the host re-delivers every request
            a leader did not apply).
        group_configs: the app's per-group defaults of group configs.
        auth_health: the monitor of refused signatures (:mod:`queueflow.server.auth_health`).
    """

    app_id: str
    settings: ShareGroupSettings
    sender: ControlSender
    runtime: ServerRuntime
    log_offsets: LogOffsetsSource
    topic_metadata: PartitionCounts
    stall_limit_ms: int
    clock: Clock = SYSTEM_CLOCK
    metrics: Metrics = field(default_factory=Metrics)
    state_scope: StateScope = no_state_scope
    flush_state: Callable[[], Awaitable[None]] = no_flush
    request_log: RequestLog | None = None
    #: The app's per-group defaults of group configs (``App(group_configs=...)``): group id ->
    #: validated ``share.*`` values (:func:`~queueflow.engine.group_config.validate_group_configs`).
    #: Values set with the admin win over them (:mod:`queueflow.server.group_configs`).
    group_configs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: Whether this worker's key matches its peers' (fed where control messages are opened).
    auth_health: AuthHealth = field(default_factory=AuthHealth)
    #: Reads source partitions' keys for key-ordered share groups (``share.ordering=key``);
    #: ``None``: no key-ordered share-partition acquires anything (its keys can't be learned),
    #: and no hole is learned (acquisition counts offsets: docs/concepts.md).
    key_source: KeySource | None = None
    #: Reads raw record batches for the direct path's answers (``None``: leaders carry no
    #: records; members read them; :mod:`queueflow.server.record_cache`).
    batch_source: BatchSource | None = None
    #: The direct endpoint's TLS server context (``queueflow.leader.listener.ssl.*``,
    #: :func:`queueflow.kafka.tls.leader_ssl_context`); ``None``: the direct path is plaintext.
    direct_ssl: ssl.SSLContext | None = None
    #: Partitions of the coordinator topic, as the host found or created it (Faust hosts set it
    #: before the coordinator serves; it never changes after): a share group's coordinator
    #: partition is ``topics.coordinator_partition(group, coordinator_partitions)``.
    coordinator_partitions: int = 1
    #: Set whenever a leader applies a result or is assigned partitions: the ticker
    #: (:class:`queueflow.server.ticker.LeaderTicker`) sleeps on it while no lock is held.
    state_changed: asyncio.Event = field(default_factory=asyncio.Event)

    def coordinator_partition(self, group: str) -> int:
        """The coordinator partition of share group ``group`` (docs/architecture.md
        "Coordinator sharding")."""
        return topics.coordinator_partition(group, self.coordinator_partitions)
