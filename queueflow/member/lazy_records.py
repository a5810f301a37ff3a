"""Lazy :class:`~queueflow.structs.ShareRecord` views over a fetched Kafka record batch.

:func:`lazy_records_from_batches` is :func:`queueflow.member.reader.records_from_batches`
without the per-record decode: for a v2 record batch whose offsets are contiguous (its record
count is its last offset delta plus one, so record ``i`` is at ``base_offset + i``: every batch
a producer wrote and compaction did not thin), each acquired record becomes a
:class:`LazyShareRecord` holding its topic, partition, offset, delivery count, lock deadline
and delivery time, and nothing else. Its key, value, headers and timestamps are decoded the
first time any record of the batch is touched: aiokafka's batch parser (the C
``DefaultRecordBatch``) then runs once over the batch and fills every view of it, and each
view becomes a plain ``ShareRecord`` (its class is switched: same slots), so from then on it
is one, at a plain ``ShareRecord``'s attribute cost. A handler that counts records, reads
offsets or acknowledges by range never pays for the parse.

A view equals, hashes as, prints as and pickles as the eager ``ShareRecord`` (touching it
for that decodes its batch). Batches that are not contiguous, not v2, or partly before the
acquired range are parsed eagerly, as :func:`~queueflow.member.reader.records_from_batches`
does; so are control batches (skipped) and aborted ones (gaps).

What is not the same: a record whose header name is not UTF-8 is found when its batch is
decoded, not before the handler runs. Eagerly it is left out of the handler's records and
REJECTed; lazily, touching any record of its batch raises :class:`UndecodableRecordError`
once (the other records are decoded then) and touching that record raises it every time: a
batch handler that raises has its records handled again alone, so that record fails alone
and is RELEASEd, until ``share.delivery.count.limit`` archives it (docs/guide.md "Batch
handlers", docs/performance.md "Lazy record views").
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import aiokafka.consumer.fetcher as aiokafka_fetcher
from aiokafka.errors import CorruptRecordException

from queueflow._compat import tolerate_undecodable_records, undecodable_records
from queueflow.protocol import messages as protocol
from queueflow.structs import ShareRecord

__all__ = [
    "LazyShareRecord",
    "UndecodableRecordError",
    "lazy_records_from_batches",
]

#: v2 batch header: base offset (int64), batch length (int32), ... records count at byte 57.
_HEADER = struct.Struct(">qi")
_COUNT = struct.Struct(">i")
_MAGIC_AT, _COUNT_AT, _V2_HEADER_BYTES = 16, 57, 61

# The slot descriptors of the fields a view decodes on access (the class's own properties
# below shadow them; the decoded values go straight into the slots).
_LAZY_FIELDS = ("key", "value", "headers", "timestamp", "raw_value", "raw_key", "timestamp_type")
_SLOTS = {name: getattr(ShareRecord, name) for name in _LAZY_FIELDS}
_HEADERS_SLOT = _SLOTS["headers"]


class UndecodableRecordError(ValueError):
    """A record of a lazily decoded batch has a header name that is not UTF-8.

    Args:
        offset: the record's offset.
        reason: why (as :func:`queueflow._compat.undecodable_records` says it).
    """

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"the record at offset {offset} can't be decoded: {reason}")
        self.offset = offset


class _Pending:
    """One batch's undecoded views (kept in the views' ``headers`` slot until decoded).

    Args:
        batch: aiokafka's parsed batch (iterated once, on the first access).
        views: the batch's views by offset minus ``base``.
        base: the offset of ``views[0]``.
    """

    __slots__ = ("base", "batch", "views")

    def __init__(self, batch: Any, views: list[ShareRecord | None], base: int) -> None:
        self.batch = batch
        self.views = views
        self.base = base

    def decode(self) -> None:
        """Parse the batch once and fill every view of it (each becomes a ``ShareRecord``).

        Raises:
            UndecodableRecordError: a header name of a record of the batch is not UTF-8.
        """
        views, base = self.views, self.base
        size = len(views)
        new_class = ShareRecord
        with undecodable_records() as seen:
            for m in self.batch:
                i = m.offset - base
                if i < 0:
                    continue
                if i >= size:
                    break
                r = views[i]
                if r is None:
                    continue
                r.__class__ = new_class  # from here on a plain ShareRecord: slot stores
                r.key = r.raw_key = m.key
                r.value = r.raw_value = m.value
                r.headers = tuple(m.headers)
                r.timestamp = m.timestamp
                r.timestamp_type = m.timestamp_type
        self.views = []
        for offset, reason in seen:  # these stay views that raise on every access
            r = views[offset - base] if 0 <= offset - base < size else None
            if r is not None:
                r.__class__ = LazyShareRecord
                _HEADERS_SLOT.__set__(r, _Undecodable(offset, reason))
        if seen:
            raise UndecodableRecordError(*seen[0])


class _Undecodable(_Pending):
    """The pending state of a view whose record can't be decoded: every access raises."""

    __slots__ = ("offset", "reason")

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(None, [], offset)
        self.offset, self.reason = offset, reason

    def decode(self) -> None:
        """Raises:
        UndecodableRecordError: always."""
        raise UndecodableRecordError(self.offset, self.reason)


