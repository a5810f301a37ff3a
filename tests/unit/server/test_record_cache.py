"""The records leaders carry in direct-path answers: batch splitting, the bounded cache, what an
answer carries, the wire field, and the member's parser of carried batches (brokerless)."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

import pytest
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c

from queueflow.errors import InvalidRequestError
from queueflow.member.reader import carried_records
from queueflow.protocol import messages as protocol
from queueflow.server.record_cache import (
    CARRY_MAX_BYTES,
    Chunk,
    LeaderRecords,
    RecordCache,
    split_batches,
)
from queueflow.structs import TopicPartition

TP = TopicPartition("t", 0)


def batch(
    base: int,
    offsets: list[int],
    *,
    transactional: bool = False,
    control: bool = False,
    value_bytes: int = 0,
) -> bytes:
    """A v2 record batch at ``base`` holding records at ``offsets`` (absolute; missing ones as
    after compaction), value ``b"v<offset>"`` padded to ``value_bytes``."""
    builder = DefaultRecordBatchBuilder(2, 0, int(transactional), 7, 0, -1, 1 << 24)
    for offset in offsets:
        value = f"v{offset}".encode().ljust(value_bytes, b".")
        builder.append(offset - base, timestamp=1000 + offset, key=b"k", value=value, headers=[])
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base)
    if control:
        attributes = struct.unpack_from(">h", data, 21)[0] | 0x20
        struct.pack_into(">h", data, 21, attributes)
        struct.pack_into(">I", data, 17, calc_crc32c(bytes(data[21:])))
    return bytes(data)


@dataclass
class _Fetched:
    data: bytes
    high_watermark: int


class FakeLog:
    """A partition's log of batches; a fetch returns whole batches from the one holding the
    offset, about ``max_bytes`` (at least one)."""

    def __init__(self, batches: list[bytes]) -> None:
        self.batches = batches
        self.fetches: list[int] = []
        self.fail = False

    async def fetch(self, tp: TopicPartition, offset: int, max_bytes: int) -> _Fetched:
        self.fetches.append(offset)
        if self.fail:
            raise OSError("broker away")
        out: list[bytes] = []
        for data in self.batches:
            (last,) = [b.last for b in split_batches(data)]
            if last < offset:
                continue
            if out and sum(map(len, out)) + len(data) > max_bytes:
                break
            out.append(data)
        return _Fetched(b"".join(out), 0)

    async def close(self) -> None:
        pass


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_split_batches_stops_at_a_batch_cut_short() -> None:
    data = batch(0, [0, 1]) + batch(2, [2, 3, 4])
    whole = split_batches(data)
    assert [(b.base, b.last) for b in whole] == [(0, 1), (2, 4)]
    assert [(b.base, b.last) for b in split_batches(data[:-3])] == [(0, 1)]
    assert split_batches(b"") == [] and split_batches(data[:20]) == []


def test_split_batches_reads_the_transactional_and_control_flags() -> None:
    (txn,) = split_batches(batch(5, [5], transactional=True))
    (marker,) = split_batches(batch(6, [6], transactional=True, control=True))
    assert txn.transactional and not txn.control
    assert marker.transactional and marker.control


def test_the_cache_keeps_at_most_its_bound_per_partition_oldest_dropped_first() -> None:
    cache = RecordCache(max_bytes=1000)
    chunks = [
        Chunk.of(i * 10, split_batches(batch(i * 10, [i * 10], value_bytes=300))) for i in range(5)
    ]
    for chunk in chunks:
        assert chunk is not None
        cache.put(TP, chunk)
        assert cache.bytes(TP) <= 1000
    assert cache.covering(TP, 40) is chunks[4]
    assert cache.covering(TP, 0) is None  # dropped first
    other = TopicPartition("t", 1)
    assert cache.bytes(other) == 0 and cache.covering(other, 40) is None
    too_big = Chunk.of(100, split_batches(batch(100, [100], value_bytes=2000)))
    assert too_big is not None
    cache.put(TP, too_big)  # larger than the bound: not kept
    assert cache.covering(TP, 100) is None and cache.bytes(TP) <= 1000
    cache.drop(TP)
    assert cache.bytes(TP) == 0


def test_a_chunk_covers_from_the_fetch_offset_to_its_last_batch() -> None:
    chunk = Chunk.of(3, split_batches(batch(0, [0, 1, 2, 3, 4]) + batch(5, [6])))
    assert chunk is not None and (chunk.start, chunk.end) == (0, 7)
    compacted = Chunk.of(3, split_batches(batch(8, [9])))  # 3..7 compacted away
    assert compacted is not None and (compacted.start, compacted.end) == (3, 10)
    assert Chunk.of(3, []) is None


def test_an_answer_carries_the_acquired_records_once_and_a_backlog_hits_the_cache() -> None:
    log = FakeLog([batch(0, [0, 1, 2]), batch(3, [3, 4]), batch(5, [5, 6, 7])])
    records = LeaderRecords(log, max_bytes=1 << 20)

    async def scenario() -> None:
        data, end = await records.carry(TP, [(1, 3, 1), (6, 6, 2)], read_committed=False)
        assert end == 7
        assert [(b.base, b.last) for b in split_batches(data)] == [(0, 2), (3, 4), (5, 7)]
        assert log.fetches == [1]  # one read filled the cache
        data, end = await records.carry(TP, [(4, 7, 1)], read_committed=False)
        assert [(b.base, b.last) for b in split_batches(data)] == [(3, 4), (5, 7)]
        assert end == 8 and log.fetches == [1]
        data, end = await records.carry(TP, [(6, 6, 2), (1, 1, 1)], read_committed=False)
        assert [b.base for b in split_batches(data)] == [0, 5] and end == 7  # in offset order

    run(scenario())


def test_control_batches_are_left_out_and_read_committed_stops_at_a_transaction() -> None:
    log = FakeLog(
        [
            batch(0, [0, 1]),
            batch(2, [2, 3], transactional=True),
            batch(4, [4], transactional=True, control=True),
            batch(5, [5]),
        ]
    )
    records = LeaderRecords(log, max_bytes=1 << 20)

    async def scenario() -> None:
        data, end = await records.carry(TP, [(0, 5, 1)], read_committed=False)
        assert [b.base for b in split_batches(data)] == [0, 2, 5] and end == 6
        data, end = await records.carry(TP, [(0, 5, 1)], read_committed=True)
        assert [b.base for b in split_batches(data)] == [0] and end == 2
        data, end = await records.carry(TP, [(2, 5, 1)], read_committed=True)
        assert (data, end) == (b"", 0)  # nothing carried: the member reads it all

    run(scenario())


def test_an_answer_is_bounded_and_a_failed_read_carries_what_it_has() -> None:
    big = CARRY_MAX_BYTES // 3
    log = FakeLog([batch(i, [i], value_bytes=big) for i in range(5)])
    records = LeaderRecords(log, max_bytes=64 << 20)

    async def scenario() -> None:
        data, end = await records.carry(TP, [(0, 4, 1)], read_committed=False)
        assert len(data) <= CARRY_MAX_BYTES
        assert [b.base for b in split_batches(data)] == [0, 1] and end == 2
        cold = LeaderRecords(FakeLog([]), max_bytes=1 << 20)
        cold.source.fail = True  # type: ignore[attr-defined]
        assert await cold.carry(TP, [(0, 4, 1)], read_committed=False) == (b"", 0)

    run(scenario())


def test_the_wire_field_travels_in_the_binary_form_and_not_in_json() -> None:
    data = batch(0, [0, 1])
    response = protocol.ShareFetchResponse(
        member_id="m",
        request_id=1,
        topic="t",
        partition=0,
        acquired=[(0, 1, 1)],
        records=data,
        records_end=2,
    )
    decoded = protocol.decode_binary(protocol.encode_binary(response))
    assert isinstance(decoded, protocol.ShareFetchResponse)
    assert decoded.records == data and decoded.records_end == 2
    plain = protocol.ShareFetchResponse(member_id="m", request_id=1, topic="t", partition=0)
    assert b"records" not in protocol.encode(plain)
    assert b"records" not in protocol.encode_binary(plain)
    with pytest.raises(InvalidRequestError):
        protocol.decode(
            b'{"kind":"fetch_response","member_id":"m","request_id":1,'
            b'"topic":"t","partition":0,"records_end":"x"}'
        )


def test_the_member_delivers_only_acquired_offsets_and_gaps_the_empty_ones() -> None:
    data = (
        batch(0, [0, 1, 2, 3]) + batch(4, [4, 6]) + batch(7, [7], transactional=True, control=True)
    )
    (records, gaps, bad), rest = carried_records(data, "t", 0, [(1, 2, 3), (5, 9, 1)], 8)
    assert [(r.offset, r.value, r.delivery_count) for r in records] == [
        (1, b"v1", 3),
        (2, b"v2", 3),
        (6, b"v6", 1),
    ]
    assert gaps == [5, 7] and bad == []
    assert rest == [(8, 9, 1)]  # the member reads those itself
    assert records[0].headers == () and records[0].timestamp == 1001


def test_a_carried_batch_with_a_bad_crc_is_refused() -> None:
    data = bytearray(batch(0, [0, 1]))
    data[-1] ^= 0xFF
    with pytest.raises(CorruptRecordException, match="CRC"):
        carried_records(bytes(data), "t", 0, [(0, 1, 1)], 2)
