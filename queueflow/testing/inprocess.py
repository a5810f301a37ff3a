"""An in-process share-group cluster: coordinator, leaders and members wired in memory.

The real :class:`~queueflow.server.coordinator.ShareGroupCoordinator`,
:class:`~queueflow.server.leader.ShareLeader`, :class:`~queueflow.member.session.ShareFetchSession`,
:class:`~queueflow.ShareConsumer` and :class:`~queueflow.ShareAgent` run against in-memory topics
and tables instead of Kafka and Faust, so their behaviour can be unit-tested in milliseconds::

    cluster = InProcessCluster(topics={"jobs": 2}, clock=FakeClock())
    cluster.produce("jobs", b"hello", partition=0)
    async with cluster:
        consumer = cluster.consumer("workers")
        await consumer.subscribe(["jobs"])
        records = await consumer.poll(timeout_ms=1000)

Requests go through the real wire encoding and reach the leaders one request partition at a
time, in order, as a Faust agent would deliver them; every leader and the coordinator are live
from :meth:`InProcessCluster.start`. Time is the injected clock: with a
:class:`~queueflow.testing.FakeClock`, locks and sessions expire only when the test advances it
and calls :meth:`InProcessCluster.tick`.

With ``direct=True`` the leaders also serve their direct endpoint (a real TCP server on
``queueflow.leader.listener``, e.g. ``127.0.0.1:0``) and announce it, so members fetch over the
direct path (long polls included) as they do against Faust workers.

With ``queueflow.processing.guarantee=exactly_once`` in its settings the cluster has the ack
topics and Kafka transactions in memory (:mod:`queueflow.testing.transactions`): an
``exactly_once`` share agent commits its results and acknowledgements through the real
:class:`~queueflow.member.agent.transactions.TransactionalPublisher`, and the leaders apply the
committed acknowledgements with their real
:class:`~queueflow.server.leader.acks.AckApplier`, releasing records by time or by member only
as of their lock clock (``release_by_lock_end``).
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import UnknownTopicOrPartitionError

from queueflow.admin import ShareGroupAdmin
from queueflow.clock import SYSTEM_CLOCK, Clock
from queueflow.engine.group_config import validate_group_configs
from queueflow.errors import ConfigurationError, ErrorCode, ShareGroupError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.member.agent import Handler, ShareAgent
from queueflow.member.browse import LogRecord
from queueflow.member.consumer import ShareConsumer
from queueflow.member.context import MemberContext
from queueflow.member.producer import Headers
from queueflow.member.reader import ReadResult, Undecodable
from queueflow.member.transport import ReplyHandler
from queueflow.metrics import Metrics
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics as internal
from queueflow.protocol.auth import issue_ticket
from queueflow.server.context import RequestHandler, ServerContext
from queueflow.server.coordinator import ShareGroupCoordinator
from queueflow.server.endpoint import LeaderEndpoint
from queueflow.server.leader import ShareLeader
from queueflow.server.ticker import LeaderTicker
from queueflow.settings import AutoOffsetReset, ProcessingGuarantee, ShareGroupSettings
from queueflow.structs import ShareRecord, TopicPartition
from queueflow.testing.batches import InProcessBatches
from queueflow.testing.transactions import AckTopics, TransactionalProducer

__all__ = ["InProcessCluster", "StoredRecord"]


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A record of an in-memory source partition (``value`` None marks an offset without a
    record, such as a transaction marker)."""

    key: bytes | None
    value: bytes | None
    timestamp: int
    #: A name given as ``bytes`` stands for a header name that is not UTF-8 (undecodable).
    headers: tuple[tuple[str | bytes, bytes], ...] = ()


