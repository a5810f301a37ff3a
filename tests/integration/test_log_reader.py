""":class:`queueflow.kafka.log_reader.LogRangeReader` on the real broker: what a new leader
reads back of the requests its host skipped."""

from __future__ import annotations

import asyncio
import uuid

from queueflow.devtools.broker import create_topic
from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.log_reader import LogRangeReader
from queueflow.testing import produce


def test_reads_exactly_the_range_asked_for(kafka_bootstrap: str) -> None:
    topic = f"qf-range-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 2)
    reader = LogRangeReader(KafkaClientConfig(kafka_bootstrap), timeout_s=20.0)

    async def scenario() -> None:
        await produce(kafka_bootstrap, topic, [f"r{i}" for i in range(10)], partition=1)
        got = await reader.read(topic, 1, 3, 7)
        assert got == [(o, f"r{o}".encode()) for o in range(3, 7)]
        assert await reader.read(topic, 1, 9, 10) == [(9, b"r9")]
        assert await reader.read(topic, 1, 5, 5) == []
        assert await reader.read(topic, 0, 0, 0) == []

    asyncio.run(scenario())
