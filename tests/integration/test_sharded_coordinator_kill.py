"""The sharded coordinator on the real broker (docs/architecture.md "Coordinator sharding"):
200 share groups over three leader workers, whose coordinator topic has 8 partitions, so each
worker coordinates some of the groups; the worker coordinating the most is SIGKILLed while every
group's member works. Its partitions move to the two others, every group's coordinator is live
again, and every group gets every record, those produced after the kill included.

The 200 members live in this process and share one producer, one reply consumer and one record
reader (:class:`SharedMemberIO`), as 200 full ShareConsumers would open 400 Kafka clients; each
still has its own session, membership, heartbeats, direct-path fetches and acknowledgements."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition

from queueflow import ACCEPT, ShareConsumer, ShareGroupSettings
from queueflow.kafka.config import KafkaClientConfig
from queueflow.member.context import KafkaMemberIO, MemberContext
from queueflow.member.reader import KafkaRecordReader, ReadResult
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.structs import ShareRecord, TopicPartition
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

GROUPS = 200
WORKERS = 3
PARTITIONS = 8
#: The leaders' Faust group notices a SIGKILLed worker after 6 s.
FAUST_ENV = {"BROKER_SESSION_TIMEOUT": "6", "BROKER_HEARTBEAT_INTERVAL": "1"}
LEADER_SETTINGS: dict[str, int | str] = {
    "share.auto.offset.reset": "earliest",
    "queueflow.coordinator.topic.num.partitions": PARTITIONS,
    # 200 members heartbeat 100 times a second in all; a session outlives the failover.
    "group.share.heartbeat.interval.ms": 2000,
    "group.share.session.timeout.ms": 30000,
    "group.share.record.lock.duration.ms": 5000,
    # Every member connects to the leader from 127.0.0.1.
    "queueflow.direct.max.connections.per.ip": 1000,
}
MEMBER_SETTINGS: dict[str, int | str] = {
    "group.share.heartbeat.interval.ms": 2000,
    "group.share.session.timeout.ms": 30000,
    # a heartbeat lost with its coordinator is sent again after 3 s
    "queueflow.request.timeout.ms": 3000,
    "max.poll.records": 5,
}


class _SharedReplies:
    """One producer for every member's requests and one consumer of one reply partition,
    handing each reply to the member its key names."""

    def __init__(self, kafka: KafkaClientConfig, app_id: str) -> None:
        self.kafka = kafka
        self.reply_topic = topics.reply_topic(app_id)
        self.reply_partition = random.randrange(topics.REPLY_PARTITIONS)
        self.routes: dict[bytes, Callable[[bytes], None]] = {}
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._reader: asyncio.Task[None] | None = None
        self._started: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        kwargs = self.kafka.client_kwargs("qf-shard-members")
        self._producer = AIOKafkaProducer(**kwargs, linger_ms=0, acks=1)
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(**kwargs, enable_auto_commit=False, fetch_max_wait_ms=100)
        await self._consumer.start()
        tp = KafkaTopicPartition(self.reply_topic, self.reply_partition)
        self._consumer.assign([tp])
        await self._consumer.seek_to_end(tp)
        await self._consumer.position(tp)
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=500)
            for messages in batches.values():
                for message in messages:
                    handler = self.routes.get(message.key or b"")
                    if handler is not None and message.value is not None:
                        handler(message.value)

    async def send(self, topic: str, partition: int, payload: bytes, key: bytes) -> None:
        assert self._producer is not None
        await self._producer.send(topic, payload, key=key, partition=partition)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        for client in (self._consumer, self._producer):
            if client is not None:
                await client.stop()


class _MuxTransport:
    """One member's :class:`~queueflow.member.transport.MemberTransport` on the shared clients."""

    def __init__(self, shared: _SharedReplies, key: str, reply_route: str | None) -> None:
        self.shared = shared
        self.reply_partition = shared.reply_partition
        self._key = key.encode()
        self._keys = [self._key] + ([reply_route.encode()] if reply_route else [])

    async def start(self, on_reply: Callable[[bytes], None]) -> None:
        await self.shared.start()
        for key in self._keys:
            self.shared.routes[key] = on_reply

    async def send(self, topic: str, partition: int, payload: bytes) -> None:
        await self.shared.send(topic, partition, payload, self._key)

    async def close(self) -> None:
        for key in self._keys:
            self.shared.routes.pop(key, None)


