"""Kafka transactions in memory, for the ``exactly_once`` share agents of an
:class:`~queueflow.testing.inprocess.InProcessCluster` (docs/architecture.md "Exactly-once:
transactional acknowledgements").

:class:`TransactionalProducer` is the in-memory transactional
:class:`~queueflow.member.producer.ResultProducer` the member's
:class:`~queueflow.member.agent.transactions.TransactionalPublisher` runs against, with Kafka's
semantics (KIP-98 "Exactly Once Delivery and Transactional Messaging"): ``begin``; ``send``
buffers result records (a topic or partition the cluster doesn't have fails the send, and the
transaction can then only be aborted); ``commit`` makes every result visible at once in the
cluster's topics (:meth:`~queueflow.testing.inprocess.InProcessCluster.sink_records`), ``abort``
discards them. A newer producer of the same transactional id fences the older one (its open
transaction is aborted), and a transaction open longer than its ``transaction.timeout.ms``
(``queueflow.transaction.timeout.ms``, on the cluster's clock) is aborted by the in-memory
"transaction coordinator", as the brokers do.

:class:`AckTopics` are the ack topics ``<app>-share-ack-<topic>`` of an exactly_once cluster:
a message sent to one inside a transaction is appended to the partition's log at once (as a
broker appends it, below the high watermark but not readable read_committed); the log is read
as a read_committed consumer reads it: in offset order, committed messages handed to the
leader's real :class:`~queueflow.server.leader.acks.AckApplier` (through the cluster's bus, one
partition at a time, in order, as request partitions), aborted ones skipped, and nothing past a
transaction still open (the last stable offset).

:class:`AckLogClock` is the leaders' lock clock (:mod:`~queueflow.server.leader.ack_clock`) on
those logs: with a reader that has no latency, ``ack_safe_ms`` of a partition is "now" when
every message of its log was applied or aborted, else the time the oldest message not yet
applied or aborted was appended. So, as on Kafka, a leader releases no record by time or by
member while an acknowledgement of it may still commit (a crashed member's open transaction
holds releases on its partitions until the transaction timeout), and every committed
acknowledgement is applied before its records can be delivered again.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiokafka.errors import IllegalStateError, ProducerFenced, UnknownTopicOrPartitionError

from queueflow.errors import ConfigurationError
from queueflow.logging import get_logger
from queueflow.member.producer import Headers
from queueflow.protocol import topics as internal
from queueflow.server.context import RequestHandler
from queueflow.server.leader.ack_clock import AckClock
from queueflow.server.leader.acks import AckApplier

if TYPE_CHECKING:
    from queueflow.testing.inprocess import InProcessCluster

__all__ = ["AckLogClock", "AckTopics", "TransactionalProducer"]


#: A buffered result record: topic, value, key, headers, partition (None: by the key).
_Result = tuple[str, bytes | None, bytes | None, tuple[tuple[str, bytes], ...], int | None]


class TxnState(enum.Enum):
    """Where a transaction is."""

    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclass(slots=True)
class Transaction:
    """One transaction of a :class:`TransactionalProducer`.

    Attributes:
        transactional_id: its producer's transactional id.
        began_ms: when it began (cluster clock, ms).
        timeout_ms: ``transaction.timeout.ms``: aborted when open longer.
        state: open, committed or aborted.
        why: why it was aborted by the cluster (a timeout, a newer producer), or "".
        results: the result records buffered (topic, value, key, headers, partition).
        acks: the ack topic partitions it appended to.
    """

    transactional_id: str
    began_ms: int
    timeout_ms: int
    state: TxnState = TxnState.OPEN
    why: str = ""
    results: list[_Result] = field(default_factory=list)
    acks: set[tuple[str, int]] = field(default_factory=set)


@dataclass(slots=True)
class _AckMessage:
    value: bytes
    appended_ms: int
    txn: Transaction
    #: Handed to the leader and applied, or aborted: the reader is past it.
    settled: bool = False


class AckTopics:
    """The ack topics of an exactly_once :class:`InProcessCluster` and their reader (see the
    module docstring).

    Args:
        cluster: the cluster (its source topics give the ack topics and their partitions; its
            bus delivers the committed acknowledgements to the leaders).
    """

    def __init__(self, cluster: InProcessCluster) -> None:
        self.cluster = cluster
        #: Ack topic -> its partition count (the source topic's).
        self.partitions: dict[str, int] = {}
        self._logs: dict[tuple[str, int], list[_AckMessage]] = {}
        self._read: dict[tuple[str, int], int] = {}  # the next message to hand over
        self._settled: dict[tuple[str, int], int] = {}  # every message before it is settled
        self._open: list[Transaction] = []
        #: Transactional id -> its producer's epoch (a newer producer fences older ones).
        self.epochs: dict[str, int] = {}
        self._log = get_logger("queueflow.server.leader")
        for name, count in cluster.topics.items():
            self.add(name, count)

    def add(self, topic: str, count: int) -> None:
        """Create (or grow to ``count`` partitions) the ack topic of source topic ``topic``."""
        ack_topic = internal.ack_topic(self.cluster.app_id, topic)
        for p in range(self.partitions.get(ack_topic, 0), count):
            self._logs[(ack_topic, p)] = []
            self._read[(ack_topic, p)] = self._settled[(ack_topic, p)] = 0
        self.partitions[ack_topic] = count

    def wire(self, topic: str) -> AckLogClock:
        """Make the leader of source topic ``topic`` apply its ack topic (a handler on the bus,
        its real :class:`~queueflow.server.leader.acks.AckApplier`) and use the lock clock of
        its logs; returns that clock."""
        leader = self.cluster.leaders[topic]
        applier = AckApplier(leader)
        self.cluster.bus.handlers[applier.ack_topic] = self._handler(applier)
        clock = AckLogClock(self, applier.ack_topic)
        leader.fetcher.lock_clock = clock
        return clock

    def _handler(self, applier: AckApplier) -> RequestHandler:
        log = self._log.bind(topic=applier.leader.topic)

        async def apply(partition: int, offset: int, value: bytes) -> None:
            try:
                await applier.apply(partition, offset, value)
            except Exception as exc:  # the ack reader logs and reads it again; here: once
                log.warning("ack_apply_failed", partition=partition, error=repr(exc))

        return apply

    # -- transactions ----------------------------------------------------------------------
    def begin(self, transactional_id: str, timeout_ms: int) -> Transaction:
        """A new open transaction."""
        txn = Transaction(transactional_id, self.cluster.clock.now_ms(), timeout_ms)
        self._open.append(txn)
        return txn

    def append(self, txn: Transaction, ack_topic: str, partition: int, value: bytes) -> None:
        """Append ``value`` to the ack topic partition inside ``txn`` (not readable until it
        commits).

        Raises:
            UnknownTopicOrPartitionError: no such ack topic or partition.
        """
        log = self._logs.get((ack_topic, partition))
        if log is None:
            raise UnknownTopicOrPartitionError(f"{ack_topic}[{partition}] (in-process cluster)")
        log.append(_AckMessage(value, self.cluster.clock.now_ms(), txn))
        txn.acks.add((ack_topic, partition))

    def end(self, txn: Transaction, state: TxnState, why: str = "") -> None:
        """Commit or abort ``txn``: its ack messages become readable (handed to the leaders in
        log order) or are skipped."""
        if txn.state is not TxnState.OPEN:
            return
        txn.state, txn.why = state, why
        self._open.remove(txn)
        for key in sorted(txn.acks):
            self._hand_over(key)

    def fence(self, transactional_id: str) -> int:
        """A producer of ``transactional_id`` starts: older ones are fenced, their open
        transaction aborted. Returns the new producer's epoch."""
        for txn in list(self._open):
            if txn.transactional_id == transactional_id:
                self.end(txn, TxnState.ABORTED, "fenced by a newer producer of its id")
        epoch = self.epochs[transactional_id] = self.epochs.get(transactional_id, -1) + 1
        return epoch

    def expire(self, now_ms: int) -> None:
        """Abort the transactions open longer than their timeout (as the brokers' transaction
        coordinator does)."""
        for txn in list(self._open):
            if now_ms - txn.began_ms > txn.timeout_ms:
                self.end(txn, TxnState.ABORTED, f"open longer than {txn.timeout_ms} ms")

    def _hand_over(self, key: tuple[str, int]) -> None:
        """Hand what became readable (read_committed) of one ack partition to its leader."""
        log, at = self._logs[key], self._read[key]
        while at < len(log) and log[at].txn.state is not TxnState.OPEN:
            message = log[at]
            if message.txn.state is TxnState.COMMITTED:
                handled = self.cluster.bus.enqueue(key[0], key[1], message.value, offset=at)
                handled.add_done_callback(_settle(message))
            else:
                message.settled = True
            at += 1
        self._read[key] = at

    # -- the lock clock --------------------------------------------------------------------
    def pending_since_ms(self, ack_topic: str, partition: int) -> int | None:
        """When the oldest message of the ack partition not yet applied or aborted was
        appended; ``None``: there is none."""
        key = (ack_topic, partition)
        log = self._logs.get(key)
        if log is None:
            return None
        at = self._settled[key]
        while at < len(log) and log[at].settled:
            at += 1
        self._settled[key] = at
        return log[at].appended_ms if at < len(log) else None

    def messages(self, ack_topic: str, partition: int) -> list[bytes]:
        """The messages of an ack partition, in log order (committed, aborted and open)."""
        return [m.value for m in self._logs[(ack_topic, partition)]]


