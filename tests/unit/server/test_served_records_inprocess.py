"""Leaders serve records on the direct path, on the in-process cluster (real endpoint over TCP,
real leaders and members; batches built as Kafka stores them, queueflow.testing.batches): a
member reads nothing itself, redeliveries, markers and undecodable records are handled as when
it read them, and the request topics keep member-side reads."""

from __future__ import annotations

from typing import Any

from inprocess_helpers import TOPIC, direct_cluster, run

from queueflow import ACCEPT, RELEASE
from queueflow.member.consumer import ShareConsumer
from queueflow.structs import ShareRecord, TopicPartition

TP = TopicPartition(TOPIC, 0)


def counted_reads(consumer: ShareConsumer) -> list[int]:
    """Every offset the member's own record reader is asked for, appended to the list."""
    session = consumer._session
    assert session is not None
    source, asked = session._source, []
    inner = source.read

    async def read(tp: TopicPartition, acquired: list[Any], *args: Any) -> Any:
        asked.extend(o for first, last, _ in acquired for o in range(first, last + 1))
        return await inner(tp, acquired, *args)

    source.read = read  # type: ignore[method-assign,assignment]
    return asked


async def poll_until(consumer: ShareConsumer, count: int, ack: Any = None) -> list[ShareRecord]:
    got: list[ShareRecord] = []
    for _ in range(50):
        if len(got) >= count:
            break
        for record in await consumer.poll(timeout_ms=500):
            got.append(record)
            if ack is not None:
                consumer.acknowledge(record, ack(record))
    assert len(got) == count, [(r.offset, r.delivery_count) for r in got]
    return got


def test_a_direct_member_reads_nothing_itself_and_redeliveries_come_back_whole() -> None:
    async def scenario() -> None:
        async with direct_cluster(records=0, leader_record_cache_bytes=300) as cluster:
            for i in range(30):
                cluster.produce(TOPIC, f"r{i}".encode(), key=b"k", headers=(("h", b"1"),))
            cluster.produce(TOPIC, None)  # a marker: a gap
            cluster.produce(TOPIC, b"last")
            consumer = cluster.consumer("g", acknowledgement_mode="explicit")
            await consumer.subscribe([TOPIC])
            asked = counted_reads(consumer)

            def outcome(record: ShareRecord) -> Any:
                return RELEASE if record.delivery_count == 1 and record.offset % 3 == 0 else ACCEPT

            got = await poll_until(consumer, 31 + 10, outcome)
            await consumer.commit_sync()
            firsts = [r for r in got if r.delivery_count == 1]
            assert [r.offset for r in firsts] == [*range(30), 31]
            assert [r.value for r in firsts] == [f"r{i}".encode() for i in range(30)] + [b"last"]
            assert firsts[0].key == b"k" and firsts[0].headers == (("h", b"1"),)
            again = sorted(r.offset for r in got if r.delivery_count == 2)
            assert again == [o for o in range(30) if o % 3 == 0]
            assert {r.value for r in got if r.delivery_count == 2} == {
                f"r{o}".encode() for o in again
            }
            assert asked == []  # every record came in the leader's answers
            assert cluster.batches.fetches > 1  # a 300-byte cache: the redeliveries read again
            await consumer.close()

    run(scenario())


def test_undecodable_records_carried_are_rejected_and_the_others_handled() -> None:
    async def scenario() -> None:
        async with direct_cluster(records=0) as cluster:
            for i in range(5):
                headers = ((b"\xff\xfebad", b"h"),) if i == 2 else (("ok", b"1"),)
                cluster.produce(TOPIC, f"r{i}".encode(), headers=headers)
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            asked = counted_reads(consumer)
            got = await poll_until(consumer, 4)
            assert [r.offset for r in got] == [0, 1, 3, 4] and asked == []
            session = consumer._session
            assert session is not None and session.undecodable == 1
            await consumer.close()

    run(scenario())


def test_with_carrying_off_the_member_reads_as_before() -> None:
    async def scenario() -> None:
        async with direct_cluster(records=3, leader_record_cache_bytes=0) as cluster:
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            asked = counted_reads(consumer)
            got = await poll_until(consumer, 3)
            assert [r.value for r in got] == [b"r0", b"r1", b"r2"] and asked == [0, 1, 2]
            assert cluster.batches.fetches == 0
            await consumer.close()

    run(scenario())


def test_a_leader_that_stops_leading_a_partition_releases_its_cached_batches() -> None:
    """Revoked (a rebalance) or stepped down: the endpoint's record cache of that partition is
    dropped at once, the other partitions' kept."""

    async def scenario() -> None:
        async with direct_cluster(records=8, partitions=2) as cluster:
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            await poll_until(consumer, 8)
            assert cluster.endpoint is not None and cluster.endpoint.records is not None
            cache = cluster.endpoint.records.cache
            other = TopicPartition(TOPIC, 1)
            assert cache.bytes(TP) > 0 and cache.bytes(other) > 0
            leader = cluster.leaders[TOPIC]
            leader.revoke({0})
            assert cache.bytes(TP) == 0 and cache.covering(TP, 0) is None
            assert cache.bytes(other) > 0
            leader.step_down([1], "a test")
            assert cache.bytes(other) == 0
            await consumer.close()

    run(scenario())
