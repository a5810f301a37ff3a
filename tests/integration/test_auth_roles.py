"""Role keys and envelope v2 on the real broker (``queueflow.auth.mode=hmac``): the worker holds
the secret, the victim member only a member credential.

* The cross-topic replay: every signed request record of one request topic is copied to the
  other request topic (same partition) while the victim handles records of both topics: the
  copies are refused as ``wrong_destination``; every record is handled once, delivery count 1.
* Insider attacks by a process holding only a member credential: heartbeat answers with member
  epoch 2**62 sealed to the victim's reply key (read from its requests' clear header), a leader
  Fence and a coordinator Fence of 2**62, a group config change and a forged ticket of config
  version 2**62, a black-hole leader announcement: all refused (``bad_seal``, ``wrong_role``,
  ``bad_ticket``); the victim handles everything with delivery count 1, and keeps doing so
  after the attack.
"""

from __future__ import annotations

import asyncio
import secrets
import struct
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from queueflow import ShareConsumer, ShareRecord
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.auth import issue_ticket
from queueflow.protocol.credentials import Credentials, member_credential
from queueflow.protocol.envelope import MEMBER_FORMAT, reply_dest, topic_dest
from queueflow.protocol.roles import ControlAuth
from queueflow.protocol.sealed_replies import ReplySealer, reply_route
from queueflow.settings import int_default
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

#: The apps of these tests create their coordinator topic with the default partition count.
COORDINATOR_PARTITIONS = int_default("coordinator_topic_partitions")

SECRET = secrets.token_urlsafe(32)
LEADER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.record.lock.duration.ms": 5000,
    "group.share.session.timeout.ms": 6000,
    "group.share.heartbeat.interval.ms": 500,
    "queueflow.lock.check.interval.ms": 100,
    "queueflow.auth.mode": "hmac",
    "queueflow.auth.secret": SECRET,
}
ABSURD = 2**62
WAIT_S = 35.0


def member_settings(app_id: str) -> dict[str, int | str]:
    """A member that holds only the member credential (no secret)."""
    return {
        "group.share.heartbeat.interval.ms": 500,
        "group.share.session.timeout.ms": 6000,
        "fetch.max.wait.ms": 1000,
        "queueflow.auth.mode": "hmac",
        "queueflow.auth.member.credential": member_credential(SECRET, app_id),
    }


async def handle_all(
    member: ShareConsumer, expected: set[bytes], deadline: float
) -> list[ShareRecord]:
    """Poll (implicit acknowledgement: ACCEPTed next poll) until every value of ``expected``
    was handled."""
    got: list[ShareRecord] = []
    while not expected <= {r.value for r in got}:
        assert time.monotonic() < deadline, f"{len(got)} of {len(expected)} within the deadline"
        got += await member.poll(timeout_ms=500)
    await member.commit_sync()
    return got


def assert_once(got: list[ShareRecord], expected: set[bytes]) -> None:
    values = [r.value for r in got]
    assert sorted(values) == sorted(expected), "lost or duplicated records"  # type: ignore[type-var]
    assert {r.delivery_count for r in got} == {1}, "an attacker made a record redelivered"


async def run_while(
    attack: Callable[[], Awaitable[None]], stop: asyncio.Event, every_s: float = 0.05
) -> int:
    rounds = 0
    while not stop.is_set():
        await attack()
        rounds += 1
        await asyncio.sleep(every_s)
    return rounds


