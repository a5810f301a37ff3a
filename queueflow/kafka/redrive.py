"""Redrive: move the records of a dead-letter topic back to their source topics (SQS's
"redrive"; docs/guide.md "Dead-letter topics").

Each DLQ record names its source in its ``queueflow.dead_letter.*`` headers. The redrive reads
the DLQ topic with a consumer group of its own (``queueflow-redrive-<app>-<group>``), produces
each record back (``acks=all``, idempotent) to its source topic and partition (or to ``to``),
and commits the group's offsets after every produced batch. So it is safe to interrupt: a run
started again resumes after the last committed batch; a batch produced but not committed when
it stopped is produced once more (at least once). It stops at the DLQ's end offsets as of its
start, so records dead-lettered again meanwhile wait for the next redrive.

A DLQ record without the source's key and value (no key, an empty value:
``errors.deadletterqueue.copy.record.enable`` was false) is redriven from the source record
itself, read by offset; if retention deleted it, it is skipped and counted in
:attr:`RedriveResult.missing`. Records without the headers are counted in
:attr:`RedriveResult.skipped` (their offsets are committed: they can't be redriven).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition

from queueflow.errors import ConfigurationError
from queueflow.kafka.admin import admin_client, existing_partition_counts
from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.lifecycle import stop_quietly
from queueflow.protocol.dead_letters import HEADER_PREFIX, source_of

__all__ = ["REDRIVE_HEADER", "RedriveResult", "redrive", "redrive_group_id"]

#: The header a redriven record carries: ``<dlq topic>:<partition>:<offset>`` it came from.
REDRIVE_HEADER: Final = "queueflow.redriven_from"
_BATCH: Final = 500


@dataclass(frozen=True, slots=True)
class RedriveResult:
    """What a redrive moved (or, with ``dry_run``, would move).

    Attributes:
        dead_letter_topic: the DLQ topic read.
        moved: records produced (or to produce) per destination topic.
        skipped: DLQ records without ``queueflow.dead_letter.*`` headers naming a source.
        missing: records without a copy whose source record is gone from the log.
        dry_run: nothing was produced or committed.
    """

    dead_letter_topic: str
    moved: dict[str, int] = field(default_factory=dict)
    skipped: int = 0
    missing: int = 0
    dry_run: bool = False


def redrive_group_id(app_id: str, group: str) -> str:
    """The consumer group a redrive of ``group``'s DLQ commits its progress in."""
    return f"queueflow-redrive-{app_id}-{group}"


