"""A record that can't be decoded (a header name that is not UTF-8) costs that record only: a
ShareConsumer and a share agent REJECT it, logged, and go on (in-process cluster); and the
aiokafka seam that reads such a record instead of failing for good
(:func:`queueflow._compat.undecodable_records`)."""

from __future__ import annotations

import struct

import pytest
from inprocess_helpers import TOPIC, events, run, settings, until
from structlog.testing import capture_logs

from queueflow import _compat
from queueflow.structs import ShareRecord
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster

GOOD = 25
BAD_AT = 12


def cluster_with_a_bad_record(clock: FakeClock) -> InProcessCluster:
    cluster = InProcessCluster({TOPIC: 1}, clock=clock, settings=settings())
    for i in range(GOOD + 1):
        headers = ((b"\xff\xfebad", b"h"),) if i == BAD_AT else (("ok", b"1"),)
        cluster.produce(TOPIC, f"r{i}".encode(), headers=headers)
    return cluster


def test_a_share_consumer_rejects_an_undecodable_record_and_goes_on() -> None:
    clock = FakeClock()

    async def scenario() -> None:
        async with cluster_with_a_bad_record(clock) as cluster:
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            got: list[ShareRecord] = []
            with capture_logs() as logs:
                while len(got) < GOOD:
                    got += await consumer.poll(timeout_ms=100)
                    clock.advance(10)
                await consumer.commit_sync()
            assert sorted(r.offset for r in got) == [o for o in range(GOOD + 1) if o != BAD_AT]
            (line,) = events(logs, "undecodable_record_rejected")
            assert line["offset"] == BAD_AT and "UTF-8" in line["error"]
            view = cluster.share_partition("g", TOPIC, 0)
            await until(lambda: int(view.start_offset) == GOOD + 1, "all settled", clock)
            assert view.archived_total == 1 and line["delivery_count"] == 1  # REJECTed at once
            await consumer.close()

    run(scenario())


@pytest.mark.parametrize("batch", [False, True])
def test_a_share_agent_rejects_an_undecodable_record_and_goes_on(batch: bool) -> None:
    clock = FakeClock()
    handled: set[int] = set()

    async def handler(record: ShareRecord) -> None:
        handled.add(record.offset)

    async def batch_handler(records: list[ShareRecord]) -> None:
        handled.update(r.offset for r in records)

    async def scenario() -> None:
        async with cluster_with_a_bad_record(clock) as cluster:
            with capture_logs() as logs:
                agent = await cluster.agent(
                    batch_handler if batch else handler, TOPIC, "g", batch=batch
                )
                view = cluster.share_partition
                await until(lambda: len(handled) == GOOD, "every good record handled", clock)
                await until(
                    lambda: int(view("g", TOPIC, 0).start_offset) == GOOD + 1, "settled", clock
                )
            assert BAD_AT not in handled
            assert agent.stats.undecodable == 1 and agent.stats.rejected == 1
            assert [e["offset"] for e in events(logs, "undecodable_record_rejected")] == [BAD_AT]

    run(scenario())


def bad_batch(
    base_offset: int, bad: set[int], records: int = 5, compression_type: int = 0
) -> bytes:
    """A v2 record batch (as fetched) whose records at ``bad`` have a non-UTF-8 header name."""
    from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy

    class Bytes(str):
        def encode(self, *args: object, **kwargs: object) -> bytes:  # type: ignore[override]
            return b"\xff\xfename"

    builder = _DefaultRecordBatchBuilderPy(
        magic=2,
        compression_type=compression_type,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for i in range(records):
        headers = [(Bytes("x"), b"h")] if i in bad else [("ok", b"1")]
        builder.append(i, timestamp=None, key=b"k", value=b"v%d" % i, headers=headers)
    data = bytes(builder.build())
    return struct.pack(">q", base_offset) + data[8:]


@pytest.mark.parametrize(
    ("bad", "compression_type"),
    [({1, 3}, 0), ({0}, 0), ({4}, 0), ({0, 1, 2, 3, 4}, 0), ({2}, 1)],
    ids=["two", "first", "last", "all", "gzip"],
)
def test_the_seam_reads_past_undecodable_records_only_when_asked(
    bad: set[int], compression_type: int
) -> None:
    import aiokafka.consumer.fetcher as fetcher

    _compat.tolerate_undecodable_records()
    _compat.tolerate_undecodable_records()  # idempotent
    data = bad_batch(100, bad, compression_type=compression_type)
    batch = fetcher.MemoryRecords(data).next_batch()
    with pytest.raises(UnicodeDecodeError):  # aiokafka's own behaviour elsewhere
        list(batch)
    with _compat.undecodable_records() as seen:
        batch = fetcher.MemoryRecords(data).next_batch()
        assert batch.validate_crc() and batch.base_offset == 100
        records = list(batch)
    assert [r.offset for r in records] == [100, 101, 102, 103, 104]
    assert [r.value for r in records] == [b"v0", b"v1", b"v2", b"v3", b"v4"]
    for i, record in enumerate(records):
        expected = [("\ufffd\ufffdname", b"h")] if i in bad else [("ok", b"1")]
        assert record.headers == expected
    assert [offset for offset, _ in seen] == sorted(100 + i for i in bad)
