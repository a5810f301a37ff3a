"""Reading acquired records by offset from the source topic.

On the direct path a leader's ShareFetch answer carries the acquired records' batches
(:func:`carried_records` parses them); otherwise (the request topics, or offsets the answer
did not carry) an answer holds offset ranges and delivery counts only, and the member reads
those offsets from Kafka through Kafka's own fetch path (:class:`KafkaRecordReader`).
Offsets in a range that hold no record (transaction markers, compacted-away records; aborted
records too for a ``read_committed`` group) are reported as gaps, which the member
acknowledges as ``GAP``.
Records aiokafka can't decode (a header name that is not UTF-8) are reported apart, as
*undecodable*, with their header names decoded with U+FFFD replacement characters; a
ShareConsumer or share agent REJECTs them (docs/guide.md "Handler outcomes").
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

import aiokafka.consumer.fetcher as aiokafka_fetcher
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.errors import CorruptRecordException
from aiokafka.record.control_record import ABORT_MARKER, ControlRecord

from queueflow._compat import raw_records, tolerate_undecodable_records, undecodable_records
from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.lifecycle import stop_quietly
from queueflow.protocol import messages as protocol
from queueflow.structs import ShareRecord, TopicPartition

__all__ = [
    "READER_IDLE_PAUSE_S",
    "RELEASED_CACHE_RECORDS",
    "CorruptRecords",
    "KafkaRecordReader",
    "PartitionReader",
    "ReadResult",
    "RecordSource",
    "Undecodable",
    "carried_records",
    "records_from_batches",
    "share_records",
]

#: A record that could not be decoded, and why (see :func:`queueflow._compat.undecodable_records`).
Undecodable = tuple[ShareRecord, str]
#: What a read returns: (records in offset order, gap offsets, undecodable records).
ReadResult = tuple[list[ShareRecord], list[int], list[Undecodable]]


class CorruptRecords(CorruptRecordException):  # type: ignore[misc,unused-ignore]  # aiokafka: untyped
    """A read stopped at a record batch that fails its CRC check (``check.crcs``): every
    acquired offset before ``offset`` was read (``read``), none from it on.

    Args:
        offset: the first offset of the corrupt batch (the first acquired offset not read).
        read: what was read before it (records, gaps, undecodable records).
        detail: aiokafka's message.
    """

    def __init__(self, offset: int, read: ReadResult, detail: str) -> None:
        super().__init__(f"the record batch at offset {offset} fails its CRC check: {detail}")
        self.offset = offset
        self.read = read


def share_records(
    messages: Iterable[Any],
    topic: str,
    partition: int,
    expected: int,
    last: int,
    delivery_count: int,
    out: list[ShareRecord],
    gaps: list[int],
) -> int:
    """Turn the records Kafka returned for ``topic[partition]`` into :class:`ShareRecord` objects.

    The hot loop of a member's reads. Each ``ShareRecord`` is built in place: an empty instance
    whose slots are filled here, from locals (topic and partition are the partition's; key and
    value are read once). That skips the dataclass ``__init__`` call (a Python frame and twelve
    arguments per record); no object is built besides the ``ShareRecord`` (the reader's consumer
    hands over the records its parser made, no ``ConsumerRecord``: :func:`_compat.raw_records
    <queueflow._compat.raw_records>`). The result equals ``ShareRecord(...)`` field by field
    (tests/unit/member/test_batch_agent.py checks every field).

    Args:
        messages: the records of ``topic[partition]`` in offset order as aiokafka's parser made
            them (:func:`queueflow._compat.raw_records`) or ``ConsumerRecord`` objects (any
            objects with ``offset``, ``key``, ``value``, ``headers``, ``timestamp`` and
            ``timestamp_type``).
        topic / partition: where they were read.
        expected: the next offset wanted; offsets skipped before a record are gaps.
        last: the last offset wanted; the first record after it ends the loop.
        delivery_count: the delivery count of every record (from the acquired range).
        out: the records are appended to it.
        gaps: offsets without a record (compaction, transaction markers) are appended to it.

    Returns:
        The next offset wanted (``last + 1`` once a record after ``last`` was seen).
    """
    append = out.append
    new = object.__new__
    cls = ShareRecord
    inf = math.inf
    for m in messages:
        offset = m.offset
        if offset != expected:  # offsets without records (compaction, markers)
            gaps.extend(range(expected, min(offset, last + 1)))
        if offset > last:  # not acquired (a read of n records can pass a marker or a hole)
            return last + 1
        # Every field of ShareRecord, in its order (a new field must be set here too).
        r = new(cls)
        r.topic = topic
        r.partition = partition
        r.offset = offset
        r.key = r.raw_key = m.key
        r.value = r.raw_value = m.value
        r.headers = tuple(m.headers)  # a list in aiokafka's parsed records
        r.timestamp = m.timestamp
        r.delivery_count = delivery_count
        r.lock_deadline = inf
        r.timestamp_type = m.timestamp_type
        append(r)
        expected = offset + 1
    return expected


def records_from_batches(
    data: bytes,
    topic: str,
    partition: int,
    acquired: Sequence[protocol.WireAcquired],
    *,
    check_crcs: bool = True,
    aborted_transactions: Iterable[tuple[int, int]] = (),
    lock_deadline: float = math.inf,
    delivered_at: float = 0.0,
) -> ReadResult:
    """The acquired records of ``topic[partition]`` from Kafka record batches (any message
    format, compressed or not) as :class:`ShareRecord` objects built straight from aiokafka's
    batch parser (its C ``DefaultRecordBatch``): no ``ConsumerRecord``, no consumer.

    Args:
        data: the record batches, as a Fetch response's ``records`` carries them.
        topic / partition: where they were read.
        acquired: the acquired ranges ``[(first, last, delivery_count), ...]`` in offset
            order; records outside them are skipped.
        check_crcs: check each batch's CRC-32C (Kafka's consumer ``check.crcs``).
        aborted_transactions: a ``read_committed`` read's aborted transactions, as the Fetch
            answer lists them ``(producer_id, first_offset)``: their records are gaps.
        lock_deadline / delivered_at: set on every record as it is built (one per fetch).

    Returns:
        A :data:`ReadResult`: gaps are acquired offsets without a record in ``data`` (control,
        compacted, aborted, or past its end); undecodable records come apart, with the reason.

    Raises:
        CorruptRecordException: with ``check_crcs``, a batch fails its CRC check (the message
            names the partition and the batch's offset); nothing is returned.
    """
    tolerate_undecodable_records()
    records: list[ShareRecord] = []
    append, new, cls = records.append, object.__new__, ShareRecord
    gaps: list[int] = []
    if not acquired:
        return records, gaps, []
    ranges = iter(acquired)
    first, last, count = next(ranges)
    expected, done = first, False  # the next acquired offset without a record or gap yet
    with undecodable_records() as seen:
        for batch in _data_batches(data, topic, partition, check_crcs, aborted_transactions):
            if done:
                break
            for m in batch:
                offset = m.offset
                while offset > last:  # past this range: the rest of it holds no record
                    gaps.extend(range(expected, last + 1))
                    first, last, count = nxt = next(ranges, (0, -1, 0))
                    expected, done = first, nxt[1] < 0
                    if done:
                        break
                if done:
                    break
                if offset != expected:
                    if offset < expected:  # before the range (a compressed set's earlier part)
                        continue
                    gaps.extend(range(expected, offset))
                # Every field of ShareRecord, in its order (a new field must be set here too).
                r = new(cls)
                r.topic = topic
                r.partition = partition
                r.offset = offset
                r.key = r.raw_key = m.key
                r.value = r.raw_value = m.value
                r.headers = tuple(m.headers)
                r.timestamp = m.timestamp
                r.delivery_count = count
                r.lock_deadline = lock_deadline
                r.timestamp_type = m.timestamp_type
                r.delivered_at = delivered_at
                append(r)
                expected = offset + 1
    if not done:
        gaps.extend(range(expected, last + 1))
        for first, last, _count in ranges:
            gaps.extend(range(first, last + 1))
    return _without_undecodable(records, gaps, seen)


def _without_undecodable(
    records: list[ShareRecord], gaps: list[int], seen: list[tuple[int, str]]
) -> ReadResult:
    """The read's result with the records named in ``seen`` (``(offset, reason)``) apart."""
    if not seen:
        return records, gaps, []
    bad = dict(seen)
    undecodable = [(r, bad[r.offset]) for r in records if r.offset in bad]
    return [r for r in records if r.offset not in bad], gaps, undecodable


def _data_batches(
    data: bytes,
    topic: str,
    partition: int,
    check_crcs: bool,
    aborted_transactions: Iterable[tuple[int, int]],
) -> Iterator[Any]:
    """The batches of ``data`` that hold data records, CRC checked if ``check_crcs``: control
    batches and aborted ones (``aborted_transactions``) are left out (see
    :func:`records_from_batches`). Call it inside :func:`undecodable_records`.

    Raises:
        CorruptRecordException: a batch fails its CRC check.
    """
    aborted = sorted(aborted_transactions, key=lambda a: a[1])
    aborting: set[int] = set()
    batches = aiokafka_fetcher.MemoryRecords(data)  # queueflow's lenient wrapper
    while batches.has_next():
        batch = batches.next_batch()
        if batch is None:
            return
        if check_crcs and not batch.validate_crc():
            raise CorruptRecordException(
                f"{topic}[{partition}]: the record batch at offset {batch.base_offset} "
                f"fails its CRC check (corrupted in the log or on the way; check.crcs)"
            )
        skip = (aborted or aborting) and batch.producer_id is not None
        if skip and _skip_aborted(batch, aborted, aborting):
            continue
        if not batch.is_control_batch:
            yield batch


def _skip_aborted(batch: Any, aborted: list[tuple[int, int]], aborting: set[int]) -> bool:
    """``read_committed``: True if ``batch`` holds aborted records (as aiokafka's fetcher
    decides it: the producers whose aborted transaction started at or before the batch, until
    their abort marker). ``aborted`` and ``aborting`` are the read's state (consumed here)."""
    while aborted and aborted[0][1] <= batch.base_offset:
        aborting.add(aborted.pop(0)[0])
    if batch.is_control_batch:
        for control in batch:
            if ControlRecord.parse(control.key) == ABORT_MARKER:
                aborting.discard(batch.producer_id)
            break
        return False
    return bool(batch.is_transactional and batch.producer_id in aborting)


class RecordSource(Protocol):
    """Where a member reads the payloads of the records it acquired."""

    async def read(
        self,
        tp: TopicPartition,
        acquired: list[protocol.WireAcquired],
        timeout_ms: int,
        read_committed: bool = False,
    ) -> ReadResult:
        """Read the acquired ranges ``[(first, last, delivery_count), ...]`` of ``tp``;
        ``read_committed``: as a ``read_committed`` consumer (the group's
        ``share.isolation.level``): aborted records are gaps too.

        Returns:
            (records in offset order, gap offsets: acquired offsets that hold no record,
            undecodable records with the reason: left out of the records).

        Raises:
            ShareGroupError: ``REQUEST_TIMED_OUT`` when they can't be read in ``timeout_ms``.
        """
        ...

    def prepare(self, tp: TopicPartition) -> None:
        """``tp`` was assigned: get ready to read it (in the background; never raises), so
        the first acquired records don't wait for a connection."""
        ...

    def remember_released(self, record: ShareRecord) -> None:
        """Keep a RELEASEd record so its redelivery to this member needs no read."""
        ...

    async def drop(self, tp: TopicPartition) -> None:
        """Forget ``tp`` (no longer assigned): close what reads it."""
        ...

    async def close(self) -> None:
        """Close everything."""
        ...


class KafkaRecordReader:
    """A :class:`RecordSource` over Kafka: one :class:`PartitionReader` per source partition.

    Args:
        kafka: the cluster.
        check_crcs: the readers check each record batch's CRC (``check.crcs``).
    """

    def __init__(self, kafka: KafkaClientConfig, *, check_crcs: bool = True) -> None:
        self.kafka = kafka
        self.check_crcs = check_crcs
        self._readers: dict[TopicPartition, PartitionReader] = {}
        # The read_committed readers (groups with share.isolation.level=read_committed).
        self._committed: dict[TopicPartition, PartitionReader] = {}
        # Closed for good: an assignment answered after the member closed must not start a
        # reader (its consumer would never be stopped).
        self._closed = False

    async def read(
        self,
        tp: TopicPartition,
        acquired: list[protocol.WireAcquired],
        timeout_ms: int,
        read_committed: bool = False,
    ) -> ReadResult:
        """See :meth:`RecordSource.read`.

        Raises:
            ShareGroupError: ``REQUEST_TIMED_OUT`` (see :meth:`PartitionReader.read`), or
                ``INVALID_REQUEST`` after :meth:`close`.
        """
        if self._closed:
            raise ShareGroupError(ErrorCode.INVALID_REQUEST, "the record reader is closed")
        return await self._reader_for(tp, read_committed).read(acquired, timeout_ms)

    def _reader_for(self, tp: TopicPartition, read_committed: bool) -> PartitionReader:
        """The reader of ``tp`` (made on first use)."""
        readers = self._committed if read_committed else self._readers
        reader = readers.get(tp)
        if reader is None:
            reader = readers[tp] = PartitionReader(
                self.kafka,
                tp.topic,
                tp.partition,
                read_committed=read_committed,
                check_crcs=self.check_crcs,
            )
        return reader

    def prepare(self, tp: TopicPartition) -> None:
        """See :meth:`RecordSource.prepare`: the partition's reader connects, paused."""
        if tp not in self._readers and not self._closed:
            reader = self._readers[tp] = PartitionReader(
                self.kafka, tp.topic, tp.partition, check_crcs=self.check_crcs
            )
            reader.warm()

    def remember_released(self, record: ShareRecord) -> None:
        """See :meth:`RecordSource.remember_released` (kept by the reader that read it: the
        read_committed one of a read_committed group)."""
        tp = TopicPartition(record.topic, record.partition)
        reader = self._committed.get(tp) or self._readers.get(tp)
        if reader is not None and record.raw_value is not None:
            reader.remember_released(record)

    async def drop(self, tp: TopicPartition) -> None:
        """See :meth:`RecordSource.drop`."""
        for readers in (self._readers, self._committed):
            reader = readers.pop(tp, None)
            if reader is not None:
                await reader.close()

    async def close(self) -> None:
        """See :meth:`RecordSource.close`."""
        self._closed = True
        for readers in (self._readers, self._committed):
            while readers:  # a reader added while another closes is closed too
                _tp, reader = readers.popitem()
                await reader.close()


#: RELEASEd records a partition reader keeps for their redelivery (oldest dropped first).
RELEASED_CACHE_RECORDS = 10_000
#: Seconds without a read after which a partition reader gives up its partition (it takes it
#: back on the next read): an idle member then sends no fetches for its records at all, and
#: its consumer's fetch routine sleeps (a paused partition would still wake it every 200 ms).
READER_IDLE_PAUSE_S = 1.0


class PartitionReader:
    """Reads acquired offset ranges of one source partition with a group-less consumer.

    Args:
        kafka: the cluster.
        topic / partition: the source partition.
        read_committed: read as a ``read_committed`` consumer: aborted transactional records
            are left out like transaction markers, so they are reported as gaps (the leader
            acquired only offsets below the last stable offset, which such a fetch reaches).
        check_crcs: check each record batch's CRC (Kafka's consumer ``check.crcs``); a batch
            that fails makes the read fail (``CorruptRecordException``), so the records are
            RELEASEd undelivered by the session, never passed to a handler.
    """

    def __init__(
        self,
        kafka: KafkaClientConfig,
        topic: str,
        partition: int,
        *,
        read_committed: bool = False,
        check_crcs: bool = True,
    ) -> None:
        tolerate_undecodable_records()
        self.tp = KafkaTopicPartition(topic, partition)
        self.consumer = AIOKafkaConsumer(
            **kafka.client_kwargs(),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed" if read_committed else "read_uncommitted",
            check_crcs=check_crcs,
            fetch_max_wait_ms=50,
            max_partition_fetch_bytes=1 << 20,
        )
        self.position = -1
        self.released: OrderedDict[int, ShareRecord] = OrderedDict()
        self._lock = asyncio.Lock()  # one read at a time: reads seek
        self._started = False
        # Unassigned after READER_IDLE_PAUSE_S without a read: an idle consumer would otherwise
        # keep long-polling the partition (prefetch) forever.
        self._assigned = False
        self._idle_timer: asyncio.TimerHandle | None = None
        self._warming: asyncio.Future[None] | None = None

    def remember_released(self, record: ShareRecord) -> None:
        """Keep a record its handler RELEASEd: it is likely acquired again by this member, and
        reading it back from Kafka would cost a seek and a fetch of its own."""
        self.released[record.offset] = record
        if len(self.released) > RELEASED_CACHE_RECORDS:
            self.released.popitem(last=False)

    def _take_released(
        self, first: int, last: int, delivery_count: int, out: list[ShareRecord]
    ) -> bool:
        """Serve ``first..last`` from the released records if all are there."""
        if any(o not in self.released for o in range(first, last + 1)):
            return False
        for offset in range(first, last + 1):
            r = self.released.pop(offset)
            out.append(
                ShareRecord(
                    r.topic,
                    r.partition,
                    offset,
                    r.raw_key,
                    r.raw_value,
                    r.headers,
                    r.timestamp,
                    delivery_count,
                    r.raw_value,
                    r.raw_key,
                    math.inf,
                    r.timestamp_type,
                )
            )
        return True

    async def start(self) -> None:
        """Start the consumer (once), connected but without its partition: it fetches
        nothing until the first read assigns it.

        Raises:
            Exception: aiokafka's error when the cluster can't be reached.
        """
        async with self._lock:
            if not self._started:
                await self.consumer.start()
                self._started = True

    def warm(self) -> None:
        """Start the consumer in the background, so its connection and metadata are ready
        when the first records are acquired (a failure is left to the first read)."""

        async def start() -> None:
            with contextlib.suppress(Exception):
                await self.start()

        self._warming = asyncio.ensure_future(start())

    async def close(self) -> None:
        """Stop the consumer."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self._warming is not None:
            self._warming.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._warming
        await stop_quietly("member record reader", self.consumer.stop)

    async def read(self, acquired: list[protocol.WireAcquired], timeout_ms: int) -> ReadResult:
        """Read the acquired ranges; see :meth:`RecordSource.read`.

        Raises:
            ShareGroupError: ``REQUEST_TIMED_OUT`` if they can't be read within ``timeout_ms``.
        """
        await self.start()
        async with self._lock:
            if self._idle_timer is not None:
                self._idle_timer.cancel()
            if not self._assigned:
                self.consumer.assign([self.tp])
                self._assigned = True
                self.position = -1  # a new assignment has no position: seek
            try:
                return await self._read(acquired, timeout_ms)
            finally:
                self._idle_timer = asyncio.get_running_loop().call_later(
                    READER_IDLE_PAUSE_S, self._pause_idle
                )

    def _pause_idle(self) -> None:
        if not self._lock.locked() and self._assigned:
            self.consumer.unsubscribe()
            self._assigned = False

    async def _read(self, acquired: list[protocol.WireAcquired], timeout_ms: int) -> ReadResult:
        records: list[ShareRecord] = []
        gaps: list[int] = []
        bad: dict[int, str] = {}
        topic, partition = self.tp.topic, self.tp.partition
        deadline = time.monotonic() + timeout_ms / 1000
        for first, last, delivery_count in acquired:
            if first in self.released and self._take_released(first, last, delivery_count, records):
                continue
            if self.position != first:
                self.consumer.seek(self.tp, first)
                self.position = first
            expected = first
            careful = False  # after a CRC failure: one record at a time, to find its batch
            while expected <= last:
                try:
                    with undecodable_records() as seen, raw_records():
                        batch = await self.consumer.getmany(
                            self.tp,
                            timeout_ms=200,
                            max_records=1 if careful else last - expected + 1,
                        )
                except CorruptRecordException as exc:
                    # The consumer dropped the records of the fetch before the bad batch and
                    # moved past them: seek back, then read one at a time up to the bad one.
                    self.consumer.seek(self.tp, expected)
                    self.position = -1 if careful else expected
                    if careful:
                        read = _without_undecodable(records, gaps, list(bad.items()))
                        raise CorruptRecords(expected, read, str(exc)) from exc
                    careful = True
                    continue
                bad.update(seen)
                messages = batch.get(self.tp, [])
                expected = share_records(
                    messages, topic, partition, expected, last, delivery_count, records, gaps
                )
                position = await self.consumer.position(self.tp)
                if not messages and position > expected:
                    # The consumer skipped offsets without records (control records).
                    gaps.extend(range(expected, min(position, last + 1)))
                    expected = min(position, last + 1)
                if time.monotonic() > deadline:
                    raise ShareGroupError(
                        ErrorCode.REQUEST_TIMED_OUT,
                        f"{self.tp.topic}[{self.tp.partition}]: offsets {expected}..{last} were "
                        f"acquired but could not be read within {timeout_ms} ms",
                    )
            self.position = last + 1
            if (await self.consumer.position(self.tp)) != self.position:
                self.position = -1  # force a seek next time
        return _without_undecodable(records, gaps, list(bad.items()))


def carried_records(
    data: bytes,
    topic: str,
    partition: int,
    acquired: list[protocol.WireAcquired],
    records_end: int,
    *,
    check_crcs: bool = True,
    lazy: bool = False,
    lock_deadline: float = math.inf,
    delivered_at: float = 0.0,
) -> tuple[ReadResult, list[protocol.WireAcquired]]:
    """The acquired records a direct-path answer carried (``ShareFetchResponse.records``),
    parsed by :func:`records_from_batches`: only acquired offsets below ``records_end`` are
    delivered, whatever else the batches hold; an acquired offset below ``records_end``
    without a record is a gap.

    Args:
        data: the record batches (Kafka v2 format, possibly compressed).
        topic / partition: the source partition.
        acquired: the acquired ranges ``(first, last, delivery_count)``, in offset order.
        records_end: the answer's ``records_end``: the batches hold every acquired record
            below it.
        check_crcs: check each batch's CRC-32C (the member's ``check.crcs``).
        lazy: lazy record views (:func:`queueflow.member.lazy_records.lazy_records_from_batches`:
            a share agent's ``lazy_records=True``).
        lock_deadline / delivered_at: set on every record (see :func:`records_from_batches`).

    Returns:
        ((records, gaps, undecodable records), the acquired ranges at or after
        ``records_end``: the member reads those itself).

    Raises:
        CorruptRecordException: a batch's CRC does not match (the caller reads every acquired
            offset itself instead).
        ValueError: the bytes are not record batches.
    """
    covered = [(f, min(last, records_end - 1), c) for f, last, c in acquired if f < records_end]
    rest = [(max(f, records_end), last, c) for f, last, c in acquired if last >= records_end]
    parse = records_from_batches
    if lazy:
        from queueflow.member.lazy_records import lazy_records_from_batches as parse
    read = parse(
        data,
        topic,
        partition,
        covered,
        check_crcs=check_crcs,
        lock_deadline=lock_deadline,
        delivered_at=delivered_at,
    )
    return read, rest
