"""The member's read path from bytes: a Kafka record batch of 500 records to ``ShareRecord``s.

The batch (v2, uncompressed, 500 records of a 100-byte value, no key, no headers) is built once
with aiokafka's ``DefaultRecordBatchBuilder`` and its base offset set as a broker's fetch
answer would have it. Each parse then does what a member's read does with a fetch answer
(:class:`queueflow.member.reader.PartitionReader`): aiokafka's ``MemoryRecords`` (with
queueflow's undecodable-record wrapper installed, inside ``undecodable_records()``), its
``PartitionRecords`` iteration (what ``FetchResult.getall`` collects for ``getmany``; inside
``raw_records()`` as the reader reads, so the parser's records, no ``ConsumerRecord``), then
:func:`queueflow.member.reader.share_records`.

* ``read.records.crc``: the whole path with the batch CRC checked (aiokafka's consumer
  ``check_crcs=True``, its default and what the reader's ``AIOKafkaConsumer`` uses);
* ``read.records.nocrc``: the same with ``check_crcs=False``;
* ``read.views.crc`` / ``read.views.nocrc``: :func:`queueflow.member.reader.records_from_batches`
  (the batch-first parse: ``ShareRecord``s straight from aiokafka's batch parser, no
  ``ConsumerRecord``), CRC checked or not;
* ``read.parse``: aiokafka's batch iteration alone (the C ``DefaultRecordBatch`` when the
  extension is built), no CRC, no ``ConsumerRecord``: the floor under the two above;
* ``read.crc``: ``DefaultRecordBatch.validate_crc()`` alone.

All µs per record. No fetch request, no network, no ``getmany`` bookkeeping.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import aiokafka.consumer.fetcher as fetcher
from aiokafka.consumer.fetcher import READ_UNCOMMITTED, PartitionRecords
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition as KafkaTopicPartition

from bench.micro.timing import Result, Sizes, sample, summarize
from queueflow._compat import raw_records, tolerate_undecodable_records, undecodable_records
from queueflow.member.reader import records_from_batches, share_records
from queueflow.structs import ShareRecord

__all__ = ["BATCH_RECORDS", "BENCHMARKS", "parse", "record_batch"]

#: Records in the batch.
BATCH_RECORDS = 500
#: Its base offset.
BASE_OFFSET = 12_345_678
TOPIC, PARTITION = "jobs", 0


def record_batch(records: int = BATCH_RECORDS, base_offset: int = BASE_OFFSET) -> bytes:
    """A v2 record batch as a fetch answer carries it: ``records`` records of a 100-byte value
    from ``base_offset`` (the base offset is outside the batch CRC, so setting it after
    building keeps the CRC valid)."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 22,
    )
    for i in range(records):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=None, value=b"x" * 100, headers=[])
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base_offset)
    return bytes(data)


def parse(data: bytes, check_crcs: bool) -> list[ShareRecord]:
    """The records of ``data`` as a member's read returns them (see the module docstring).

    Raises:
        AssertionError: a record is missing or an offset is a gap (the batch is wrong).
    """
    tp = KafkaTopicPartition(TOPIC, PARTITION)
    out: list[ShareRecord] = []
    gaps: list[int] = []
    with undecodable_records(), raw_records():
        records = fetcher.MemoryRecords(data)  # queueflow's wrapper once installed
        messages = list(
            PartitionRecords(tp, records, [], BASE_OFFSET, None, None, check_crcs, READ_UNCOMMITTED)
        )
    last = BASE_OFFSET + BATCH_RECORDS - 1
    share_records(messages, TOPIC, PARTITION, BASE_OFFSET, last, 1, out, gaps)
    return out


def _iterate(data: bytes) -> int:
    count = 0
    records = MemoryRecords(data)
    while records.has_next():
        for _ in records.next_batch():
            count += 1
    return count


def _crc(data: bytes) -> bool:
    records = MemoryRecords(data)
    ok = True
    while records.has_next():
        ok = records.next_batch().validate_crc() and ok
    return ok


def bench_read(sizes: Sizes) -> list[Result]:
    tolerate_undecodable_records()  # as PartitionReader does
    data = record_batch()
    for crc in (True, False):
        got = parse(data, crc)
        if len(got) != BATCH_RECORDS or got[-1].offset != BASE_OFFSET + BATCH_RECORDS - 1:
            raise AssertionError(f"parsed {len(got)} records, not {BATCH_RECORDS}")
    acquired = [(BASE_OFFSET, BASE_OFFSET + BATCH_RECORDS - 1, 1)]

    def views(crc: bool) -> list[ShareRecord]:
        return records_from_batches(data, TOPIC, PARTITION, acquired, check_crcs=crc)[0]

    if views(True) != parse(data, True):
        raise AssertionError("records_from_batches differs from the consumer's path")
    if _iterate(data) != BATCH_RECORDS or not _crc(data):
        raise AssertionError("the record batch does not iterate or its CRC is wrong")
    batches = sizes.read_batches
    n = batches * BATCH_RECORDS
    cases: list[tuple[str, str, Callable[[], Any]]] = [
        ("read.records.crc", "bytes -> ShareRecords, CRC checked", lambda: parse(data, True)),
        ("read.records.nocrc", "bytes -> ShareRecords, no CRC check", lambda: parse(data, False)),
        ("read.views.crc", "bytes -> ShareRecords direct, CRC checked", lambda: views(True)),
        ("read.views.nocrc", "bytes -> ShareRecords direct, no CRC check", lambda: views(False)),
        ("read.parse", "aiokafka batch iteration only", lambda: _iterate(data)),
        ("read.crc", "batch CRC check only", lambda: _crc(data)),
    ]
    out = []
    for name, what, call in cases:

        def run(call: Callable[[], Any] = call) -> None:
            for _ in range(batches):
                call()

        samples = sample(run, units=n, repeats=sizes.repeats)
        out.append(summarize(name, "record", n, samples, f"{what} ({BATCH_RECORDS}/batch)"))
    return out


#: Name prefix -> the function that runs those benchmarks.
BENCHMARKS: dict[str, Callable[[Sizes], list[Result]]] = {"read": bench_read}
