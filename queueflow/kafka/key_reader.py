"""Reading the keys of a source partition, outside any consumer group, for key-ordered share
groups (``share.ordering=key``; docs/architecture.md "Key-ordered sharing").

A share-partition leader of a key-ordered group tails its source partition from the SPSO with
one group-less consumer per share-partition and indexes each record's key hash
(:mod:`queueflow.server.leader.key_index`). Only the keys are kept. The same reader finds the
offsets without a record (:mod:`queueflow.server.leader.holes`).
"""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition

from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.lifecycle import stop_quietly
from queueflow.structs import TopicPartition

__all__ = ["KafkaKeySource", "KafkaKeyTail"]


class KafkaKeyTail:
    """Reads one partition's keys with a group-less consumer (see :class:`KafkaKeySource`)."""

    def __init__(self, consumer: AIOKafkaConsumer, tp: KafkaTopicPartition) -> None:
        self._consumer = consumer
        self._tp = tp
        self._position: int | None = None

    async def read(
        self, start: int, max_records: int, wait_ms: int
    ) -> tuple[list[tuple[int, bytes | None]], int]:
        """Up to ``max_records`` ``(offset, key)`` from ``start`` on (waiting at most
        ``wait_ms``) and the offset to read next; offsets deleted by retention are skipped.

        Raises:
            aiokafka.errors.KafkaError: the broker call failed.
        """
        consumer, tp = self._consumer, self._tp
        if self._position != start:
            consumer.seek(tp, start)
        batch = await consumer.getmany(tp, timeout_ms=wait_ms, max_records=max(max_records, 1))
        records = [(r.offset, r.key) for r in batch.get(tp, []) if r.offset >= start]
        following = records[-1][0] + 1 if records else start
        # The consumer's position passes offsets without a record (markers, compaction).
        position = max(following, await consumer.position(tp))
        self._position = position
        return records, position

    async def close(self) -> None:
        """Stop the consumer."""
        await stop_quietly("key reader", self._consumer.stop)


class KafkaKeySource:
    """Opens :class:`KafkaKeyTail` readers on the cluster ``kafka``."""

    def __init__(self, kafka: KafkaClientConfig) -> None:
        self.kafka = kafka

    async def open(self, tp: TopicPartition, *, read_committed: bool = False) -> KafkaKeyTail:
        """A key reader of ``tp`` (``read_committed``: aborted records are skipped, as
        transaction markers are).

        Raises:
            aiokafka.errors.KafkaError: the consumer could not start (the broker is down).
        """
        consumer = AIOKafkaConsumer(
            **self.kafka.client_kwargs(),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed" if read_committed else "read_uncommitted",
        )
        try:
            await consumer.start()
        except BaseException:
            await stop_quietly("key reader", consumer.stop)
            raise
        ktp = KafkaTopicPartition(tp.topic, tp.partition)
        consumer.assign([ktp])
        return KafkaKeyTail(consumer, ktp)