def test_signed_requests_copied_to_another_request_topic_are_refused(
    kafka_bootstrap: str, topic_factory: object, tmp_path: Path
) -> None:
    a, b = topic_factory(2), topic_factory(2)  # type: ignore[operator]
    app_id = f"qf-roles-{uuid.uuid4().hex[:8]}"
    values = {t: [f"{t}-{i}" for i in range(150)] for t in (a, b)}
    for t in (a, b):
        asyncio.run(produce_records(kafka_bootstrap, t, values[t], partitions=2))
    expected = {v.encode() for vs in values.values() for v in vs}
    request = {t: topics.request_topic(app_id, t) for t in (a, b)}
    other = {request[a]: request[b], request[b]: request[a]}

    async def scenario() -> tuple[list[ShareRecord], int]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        copier = AIOKafkaConsumer(
            request[a], request[b], bootstrap_servers=kafka_bootstrap, auto_offset_reset="latest"
        )
        await producer.start()
        await copier.start()
        stop = asyncio.Event()
        copied = 0

        async def copy() -> None:
            nonlocal copied
            for tp, records in (await copier.getmany(timeout_ms=100)).items():
                for r in records:
                    if r.value and r.value[0] == MEMBER_FORMAT:  # the member's signed requests
                        await producer.send(
                            other[tp.topic], r.value, key=r.key, partition=r.partition
                        )
                        copied += 1

        member = ShareConsumer(
            "roles",
            app_id=app_id,
            bootstrap_servers=kafka_bootstrap,
            settings=member_settings(app_id),
        )
        attacking = asyncio.ensure_future(run_while(copy, stop, 0.0))
        try:
            await member.subscribe([a, b])
            got = await handle_all(member, expected, time.monotonic() + WAIT_S)
        finally:
            stop.set()
            await attacking
            await member.close()
            await copier.stop()
            await producer.stop()
        return got, copied

    # no direct path: every ShareFetch travels as a record of a request topic
    settings = {**LEADER_SETTINGS, "queueflow.leader.listener": ""}
    worker = LeaderWorker(app_id, [a, b], kafka_bootstrap, tmp_path, settings)
    with worker.start():
        got, copied = asyncio.run(scenario())
    assert copied > 0
    assert_once(got, expected)
    log = worker.log_path.read_text()
    assert "wrong_destination" in log


def _member_keys(values: list[bytes]) -> set[bytes]:
    """The member public keys in the clear headers of member envelopes (what any reader of the
    coordinator or request topics sees)."""
    keys = set()
    for value in values:
        if value[:1] != bytes((MEMBER_FORMAT,)) or len(value) < 40:
            continue
        (n,) = struct.unpack_from(">H", value, 37)
        head = msgspec.msgpack.decode(value[39 : 39 + n])
        keys.add(bytes(head[4]))
    return keys