class _Bus:
    """In-memory control topics: request partitions feed their handler one record at a time, in
    order; the reply topic feeds members by key. A :class:`ControlSender`."""

    def __init__(self, reply_topic: str) -> None:
        self.reply_topic = reply_topic
        self.handlers: dict[str, RequestHandler] = {}
        self.members: dict[bytes, ReplyHandler] = {}
        self.sent: list[tuple[str, int, bytes]] = []
        self._logs: dict[
            tuple[str, int], asyncio.Queue[tuple[int, bytes, asyncio.Future[None]]]
        ] = {}
        self._next: dict[tuple[str, int], int] = {}
        self._pumps: list[asyncio.Task[None]] = []
        self._outstanding = 0  # requests sent and not yet handled
        self._idle = asyncio.Event()
        self._idle.set()

    async def send(
        self, topic: str, partition: int, value: bytes, key: bytes | None = None
    ) -> None:
        if topic == self.reply_topic:
            handler = self.members.get(key or b"")
            if handler is not None:
                asyncio.get_running_loop().call_soon(handler, value)
            return
        self.enqueue(topic, partition, value)

    def enqueue(
        self, topic: str, partition: int, value: bytes, offset: int | None = None
    ) -> asyncio.Future[None]:
        """Queue ``value`` for the handler of ``topic`` (handled in order per partition, after
        what was queued before); the future is done once it was handled.

        Args:
            offset: the record's offset (``None``: the next of the partition's sequence); the
                ack topics of an exactly_once cluster pass their log's offsets.

        Raises:
            ShareGroupError: no handler for ``topic``.
        """
        if topic not in self.handlers:
            raise ShareGroupError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no in-process handler for {topic!r}"
            )
        self.sent.append((topic, partition, value))
        key_tp = (topic, partition)
        queue = self._logs.get(key_tp)
        if queue is None:
            queue = self._logs[key_tp] = asyncio.Queue()
            self._pumps.append(asyncio.ensure_future(self._pump(topic, partition, queue)))
        if offset is None:
            offset = self._next.get(key_tp, 0)
        self._next[key_tp] = offset + 1
        self._outstanding += 1
        self._idle.clear()
        handled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.put_nowait((offset, value, handled))
        return handled

    async def _pump(
        self,
        topic: str,
        partition: int,
        queue: asyncio.Queue[tuple[int, bytes, asyncio.Future[None]]],
    ) -> None:
        handler = self.handlers[topic]
        while True:
            offset, value, handled = await queue.get()
            try:
                await handler(partition, offset, value)
            finally:
                if not handled.done():
                    handled.set_result(None)
                self._outstanding -= 1
                if not self._outstanding:
                    self._idle.set()

    async def drain(self) -> None:
        """Wait until every request sent so far, and every request their handling sent in turn
        (a coordinator's ReleaseMember after a Tick), has been handled."""
        await self._idle.wait()

    async def close(self) -> None:
        for task in self._pumps:
            task.cancel()
        for task in self._pumps:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._pumps.clear()


class _Transport:
    """A member's :class:`~queueflow.member.transport.MemberTransport` on the bus."""

    reply_partition = 0

    def __init__(self, bus: _Bus, member_id: str, reply_route: str | None = None) -> None:
        self.bus = bus
        self.key = member_id.encode()
        self.reply_keys = [self.key] + ([reply_route.encode()] if reply_route else [])

    async def start(self, on_reply: ReplyHandler) -> None:
        for key in self.reply_keys:
            self.bus.members[key] = on_reply

    async def send(self, topic: str, partition: int, payload: bytes) -> None:
        await self.bus.send(topic, partition, payload, self.key)

    async def close(self) -> None:
        for key in self.reply_keys:
            self.bus.members.pop(key, None)


