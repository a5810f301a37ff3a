"""The ack reader of an exactly-once leader: reads the ack topic ``<app>-share-ack-<topic>``
read_committed and drives the lock clock (docs/architecture.md "Exactly-once: transactional
acknowledgements").

One aiokafka consumer per leader (source topic), without a consumer group: its assignment
follows the request partitions the leader is live on, each resumed right after the last
message a leader applied (the position persisted in the state table,
:mod:`~queueflow.server.leader.acks`). Each round samples the ack topic's high watermarks
(read_uncommitted ListOffsets) at time ``T``, applies what the consumer returns, and once the
consumer's position passed a sample, moves ``ack_safe_ms`` to its ``T``
(:class:`~queueflow.server.leader.ack_clock.AckClock`).

aiokafka (0.14, ``consumer/fetcher.py`` ``PartitionRecords``) moves a read_committed
consumer's position past commit and abort markers and past aborted batches, also at the end of
a partition, when the fetched data holding them is drained by ``getmany`` (which returns no
record for them): the position reaches the high watermark once every transaction below it is
resolved, and stays at the last stable offset while one is open.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition

from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.lifecycle import stop_quietly
from queueflow.logging import get_logger
from queueflow.server.leader.ack_clock import AckClock
from queueflow.server.leader.acks import AckApplier
from queueflow.server.log_offsets import LogOffsets
from queueflow.structs import TopicPartition

if TYPE_CHECKING:
    from queueflow.server.leader.manager import ShareLeader

__all__ = ["AckReader"]

#: How long (ms) a round waits for new acknowledgements before it samples the ends again: the
#: lock clock trails the wall clock by about this much while the ack topic is idle.
ROUND_WAIT_MS = 100


class AckReader:
    """Reads one source topic's ack topic for its leader (see the module docstring).

    Args:
        leader: the share-partition leaders of the source topic; its fetcher gets the lock
            clock (:attr:`ShareFetcher.lock_clock`), so its lock expiries wait for it.
        kafka: the cluster.
        offsets: where high watermarks are sampled (read_uncommitted).
    """

    def __init__(self, leader: ShareLeader, kafka: KafkaClientConfig, offsets: LogOffsets) -> None:
        self.leader = leader
        self.kafka = kafka
        self.offsets = offsets
        self.clock = AckClock()
        leader.fetcher.lock_clock = self.clock
        self.applier = AckApplier(leader)
        self.ack_topic = self.applier.ack_topic
        #: Partition -> the leader epoch it is read under.
        self._led: dict[int, int] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._lag = leader.ctx.metrics.ack_reader_lag_seconds
        self._log = get_logger("queueflow.server.leader", topic=leader.topic)

    async def start(self) -> None:
        """Start the consumer and the reading task.

        Raises:
            Exception: what starting the consumer raises (the broker unreachable).
        """
        consumer = AIOKafkaConsumer(
            **self.kafka.client_kwargs(),
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
        )
        await consumer.start()
        self._consumer = consumer
        self._task = asyncio.ensure_future(self._run(consumer))

    async def stop(self) -> None:
        """Stop reading and close the consumer."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        if self._consumer is not None:
            await stop_quietly("ack reader", self._consumer.stop)
            self._consumer = None

    async def _run(self, consumer: AIOKafkaConsumer) -> None:
        failing = False
        while True:
            try:
                await self.round(consumer)
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the broker may be restarting: start over from the table
                if not failing:
                    self._log.warning("ack_reader_failed", error=repr(exc))
                failing = True
                self._led.clear()
                await asyncio.sleep(1.0)

    async def round(self, consumer: AIOKafkaConsumer) -> None:
        """One round: follow the leader's live partitions, sample the high watermarks, apply
        what arrived, advance the lock clock."""
        await self._follow(consumer)
        if not self._led:
            await asyncio.sleep(ROUND_WAIT_MS / 1000)
            return
        tps = {p: KafkaTopicPartition(self.ack_topic, p) for p in self._led}
        at_ms = self.leader.ctx.clock.now_ms()  # before the request: its answer is as new
        ends = await self.offsets.log_ends([TopicPartition(*tp) for tp in tps.values()])
        for p, tp in tps.items():
            self.clock.sampled(p, at_ms, ends[TopicPartition(*tp)])
        batches = await consumer.getmany(*tps.values(), timeout_ms=ROUND_WAIT_MS)
        for tp, messages in batches.items():
            try:
                for message in messages:
                    await self.applier.apply(tp.partition, message.offset, message.value)
            except Exception as exc:  # stepped down, or a state write failed: read it again
                self._led.pop(tp.partition, None)  # from the table, under the next epoch
                self._log.warning("ack_apply_failed", partition=tp.partition, error=repr(exc))
        now = self.leader.ctx.clock.now_ms()
        for p, tp in tps.items():
            if p in self._led:
                self.clock.advanced(p, await consumer.position(tp))
            lag = self.clock.lag_ms(p, now)
            self._lag.labels(self.leader.topic, str(p)).set(-1 if lag is None else lag / 1000)

    async def _follow(self, consumer: AIOKafkaConsumer) -> None:
        """Read the partitions the leader is live on, each from right after the last message
        applied; a partition new here (or under a new leader epoch) releases nothing until it
        caught up."""
        fencing = self.leader.fencing
        wanted = {p: lead.epoch for p, lead in fencing.partitions.items() if fencing.is_live(p)}
        if wanted == self._led:
            return
        for p in self._led.keys() - wanted.keys():
            self.clock.forget(p)
            self.applier.positions.forget(p)
            self._lag.labels(self.leader.topic, str(p)).set(-1)
        positions = self.applier.positions
        for p, epoch in wanted.items():
            if self._led.get(p) != epoch:
                self.clock.reset(p)
                positions.forget(p)
        tps = {p: KafkaTopicPartition(self.ack_topic, p) for p in wanted}
        consumer.assign(list(tps.values()))
        for p, tp in tps.items():
            with self.leader.ctx.state_scope(self.leader.request_topic, p):
                applied = positions.applied(p)
            consumer.seek(tp, applied + 1) if applied >= 0 else await consumer.seek_to_beginning(tp)
        self._led = wanted
        self._log.info("ack_reader_assigned", partitions=sorted(wanted))
