"""The records a leader carries in its direct-path ShareFetch answers.

On the direct path a leader answers a ShareFetch with the acquired records' bytes, as Kafka's
broker answers a ShareFetch (KIP-932 "ShareFetch API": the response holds the records), so a
member does one round trip per batch and reads nothing from the broker itself
(docs/architecture.md "The direct path"). The leader keeps, per source partition, a cache of
raw Kafka v2 record batches (as the broker stored them, possibly compressed) bounded in bytes
(``queueflow.leader.record.cache.bytes``); what it lacks it reads with one Fetch of about
:data:`FILL_BYTES` from the first missing offset, so the next acquisitions of a backlog find
their batches in the cache.

What an answer carries (``ShareFetchResponse.records`` up to ``records_end``):

* whole batches, so they may hold offsets that were not acquired (the member delivers only
  acquired offsets);
* never a control batch (its offsets are gaps to the member);
* for a ``read_committed`` group, nothing from the first transactional batch on: whether its
  records were aborted is not known from the batch alone, so the member reads those offsets
  with its own ``read_committed`` consumer (aborted records stay hidden);
* at most :data:`CARRY_MAX_BYTES`; the member reads the rest.
"""

from __future__ import annotations

import asyncio
import bisect
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from queueflow.logging import SkipLogLimiter
from queueflow.protocol import messages as protocol
from queueflow.structs import TopicPartition

__all__ = [
    "CARRY_MAX_BYTES",
    "FILL_BYTES",
    "BatchSource",
    "Chunk",
    "LeaderRecords",
    "RawBatch",
    "RecordCache",
    "split_batches",
]

log = structlog.get_logger("queueflow.server.record_cache")

#: The most record bytes one answer carries (well below a direct-path frame's 16 MiB).
CARRY_MAX_BYTES = 4 * 1024 * 1024
#: How many bytes a leader reads from the broker at once when its cache lacks an offset (as
#: Kafka's ``max.partition.fetch.bytes`` default).
FILL_BYTES = 1024 * 1024

_HEADER = struct.Struct(">qiiBIhi")  # base offset, length, leader epoch, magic, crc, attrs, delta
_TRANSACTIONAL = 0x10
_CONTROL = 0x20


@dataclass(frozen=True, slots=True)
class RawBatch:
    """One Kafka v2 record batch, as bytes.

    Attributes:
        base: its first offset.
        last: its last offset (base + last offset delta; compaction keeps it).
        transactional: written in a transaction (maybe aborted).
        control: a control batch (a transaction marker).
        data: the whole batch.
    """

    base: int
    last: int
    transactional: bool
    control: bool
    data: bytes


def split_batches(data: bytes) -> list[RawBatch]:
    """The whole v2 batches at the start of a Fetch answer's record set ``data``; stops at a
    batch cut short (the broker cuts the last one at the fetch's size) or of an older format
    (magic < 2: not carried; the member reads those offsets itself)."""
    out: list[RawBatch] = []
    pos, size = 0, len(data)
    while pos + _HEADER.size <= size:
        base, length, _epoch, magic, _crc, attributes, delta = _HEADER.unpack_from(data, pos)
        end = pos + 12 + length
        if magic < 2 or length < _HEADER.size - 12 or end > size:
            break
        out.append(
            RawBatch(
                base,
                base + delta,
                bool(attributes & _TRANSACTIONAL),
                bool(attributes & _CONTROL),
                data[pos:end],
            )
        )
        pos = end
    return out


@dataclass(frozen=True, slots=True)
class Chunk:
    """Batches from one Fetch: every record of offsets ``start..end - 1`` is in ``batches``
    (an offset there without a record holds none).

    Attributes:
        start / end: the offsets covered, ``end`` exclusive.
        batches: in offset order.
        size: their bytes.
    """

    start: int
    end: int
    batches: tuple[RawBatch, ...]
    size: int
    #: Each batch's last offset (to find where an offset's batches start).
    lasts: tuple[int, ...] = ()

    @classmethod
    def of(cls, offset: int, batches: list[RawBatch]) -> Chunk | None:
        """The chunk of a Fetch from ``offset`` that returned ``batches`` (``None``: none)."""
        if not batches:
            return None
        return cls(
            min(offset, batches[0].base),
            batches[-1].last + 1,
            tuple(batches),
            sum(len(b.data) for b in batches),
            tuple(b.last for b in batches),
        )

    def from_offset(self, offset: int) -> tuple[RawBatch, ...]:
        """The batches from the one holding ``offset`` (or the next one) on."""
        return self.batches[bisect.bisect_left(self.lasts, offset) :]