def _settle(message: _AckMessage) -> Callable[[asyncio.Future[None]], None]:
    def settle(_: asyncio.Future[None]) -> None:
        message.settled = True

    return settle


class AckLogClock(AckClock):
    """The lock clock of a leader of an exactly_once :class:`InProcessCluster`: ``ack_safe_ms``
    of a partition is "now" when everything of its ack log was applied or aborted, else when
    the oldest message not yet applied or aborted was appended (see the module docstring).
    Transactions open past their timeout are aborted when it is read."""

    def __init__(self, acks: AckTopics, ack_topic: str) -> None:
        super().__init__()
        self.acks = acks
        self.ack_topic = ack_topic

    def safe_ms(self, partition: int) -> int | None:
        """See :meth:`AckClock.safe_ms` (never ``None``: the in-memory reader is caught up)."""
        return self.expiry_ms(partition, self.acks.cluster.clock.now_ms())

    def expiry_ms(self, partition: int, now_ms: int) -> int:
        """See :meth:`AckClock.expiry_ms`."""
        self.acks.expire(now_ms)
        since = self.acks.pending_since_ms(self.ack_topic, partition)
        return now_ms if since is None else min(now_ms, since)

    def lag_ms(self, partition: int, now_ms: int) -> int | None:
        """See :meth:`AckClock.lag_ms`."""
        return max(0, now_ms - self.expiry_ms(partition, now_ms))