class _SharedSource:
    """One member's record source on the shared reader (leaders carry the records on the
    direct path; this reads what they don't)."""

    def __init__(self, reader: KafkaRecordReader) -> None:
        self.reader = reader

    async def read(
        self,
        tp: TopicPartition,
        acquired: list[protocol.WireAcquired],
        timeout_ms: int,
        read_committed: bool = False,
    ) -> ReadResult:
        return await self.reader.read(tp, acquired, timeout_ms, read_committed)

    def prepare(self, tp: TopicPartition) -> None:
        pass

    def remember_released(self, record: ShareRecord) -> None:
        self.reader.remember_released(record)

    async def drop(self, tp: TopicPartition) -> None:
        pass

    async def close(self) -> None:
        pass


class SharedMemberIO(KafkaMemberIO):
    """:class:`KafkaMemberIO` whose members share their Kafka clients (see the module)."""

    def __init__(self, kafka: KafkaClientConfig, app_id: str, settings: ShareGroupSettings):
        super().__init__(kafka, app_id, settings.request_timeout_ms)
        self.replies = _SharedReplies(kafka, app_id)
        self.reader = KafkaRecordReader(kafka)
        self._prepared: asyncio.Future[dict[str, int]] | None = None
        self._found: asyncio.Future[int] | None = None

    async def prepare(self, settings: ShareGroupSettings, topics_: list[str]) -> dict[str, int]:
        if self._prepared is None:
            self._prepared = asyncio.ensure_future(super().prepare(settings, topics_))
        return dict(await asyncio.shield(self._prepared))

    async def coordinator_partitions(self) -> int:
        if self._found is None:  # one lookup for the 200 members starting at once
            self._found = asyncio.ensure_future(super().coordinator_partitions())
        return await asyncio.shield(self._found)

    def transport(self, member_id: str, client_id: str, reply_route: str | None = None) -> Any:
        return _MuxTransport(self.replies, member_id, reply_route)

    def record_source(self) -> Any:
        return _SharedSource(self.reader)

    async def close(self) -> None:
        await self.reader.close()
        await self.replies.close()


def coordinators(workers: list[LeaderWorker]) -> dict[int, tuple[int, LeaderWorker]]:
    """Coordinator partition -> (the newest coordinator epoch it went live under, its worker)."""
    out: dict[int, tuple[int, LeaderWorker]] = {}
    for worker in workers:
        for event in worker.events("coordinator_live"):
            p, epoch = int(event["partition"]), int(event["coordinator_epoch"])
            if p not in out or epoch > out[p][0]:
                out[p] = (epoch, worker)
    return out


