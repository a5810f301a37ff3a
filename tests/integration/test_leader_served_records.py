"""Leaders serve records on the direct path (docs/architecture.md "The direct path"): against a
real Faust leader worker and the real broker, a member handles every record without reading
anything from the broker itself (its record reader is never asked), records RELEASEd and
delivered again after the leader's record cache moved past them still come back whole, and a
read_committed group still never sees an aborted record."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from queueflow import ACCEPT, RELEASE, ShareConsumer, ShareRecord
from queueflow.admin import ShareGroupAdmin
from queueflow.kafka.config import KafkaClientConfig
from queueflow.structs import TopicPartition
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

LEADER_SETTINGS: dict[str, int | str] = {
    "share.auto.offset.reset": "earliest",
    "group.share.record.lock.duration.ms": 5000,
    "group.share.session.timeout.ms": 6000,
    "group.share.heartbeat.interval.ms": 500,
    "queueflow.lock.check.interval.ms": 100,
    # Smaller than one produced batch: nothing is kept, so every answer, the redeliveries'
    # too, is served from a fresh read of the leader's.
    "queueflow.leader.record.cache.bytes": 2048,
}
MEMBER_SETTINGS = {
    "group.share.heartbeat.interval.ms": 500,
    "group.share.session.timeout.ms": 6000,
    "fetch.max.wait.ms": 1000,
    "max.poll.records": 50,
}
WAIT_S = 30.0


class CountedReads:
    """Wraps a member's record source and counts the offsets it was asked to read."""

    def __init__(self, member: ShareConsumer) -> None:
        session = member._session
        assert session is not None
        self.source = session._source
        self.offsets = 0
        inner = self.source.read

        async def read(tp: TopicPartition, acquired: list[Any], *args: Any) -> Any:
            self.offsets += sum(last - first + 1 for first, last, _ in acquired)
            return await inner(tp, acquired, *args)

        self.source.read = read  # type: ignore[method-assign,assignment]


async def wait_leaders(member: ShareConsumer, topic: str, partitions: int) -> None:
    session = member._session
    assert session is not None
    deadline = time.monotonic() + WAIT_S
    wanted = {TopicPartition(topic, p) for p in range(partitions)}
    while set(session._membership.leaders) != wanted:
        assert time.monotonic() < deadline, "no heartbeat named the leader endpoints"
        await asyncio.sleep(0.05)


def test_a_member_reads_nothing_itself_and_redeliveries_come_back_whole(
    kafka_bootstrap: str, topic_factory: object, tmp_path: Path
) -> None:
    topic = topic_factory(2)  # type: ignore[operator]
    app_id = f"qf-served-{uuid.uuid4().hex[:8]}"
    values = [f"s-{i:04d}-".encode() + b"x" * 40 for i in range(400)]
    asyncio.run(produce_records(kafka_bootstrap, topic, values, partitions=2))

    async def scenario() -> tuple[list[ShareRecord], int]:
        member = ShareConsumer(
            "served",
            app_id=app_id,
            bootstrap_servers=kafka_bootstrap,
            acknowledgement_mode="explicit",
            settings=MEMBER_SETTINGS,
        )
        await member.subscribe([topic])
        await wait_leaders(member, topic, 2)
        reads = CountedReads(member)
        got: list[ShareRecord] = []
        deadline = time.monotonic() + WAIT_S
        released = {v for i, v in enumerate(values) if i % 10 == 0}
        while len(got) < len(values) + len(released):
            assert time.monotonic() < deadline, len(got)
            for record in await member.poll(timeout_ms=1000):
                got.append(record)
                first = record.delivery_count == 1
                member.acknowledge(
                    record, RELEASE if first and record.value in released else ACCEPT
                )
        await member.commit_sync()
        await member.close()
        return got, reads.offsets

    with LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path / "d", LEADER_SETTINGS).start():
        got, read_offsets = asyncio.run(scenario())
    assert read_offsets == 0  # every record came in the leader's answers
    firsts = [r.value for r in got if r.delivery_count == 1]
    seconds = [r.value for r in got if r.delivery_count == 2]
    assert sorted(firsts) == sorted(values)  # each once, whole
    assert sorted(seconds) == sorted(v for i, v in enumerate(values) if i % 10 == 0)
    assert len(got) == len(values) + len(seconds)


def test_read_committed_members_see_no_aborted_record_and_plain_records_are_served(
    kafka_bootstrap: str, topic_factory: object, tmp_path: Path
) -> None:
    topic = topic_factory(1)  # type: ignore[operator]
    app_id = f"qf-served-rc-{uuid.uuid4().hex[:8]}"

    async def produce() -> None:
        await produce_records(
            kafka_bootstrap, topic, [f"plain-{i}" for i in range(20)], partition=0
        )
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap, transactional_id=f"txn-{uuid.uuid4().hex[:8]}"
        )
        await producer.start()
        try:
            for n, outcome in enumerate(("commit", "abort", "commit")):
                await producer.begin_transaction()
                for i in range(5):
                    await producer.send_and_wait(topic, f"{outcome}-{n}-{i}".encode(), partition=0)
                if outcome == "abort":
                    await producer.abort_transaction()
                else:
                    await producer.commit_transaction()
        finally:
            await producer.stop()
        await produce_records(kafka_bootstrap, topic, ["after"], partition=0)

    async def scenario() -> tuple[list[bytes], int]:
        admin = ShareGroupAdmin(app_id, KafkaClientConfig(kafka_bootstrap))
        await admin.alter_group_configs("rc", {"share.isolation.level": "read_committed"})
        member = ShareConsumer(
            "rc", app_id=app_id, bootstrap_servers=kafka_bootstrap, settings=MEMBER_SETTINGS
        )
        await member.subscribe([topic])
        await wait_leaders(member, topic, 1)
        reads = CountedReads(member)
        got: list[bytes] = []
        deadline = time.monotonic() + WAIT_S
        while b"after" not in got:
            assert time.monotonic() < deadline, got
            got += [r.value for r in await member.poll(timeout_ms=1000)]
        await member.close()
        return got, reads.offsets

    asyncio.run(produce())
    with LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path / "d", LEADER_SETTINGS).start():
        got, read_offsets = asyncio.run(scenario())
    committed = [f"commit-{n}-{i}".encode() for n in (0, 2) for i in range(5)]
    assert got == [f"plain-{i}".encode() for i in range(20)] + committed + [b"after"]
    # The plain records came in the answers; from the first transaction on the member read.
    assert 0 < read_offsets <= 1 + 15 + 3 + 1
