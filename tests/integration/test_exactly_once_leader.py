"""The leader side of ``queueflow.processing.guarantee=exactly_once`` on the real broker
(docs/architecture.md "Exactly-once: transactional acknowledgements"): a member's
ShareAcknowledge, sealed as the member seals it and produced to the ack topic by a real
transactional producer, is applied by the leader when its transaction commits, never when it
aborts; a transaction left open holds the partition's lock expiries until the broker aborts it;
and a committed acknowledgement a SIGKILLed leader never applied is applied by the next one.

A ``ShareConsumer`` (explicit acknowledgement, never acknowledging itself) acquires the records;
the test writes its acknowledgement to the ack topic the way an exactly-once member does; a
second consumer shows whether the records come again.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import urllib.request
import uuid
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from queueflow import ShareConsumer, ShareRecord
from queueflow.devtools.broker import create_topic
from queueflow.devtools.broker.acls import create_acls, role_acls
from queueflow.errors import ConfigurationError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.transactions import check_ack_topics_readable, check_transactions
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.envelope import topic_dest
from queueflow.structs import AcknowledgeType
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

SECRET = secrets.token_urlsafe(32)
AUTH = {"queueflow.auth.mode": "hmac", "queueflow.auth.secret": SECRET}
LOCK_MS = 2000
TXN_TIMEOUT_MS = 5000
WORKER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.record.lock.duration.ms": LOCK_MS,
    "group.share.session.timeout.ms": 30_000,
    "group.share.heartbeat.interval.ms": 500,
    "queueflow.lock.check.interval.ms": 100,
    "queueflow.processing.guarantee": "exactly_once",
    **AUTH,
}
MEMBER_SETTINGS = {
    "group.share.heartbeat.interval.ms": 500,
    "group.share.session.timeout.ms": 30_000,
    "fetch.max.wait.ms": 500,
    "queueflow.request.timeout.ms": 3000,  # requests lost with the killed leader time out soon
    **AUTH,
}
RECORDS = 5
#: A SIGKILLed leader's partitions move to the next one after Faust's session timeout (s).
FAUST_ENV = {"BROKER_SESSION_TIMEOUT": "6", "BROKER_HEARTBEAT_INTERVAL": "1"}


def member(app_id: str, bootstrap: str) -> ShareConsumer:
    return ShareConsumer(
        "g",
        app_id=app_id,
        bootstrap_servers=bootstrap,
        settings=MEMBER_SETTINGS,  # type: ignore[arg-type]
        acknowledgement_mode="explicit",
        max_poll_records=RECORDS,
    )


def sealed_ack(
    consumer: ShareConsumer, app_id: str, topic: str, records: list[ShareRecord]
) -> bytes:
    """The ShareAcknowledge (ACCEPT) of ``records`` as an exactly-once member writes it to
    partition 0 of the ack topic: its request bytes (ticket, member id), in its member
    envelope, sealed for the ack topic's partition."""
    session = consumer._session
    assert session is not None
    requester = session._requester
    offsets = sorted(r.offset for r in records)
    request = protocol.ShareFetchRequest(
        group="g",
        topic=topic,
        partition=0,
        member_id=session.member_id,
        request_id=requester.next_id(),
        reply_partition=requester.reply_partition,
        max_records=0,
        acks=[(offsets[0], offsets[-1], (int(AcknowledgeType.ACCEPT),))],
        deadline_ms=int(time.time() * 1000) + 10_000,
        ticket=session._membership.ticket,
    )
    dest = topic_dest(topics.ack_topic(app_id, topic), 0)
    return requester.auth.seal(protocol.encode(request), dest)


@asynccontextmanager
async def transaction(bootstrap: str, timeout_ms: int = TXN_TIMEOUT_MS) -> Any:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"test-share-txn-{uuid.uuid4().hex[:8]}",
        transaction_timeout_ms=timeout_ms,
    )
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


async def acquire_all(consumer: ShareConsumer, topic: str) -> list[ShareRecord]:
    await consumer.subscribe([topic])
    got: list[ShareRecord] = []
    deadline = time.monotonic() + 20
    while len(got) < RECORDS:
        assert time.monotonic() < deadline, f"acquired {len(got)} of {RECORDS}"
        got += await consumer.poll(timeout_ms=500)
    return got


async def second_look(
    app_id: str, bootstrap: str, topic: str, wait_s: float, arrived: list[float] | None = None
) -> list[ShareRecord]:
    """What another member gets within ``wait_s`` (a sentinel record is produced first, so
    it gets at least that one); ``arrived`` gets the monotonic time of each batch with a
    record other than the sentinel."""
    await produce_records(bootstrap, topic, ["sentinel"])
    other = member(app_id, bootstrap)
    await other.subscribe([topic])
    got: list[ShareRecord] = []
    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline:
            batch = await other.poll(timeout_ms=300)
            for record in batch:
                other.acknowledge(record, AcknowledgeType.ACCEPT)
            if arrived is not None and any(r.value != b"sentinel" for r in batch):
                arrived.append(time.monotonic())
            got += batch
            if len(got) > RECORDS:
                break
    finally:
        await other.close()
    return got


