"""The partition reader's cache of RELEASEd records (``queueflow.member.reader``), no Kafka."""

from __future__ import annotations

import asyncio

from queueflow.kafka.config import KafkaClientConfig
from queueflow.member import reader as reader_module
from queueflow.structs import ShareRecord


def record(offset: int, key: bytes = b"k") -> ShareRecord:
    return ShareRecord(
        "t", 0, offset, key, b"v%d" % offset, [("h", b"1")], 1000 + offset, 1, b"v%d" % offset, key
    )


def reader() -> reader_module.PartitionReader:
    async def make() -> reader_module.PartitionReader:
        # never started: no connection; stopped, so its consumer is not left unclosed
        partition_reader = reader_module.PartitionReader(KafkaClientConfig("localhost:1"), "t", 0)
        await partition_reader.consumer.stop()
        return partition_reader

    return asyncio.run(make())


def test_redelivery_of_a_released_range_comes_from_the_cache() -> None:
    r = reader()
    for o in (5, 6, 7):
        decoded = record(o)
        decoded.key, decoded.value = "decoded key", {"decoded": o}  # what a share agent does
        r.remember_released(decoded)
    out: list[ShareRecord] = []
    assert r._take_released(5, 6, 2, out)
    assert [(x.offset, x.key, x.value, x.delivery_count, x.timestamp) for x in out] == [
        (5, b"k", b"v5", 2, 1005),
        (6, b"k", b"v6", 2, 1006),
    ]
    assert list(r.released) == [7]  # served records leave the cache


def test_a_range_only_partly_cached_is_read_from_kafka() -> None:
    r = reader()
    r.remember_released(record(5))
    out: list[ShareRecord] = []
    assert not r._take_released(5, 6, 2, out)
    assert out == [] and list(r.released) == [5]


def test_the_cache_is_bounded_oldest_first(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(reader_module, "RELEASED_CACHE_RECORDS", 3)
    r = reader()
    for o in range(5):
        r.remember_released(record(o))
    assert list(r.released) == [2, 3, 4]