class _RecordSource:
    """A member's :class:`~queueflow.member.reader.RecordSource` on the in-memory partitions."""

    def __init__(self, cluster: InProcessCluster) -> None:
        self.cluster = cluster

    def prepare(self, tp: TopicPartition) -> None:
        pass  # the log is in memory

    async def read(
        self,
        tp: TopicPartition,
        acquired: list[protocol.WireAcquired],
        timeout_ms: int,
        read_committed: bool = False,
    ) -> ReadResult:
        log = self.cluster.records[TopicPartition(*tp)]
        aborted = self.cluster.aborted if read_committed else set()
        records: list[ShareRecord] = []
        gaps: list[int] = []
        undecodable: list[Undecodable] = []
        for first, last, count in acquired:
            for offset in range(first, last + 1):
                stored = log[offset]
                if stored.value is None or (TopicPartition(*tp), offset) in aborted:
                    gaps.append(offset)
                    continue
                # A header name given as bytes stands for one Kafka can't decode as UTF-8.
                lossy = [
                    (n.decode("utf-8", "replace") if isinstance(n, bytes) else n, v)
                    for n, v in stored.headers
                ]
                record = ShareRecord(
                    tp.topic,
                    tp.partition,
                    offset,
                    stored.key,
                    stored.value,
                    lossy,
                    stored.timestamp,
                    count,
                    stored.value,
                    stored.key,
                )
                if any(isinstance(n, bytes) for n, _ in stored.headers):
                    undecodable.append((record, "a header name is not UTF-8"))
                else:
                    records.append(record)
        return records, gaps, undecodable

    def remember_released(self, record: ShareRecord) -> None:
        pass

    async def drop(self, tp: TopicPartition) -> None:
        pass

    async def close(self) -> None:
        pass


class _BrowseSource:
    """What a browse reads (:class:`~queueflow.member.browse.BrowseSource`) in the in-memory
    cluster: its tables as changelogs, its partitions as topics."""

    def __init__(self, cluster: InProcessCluster) -> None:
        self.cluster = cluster

    async def table(self, topic: str) -> Mapping[bytes, bytes] | None:
        cluster = self.cluster
        if topic == internal.groups_changelog(cluster.app_id):
            return dict(cluster.tables["groups"])
        for name in cluster.topics:
            if topic == internal.state_changelog(cluster.app_id, name):
                return dict(cluster.tables[name])
        return None

    async def partition_count(self, topic: str) -> int | None:
        return self.cluster.topics.get(topic)

    async def read(
        self, tp: TopicPartition, from_offset: int | None, max_records: int, read_committed: bool
    ) -> tuple[list[LogRecord], int]:
        log = self.cluster.records[TopicPartition(*tp)]
        end = self.cluster.stable_end_now(tp) if read_committed else len(log)
        first = min(from_offset or 0, end)
        out: list[LogRecord] = []
        for offset in range(first, end):
            stored = log[offset]
            if stored.value is None or (read_committed and (tp, offset) in self.cluster.aborted):
                continue
            headers = tuple((str(n), v) for n, v in stored.headers)
            out.append(LogRecord(offset, stored.key, stored.value, headers, stored.timestamp))
            if len(out) == max_records:
                break
        return out, first


class _Producer:
    """A share agent's :class:`~queueflow.member.producer.ResultProducer` on the in-memory
    topics: results are appended to the cluster's partitions at once (so share agents
    subscribed to a sink topic get them) and listed by :meth:`InProcessCluster.sink_records`;
    a topic the cluster doesn't have fails as on Kafka (unknown topic). Not transactional
    (an ``exactly_once`` agent's is a
    :class:`~queueflow.testing.transactions.TransactionalProducer`)."""

    def __init__(self, cluster: InProcessCluster) -> None:
        self.cluster = cluster

    async def start(self) -> None:
        pass

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers,
        partition: int | None,
    ) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(self.cluster.publish(topic, value, key, tuple(headers), partition))
        return fut

    async def check_topic(self, topic: str) -> None:
        if topic not in self.cluster.topics:
            raise UnknownTopicOrPartitionError(f"{topic} (in-process cluster)")

    async def begin(self) -> None:
        raise ConfigurationError("not a transactional producer")

    async def commit(self) -> None:
        raise ConfigurationError("not a transactional producer")

    async def abort(self) -> None:
        pass

    async def close(self) -> None:
        pass


