"""What a browse reads, from Kafka (:class:`~queueflow.member.browse.BrowseSource`): the app's
compacted changelogs and the source topic's records, with group-less consumers that commit
nothing (docs/guide.md "Browsing")."""

from __future__ import annotations

import time
from collections.abc import Mapping

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition

from queueflow._compat import tolerate_undecodable_records
from queueflow.kafka.admin import admin_client, existing_partition_counts
from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.lifecycle import stop_quietly
from queueflow.kafka.log_reader import read_latest
from queueflow.member.browse import LogRecord
from queueflow.structs import TopicPartition

__all__ = ["KafkaBrowseSource"]


class KafkaBrowseSource:
    """:class:`~queueflow.member.browse.BrowseSource` over Kafka.

    Args:
        kafka: the cluster.
        timeout_ms: how long one read (a changelog to its end, a partition's records) may take.
    """

    def __init__(self, kafka: KafkaClientConfig, timeout_ms: int = 30_000) -> None:
        self.kafka = kafka
        self.timeout_ms = timeout_ms

    async def partition_count(self, topic: str) -> int | None:
        """See :meth:`~queueflow.member.browse.BrowseSource.partition_count`."""
        admin = admin_client(self.kafka)
        await admin.start()
        try:
            return (await existing_partition_counts(admin, [topic])).get(topic)
        finally:
            await admin.close()

    async def table(self, topic: str) -> Mapping[bytes, bytes] | None:
        """See :meth:`~queueflow.member.browse.BrowseSource.table` (tombstones delete).

        Raises:
            TimeoutError: not read to its end within ``timeout_ms``.
        """
        count = await self.partition_count(topic)
        if not count:
            return None
        consumer = await self._consumer("read_uncommitted")
        try:
            return await read_latest(consumer, topic, count, self.timeout_ms)
        finally:
            await stop_quietly("browse changelog consumer", consumer.stop)

    async def read(
        self, tp: TopicPartition, from_offset: int | None, max_records: int, read_committed: bool
    ) -> tuple[list[LogRecord], int]:
        """See :meth:`~queueflow.member.browse.BrowseSource.read`.

        Raises:
            TimeoutError: the records can't be read within ``timeout_ms``.
        """
        tolerate_undecodable_records()
        consumer = await self._consumer("read_committed" if read_committed else "read_uncommitted")
        ktp = KafkaTopicPartition(tp.topic, tp.partition)
        try:
            consumer.assign([ktp])
            start = (await consumer.beginning_offsets([ktp]))[ktp]
            end = (await consumer.end_offsets([ktp]))[ktp]
            first = start if from_offset is None else min(max(from_offset, start), end)
            consumer.seek(ktp, first)
            out: list[LogRecord] = []
            deadline = time.monotonic() + self.timeout_ms / 1000
            while len(out) < max_records and await consumer.position(ktp) < end:
                self._check(deadline, f"{tp.topic}[{tp.partition}]")
                batch = await consumer.getmany(
                    ktp, timeout_ms=200, max_records=max_records - len(out)
                )
                out += [
                    LogRecord(m.offset, m.key, m.value, tuple(m.headers), m.timestamp)
                    for m in batch.get(ktp, [])
                    if m.offset < end
                ]
            return out[:max_records], first
        finally:
            await stop_quietly("browse record consumer", consumer.stop)

    def _check(self, deadline: float, what: str) -> None:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"could not read {what} within {self.timeout_ms} ms; check the cluster, or "
                "raise the timeout"
            )

    async def _consumer(self, isolation_level: str) -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(
            **self.kafka.client_kwargs(f"{self.kafka.client_id}-browse"),
            group_id=None,
            enable_auto_commit=False,
            isolation_level=isolation_level,
        )
        await consumer.start()
        return consumer
