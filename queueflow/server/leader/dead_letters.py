"""The DLQ writer of a leader: writes the records its share-partitions hold for their group's
dead-letter topic, then archives them (KIP-1191 ``errors.deadletterqueue.topic.name``;
docs/guide.md "Dead-letter topics").

With a DLQ set for a group, every archive transition of the engine except a GAP holds the
record Acquired by :data:`~queueflow.engine.reserved.DEAD_LETTER_OWNER` (durable, like any
lock). Each round this writer finds the held records of the share-partitions the leader serves,
reads them back from the source topic by offset (raw key, value, headers), produces one DLQ
record each with ``acks=all`` and, once every send is acknowledged, archives them through the
engine under the request partition's lock, as the request and direct paths change state. A
leader that stops between the send and the archive leaves them held: its successor writes them
again, so the DLQ gets every archived record at least once.

A DLQ topic that does not exist or can't be written leaves the records held (never lost, never
delivered again): ``dead_letter_write_failed`` names the topic and what to do, the writer
retries with back-off (1 s doubling to 30 s), and the records show as "Archiving (dead
letter)" in ``queueflow share-groups --describe --verbose`` and in
``queueflow_dead_letter_pending_records``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition

from queueflow._compat import tolerate_undecodable_records, undecodable_records
from queueflow.engine.partition import RunView
from queueflow.errors import FencedStateEpochError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.lifecycle import stop_quietly
from queueflow.logging import get_logger
from queueflow.protocol.dead_letters import DeadLetterRecord, SourceRecord, dead_letter_record
from queueflow.server.durable import DurableSharePartition
from queueflow.server.leader.dead_letter_notes import dead_letter_reason
from queueflow.server.leader.results import LeaderResult, LogEvent
from queueflow.settings import StateDurability

if TYPE_CHECKING:
    from queueflow.server.leader.manager import ShareLeader

__all__ = ["DeadLetterIO", "DeadLetterWriter", "KafkaDeadLetterIO"]

#: The most records one round writes per share-partition.
BATCH_RECORDS: Final = 500
#: Back-off (s) after a failed write of a share-partition's records: first, then doubling to max.
BACKOFF_FIRST_S: Final = 1.0
BACKOFF_MAX_S: Final = 30.0
#: How long (s) the writer waits between rounds when there was nothing to write.
IDLE_WAIT_S: Final = 0.2


class DeadLetterTopicMissing(Exception):
    """The group's dead-letter topic does not exist (nothing is auto-created)."""


class DeadLetterIO(Protocol):
    """Reads source records by offset and produces DLQ records (:class:`KafkaDeadLetterIO`)."""

    async def read(
        self, topic: str, partition: int, runs: list[tuple[int, int]]
    ) -> dict[int, SourceRecord]:
        """The records of ``topic[partition]`` in the inclusive ``runs``, by offset (offsets
        without a record are absent)."""
        ...

    async def send(self, topic: str, records: list[DeadLetterRecord]) -> None:
        """Produce ``records`` to ``topic``; return once every one is acknowledged by the
        in-sync replicas (``acks=all``). Raises what the producer raises."""
        ...

    async def close(self) -> None:
        """Close the clients."""
        ...


class KafkaDeadLetterIO:
    """:class:`DeadLetterIO` on aiokafka: an idempotent ``acks=all`` producer and a group-less
    consumer that reads by offset (as :class:`~queueflow.kafka.log_reader.LogRangeReader`).

    Args:
        kafka: the cluster.
        read_timeout_s: how long one read may take (s).
    """

    def __init__(self, kafka: KafkaClientConfig, read_timeout_s: float = 10.0) -> None:
        tolerate_undecodable_records()  # a record with a non-UTF-8 header name is read too
        self.kafka = kafka
        self.read_timeout_s = read_timeout_s
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None

    async def _clients(self) -> tuple[AIOKafkaProducer, AIOKafkaConsumer]:
        if self._producer is None:
            producer = AIOKafkaProducer(
                **self.kafka.client_kwargs(), acks="all", enable_idempotence=True
            )
            try:
                await producer.start()
            except BaseException:
                await stop_quietly("dead-letter producer", producer.stop)
                raise
            self._producer = producer
        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                **self.kafka.client_kwargs(),
                enable_auto_commit=False,
                auto_offset_reset="earliest",
            )
            try:
                await consumer.start()
            except BaseException:
                await stop_quietly("dead-letter reader", consumer.stop)
                raise
            self._consumer = consumer
        return self._producer, self._consumer

    async def read(
        self, topic: str, partition: int, runs: list[tuple[int, int]]
    ) -> dict[int, SourceRecord]:
        """See :meth:`DeadLetterIO.read`.

        Raises:
            aiokafka.errors.KafkaError: the broker could not be reached.
            TimeoutError: a run was not read to its end within ``read_timeout_s`` (a partial
                read would write records without their payload).
        """
        _producer, consumer = await self._clients()
        tp = KafkaTopicPartition(topic, partition)
        consumer.assign([tp])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.read_timeout_s
        out: dict[int, SourceRecord] = {}
        for first, last in runs:
            consumer.seek(tp, first)
            position = first
            while position <= last and loop.time() < deadline:
                with undecodable_records():  # its header names come with U+FFFD
                    wanted = last - position + 1
                    batch = await consumer.getmany(tp, timeout_ms=200, max_records=wanted)
                for record in batch.get(tp, []):
                    position = record.offset + 1
                    if first <= record.offset <= last:
                        headers = tuple((k, bytes(v)) for k, v in (record.headers or ()))
                        out[record.offset] = SourceRecord(
                            record.offset, record.key, record.value, headers
                        )
                if not batch:  # offsets without records (retention, markers) are skipped
                    position = max(position, await consumer.position(tp))
            if position <= last:  # not a missing record: a slow read, tried again later
                raise TimeoutError(
                    f"{topic}[{partition}] was read up to offset {position} of {first}..{last} "
                    f"within {self.read_timeout_s} s"
                )
        return out

    async def send(self, topic: str, records: list[DeadLetterRecord]) -> None:
        """See :meth:`DeadLetterIO.send`."""
        producer, _consumer = await self._clients()
        futures = [
            await producer.send(topic, value=r.value, key=r.key, headers=list(r.headers))
            for r in records
        ]
        await asyncio.gather(*futures)

    async def close(self) -> None:
        """Stop the producer and the reader."""
        if self._producer is not None:
            await stop_quietly("dead-letter producer", self._producer.stop)
            self._producer = None
        if self._consumer is not None:
            await stop_quietly("dead-letter reader", self._consumer.stop)
            self._consumer = None