async def wait_for(check: Callable[[], bool], what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        await asyncio.sleep(0.2)


def test_two_hundred_groups_over_three_workers_survive_a_coordinator_kill(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    started = time.monotonic()
    topic = topic_factory(1)
    app_id = f"qf-shard-{uuid.uuid4().hex[:8]}"
    groups = [f"group-{i}" for i in range(GROUPS)]
    partition_of = {g: topics.coordinator_partition(g, PARTITIONS) for g in groups}
    workers = [
        LeaderWorker(
            app_id, [topic], kafka_bootstrap, tmp_path / f"w{i}", LEADER_SETTINGS, env=FAUST_ENV
        )
        for i in range(WORKERS)
    ]
    for w in workers:
        w.launch()
    seen: dict[str, set[str]] = {g: set() for g in groups}
    try:
        for w in workers:
            w.worker.wait_ready(90, what="leader worker")

        async def scenario() -> tuple[LeaderWorker, dict[int, tuple[int, LeaderWorker]], float]:
            await produce_records(kafka_bootstrap, topic, ["before-0", "before-1"])
            # every partition live, spread over every worker
            await wait_for(
                lambda: (
                    len(coordinators(workers)) == PARTITIONS
                    and len({id(w) for _, w in coordinators(workers).values()}) == WORKERS
                ),
                "the coordinator partitions live on all three workers",
                60,
            )
            settings = ShareGroupSettings.load(MEMBER_SETTINGS)
            io = SharedMemberIO(KafkaClientConfig(kafka_bootstrap), app_id, settings)
            ctx = MemberContext(app_id, settings, io)
            members = {
                g: ShareConsumer(g, app_id=app_id, acknowledgement_mode="explicit", context=ctx)
                for g in groups
            }
            stop = asyncio.Event()

            async def work(group: str) -> None:
                member = members[group]
                await member.subscribe([topic])
                while not stop.is_set():
                    for record in await member.poll(timeout_ms=500):
                        seen[group].add(record.value.decode())
                        member.acknowledge(record, ACCEPT)

            tasks = [asyncio.ensure_future(work(g)) for g in groups]
            try:
                before = {"before-0", "before-1"}
                await wait_for(
                    lambda: all(s >= before for s in seen.values()) or _failed(tasks),
                    "every group to get the first records",
                    90,
                )
                _raise_failed(tasks)
                owners = coordinators(workers)
                load = {id(w): 0 for w in workers}
                for g in groups:
                    load[id(owners[partition_of[g]][1])] += 1
                victim = next(w for w in workers if load[id(w)] == max(load.values()))
                killed = {p: e for p, (e, w) in owners.items() if w is victim}
                victim.kill()
                killed_at = time.monotonic()
                await produce_records(kafka_bootstrap, topic, ["after-0", "after-1"])
                everything = before | {"after-0", "after-1"}
                await wait_for(
                    lambda: all(
                        coordinators(workers)[p][0] > e
                        and coordinators(workers)[p][1] is not victim
                        for p, e in killed.items()
                    ),
                    "the killed worker's coordinator partitions to go live elsewhere",
                    60,
                )
                await wait_for(
                    lambda: all(s >= everything for s in seen.values()) or _failed(tasks),
                    "every group to get every record",
                    90,
                )
                _raise_failed(tasks)
                healed_s = time.monotonic() - killed_at
                return victim, killed, healed_s
            finally:
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
                await asyncio.gather(*(m.close() for m in members.values()), return_exceptions=True)
                await io.close()

        victim, killed, healed_s = asyncio.run(scenario())
        after = coordinators([w for w in workers if w is not victim])
        # every member hashed its group as the workers did: no request reached another partition
        misrouted = [e for w in workers for e in w.events("coordinator_request_misrouted")]
    finally:
        for w in workers:
            w.kill()
    moved = [g for g in groups if partition_of[g] in killed]
    print(
        f"\n{GROUPS} groups, {PARTITIONS} coordinator partitions over {WORKERS} workers; "
        f"killed the coordinator of partitions {sorted(killed)} ({len(moved)} groups); every "
        f"group had every record {healed_s:.1f} s after the kill; "
        f"{time.monotonic() - started:.1f} s in all"
    )
    # every partition of the killed worker is live on a survivor under a newer epoch
    assert sorted(killed) and all(after[p][0] > e for p, e in killed.items())
    # nothing lost: every group got the records produced before and after the kill
    assert all(seen[g] == {"before-0", "before-1", "after-0", "after-1"} for g in groups)
    assert moved
    assert misrouted == []


def _failed(tasks: list[asyncio.Future[None]]) -> bool:
    return any(t.done() and t.exception() is not None for t in tasks)


def _raise_failed(tasks: list[asyncio.Future[None]]) -> None:
    for t in tasks:
        if t.done() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]