def _decoded(record: LazyShareRecord) -> ShareRecord:
    pending = _HEADERS_SLOT.__get__(record, ShareRecord)
    if isinstance(pending, _Pending):
        pending.decode()
    return record


def _lazy_field(name: str) -> property:
    slot = _SLOTS[name]

    def get(self: LazyShareRecord) -> Any:
        return slot.__get__(_decoded(self), ShareRecord)

    def set_(self: LazyShareRecord, value: Any) -> None:
        slot.__set__(_decoded(self), value)

    return property(get, set_, doc=f"``{name}``, decoded from the batch on first access.")


class LazyShareRecord(ShareRecord):
    """A :class:`~queueflow.structs.ShareRecord` whose key, value, headers and timestamps are
    decoded from its record batch on first access (see the module docstring); then it is a
    ``ShareRecord``. Equality, hashing, ``repr`` and pickling decode it first."""

    __slots__ = ()

    key = _lazy_field("key")
    value = _lazy_field("value")
    headers = _lazy_field("headers")
    timestamp = _lazy_field("timestamp")
    raw_value = _lazy_field("raw_value")
    raw_key = _lazy_field("raw_key")
    timestamp_type = _lazy_field("timestamp_type")

    def __eq__(self, other: object) -> bool:
        record = _decoded(self)
        if isinstance(other, LazyShareRecord):
            other = _decoded(other)
        return record == other  # now a ShareRecord: its dataclass __eq__

    __hash__ = None  # type: ignore[assignment]  # as the dataclass (eq without frozen)

    def __repr__(self) -> str:
        return repr(_decoded(self))

    def __reduce_ex__(self, protocol: Any) -> Any:
        return _decoded(self).__reduce_ex__(protocol)

    def __copy__(self) -> ShareRecord:
        import copy

        return copy.copy(_decoded(self))

    def __deepcopy__(self, memo: dict[int, Any]) -> ShareRecord:
        import copy

        return copy.deepcopy(_decoded(self), memo)


def _batch_spans(data: bytes | memoryview) -> list[tuple[int, int, int]]:
    """``(position, size, record count)`` of each whole batch of ``data``, in order (count -1
    for a batch of another message format than v2)."""
    out = []
    pos, end = 0, len(data)
    while pos + 17 <= end:
        _base, length = _HEADER.unpack_from(data, pos)
        size = 12 + length
        if pos + size > end:
            break
        count = -1
        if data[pos + _MAGIC_AT] == 2 and size >= _V2_HEADER_BYTES:
            (count,) = _COUNT.unpack_from(data, pos + _COUNT_AT)
        out.append((pos, size, count))
        pos += size
    return out


class _Ranges:
    """The acquired ranges as a read resolves them: every acquired offset becomes a record
    or a gap, in offset order."""

    def __init__(self, acquired: Sequence[protocol.WireAcquired], gaps: list[int]) -> None:
        self.ranges = list(acquired)
        self.index = 0
        self.expected = self.ranges[0][0]  # the next acquired offset not resolved yet
        self.gaps = gaps

    @property
    def current(self) -> protocol.WireAcquired | None:
        return self.ranges[self.index] if self.index < len(self.ranges) else None

    def advance(self, to: float, gaps: bool = True) -> None:
        """Resolve every acquired offset below ``to`` (as gaps unless ``gaps`` is False)."""
        while (r := self.current) is not None:
            first, last, _count = r
            start = max(self.expected, first)
            stop = min(last + 1, to)
            if gaps and start < stop:
                self.gaps.extend(range(start, int(stop)))
            if to <= last:
                self.expected = max(start, int(to))
                return
            self.index += 1
            self.expected = self.ranges[self.index][0] if self.index < len(self.ranges) else 0

    def clipped(self, base: int, top: int) -> list[protocol.WireAcquired]:
        """The unresolved acquired offsets of ``base..top``, as ranges."""
        out = []
        for i in range(self.index, len(self.ranges)):
            first, last, count = self.ranges[i]
            if first > top:
                break
            lo = max(first, base, self.expected)
            hi = min(last, top)
            if lo <= hi:
                out.append((lo, hi, count))
        return out