class DeadLetterWriter:
    """Writes one leader's held dead letters (see the module docstring).

    Args:
        leader: the share-partition leaders of one source topic.
        io: reads the source records and produces the DLQ records.
    """

    def __init__(self, leader: ShareLeader, io: DeadLetterIO) -> None:
        self.leader = leader
        self.io = io
        self._task: asyncio.Task[None] | None = None
        #: (group, partition) -> (failures in a row, monotonic time of the next try).
        self._retry: dict[tuple[str, int], tuple[int, float]] = {}
        self._pending: set[tuple[str, int]] = set()
        self._log = get_logger("queueflow.server.leader", topic=leader.topic)

    def start(self) -> None:
        """Start the writing task (idempotent)."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        """Stop writing and close the clients (records still held stay held: durable)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        await self.io.close()

    async def _run(self) -> None:
        while True:
            try:
                busy = await self.round()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one round stop the writer
                self._log.exception("dead_letter_writer_failed")
                busy = False
            await asyncio.sleep(0 if busy else IDLE_WAIT_S)

    async def round(self) -> bool:
        """Write (up to :data:`BATCH_RECORDS` per share-partition) and archive the held records
        of every share-partition served now whose back-off is over; True if any was written."""
        wrote = False
        now = time.monotonic()
        held_now: set[tuple[str, int]] = set()
        for key, durable in self.leader.cache.live():
            runs = durable.engine.dead_letters()
            self._gauge(key, runs)
            if not runs:
                self._retry.pop(key, None)
                continue
            held_now.add(key)
            failures, due = self._retry.get(key, (0, 0.0))
            if now < due:
                continue
            try:
                wrote = await self._write(durable, runs) or wrote
                self._retry.pop(key, None)
            except asyncio.CancelledError:
                raise
            except FencedStateEpochError:
                continue  # no longer the leader: the new one writes them
            except Exception as exc:
                self._failed(durable, runs, failures + 1, exc)
                # Fresh clients for the next attempt: after a broker restart an aiokafka
                # client can stay without a usable broker (NodeNotReadyError, node id None).
                await self.io.close()
        for key in self._pending - held_now:  # moved away or all written
            self._gauge(key, [])
        self._pending = held_now
        return wrote

    def _gauge(self, key: tuple[str, int], runs: list[RunView]) -> None:
        if runs or key in self._pending:
            held = sum(r.last_offset - r.first_offset + 1 for r in runs)
            labels = (key[0], self.leader.topic, str(key[1]))
            self.leader.ctx.metrics.dead_letter_pending.labels(*labels).set(held)

    async def _write(self, durable: DurableSharePartition, runs: list[RunView]) -> bool:
        """Write a batch of ``durable``'s held records to its group's DLQ, then archive them.

        Raises:
            DeadLetterTopicMissing: the topic does not exist.
            Exception: what reading, producing or the state write raises (nothing archived).
        """
        leader = self.leader
        group, partition = durable.group, durable.partition
        topic, copy_record, known = leader.group_configs.dead_letter(group)
        runs = _first_records(runs, BATCH_RECORDS)
        if not topic:
            if not known:
                return False  # the group's configs come with its next ticket
            await self._archive(durable, runs, "", {})  # the DLQ was turned off meanwhile
            return True
        counts = await leader.ctx.topic_metadata.partition_counts([topic])
        if topic not in counts:
            raise DeadLetterTopicMissing(f"the dead-letter topic {topic!r} does not exist")
        spans = [(r.first_offset, r.last_offset) for r in runs]
        sources = await self.io.read(leader.topic, partition, spans)
        notes = leader.fetcher.dead_letter_notes
        limit = durable.engine.config.delivery_count_limit
        records: list[DeadLetterRecord] = []
        reasons: dict[str, int] = {}
        for r in runs:
            for offset in range(r.first_offset, r.last_offset + 1):
                note = notes.note(group, partition, offset)
                reason = dead_letter_reason(note, r.delivery_count, limit)
                reasons[reason] = reasons.get(reason, 0) + 1
                records.append(
                    dead_letter_record(
                        sources.get(offset),
                        group=group,
                        topic=leader.topic,
                        partition=partition,
                        offset=offset,
                        delivery_count=r.delivery_count,
                        reason=reason,
                        error=None if note is None else note.error,
                        copy_record=copy_record,
                    )
                )
        await self.io.send(topic, records)
        await self._archive(durable, runs, topic, reasons)
        return True

    async def _archive(
        self,
        durable: DurableSharePartition,
        runs: list[RunView],
        topic: str,
        reasons: dict[str, int],
    ) -> None:
        """Archive ``runs`` (written to ``topic``; ``""``: no DLQ any more) under the request
        partition's lock, write the change and, with durability ``acked``, flush it."""
        leader = self.leader
        group, partition = durable.group, durable.partition
        async with leader._lock(partition):
            leader.fencing.check(partition)
            if leader.cache.get_live((group, partition)) is not durable:
                return  # moved away: its new leader writes them again
            with leader.ctx.state_scope(leader.request_topic, partition):
                for r in runs:
                    durable.engine.archive_dead_letters(r.first_offset, r.last_offset)
                result = LeaderResult(
                    writes=(durable,), logs=(self._archived(durable, runs, topic, reasons),)
                )
                await leader.applier.apply(result, partition)
        if leader.ctx.settings.state_durability is StateDurability.ACKED:
            await leader.ctx.flush_state()
        notes = leader.fetcher.dead_letter_notes
        for r in runs:
            notes.forget(group, partition, r.first_offset, r.last_offset)
        metric = leader.ctx.metrics.dead_letters
        for reason, n in reasons.items():
            metric.labels(group, leader.topic, topic, reason).inc(n)
        leader.long_polls.notify(partition)  # the SPSO may have moved: more may be acquired

    def _archived(
        self,
        durable: DurableSharePartition,
        runs: list[RunView],
        topic: str,
        reasons: dict[str, int],
    ) -> LogEvent:
        fields: dict[str, Any] = {
            "group": durable.group,
            "partition": durable.partition,
            "offsets": [[r.first_offset, r.last_offset] for r in runs],
            "records": sum(r.last_offset - r.first_offset + 1 for r in runs),
            "delivery_counts": sorted({r.delivery_count for r in runs}),
            "reasons": reasons,
        }
        if topic:
            return LogEvent("info", "dead_letters_written", {**fields, "dead_letter_topic": topic})
        return LogEvent("warning", "dead_letters_archived_without_topic", fields)

    def _failed(
        self, durable: DurableSharePartition, runs: list[RunView], failures: int, exc: Exception
    ) -> None:
        """Back off and say what the operator must do (logged at the 1st, 2nd, 4th, ... failure)."""
        key = (durable.group, durable.partition)
        backoff = min(BACKOFF_FIRST_S * 2 ** (failures - 1), BACKOFF_MAX_S)
        self._retry[key] = (failures, time.monotonic() + backoff)
        topic, _copy, _known = self.leader.group_configs.dead_letter(durable.group)
        self.leader.ctx.metrics.dead_letter_failures.labels(
            durable.group, self.leader.topic, topic
        ).inc()
        if failures & (failures - 1):
            return
        if isinstance(exc, DeadLetterTopicMissing):
            action = (
                f"create the topic {topic!r}, or change the group's "
                "errors.deadletterqueue.topic.name; the records stay held until then"
            )
        else:
            action = (
                f"check that this worker may write to {topic!r} (ACLs, min.insync.replicas) "
                "and that the brokers are up; the records stay held until then"
            )
        self._log.warning(
            "dead_letter_write_failed",
            group=durable.group,
            partition=durable.partition,
            dead_letter_topic=topic,
            held_records=sum(r.last_offset - r.first_offset + 1 for r in runs),
            failures=failures,
            retry_in_s=backoff,
            error=str(exc) or repr(exc),
            action=action,
        )


def _first_records(runs: list[RunView], limit: int) -> list[RunView]:
    """The first ``limit`` records of ``runs`` (the last run cut to fit)."""
    out: list[RunView] = []
    left = limit
    for r in runs:
        if left <= 0:
            break
        n = r.last_offset - r.first_offset + 1
        out.append(r if n <= left else replace(r, last_offset=r.first_offset + left - 1))
        left -= n
    return out