def test_a_member_credential_cannot_act_as_a_worker(
    kafka_bootstrap: str, topic_factory: object, tmp_path: Path
) -> None:
    topic = topic_factory(2)  # type: ignore[operator]
    app_id = f"qf-insider-{uuid.uuid4().hex[:8]}"
    first = [f"i-{i}" for i in range(250)]
    after = [f"after-{i}" for i in range(50)]
    asyncio.run(produce_records(kafka_bootstrap, topic, first, partitions=2))
    credential = member_credential(SECRET, app_id)
    insider = ControlAuth(Credentials.from_member_credential(credential, app_id), role="member")
    creds = Credentials.from_member_credential(credential, app_id)
    # the insider's own key pair, sealing "answers" to the victim's public key
    forger = ReplySealer(X25519PrivateKey.generate())
    coordinator = topics.coordinator_topic(app_id)
    request_topic = topics.request_topic(app_id, topic)
    replies = topics.reply_topic(app_id)

    def forgeries() -> list[tuple[str, int, bytes]]:
        now = int(time.time() * 1000)
        out = []
        for p in range(2):
            fence = protocol.Fence(leader_epoch=ABSURD, sent_ms=now)
            out.append(
                (
                    request_topic,
                    p,
                    insider.seal(protocol.encode(fence), topic_dest(request_topic, p)),
                )
            )
            announcement = protocol.LeaderAnnouncement(
                topic=topic,
                partitions=[0, 1],
                leader_epoch=ABSURD,
                address="black.hole:9",
                sent_ms=now,
            )
            for message in (fence, announcement):
                # the partitions of the victim's and the insider's groups (every partition's
                # refusals would fill the rate-limited refusal log before the wrong_role ones)
                for cp in sorted(
                    {
                        topics.coordinator_partition(g, COORDINATOR_PARTITIONS)
                        for g in ("insider-victim", "insider")
                    }
                ):
                    sealed = insider.seal(protocol.encode(message), topic_dest(coordinator, cp))
                    out.append((coordinator, cp, sealed))
        configs = protocol.AlterGroupConfigsRequest(
            group="insider",
            admin_id="insider",
            request_id=1,
            reply_partition=0,
            set_configs={
                "share.delivery.count.limit": "2",
                "share.record.lock.duration.ms": "1000",
            },
        )
        cp = topics.coordinator_partition("insider", COORDINATOR_PARTITIONS)
        out.append(
            (coordinator, cp, insider.seal(protocol.encode(configs), topic_dest(coordinator, cp)))
        )
        # a ticket of config version 2**62, MAC'd with the only key a member has
        ticket = issue_ticket(
            creds.member_key,
            group="insider",
            member_id="insider-m",
            member_epoch=ABSURD,
            partitions=[(topic, 0), (topic, 1)],
            ttl_ms=60_000,
            config_version=ABSURD,
            configs=[("share.delivery.count.limit", "2")],
            reply_key=insider.reply_key.public if insider.reply_key else b"",
        )
        fetch = protocol.ShareFetchRequest(
            group="insider",
            topic=topic,
            partition=0,
            member_id="insider-m",
            request_id=1,
            reply_partition=0,
            max_records=500,
            deadline_ms=now + 30_000,
            ticket=ticket,
        )
        out.append(
            (request_topic, 0, insider.seal(protocol.encode(fetch), topic_dest(request_topic, 0)))
        )
        return out

    async def scenario() -> tuple[list[ShareRecord], list[ShareRecord], int]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        watcher = AIOKafkaConsumer(
            coordinator, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest"
        )
        await producer.start()
        await watcher.start()
        stop = asyncio.Event()
        victims: set[bytes] = set()

        async def attack() -> None:
            for _tp, records in (await watcher.getmany(timeout_ms=50)).items():
                victims.update(_member_keys([r.value or b"" for r in records]))
            for t, p, data in forgeries():
                await producer.send(t, data, partition=p)
            for public in victims:  # heartbeat answers of member epoch 2**62, sealed to it
                route = reply_route(public)
                for rp in range(topics.REPLY_PARTITIONS):
                    for request_id in range(1, 11):
                        answer = protocol.HeartbeatResponse(
                            member_id="?",
                            request_id=request_id,
                            member_epoch=ABSURD,
                            heartbeat_interval_ms=500,
                            coordinator_epoch=ABSURD,
                        )
                        body = forger.seal(
                            public, protocol.encode(answer), reply_dest(replies, rp, route)
                        )
                        await producer.send(replies, body, key=route.encode(), partition=rp)

        member = ShareConsumer(
            "insider-victim",
            app_id=app_id,
            bootstrap_servers=kafka_bootstrap,
            settings=member_settings(app_id),
        )
        attacking = asyncio.ensure_future(run_while(attack, stop, 0.2))
        try:
            await member.subscribe([topic])
            got = await handle_all(member, {v.encode() for v in first}, time.monotonic() + WAIT_S)
            stop.set()
            rounds = await attacking
            # after the attack: it keeps handling records once each
            await produce_records(kafka_bootstrap, topic, after, partitions=2)
            later = await handle_all(member, {v.encode() for v in after}, time.monotonic() + 20)
        finally:
            stop.set()
            if not attacking.done():
                await attacking
            await member.close()
            await watcher.stop()
            await producer.stop()
        return got, later, rounds

    worker = LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path, LEADER_SETTINGS)
    with worker.start():
        got, later, rounds = asyncio.run(scenario())
    assert rounds > 0
    assert_once(got, {v.encode() for v in first})
    assert_once(later, {v.encode() for v in after})
    log = worker.log_path.read_text()
    assert "wrong_role" in log
    assert "leader_fenced" not in log and "leader_stepped_down" not in log