class RecordCache:
    """Chunks of record batches per source partition, at most ``max_bytes`` per partition
    (the oldest read dropped first). Pure: no I/O.

    Args:
        max_bytes: the bound per partition (``queueflow.leader.record.cache.bytes``); a chunk
            larger than it is not kept.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._chunks: dict[TopicPartition, OrderedDict[int, Chunk]] = {}
        self._bytes: dict[TopicPartition, int] = {}

    def bytes(self, tp: TopicPartition) -> int:
        """The bytes kept for ``tp``."""
        return self._bytes.get(tp, 0)

    def put(self, tp: TopicPartition, chunk: Chunk) -> None:
        """Keep ``chunk`` (replacing one of the same start), dropping the oldest chunks of
        ``tp`` until its bytes are within the bound."""
        if chunk.size > self.max_bytes:
            return
        chunks = self._chunks.setdefault(tp, OrderedDict())
        old = chunks.pop(chunk.start, None)
        total = self._bytes.get(tp, 0) - (old.size if old else 0) + chunk.size
        chunks[chunk.start] = chunk
        while total > self.max_bytes:
            _start, dropped = chunks.popitem(last=False)
            total -= dropped.size
        self._bytes[tp] = total

    def covering(self, tp: TopicPartition, offset: int) -> Chunk | None:
        """A chunk of ``tp`` that covers ``offset``, or ``None``."""
        for chunk in reversed(self._chunks.get(tp, {}).values()):  # the newest first
            if chunk.start <= offset < chunk.end:
                return chunk
        return None

    def drop(self, tp: TopicPartition) -> None:
        """Forget ``tp``."""
        self._chunks.pop(tp, None)
        self._bytes.pop(tp, None)


class BatchSource(Protocol):
    """Reads raw record batches (:class:`queueflow.kafka.batch_fetch.KafkaBatchFetcher`)."""

    async def fetch(self, tp: TopicPartition, offset: int, max_bytes: int) -> _Fetched:
        """One Fetch of ``tp`` from ``offset``, about ``max_bytes``."""
        ...

    async def close(self) -> None:
        """Close the client."""
        ...


class _Leader(Protocol):
    """What :meth:`LeaderRecords.follow` needs of a :class:`~queueflow.server.leader.ShareLeader`:
    its topic and its share-partition cache's ``on_dropped`` callbacks."""

    @property
    def topic(self) -> str: ...

    @property
    def cache(self) -> _Dropping: ...


class _Dropping(Protocol):
    @property
    def on_dropped(self) -> list[Callable[[set[int]], None]]: ...


class _Fetched(Protocol):
    @property
    def data(self) -> bytes: ...


class LeaderRecords:
    """Finds the batches of acquired offsets for direct-path answers: from the
    :class:`RecordCache`, else one Fetch that fills it.

    Args:
        source: where batches are read.
        max_bytes: ``queueflow.leader.record.cache.bytes``.
    """

    def __init__(self, source: BatchSource, max_bytes: int) -> None:
        self.source = source
        self.cache = RecordCache(max_bytes)
        self._fills: dict[TopicPartition, asyncio.Lock] = {}
        #: Fetches the cache needed (for tests and measurement).
        self.fills = 0
        # A partition that can't be read fails on every answer: a few lines, not one each.
        self._failed_log = SkipLogLimiter(lambda: int(time.monotonic() * 1000))
        self._followed: set[str] = set()  # topics whose leaders' drops release batches

    async def carry(
        self, tp: TopicPartition, acquired: list[protocol.WireAcquired], *, read_committed: bool
    ) -> tuple[bytes, int]:
        """The batches holding the records of ``acquired`` (ranges in offset order) and the
        offset below which they hold every acquired record (``records_end``; 0: nothing
        carried). Never raises: what it can't read, the member reads."""
        parts: list[bytes] = []
        seen: set[int] = set()
        size = 0
        for first, last, _count in sorted(acquired):  # records_end covers all below it
            offset = first
            while offset <= last:
                chunk = self.cache.covering(tp, offset) or await self._fill(tp, offset)
                if chunk is None:
                    return _joined(parts, offset)
                for batch in chunk.from_offset(offset):
                    if batch.base > last:
                        break
                    if batch.control:
                        continue
                    if read_committed and batch.transactional:
                        return _joined(parts, max(offset, batch.base))
                    if batch.base in seen:
                        continue
                    if size + len(batch.data) > CARRY_MAX_BYTES:
                        return _joined(parts, max(offset, batch.base))
                    parts.append(batch.data)
                    seen.add(batch.base)
                    size += len(batch.data)
                offset = chunk.end
        return _joined(parts, max(last for _first, last, _count in acquired) + 1 if acquired else 0)

    async def _fill(self, tp: TopicPartition, offset: int) -> Chunk | None:
        """Read from ``offset`` into the cache (one Fetch per partition at a time)."""
        lock = self._fills.setdefault(tp, asyncio.Lock())
        async with lock:
            chunk = self.cache.covering(tp, offset)
            if chunk is not None:  # another answer read it meanwhile
                return chunk
            try:
                fetched = await self.source.fetch(tp, offset, FILL_BYTES)
            except Exception as exc:  # the member reads these offsets itself
                if (suppressed := self._failed_log.admit()) is not None:
                    log.warning(
                        "leader_record_read_failed",
                        topic=tp.topic,
                        partition=tp.partition,
                        offset=offset,
                        error=repr(exc),
                        suppressed=suppressed,
                    )
                return None
            self.fills += 1
            chunk = Chunk.of(offset, split_batches(fetched.data))
            if chunk is not None:
                self.cache.put(tp, chunk)
            return chunk

    def drop(self, tp: TopicPartition) -> None:
        """Forget the batches of ``tp`` (no longer led here)."""
        self.cache.drop(tp)
        self._fills.pop(tp, None)

    def follow(self, leader: _Leader) -> None:
        """Drop the batches of ``leader``'s partitions when it stops leading them (revoked,
        stepped down): the new leader reads its own, and this worker's memory is freed at
        once. Idempotent per topic; call it before carrying records of ``leader``'s topic."""
        topic = leader.topic
        if topic in self._followed:
            return
        self._followed.add(topic)

        def dropped(partitions: set[int]) -> None:
            for p in partitions:
                self.drop(TopicPartition(topic, p))

        leader.cache.on_dropped.append(dropped)

    async def close(self) -> None:
        """Close the batch source."""
        await self.source.close()


def _joined(parts: list[bytes], end: int) -> tuple[bytes, int]:
    if not parts:
        return b"", 0
    return b"".join(parts), end