def lazy_records_from_batches(
    data: bytes,
    topic: str,
    partition: int,
    acquired: Sequence[protocol.WireAcquired],
    *,
    check_crcs: bool = True,
    aborted_transactions: Iterable[tuple[int, int]] = (),
    lock_deadline: float = math.inf,
    delivered_at: float = 0.0,
) -> tuple[list[ShareRecord], list[int], list[tuple[ShareRecord, str]]]:
    """:func:`queueflow.member.reader.records_from_batches` with lazy views for the contiguous
    v2 batches (the module docstring says what differs).

    Args and Returns: as :func:`~queueflow.member.reader.records_from_batches`.

    Raises:
        CorruptRecordException: with ``check_crcs``, a batch fails its CRC check.
    """
    from queueflow.member import reader  # the eager path, for the batches not made lazy

    eager = functools.partial(
        reader.records_from_batches, lock_deadline=lock_deadline, delivered_at=delivered_at
    )
    if aborted_transactions or not acquired:
        aborted = aborted_transactions
        return eager(
            data, topic, partition, acquired, check_crcs=check_crcs, aborted_transactions=aborted
        )
    tolerate_undecodable_records()
    records: list[ShareRecord] = []
    gaps: list[int] = []
    undecodable: list[tuple[ShareRecord, str]] = []
    ranges = _Ranges(acquired, gaps)
    batches = aiokafka_fetcher.MemoryRecords(data)
    for pos, size, n in _batch_spans(data):
        if ranges.current is None or not batches.has_next():
            break
        with undecodable_records():  # a batch taken inside it parses leniently when iterated
            batch = batches.next_batch()
        if batch is None:
            break
        base, top = batch.base_offset, batch.next_offset - 1
        if check_crcs and not batch.validate_crc():
            raise CorruptRecordException(
                f"{topic}[{partition}]: the record batch at offset {base} "
                f"fails its CRC check (corrupted in the log or on the way; check.crcs)"
            )
        if batch.is_control_batch:
            continue  # its offsets are gaps
        ranges.advance(base)
        current = ranges.current
        if current is None:
            break
        wanted = ranges.clipped(base, top)
        if n > 0 and batch.last_offset_delta == n - 1:  # contiguous: record i at base + i
            if wanted:
                records.extend(
                    _views(batch, n, wanted, topic, partition, lock_deadline, delivered_at)
                )
            ranges.advance(top + 1, gaps=False)
            continue
        if wanted:
            one = data[pos : pos + size]  # CRC checked above
            got, got_gaps, bad = eager(one, topic, partition, wanted, check_crcs=False)
            records.extend(got)
            gaps.extend(got_gaps)
            undecodable.extend(bad)
        ranges.advance(top + 1, gaps=False)
    ranges.advance(math.inf)
    return records, gaps, undecodable


def _views(
    batch: Any,
    n: int,
    wanted: list[protocol.WireAcquired],
    topic: str,
    partition: int,
    lock_deadline: float,
    delivered_at: float,
) -> list[ShareRecord]:
    """A view per wanted record of a contiguous batch of ``n`` records (see the module
    docstring): ``wanted`` are acquired ranges inside it."""
    base = batch.base_offset
    slots: list[ShareRecord | None] = [None] * n
    pending = _Pending(batch, slots, base)
    out: list[ShareRecord] = []
    new, cls, append = object.__new__, LazyShareRecord, out.append
    set_headers = _HEADERS_SLOT.__set__
    for first, last, delivery_count in wanted:
        for offset in range(first, last + 1):
            r = new(cls)
            r.topic = topic
            r.partition = partition
            r.offset = offset
            set_headers(r, pending)
            r.delivery_count = delivery_count
            r.lock_deadline = lock_deadline
            r.delivered_at = delivered_at
            slots[offset - base] = r
            append(r)
    return out