class _MemberIO:
    def __init__(self, cluster: InProcessCluster) -> None:
        self.cluster = cluster
        #: The principal members claim (tests set it; a real cluster's comes from SASL).
        self.principal = ""

    async def partition_counts(self, topics: list[str]) -> dict[str, int]:
        counts = self.cluster.topics
        for name in topics:
            if name not in counts:
                raise ConfigurationError(f"unknown topic {name!r} (in-process cluster)")
        return {name: counts[name] for name in topics}

    async def prepare(self, settings: ShareGroupSettings, topics: list[str]) -> dict[str, int]:
        return await self.partition_counts(topics)

    async def coordinator_partitions(self) -> int:
        return self.cluster.server.coordinator_partitions

    def transport(
        self, member_id: str, client_id: str, reply_route: str | None = None
    ) -> _Transport:
        return _Transport(self.cluster.bus, member_id, reply_route)

    def record_source(self) -> _RecordSource:
        return _RecordSource(self.cluster)

    def browse_source(self) -> _BrowseSource:
        return _BrowseSource(self.cluster)

    def result_producer(
        self,
        client_id: str,
        transactional_id: str | None = None,
        transaction_timeout_ms: int = 60_000,
    ) -> _Producer | TransactionalProducer:
        if transactional_id is not None:
            return TransactionalProducer(self.cluster, transactional_id, transaction_timeout_ms)
        return _Producer(self.cluster)


class _Runtime:
    """The host runtime of a cluster whose one worker owns every partition, generation 1."""

    def __init__(self, cluster: InProcessCluster) -> None:
        self.cluster = cluster
        self.generation = 1
        self.rebalancing = False
        self.streams_active = True
        #: what :meth:`lease_remaining_ms` answers (ms; tests set it to end the lease)
        self.lease_ms: int | None = None

    def assigned(self) -> set[TopicPartition]:
        app_id = self.cluster.app_id
        coordinator = internal.coordinator_topic(app_id)
        count = self.cluster.server.coordinator_partitions
        owned = {TopicPartition(coordinator, p) for p in range(count)}
        for name, count in self.cluster.topics.items():
            request_topic = internal.request_topic(app_id, name)
            owned.update(TopicPartition(request_topic, p) for p in range(count))
        return owned

    def lease_remaining_ms(self) -> int | None:
        """The one in-memory worker's membership can't lapse, unless a test sets one."""
        return self.lease_ms


class _KeyTail:
    """Reads an in-memory source partition's keys (a :class:`~queueflow.server.context.KeyTail`;
    a record without a value is an offset without a record, and so is an aborted one with
    ``read_committed``, which reads up to the last stable offset)."""

    def __init__(
        self, cluster: InProcessCluster, tp: TopicPartition, read_committed: bool = False
    ) -> None:
        self.cluster = cluster
        self.tp = tp
        self.read_committed = read_committed

    async def read(
        self, start: int, max_records: int, wait_ms: int
    ) -> tuple[list[tuple[int, bytes | None]], int]:
        cluster, tp = self.cluster, self.tp
        log = cluster.records[tp]
        if len(log) <= start:
            await cluster.wait_end_beyond(tp, start, wait_ms / 1000)
        top = cluster.stable_end_now(tp) if self.read_committed else len(log)
        if top <= start:  # an open transaction: wait as a consumer's fetch would
            await asyncio.sleep(wait_ms / 1000)
        aborted = cluster.aborted if self.read_committed else set()
        end = min(top, start + max(max_records, 1))
        out = [
            (o, log[o].key)
            for o in range(start, end)
            if log[o].value is not None and (tp, o) not in aborted
        ]
        return out, max(end, start)

    async def close(self) -> None:
        pass


class _KeySource:
    def __init__(self, cluster: InProcessCluster) -> None:
        self.cluster = cluster

    async def open(self, tp: TopicPartition, *, read_committed: bool = False) -> _KeyTail:
        return _KeyTail(self.cluster, TopicPartition(*tp), read_committed)


