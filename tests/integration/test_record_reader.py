"""The member's record reader against the real broker: a share-partition's reader connects
when the share-partition is assigned (without its partition, so it fetches nothing), reads
acquired ranges once records are acquired, and gives the partition up again when idle."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from queueflow.kafka.config import KafkaClientConfig
from queueflow.member.reader import KafkaRecordReader
from queueflow.structs import TopicPartition
from queueflow.testing import produce as produce_records

WAIT_S = 20.0


def test_a_prepared_reader_is_connected_and_paused_then_reads_acquired_ranges(
    kafka_bootstrap: str, topic_factory: Callable[..., str]
) -> None:
    topic = topic_factory(1)
    tp = TopicPartition(topic, 0)

    async def scenario() -> None:
        await produce_records(kafka_bootstrap, topic, [f"r{i}" for i in range(5)], partitions=1)
        source = KafkaRecordReader(KafkaClientConfig(kafka_bootstrap))
        source.prepare(tp)
        source.prepare(tp)  # idempotent
        reader = source._readers[tp]
        assert reader._warming is not None
        await asyncio.wait_for(asyncio.shield(reader._warming), WAIT_S)
        assert reader._started and reader.consumer.assignment() == set()  # fetches nothing
        records, gaps, undecodable = await source.read(tp, [(1, 3, 2)], int(WAIT_S * 1000))
        assert [(r.offset, r.value, r.delivery_count) for r in records] == [
            (1, b"r1", 2),
            (2, b"r2", 2),
            (3, b"r3", 2),
        ]
        assert gaps == [] and undecodable == [] and reader.consumer.assignment() == {reader.tp}
        # Idle: the partition is given up (no prefetch, no fetch-routine wake-ups); the next
        # read takes it back and seeks.
        reader._pause_idle()
        assert reader.consumer.assignment() == set()
        records, _, _ = await source.read(tp, [(4, 4, 1)], int(WAIT_S * 1000))
        assert [(r.offset, r.value) for r in records] == [(4, b"r4")]
        await source.drop(tp)
        await source.close()

    asyncio.run(scenario())