class TransactionalProducer:
    """An in-memory transactional :class:`~queueflow.member.producer.ResultProducer` (see the
    module docstring).

    Args:
        cluster: the cluster (refuses to start when it has ``transactions=False`` or is not
            exactly_once).
        transactional_id: the transactional id.
        transaction_timeout_ms: the transaction timeout (ms, the cluster's clock).
    """

    def __init__(
        self, cluster: InProcessCluster, transactional_id: str, transaction_timeout_ms: int
    ) -> None:
        self.cluster = cluster
        self.transactional_id = transactional_id
        self.timeout_ms = transaction_timeout_ms
        self._epoch: int | None = None
        self._txn: Transaction | None = None
        self._error: BaseException | None = None  # a failed send: only abort is allowed

    @property
    def _acks(self) -> AckTopics:
        acks = self.cluster.acks
        if acks is None:
            raise ConfigurationError(
                "the in-process cluster has no ack topics: its settings are not "
                "queueflow.processing.guarantee=exactly_once"
            )
        return acks

    async def start(self) -> None:
        """Fence older producers of the transactional id.

        Raises:
            ConfigurationError: the cluster has no transactions (``transactions=False``, as a
                cluster whose principal lacks the transactional-id ACLs) or no ack topics.
        """
        if not self.cluster.transactions:
            raise ConfigurationError(
                "the in-process cluster has no transactions (transactions=False)"
            )
        self._epoch = self._acks.fence(self.transactional_id)

    def _check_epoch(self) -> None:
        if self._acks.epochs.get(self.transactional_id) != self._epoch:
            raise ProducerFenced(f"{self.transactional_id}: a newer producer of this id started")

    def _open(self) -> Transaction:
        txn = self._txn
        if txn is None:
            raise IllegalStateError(f"{self.transactional_id}: no transaction begun")
        if txn.state is TxnState.ABORTED:  # by the cluster: a timeout, or fenced
            raise ProducerFenced(f"{self.transactional_id}: the transaction was aborted: {txn.why}")
        return txn

    async def begin(self) -> None:
        """Begin a transaction.

        Raises:
            IllegalStateError: one is open already, or the producer was not started.
            ProducerFenced: a newer producer of the transactional id started.
        """
        if self._epoch is None:
            raise IllegalStateError(f"{self.transactional_id}: the producer was not started")
        self._check_epoch()
        if self._txn is not None:
            raise IllegalStateError(f"{self.transactional_id}: a transaction is open already")
        self._txn = self._acks.begin(self.transactional_id, self.timeout_ms)
        self._error = None

    async def check_topic(self, topic: str) -> None:
        """See :meth:`~queueflow.member.producer.ResultProducer.check_topic` (results' topics
        and the ack topics)."""
        if topic not in self.cluster.topics and topic not in self._acks.partitions:
            raise UnknownTopicOrPartitionError(f"{topic} (in-process cluster)")

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: Headers,
        partition: int | None,
    ) -> asyncio.Future[Any]:
        """Buffer one record in the open transaction (an ack topic's: appended to its log, not
        readable until commit); the future is done at once (the "broker" acknowledged it).

        Raises:
            IllegalStateError: no transaction open.
            ProducerFenced: fenced, or the transaction was aborted by its timeout.
            UnknownTopicOrPartitionError: no such topic or partition (the transaction can
                then only be aborted).
        """
        self._check_epoch()
        txn = self._open()
        try:
            if topic in self._acks.partitions:
                if value is None or partition is None:
                    raise ValueError(f"an ack message to {topic} needs a value and a partition")
                self._acks.append(txn, topic, partition, value)
            else:
                count = self.cluster.topics.get(topic)
                if count is None or (partition is not None and not 0 <= partition < count):
                    raise UnknownTopicOrPartitionError(f"{topic}[{partition}] (in-process cluster)")
                txn.results.append((topic, value, key, tuple(headers), partition))
        except Exception as exc:
            self._error = exc
            raise
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    async def commit(self) -> None:
        """Commit: every result appears in the cluster's topics, and the acknowledgements are
        handed to the leaders, at once (after :meth:`InProcessCluster.hold_commits` is
        released, if held).

        Raises:
            IllegalStateError: no transaction open, or a send of it failed (abort it).
            ProducerFenced: fenced, or the transaction was aborted by its timeout meanwhile.
        """
        self._open()
        if self._error is not None:
            raise IllegalStateError(
                f"{self.transactional_id}: a send failed ({self._error!r}); abort the transaction"
            )
        await self.cluster.commit_gate()
        self._check_epoch()
        self._acks.expire(self.cluster.clock.now_ms())
        txn = self._open()  # the cluster may have aborted it meanwhile (its timeout)
        for topic, value, key, headers, partition in txn.results:
            self.cluster.publish(topic, value, key, headers, partition)
        self._acks.end(txn, TxnState.COMMITTED)
        self._txn = None

    async def abort(self) -> None:
        """Abort the open transaction: its results and acknowledgements are discarded
        (nothing to do without one)."""
        txn, self._txn, self._error = self._txn, None, None
        if txn is not None and self.cluster.acks is not None:
            self.cluster.acks.end(txn, TxnState.ABORTED, "aborted by the producer")

    async def close(self) -> None:
        """Abort an open transaction (as a closing Kafka producer's is, once it times out)."""
        await self.abort()