async def redrive(
    kafka: KafkaClientConfig,
    dead_letter_topic: str,
    group_id: str,
    *,
    to: str | None = None,
    dry_run: bool = False,
    timeout_s: float = 30.0,
) -> RedriveResult:
    """Move ``dead_letter_topic``'s records back (see the module docstring).

    Args:
        kafka: the cluster.
        dead_letter_topic: the DLQ topic.
        group_id: the consumer group that keeps the redrive's progress
            (:func:`redrive_group_id`).
        to: produce every record to this topic (default partitioner) instead of its source.
        dry_run: count only: nothing produced, no offsets committed.
        timeout_s: the longest wait (s) for a fetch that brings nothing before the end.

    Raises:
        ConfigurationError: the DLQ topic (or ``to``) does not exist.
        aiokafka.errors.KafkaError: the cluster could not be reached or written.
    """
    counts = await _partition_counts(kafka, [dead_letter_topic, *([to] if to else [])])
    if dead_letter_topic not in counts:
        raise ConfigurationError(
            f"the dead-letter topic {dead_letter_topic!r} does not exist: check the group's "
            "errors.deadletterqueue.topic.name"
        )
    if to is not None and to not in counts:
        raise ConfigurationError(f"the redrive destination topic {to!r} does not exist")
    consumer = AIOKafkaConsumer(
        **kafka.client_kwargs(),
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    producer = AIOKafkaProducer(**kafka.client_kwargs(), acks="all", enable_idempotence=True)
    reader = AIOKafkaConsumer(**kafka.client_kwargs(), enable_auto_commit=False)
    try:
        await consumer.start()
        await reader.start()
        if not dry_run:
            await producer.start()
        run = _Redrive(consumer, producer, reader, dead_letter_topic, to, dry_run)
        return await run.all(list(range(counts[dead_letter_topic])), timeout_s)
    finally:
        await stop_quietly("redrive producer", producer.stop)
        await stop_quietly("redrive reader", reader.stop)
        await stop_quietly("redrive consumer", consumer.stop)


async def _partition_counts(kafka: KafkaClientConfig, names: list[str]) -> dict[str, int]:
    admin = admin_client(kafka)
    try:
        await admin.start()
        return await existing_partition_counts(admin, names)
    finally:
        await stop_quietly("redrive admin", admin.close)


class _Redrive:
    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        reader: AIOKafkaConsumer,
        topic: str,
        to: str | None,
        dry_run: bool,
    ) -> None:
        self.consumer, self.producer, self.reader = consumer, producer, reader
        self.topic, self.to, self.dry_run = topic, to, dry_run
        self.moved: Counter[str] = Counter()
        self.skipped = self.missing = 0

    async def all(self, partitions: list[int], timeout_s: float) -> RedriveResult:
        tps = [KafkaTopicPartition(self.topic, p) for p in partitions]
        self.consumer.assign(tps)
        ends = await self.consumer.end_offsets(tps)
        loop = asyncio.get_running_loop()
        left = {tp for tp in tps if await self.consumer.position(tp) < ends[tp]}
        quiet_since = loop.time()
        while left and loop.time() - quiet_since < timeout_s:
            batches = await self.consumer.getmany(*left, timeout_ms=500, max_records=_BATCH)
            if batches:
                quiet_since = loop.time()
            for tp, records in batches.items():
                records = [r for r in records if r.offset < ends[tp]]
                await self._move(records)
                if not self.dry_run and records:
                    await self.consumer.commit({tp: records[-1].offset + 1})
            for tp in list(left):
                if await self.consumer.position(tp) >= ends[tp]:
                    left.discard(tp)
        if left:
            raise TimeoutError(f"the redrive of {self.topic!r} did not reach its end offsets")
        return RedriveResult(self.topic, dict(self.moved), self.skipped, self.missing, self.dry_run)

    async def _move(self, records: list[Any]) -> None:
        """Produce ``records`` back and wait until every one is acknowledged."""
        futures = []
        for r in records:
            headers = [(k, bytes(v)) for k, v in (r.headers or ())]
            source = source_of(headers)
            if source is None:
                self.skipped += 1
                continue
            topic, partition, offset = source
            key, value = r.key, r.value
            kept = [h for h in headers if not h[0].startswith(HEADER_PREFIX)]
            if key is None and not value:  # no copy: the source record itself
                original = await self._read(topic, partition, offset)
                if original is None:
                    self.missing += 1
                    continue
                key, value, kept = original
            dest = self.to or topic
            self.moved[dest] += 1
            if self.dry_run:
                continue
            kept.append((REDRIVE_HEADER, f"{self.topic}:{r.partition}:{r.offset}".encode()))
            part = None if self.to else partition
            futures.append(
                await self.producer.send(dest, value, key=key, partition=part, headers=kept)
            )
        await asyncio.gather(*futures)

    async def _read(
        self, topic: str, partition: int, offset: int
    ) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]] | None:
        tp = KafkaTopicPartition(topic, partition)
        self.reader.assign([tp])
        self.reader.seek(tp, offset)
        batch = await self.reader.getmany(tp, timeout_ms=2000, max_records=1)
        for record in batch.get(tp, []):
            if record.offset == offset:
                return record.key, record.value, [(k, bytes(v)) for k, v in record.headers or ()]
        return None