def metric(worker: LeaderWorker, name: str) -> float:
    """The sum of a metric's samples on the worker's /metrics page."""
    url = f"http://127.0.0.1:{worker.web_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as page:
        text = page.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
    )


def healthy(worker: LeaderWorker) -> None:
    """The ack reader ran without failing and no committed acknowledgement was refused."""
    assert not worker.events("ack_reader_failed"), worker.events("ack_reader_failed")
    assert not worker.events("transactional_ack_refused")
    assert worker.events("ack_reader_assigned")


def values(records: list[ShareRecord]) -> list[bytes]:
    return sorted(r.value or b"" for r in records)


def setup(kafka_bootstrap: str, topic_factory: Any, name: str) -> tuple[str, str]:
    topic = topic_factory(1)
    app_id = f"qf-eos-{name}-{uuid.uuid4().hex[:6]}"
    asyncio.run(produce_records(kafka_bootstrap, topic, [f"r{i}" for i in range(RECORDS)]))
    return topic, app_id


def test_a_committed_acknowledgement_is_applied_and_its_records_are_not_delivered_again(
    kafka_bootstrap: str, topic_factory: Any, tmp_path: Path
) -> None:
    topic, app_id = setup(kafka_bootstrap, topic_factory, "commit")

    async def scenario() -> tuple[list[ShareRecord], list[ShareRecord]]:
        holder = member(app_id, kafka_bootstrap)
        try:
            held = await acquire_all(holder, topic)
            async with transaction(kafka_bootstrap) as producer:
                await producer.begin_transaction()
                ack_topic = topics.ack_topic(app_id, topic)
                body = sealed_ack(holder, app_id, topic, held)
                await producer.send_and_wait(ack_topic, body, partition=0)
                await producer.commit_transaction()
            # Past the 2 s locks: without the acknowledgement the records would come again.
            return held, await second_look(app_id, kafka_bootstrap, topic, LOCK_MS / 1000 + 4)
        finally:
            await holder.close()

    worker = LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path, WORKER_SETTINGS)
    with worker.start():
        held, later = asyncio.run(scenario())
        applied = metric(worker, "queueflow_transactional_acks_total")
        lag_s = metric(worker, "queueflow_ack_reader_lag_seconds")
        healthy(worker)
    print(f"committed acknowledgement applied; ack reader lag at the end {lag_s * 1000:.0f} ms")
    assert applied == 1
    assert 0 <= lag_s < 2
    assert len(held) == RECORDS
    assert values(later) == [b"sentinel"]


def test_an_aborted_acknowledgement_is_never_applied_and_its_records_come_again(
    kafka_bootstrap: str, topic_factory: Any, tmp_path: Path
) -> None:
    topic, app_id = setup(kafka_bootstrap, topic_factory, "abort")

    async def scenario() -> list[ShareRecord]:
        holder = member(app_id, kafka_bootstrap)
        try:
            held = await acquire_all(holder, topic)
            async with transaction(kafka_bootstrap) as producer:
                await producer.begin_transaction()
                body = sealed_ack(holder, app_id, topic, held)
                await producer.send_and_wait(topics.ack_topic(app_id, topic), body, partition=0)
                await producer.abort_transaction()
            return await second_look(app_id, kafka_bootstrap, topic, 15)
        finally:
            await holder.close()

    worker = LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path, WORKER_SETTINGS)
    with worker.start():
        later = asyncio.run(scenario())
        applied = metric(worker, "queueflow_transactional_acks_total")
        healthy(worker)
    assert applied == 0
    assert values(later) == sorted([f"r{i}".encode() for i in range(RECORDS)] + [b"sentinel"])
    assert {r.delivery_count for r in later if r.value != b"sentinel"} == {2}


def test_an_open_transaction_holds_lock_expiries_until_the_broker_aborts_it(
    kafka_bootstrap: str, topic_factory: Any, tmp_path: Path
) -> None:
    topic, app_id = setup(kafka_bootstrap, topic_factory, "open")

    async def scenario() -> tuple[float, list[ShareRecord]]:
        holder = member(app_id, kafka_bootstrap)
        try:
            held = await acquire_all(holder, topic)
            async with transaction(kafka_bootstrap) as producer:
                await producer.begin_transaction()
                body = sealed_ack(holder, app_id, topic, held)
                await producer.send_and_wait(topics.ack_topic(app_id, topic), body, partition=0)
                opened = time.monotonic()
            # The member is gone without committing: the transaction stays open until the
            # broker aborts it, after its timeout.
            arrived: list[float] = []
            later = await second_look(app_id, kafka_bootstrap, topic, 25, arrived)
            return (arrived[0] if arrived else time.monotonic()) - opened, later
        finally:
            await holder.close()

    worker = LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path, WORKER_SETTINGS)
    with worker.start():
        waited, later = asyncio.run(scenario())
        applied = metric(worker, "queueflow_transactional_acks_total")
        healthy(worker)
    redelivered = [r for r in later if r.value != b"sentinel"]
    assert values(redelivered) == [f"r{i}".encode() for i in range(RECORDS)], later
    # Not at the 2 s lock deadline: only once the transaction timed out and was aborted.
    print(
        f"open transaction: records delivered again {waited:.1f} s after its produce "
        f"(lock {LOCK_MS} ms, transaction timeout {TXN_TIMEOUT_MS} ms)"
    )
    assert TXN_TIMEOUT_MS / 1000 <= waited < TXN_TIMEOUT_MS / 1000 + 10, waited
    assert applied == 0