class InProcessCluster:
    """One app's share groups in memory: a coordinator and a leader per source topic, with
    in-memory source partitions, state tables and control topics.

    Args:
        topics: source topics and their partition counts, ``{"jobs": 2}``.
        app_id: the app id.
        settings: share-group settings (default: ``auto_offset_reset="earliest"``, a short
            heartbeat interval and request timeout for tests).
        clock: the clock (a :class:`~queueflow.testing.FakeClock` makes locks and sessions
            expire only when the test says).
        group_configs: the app's per-group configs (as ``App(group_configs=...)``).
        transactions: ``False``: transactional producers refuse to start (as on a cluster
            whose principal lacks the transactional-id ACLs), so an ``exactly_once`` agent is
            refused at start. With ``queueflow.processing.guarantee=exactly_once`` in
            ``settings`` the cluster has the ack topics and transactions in memory (see the
            module docstring); otherwise a transactional producer refuses to start.
        coordinator_partitions: partitions of the coordinator topic (its one coordinator owns
            them all; each group is served on its own, as in a sharded app: docs/architecture.md
            "Coordinator sharding"). 1 by default, as an app made before sharding, so that
            tests may address the coordinator at partition 0.
    """

    def __init__(
        self,
        topics: Mapping[str, int],
        *,
        app_id: str = "inprocess",
        settings: ShareGroupSettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
        direct: bool = False,
        group_configs: Mapping[str, Mapping[str, Any]] | None = None,
        transactions: bool = True,
        coordinator_partitions: int = 1,
    ) -> None:
        if coordinator_partitions < 1:
            raise ValueError(f"coordinator_partitions={coordinator_partitions}; must be >= 1")
        self.topics = dict(topics)
        self.transactions = transactions
        self.direct = direct
        self.app_id = app_id
        self.settings = settings or ShareGroupSettings(
            auto_offset_reset=AutoOffsetReset.EARLIEST,
            heartbeat_interval_ms=200,
            session_timeout_ms=10_000,
            request_timeout_ms=2_000,
        )
        self.clock = clock
        self.metrics = Metrics()
        self.records: dict[TopicPartition, list[StoredRecord]] = {
            TopicPartition(t, p): [] for t, n in self.topics.items() for p in range(n)
        }
        self.bus = _Bus(internal.reply_topic(app_id))
        self.server = ServerContext(
            app_id=app_id,
            settings=self.settings,
            sender=self.bus,
            runtime=_Runtime(self),
            log_offsets=self,
            topic_metadata=self,
            stall_limit_ms=60_000,
            clock=clock,
            metrics=self.metrics,
            group_configs={
                g: validate_group_configs(v, self.settings)
                for g, v in (group_configs or {}).items()
            },
            key_source=_KeySource(self),
            # One worker owns every coordinator partition; groups still hash to theirs.
            coordinator_partitions=coordinator_partitions,
        )
        #: The state tables, by source topic (and ``"groups"`` for the coordinator's).
        self.tables: dict[str, dict[bytes, bytes]] = {"groups": {}}
        self.coordinator = ShareGroupCoordinator(self.server, self.tables["groups"])
        self.bus.handlers[internal.coordinator_topic(app_id)] = self.coordinator.handle
        self.leaders: dict[str, ShareLeader] = {}
        for name in self.topics:
            table = self.tables[name] = {}
            leader = self.leaders[name] = ShareLeader(self.server, name, table)
            self.bus.handlers[internal.request_topic(app_id, name)] = leader.handle
        #: The ack topics and transactions of an exactly_once cluster (else ``None``).
        self.acks: AckTopics | None = None
        if self.settings.processing_guarantee is ProcessingGuarantee.EXACTLY_ONCE:
            self.acks = AckTopics(self)
            for name in self.topics:
                self.acks.wire(name)
        self._commit_gate: asyncio.Event | None = None
        self._commits_held = 0
        self.ticker = LeaderTicker(self.server, self.leaders)
        self.member_context = MemberContext(
            app_id, self.settings, _MemberIO(self), clock=clock, metrics=self.metrics
        )
        self._agents: list[ShareAgent] = []
        #: The leaders' direct endpoint (with ``direct=True``), listening once started.
        self.endpoint: LeaderEndpoint | None = None
        self._end_waiters: list[asyncio.Future[None]] = []
        #: Per partition, the first offset of a transaction a test holds open there: the last
        #: stable offset (read_committed groups acquire nothing from it on).
        self.open_transactions: dict[TopicPartition, int] = {}
        #: Offsets of aborted transactional records: a read_committed read reports them as
        #: gaps, as Kafka's read_committed fetch leaves them out.
        self.aborted: set[tuple[TopicPartition, int]] = set()
        #: The leaders' record batches (direct-path answers carry them).
        self.batches = InProcessBatches(self.records, self.stable_end_now, self.aborted)
        self.server.batch_source = self.batches
        #: What share agents published, by topic, in order (:meth:`sink_records`).
        self.published: dict[str, list[StoredRecord]] = {}

    # -- source topics ---------------------------------------------------------------------
    def produce(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int = 0,
        headers: tuple[tuple[str | bytes, bytes], ...] = (),
    ) -> int:
        """Append a record (``value`` None: an offset without a record); returns its offset."""
        log = self.records[TopicPartition(topic, partition)]
        log.append(StoredRecord(key, value, self.clock.now_ms(), headers))
        for waiter in self._end_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._end_waiters = []
        return len(log) - 1

    def publish(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: tuple[tuple[str, bytes], ...] = (),
        partition: int | None = None,
    ) -> int:
        """Append a share agent's result to ``topic`` (``partition`` None: by the key's CRC-32,
        partition 0 without a key) and list it in :meth:`sink_records`; returns its offset.

        Raises:
            UnknownTopicOrPartitionError: the cluster has no such topic or partition (as Kafka).
        """
        count = self.topics.get(topic)
        if count is None or (partition is not None and not 0 <= partition < count):
            raise UnknownTopicOrPartitionError(f"{topic}[{partition}] (in-process cluster)")
        if partition is None:
            partition = 0 if key is None else zlib.crc32(key) % count
        stored = StoredRecord(key, value, self.clock.now_ms(), headers)
        self.published.setdefault(topic, []).append(stored)
        if value is None:  # a tombstone: kept in the list, not as a record to share
            return -1
        return self.produce(topic, value, key=key, partition=partition, headers=headers)

    # -- transactions (exactly_once) -------------------------------------------------------
    def hold_commits(self) -> None:
        """Make transaction commits wait (their transactions stay open) until
        :meth:`release_commits`: for tests of what happens while a transaction is open (a
        member crashing, time passing its ``transaction.timeout.ms``)."""
        if self._commit_gate is None:
            self._commit_gate = asyncio.Event()
        self._commit_gate.clear()

    def release_commits(self) -> None:
        """Let the commits held by :meth:`hold_commits` (and later ones) proceed."""
        if self._commit_gate is not None:
            self._commit_gate.set()

    @property
    def commits_held(self) -> int:
        """How many transaction commits wait for :meth:`release_commits` now."""
        return self._commits_held

    async def commit_gate(self) -> None:
        """Wait while commits are held (:meth:`hold_commits`); a transactional producer's
        commit passes it first."""
        gate = self._commit_gate
        if gate is None or gate.is_set():
            return
        self._commits_held += 1
        try:
            await gate.wait()
        finally:
            self._commits_held -= 1

    def sink_records(self, topic: str) -> list[StoredRecord]:
        """The records share agents published to ``topic`` (results, dead letters), in the
        order they were published (a copy)."""
        return list(self.published.get(topic, []))

    # LogOffsetsSource
    def known_end(self, tp: TopicPartition) -> int | None:
        return len(self.records[TopicPartition(*tp)])

    async def log_end(self, tp: TopicPartition) -> int:
        return len(self.records[TopicPartition(*tp)])

    def known_stable_end(self, tp: TopicPartition) -> int | None:
        return self.stable_end_now(tp)

    async def stable_end(self, tp: TopicPartition) -> int:
        return self.stable_end_now(tp)

    def stable_end_now(self, tp: TopicPartition) -> int:
        """The last stable offset of ``tp``: the log end, or below it while a test holds a
        transaction open there (:attr:`open_transactions`: partition -> first offset)."""
        end = len(self.records[TopicPartition(*tp)])
        return min(end, self.open_transactions.get(TopicPartition(*tp), end))

    async def log_start(self, tp: TopicPartition) -> int:
        return 0

    async def wait_end_beyond(self, tp: TopicPartition, offset: int, timeout_s: float) -> int:
        log = self.records[TopicPartition(*tp)]
        deadline = asyncio.get_running_loop().time() + timeout_s
        while len(log) <= offset:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._end_waiters.append(waiter)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, remaining)
        return len(log)

    async def offset_for_time(self, tp: TopicPartition, timestamp_ms: int) -> int | None:
        log = self.records[TopicPartition(*tp)]
        return next((i for i, r in enumerate(log) if r.timestamp >= timestamp_ms), None)

    # PartitionCounts
    async def partition_counts(self, names: list[str]) -> dict[str, int]:
        return {n: self.topics[n] for n in names if n in self.topics}

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Make every leader and the coordinator live: assign them all partitions and let them
        read their own fences."""
        generation = self.server.runtime.generation
        self.coordinator.assign(set(range(self.server.coordinator_partitions)), generation)
        await self.coordinator.send_fences()
        for name, leader in self.leaders.items():
            leader.assign(set(range(self.topics[name])), generation)
            await leader.send_fences()
        await self.bus.drain()
        for leader in self.leaders.values():
            for p in range(self.topics[leader.topic]):
                if not leader.fencing.is_live(p):
                    raise RuntimeError(f"in-process leader of {leader.topic}[{p}] is not live")
        if self.direct:
            self.endpoint = LeaderEndpoint(self.server, self.leaders)
            await self.endpoint.start()
            await self.endpoint.announce()
            await self.bus.drain()

    async def add_partitions(self, topic: str, count: int) -> None:
        """Grow source topic ``topic`` to ``count`` partitions at runtime (as
        ``kafka-topics.sh --alter --partitions``), with its request topic: the topic's leader
        leads the new partitions and goes live on them (what a Faust rebalance over the grown
        internal topics does). Members notice on their next heartbeat.

        Raises:
            ValueError: ``count`` is not above the current partition count.
        """
        old = self.topics[topic]
        if count <= old:
            raise ValueError(f"topic {topic!r} has {old} partitions; {count} would not grow it")
        for p in range(old, count):
            self.records[TopicPartition(topic, p)] = []
        self.topics[topic] = count
        if self.acks is not None:
            self.acks.add(topic, count)
        leader = self.leaders[topic]
        leader.assign(set(range(old, count)), self.server.runtime.generation)
        await leader.send_fences()
        await self.bus.drain()

    async def tick(self) -> None:
        """One tick of the ticker (expire locks and sessions at the clock's time), handled."""
        await self.ticker.tick()
        await self.bus.drain()

    async def close(self) -> None:
        """Stop the agents started with :meth:`agent` (commits held by :meth:`hold_commits`
        are released first) and the bus."""
        self.release_commits()
        for agent in self._agents:
            await agent.stop()
        if self.endpoint is not None:
            await self.endpoint.close()
        for leader in self.leaders.values():
            await leader.keys.close()
            if leader.fetcher.holes is not None:
                await leader.fetcher.holes.close()
        await self.bus.close()

    async def __aenter__(self) -> InProcessCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- members ---------------------------------------------------------------------------
    def consumer(self, group: str, **kwargs: Any) -> ShareConsumer:
        """A :class:`~queueflow.ShareConsumer` of ``group`` in this cluster (not subscribed)."""
        return ShareConsumer(group, app_id=self.app_id, context=self.member_context, **kwargs)

    async def agent(self, handler: Handler, topic: str, group: str, **kwargs: Any) -> ShareAgent:
        """Start a :class:`~queueflow.ShareAgent` running ``handler`` (stopped by
        :meth:`close`, or stop it yourself)."""
        agent = ShareAgent(self.member_context, handler, topic, group, **kwargs)
        await agent.start()
        self._agents.append(agent)
        return agent

    def ticket(
        self,
        group: str,
        member_id: str,
        partitions: Iterable[tuple[str, int]] | None = None,
        *,
        member_epoch: int = 1,
        ttl_ms: int | None = None,
        reply_key: bytes = b"",
    ) -> bytes:
        """An assignment ticket as this cluster's coordinator would issue it, for tests that
        speak the wire protocol by hand (attach it as ``ShareFetchRequest.ticket``).

        Args:
            partitions: the ``(topic, partition)`` pairs it assigns (default: every partition
                of every topic).
            member_epoch: the member epoch it proves.
            ttl_ms: its lifetime in ms (default ``session_timeout_ms``) from the clock's now.
            reply_key: the member key it binds (``queueflow.auth.mode=hmac``: the key of the
                member envelopes its requests come in, ``ControlAuth.reply_key.public``).
        """
        if partitions is None:
            partitions = [(t, p) for t, n in self.topics.items() for p in range(n)]
        return issue_ticket(
            self.coordinator.ticket_key,
            group=group,
            member_id=member_id,
            member_epoch=member_epoch,
            partitions=partitions,
            ttl_ms=self.settings.session_timeout_ms if ttl_ms is None else ttl_ms,
            now_ms=self.clock.now_ms(),
            coordinator_epoch=self.coordinator.epoch(group),
            reply_key=reply_key,
        )

    def share_partition(self, group: str, topic: str, partition: int) -> Any:
        """The leader's engine (:class:`~queueflow.engine.partition.SharePartition`) of a
        share-partition, or None before its first request."""
        durable = self.leaders[topic].partitions.get((group, partition))
        return None if durable is None else durable.engine

    # -- admin -----------------------------------------------------------------------------
    def admin(self, timeout_ms: int = 5000) -> ShareGroupAdmin:
        """A :class:`~queueflow.admin.ShareGroupAdmin` of this cluster: its write requests go
        to the coordinator on the bus, its reads of the changelogs read the in-memory tables,
        and its offset lookups the in-memory partitions."""
        return _InProcessAdmin(
            self,
            self.app_id,
            KafkaClientConfig("in-process:0"),
            timeout_ms,
            settings=self.settings,
            transport=lambda admin_id: _Transport(self.bus, admin_id),
            offsets=_Offsets(self),
            clock=self.clock,
            coordinator_partitions=self.server.coordinator_partitions,
        )


class _InProcessAdmin(ShareGroupAdmin):
    """:class:`~queueflow.admin.ShareGroupAdmin` reading the in-memory tables as changelogs."""

    def __init__(self, cluster: InProcessCluster, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cluster = cluster

    async def _read(self, topic: str, required: bool, home: bool = False) -> dict[bytes, bytes]:
        cluster = self.cluster
        if topic == internal.groups_changelog(cluster.app_id):
            return dict(cluster.tables["groups"])
        for name in cluster.topics:
            if topic == internal.state_changelog(cluster.app_id, name):
                return dict(cluster.tables[name])
        if required:
            raise ConfigurationError(f"no changelog {topic!r} in the in-process cluster")
        return {}

    async def _log_ends(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: len(self.cluster.records[TopicPartition(*tp)]) for tp in tps}

    async def _existing(self, names: list[str]) -> dict[str, int]:
        cluster = self.cluster
        counts = dict(cluster.topics)
        counts[internal.coordinator_topic(cluster.app_id)] = cluster.server.coordinator_partitions
        return {n: counts[n] for n in names if n in counts}


class _Offsets:
    """The in-memory partitions' offsets (:class:`~queueflow.admin.OffsetLookup`)."""

    def __init__(self, cluster: InProcessCluster) -> None:
        self.cluster = cluster

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: 0 for tp in tps}

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: len(self.cluster.records[TopicPartition(*tp)]) for tp in tps}

    async def offsets_for_times(
        self, tps: list[TopicPartition], timestamp_ms: int
    ) -> dict[TopicPartition, int | None]:
        out: dict[TopicPartition, int | None] = {}
        for tp in tps:
            log = self.cluster.records[TopicPartition(*tp)]
            out[tp] = next((i for i, r in enumerate(log) if r.timestamp >= timestamp_ms), None)
        return out
