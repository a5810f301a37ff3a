"""Junk floods on the real broker (docs/operations.md "Junk floods, quotas and ACLs").

A victim app with ``queueflow.auth.mode=hmac`` (a leader worker and a ``ShareConsumer`` on the
request-topic path) handles 300 records per phase. Between phases an outsider with WRITE on an
internal topic floods it as fast as one aiokafka producer can:

* the coordinator topic partition of the victim's group;
* the request topic partitions of the victim's source topic;
* the victim's reply-topic partition, keyed by the victim's reply route (its replies' key, which
  every reader of the topic sees), so that the key filter lets it through.

After each flood the victim's next 300 records are all handled within 15 s, none lost, each
delivered once, and the log stays bounded (the junk is dropped by its first bytes, counted, and
logged at most 20 lines per 10 s per receiver).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from structlog.testing import capture_logs

from queueflow import ShareConsumer, ShareRecord
from queueflow.protocol import topics
from queueflow.protocol.sealed_replies import reply_route
from queueflow.settings import int_default
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

#: The apps of these tests create their coordinator topic with the default partition count.
COORDINATOR_PARTITIONS = int_default("coordinator_topic_partitions")

SECRET = secrets.token_urlsafe(32)
AUTH = {"queueflow.auth.mode": "hmac", "queueflow.auth.secret": SECRET}
LEADER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.record.lock.duration.ms": 10_000,
    "group.share.session.timeout.ms": 10_000,
    "group.share.heartbeat.interval.ms": 500,
    "queueflow.lock.check.interval.ms": 200,
    "queueflow.leader.listener": "",  # members use the request topics and the reply topic
    **AUTH,
}
MEMBER_SETTINGS = {
    "group.share.heartbeat.interval.ms": 500,
    "group.share.session.timeout.ms": 10_000,
    "fetch.max.wait.ms": 500,
    **AUTH,
}
GROUP = "victim"
PARTITIONS = 2
RECORDS = 300
JUNK = 150_000
RECOVERY_S = 15.0
#: Junk log lines allowed per receiver and flood: 20 per 10 s, and a few more across periods.
MAX_JUNK_LINES = 60


async def flood(
    bootstrap: str, topic: str, partitions: list[int], count: int, key: bytes | None = None
) -> float:
    """Write ``count`` junk records (random bytes, 16 to 80 long) to ``topic``, spread over
    ``partitions``, as fast as one producer can; returns the seconds it took."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=1)
    await producer.start()
    values = [os.urandom(16 + i % 64) for i in range(512)]
    start = time.monotonic()
    try:
        sent, pending = 0, []
        while sent < count:
            for partition in partitions:
                batch = producer.create_batch()
                n = 0
                while sent < count and batch.append(
                    key=key, value=values[sent % len(values)], timestamp=None
                ):
                    sent += 1
                    n += 1
                    if n >= 20_000:
                        break
                batch.close()
                pending.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return time.monotonic() - start


async def handle_all(member: ShareConsumer, expected: set[bytes]) -> list[ShareRecord]:
    """Poll until every value of ``expected`` was delivered; fails after RECOVERY_S."""
    got: list[ShareRecord] = []
    deadline = time.monotonic() + RECOVERY_S
    while not expected <= {r.value for r in got}:
        left = deadline - time.monotonic()
        have = len({r.value for r in got} & expected)
        assert left > 0, f"{have} of {len(expected)} records handled within {RECOVERY_S} s"
        got += await member.poll(timeout_ms=500)
    await member.commit_sync()
    return got


@pytest.mark.parametrize("target", ["coordinator", "requests", "replies"])
def test_after_a_flood_of_junk_the_victim_handles_its_records_within_seconds(
    target: str, kafka_bootstrap: str, topic_factory: object, tmp_path: Path
) -> None:
    topic = topic_factory(PARTITIONS)  # type: ignore[operator]
    app_id = f"qf-junk-{uuid.uuid4().hex[:8]}"

    async def phase(member: ShareConsumer, name: str) -> list[ShareRecord]:
        values = [f"{name}-{i}" for i in range(RECORDS)]
        await produce_records(kafka_bootstrap, topic, values, partitions=PARTITIONS)
        return await handle_all(member, {v.encode() for v in values})

    async def scenario() -> dict[str, list[ShareRecord]]:
        member = ShareConsumer(
            GROUP, app_id=app_id, bootstrap_servers=kafka_bootstrap, settings=MEMBER_SETTINGS
        )
        await member.subscribe([topic])
        out: dict[str, list[ShareRecord]] = {}
        try:
            out["before"] = await phase(member, "before")
            requester = member._session._requester  # type: ignore[union-attr]
            where, partitions, key = {
                "coordinator": (
                    topics.coordinator_topic(app_id),
                    [topics.coordinator_partition(GROUP, COORDINATOR_PARTITIONS)],
                    None,
                ),
                "requests": (topics.request_topic(app_id, topic), list(range(PARTITIONS)), None),
                # Keyed by the victim's reply route, on the partition it reads.
                "replies": (
                    topics.reply_topic(app_id),
                    [requester.reply_partition],
                    reply_route(requester.reply_key.public).encode(),
                ),
            }[target]
            took = await flood(kafka_bootstrap, where, partitions, JUNK, key)
            start = time.monotonic()
            out["after"] = await phase(member, "after")
            print(
                f"{target}: {JUNK} junk in {took:.1f} s; then all {RECORDS} records in "
                f"{time.monotonic() - start:.1f} s"
            )
        finally:
            await member.close()
        return out

    worker = LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path / "leader", LEADER_SETTINGS)
    with worker.start(), capture_logs() as member_logs:
        results = asyncio.run(scenario())
        worker_junk_lines = worker.events("control_message_dropped")
    for name, got in results.items():
        values = [r.value for r in got]
        assert sorted(set(values)) == sorted(f"{name}-{i}".encode() for i in range(RECORDS))
        assert len(values) == RECORDS, f"{name}: delivered more than once"
        assert {r.delivery_count for r in got} == {1}, name
    member_junk_lines = [e for e in member_logs if e["event"] == "undecodable_reply"]
    if target == "replies":  # dropped by the member, with a bounded log
        assert 0 < len(member_junk_lines) <= MAX_JUNK_LINES
    else:  # dropped by the worker by its first bytes, with a bounded log
        assert 0 < len(worker_junk_lines) <= MAX_JUNK_LINES
