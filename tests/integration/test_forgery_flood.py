"""Issue #12 on the real broker with ``queueflow.auth.mode=hmac``: while a member works, an
outsider floods the leader's request topic with garbage, unsigned ShareFetches under a made-up
member id, forged ``Fence(leader_epoch=999999)`` and messages signed with a guessed secret. The
member still gets every record exactly once with delivery count 1 (nothing was acquired by a
forgery, the leader never stepped down) and ACCEPTs them all. Meanwhile the replies the member
got were unreadable to any other reader of the reply topic (sealed to the member's own key,
keyed by a pseudonym, not its member id)."""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition

from queueflow import ShareConsumer, ShareRecord
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.auth import AuthenticationError, ReplayGuard
from queueflow.protocol.credentials import Credentials
from queueflow.protocol.envelope import topic_dest
from queueflow.protocol.roles import ControlAuth
from queueflow.protocol.sealed_replies import SEALED_FORMAT, ReplyKey
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

SECRET = f"flood-{secrets.token_urlsafe(32)}"
AUTH = {"queueflow.auth.mode": "hmac", "queueflow.auth.secret": SECRET}
LEADER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.record.lock.duration.ms": 5000,
    "group.share.session.timeout.ms": 6000,
    "group.share.heartbeat.interval.ms": 500,
    "queueflow.lock.check.interval.ms": 100,
    **AUTH,
}
MEMBER_SETTINGS = {
    "group.share.heartbeat.interval.ms": 500,
    "group.share.session.timeout.ms": 6000,
    "fetch.max.wait.ms": 1000,
    **AUTH,
}
RECORDS = 200
WAIT_S = 60.0


def forgeries(app_id: str, topic: str, partition: int, i: int) -> list[bytes]:
    fetch = protocol.ShareFetchRequest(
        group="flood",
        topic=topic,
        partition=partition,
        member_id="m-outsider",
        request_id=i,
        reply_partition=0,
        max_records=500,
        deadline_ms=int(time.time() * 1000) + 60_000,
    )
    fence = protocol.Fence(leader_epoch=999999, sent_ms=int(time.time() * 1000))
    guessed = ControlAuth(Credentials.from_secret(f"guessed-{SECRET}", app_id), "m-outsider")
    dest = topic_dest(topics.request_topic(app_id, topic), partition)
    return [
        b"\x00garbage %d" % i,
        b'{"kind": "fetch", "group": null}',
        protocol.encode(fetch),
        protocol.encode(fence),
        guessed.seal(protocol.encode(fetch), dest),
        guessed.seal(protocol.encode(fence), dest),
    ]


def test_a_flood_of_garbage_and_forgeries_loses_nothing(
    kafka_bootstrap: str, topic_factory: object, tmp_path: Path
) -> None:
    topic = topic_factory(2)  # type: ignore[operator]
    app_id = f"qf-flood-{uuid.uuid4().hex[:8]}"
    values = [f"f-{i}".encode() for i in range(RECORDS)]
    asyncio.run(produce_records(kafka_bootstrap, topic, [v.decode() for v in values], partitions=2))

    async def scenario() -> tuple[list[ShareRecord], int, str, list[tuple[bytes, bytes]]]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        request_topic = topics.request_topic(app_id, topic)
        stop = asyncio.Event()
        sent = 0

        async def flood() -> None:
            nonlocal sent
            i = 0
            while not stop.is_set():
                for partition in (0, 1):
                    for data in forgeries(app_id, topic, partition, i):
                        await producer.send(request_topic, data, partition=partition)
                        sent += 1
                i += 1
                await asyncio.sleep(0.01)

        flooding = asyncio.ensure_future(flood())
        member = ShareConsumer(
            "flood", app_id=app_id, bootstrap_servers=kafka_bootstrap, settings=MEMBER_SETTINGS
        )
        await member.subscribe([topic])
        got: list[ShareRecord] = []
        member_id = member.member_id or ""
        deadline = time.monotonic() + WAIT_S
        try:
            while {r.value for r in got} != set(values):
                assert time.monotonic() < deadline, f"{len(got)} of {RECORDS} within {WAIT_S} s"
                got += await member.poll(timeout_ms=1000)  # implicit mode: ACCEPTed next poll
            await member.commit_sync()
        finally:
            stop.set()
            await flooding
            await member.close()
            await producer.stop()
        return got, sent, member_id, await read_replies(kafka_bootstrap, app_id)

    with LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path, LEADER_SETTINGS).start():
        got, sent, member_id, replies = asyncio.run(scenario())
    # What any reader of the reply topic saw (attack matrix row 10): every reply sealed, none
    # keyed by the member id, none readable with another member's key or as a plain message.
    assert replies and member_id
    eavesdropper = ReplyKey(Credentials.from_secret(SECRET, app_id).workers_public)
    for key, value in replies:
        assert key != member_id.encode() and value[0] == SEALED_FORMAT
        assert member_id.encode() not in value
        with pytest.raises(AuthenticationError):
            eavesdropper.open(value, "", ReplayGuard())
    assert sent > 0
    assert sorted(r.value for r in got) == sorted(values)  # each exactly once
    assert {r.delivery_count for r in got} == {1}  # no forgery acquired (and let expire) any


async def read_replies(bootstrap: str, app_id: str) -> list[tuple[bytes, bytes]]:
    """Every record of the app's reply topic, as any principal with READ on it sees them."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [
            KafkaTopicPartition(topics.reply_topic(app_id), p)
            for p in range(topics.REPLY_PARTITIONS)
        ]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + 30
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            assert time.monotonic() < deadline, "the reply topic was not read within 30 s"
            for records in (await consumer.getmany(timeout_ms=500)).values():
                out += [(r.key or b"", r.value or b"") for r in records]
        return out
    finally:
        await consumer.stop()
