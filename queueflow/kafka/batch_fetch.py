"""Raw record batches of a partition, as the broker stores them (Kafka's Fetch API).

A leader answers direct-path ShareFetches with the acquired records' bytes
(docs/architecture.md "The direct path"): it reads them with one Fetch request and keeps the
record set bytes as they came, without building a Python object per record.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError, for_code
from aiokafka.protocol.fetch import FetchRequest

from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.lifecycle import stop_quietly
from queueflow.structs import TopicPartition

__all__ = ["FetchedBatches", "KafkaBatchFetcher"]


@dataclass(frozen=True, slots=True)
class FetchedBatches:
    """What one Fetch of a partition returned.

    Attributes:
        data: the record set bytes (v2 batches, the last one possibly cut short).
        high_watermark: the partition's log end as of the answer.
    """

    data: bytes
    high_watermark: int


class KafkaBatchFetcher:
    """Fetches record set bytes of partitions with a group-less client
    (``read_uncommitted``: the caller decides what a ``read_committed`` reader may see).

    Args:
        kafka: the cluster.
    """

    def __init__(self, kafka: KafkaClientConfig) -> None:
        self.kafka = kafka
        self._kafka_client: AIOKafkaClient | None = None
        self._lock = asyncio.Lock()

    async def fetch(self, tp: TopicPartition, offset: int, max_bytes: int) -> FetchedBatches:
        """One Fetch of ``tp`` from ``offset`` for about ``max_bytes`` bytes (the broker
        returns at least one whole batch however large).

        Raises:
            aiokafka.errors.KafkaError: the broker refused the fetch (the partition's leader
                is unknown, the offset is out of range ...) or could not be reached.
        """
        client = await self._client()
        ktp = KafkaTopicPartition(tp.topic, tp.partition)
        node = client.cluster.leader_for_partition(ktp)
        if node is None or node < 0:
            await client.add_topic(tp.topic)
            await client.force_metadata_update()
            node = client.cluster.leader_for_partition(ktp)
            if node is None or node < 0:
                raise KafkaError(f"no leader known for {tp.topic}[{tp.partition}]")
        wanted = [(tp.topic, [(tp.partition, offset, max_bytes)])]
        request = FetchRequest(0, 1, max_bytes, 0, wanted)  # no wait, read_uncommitted
        response: Any = await client.send(node, request)
        for _topic, partitions in response.topics:
            for _partition, error_code, highwater, *part_data in partitions:
                error = for_code(error_code)
                if error_code:
                    raise error(f"fetch of {tp.topic}[{tp.partition}] at {offset}")
                return FetchedBatches(bytes(part_data[-1] or b""), int(highwater))
        raise KafkaError(f"the broker's fetch answer holds no {tp.topic}[{tp.partition}]")

    async def _client(self) -> AIOKafkaClient:
        async with self._lock:
            if self._kafka_client is None:
                client = AIOKafkaClient(**self.kafka.client_kwargs())
                try:
                    await client.bootstrap()
                except BaseException:
                    await stop_quietly("record batch fetcher", client.close)
                    raise
                self._kafka_client = client
            return self._kafka_client

    async def close(self) -> None:
        """Close the client."""
        client, self._kafka_client = self._kafka_client, None
        if client is not None:
            await stop_quietly("record batch fetcher", client.close)
