"""Test topics read back: partition 0 from its start to its end as of now, with a plain
group-less aiokafka consumer (what the broker holds, for tests to compare with), and the
configs of a topic the log cleaner compacts within seconds."""

from __future__ import annotations

import time
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition

#: Topic configs that let the log cleaner compact within seconds: every append after 100 ms
#: rolls a segment, and any dirty segment is worth cleaning.
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "100",
}


async def read_partition(
    bootstrap: str,
    topic: str,
    isolation_level: str = "read_uncommitted",
    timeout_s: float = 20.0,
) -> tuple[list[Any], int]:
    """(every record of partition 0 of ``topic`` up to its end now, that end offset);
    ``read_committed``: up to the last stable offset, committed records only. Fails the test
    if the end is not reached within ``timeout_s`` (s)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, isolation_level=isolation_level
    )
    await consumer.start()
    try:
        tp = KafkaTopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while await consumer.position(tp) < end:
            assert time.monotonic() < deadline, f"{topic}: read {len(out)} records, not to {end}"
            batches = await consumer.getmany(tp, timeout_ms=500)
            out += batches.get(tp, [])
        return out, end
    finally:
        await consumer.stop()


async def log_offsets(bootstrap: str, topic: str, timeout_s: float = 40.0) -> tuple[list[int], int]:
    """(offsets of the records a read_uncommitted reader finds in partition 0 of ``topic``
    from the start, log end)."""
    records, end = await read_partition(bootstrap, topic, timeout_s=timeout_s)
    return [r.offset for r in records], end