def test_a_committed_acknowledgement_a_killed_leader_never_applied_is_applied_by_the_next(
    kafka_bootstrap: str, topic_factory: Any, tmp_path: Path
) -> None:
    """The first leader applies a committed acknowledgement of records 0..1 and is SIGKILLed;
    one of records 2..4 is committed while no leader runs. The next leader resumes its ack
    reader right after the first one (its position persisted in the state table): it applies
    the second acknowledgement once and not the first again, and no record comes again."""
    topic, app_id = setup(kafka_bootstrap, topic_factory, "kill")
    ack_topic = topics.ack_topic(app_id, topic)
    first = LeaderWorker(
        app_id, [topic], kafka_bootstrap, tmp_path / "a", WORKER_SETTINGS, env=FAUST_ENV
    )

    async def commit(holder: ShareConsumer, records: list[ShareRecord]) -> None:
        async with transaction(kafka_bootstrap) as producer:
            await producer.begin_transaction()
            body = sealed_ack(holder, app_id, topic, records)
            await producer.send_and_wait(ack_topic, body, partition=0)
            await producer.commit_transaction()

    async def applied(worker: LeaderWorker, count: int) -> None:
        deadline = time.monotonic() + 10
        name = "queueflow_transactional_acks_total"
        while await asyncio.to_thread(metric, worker, name) < count:
            assert time.monotonic() < deadline, f"{worker.log_tail()}"
            await asyncio.sleep(0.1)

    async def scenario() -> tuple[list[ShareRecord], float]:
        holder = member(app_id, kafka_bootstrap)
        try:
            held = sorted(await acquire_all(holder, topic), key=lambda r: r.offset)
            await commit(holder, held[:2])
            await applied(first, 1)
            first.kill()  # SIGKILL: the next leader restores locks and positions from the table
            await commit(holder, held[2:])
            second = LeaderWorker(
                app_id, [topic], kafka_bootstrap, tmp_path / "b", WORKER_SETTINGS, env=FAUST_ENV
            )
            with second.start():
                later = await second_look(app_id, kafka_bootstrap, topic, LOCK_MS / 1000 + 4)
                count = metric(second, "queueflow_transactional_acks_total")
                healthy(second)  # no acknowledgement applied twice (refused as stale)
                return later, count
        finally:
            await holder.close()

    first.start()
    try:
        later, count = asyncio.run(scenario())
    finally:
        first.stop()
    assert count == 1
    assert values(later) == [b"sentinel"]


def test_exactly_once_is_refused_at_start_naming_the_missing_acl(secured_broker: Any) -> None:
    """On a cluster with ACLs: a principal without the transactional-id ACLs is refused
    naming them, a leader without READ on the ack topic is refused naming it; with the ACLs of
    ``queueflow acls apply --exactly-once`` both checks pass."""
    security = secured_broker.security
    app_id = f"qf-eos-acl-{uuid.uuid4().hex[:6]}"
    source = f"{app_id}-src"
    ack_topic = topics.ack_topic(app_id, source)
    admin = {"bootstrap_servers": secured_broker.sasl_bootstrap, **security.sasl_kwargs("admin")}
    for name in (source, ack_topic):
        create_topic(secured_broker.bootstrap, name, 1, client_kwargs=admin, timeout_s=30)

    def config(user: str) -> KafkaClientConfig:
        return KafkaClientConfig(secured_broker.sasl_bootstrap, extra=security.sasl_kwargs(user))

    async def refusals() -> list[str]:
        errors = []
        for check in (
            check_transactions(config("qf-member"), app_id, 10_000, timeout_s=20),
            check_ack_topics_readable(config("qf-leader"), {ack_topic: 1}, timeout_s=20),
        ):
            try:
                await check
                errors.append("")
            except ConfigurationError as exc:
                errors.append(str(exc))
        return errors

    create_acls(admin, role_acls("member", "User:qf-member", app_id, [source]))
    create_acls(admin, role_acls("leader", "User:qf-leader", app_id, [source]))
    txn, read = asyncio.run(refusals())
    assert "TransactionalIdAuthorizationFailed" in txn and f"{app_id}-share-txn-" in txn, txn
    assert "READ on the ack topics" in read and ack_topic in read, read
    for role, user in (("member", "qf-member"), ("leader", "qf-leader")):
        create_acls(admin, role_acls(role, f"User:{user}", app_id, [source], exactly_once=True))
    assert asyncio.run(refusals()) == ["", ""]
