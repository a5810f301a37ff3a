"""Dead-letter topics on the real broker (KIP-1191 ``errors.deadletterqueue.topic.name`` /
``.copy.record.enable``; docs/guide.md "Dead-letter topics"): every record a group archives
(REJECT, the delivery count limit, undecodable) is written to its DLQ with the
``queueflow.dead_letter.*`` headers before the archive is final; a missing DLQ topic loses
nothing, across a leader killed while it holds them; ``--redrive`` moves them back."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from admin_env import MEMBER_SETTINGS, WAIT_S
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as KafkaTopicPartition
from click.testing import CliRunner
from test_member_robustness import produce_with_bad_header

from queueflow import ACCEPT, REJECT, RELEASE, ShareConsumer
from queueflow.admin import ShareGroupAdmin
from queueflow.devtools.broker import create_topic
from queueflow.devtools.cli import cli
from queueflow.kafka.config import KafkaClientConfig
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

LEADER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.session.timeout.ms": 6000,
    "group.share.heartbeat.interval.ms": 500,
}
DLQ = "errors.deadletterqueue.topic.name"
COPY = "errors.deadletterqueue.copy.record.enable"
H = "queueflow.dead_letter."


@pytest.fixture(scope="module")
def app(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two 1-partition source topics led by one leader worker."""
    suffix = uuid.uuid4().hex[:8]
    topics = [f"qf-dlq-src-{suffix}", f"qf-dlq-held-{suffix}"]
    for topic in topics:
        create_topic(kafka_bootstrap, topic, 1)
    app_id = f"qf-dlq-{suffix}"
    worker = LeaderWorker(
        app_id,
        topics,
        kafka_bootstrap,
        tmp_path_factory.mktemp("dlq") / "data",
        LEADER_SETTINGS,
    )
    with worker.start():
        yield {"topics": topics, "app_id": app_id, "worker": worker, "suffix": suffix}


def admin_of(bootstrap: str, app_id: str) -> ShareGroupAdmin:
    return ShareGroupAdmin(app_id, KafkaClientConfig(bootstrap, "dlq-test"), 20_000)


def member(bootstrap: str, app_id: str, group: str) -> ShareConsumer:
    return ShareConsumer(
        group,
        app_id=app_id,
        bootstrap_servers=bootstrap,
        acknowledgement_mode="explicit",
        settings=MEMBER_SETTINGS,
    )


async def read_all(bootstrap: str, topic: str, count: int) -> list[Any]:
    """The first ``count`` records of ``topic[0]``; fails after :data:`WAIT_S`."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tp = KafkaTopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        got: list[Any] = []
        deadline = time.monotonic() + WAIT_S
        while len(got) < count:
            assert time.monotonic() < deadline, f"only {len(got)} of {count} in {topic}"
            batch = await consumer.getmany(tp, timeout_ms=500)
            got.extend(batch.get(tp, []))
        return got
    finally:
        await consumer.stop()


async def configure(
    bootstrap: str, app: dict[str, Any], group: str, topic: str, configs: dict[str, object]
) -> ShareConsumer:
    """A member of ``group`` subscribed to ``topic``, once the leader applied ``configs``."""
    consumer = member(bootstrap, app["app_id"], group)
    await consumer.subscribe([topic])
    await admin_of(bootstrap, app["app_id"]).alter_group_configs(group, configs)
    worker: LeaderWorker = app["worker"]
    deadline = time.monotonic() + WAIT_S

    def applied() -> bool:
        return any(
            e.get("group") == group and e.get("configs", {}).get(DLQ) == configs[DLQ]
            for e in worker.events("share_group_configs_applied")
        )

    while not applied():  # the next ticket carries them; a poll sends it
        assert time.monotonic() < deadline, "the leader never applied the group's configs"
        for record in await consumer.poll(200):
            consumer.acknowledge(record, RELEASE)
    return consumer


def headers(record: Any) -> dict[str, str]:
    return {k: v.decode() for k, v in record.headers if k.startswith(H)}


def test_archived_records_land_in_the_dlq_with_headers_and_redrive_moves_them_back(
    kafka_bootstrap: str, app: dict[str, Any]
) -> None:
    topic, app_id, dlq = app["topics"][0], app["app_id"], f"qf-dlq-{app['suffix']}"
    create_topic(kafka_bootstrap, dlq, 1)
    configs = {DLQ: dlq, COPY: "true", "share.delivery.count.limit": 2}

    async def scenario() -> list[Any]:
        consumer = await configure(kafka_bootstrap, app, "g-dlq", topic, configs)
        try:
            values = [b"reject", b"fail", b"ok", b"bad-header"]
            await produce_with_bad_header(kafka_bootstrap, topic, values, bad_at=3)
            deadline = time.monotonic() + WAIT_S
            seen: list[bytes] = []  # until "fail" failed at the delivery count limit (2)
            while sorted(seen) != [b"fail", b"fail", b"ok", b"reject"]:
                assert time.monotonic() < deadline, f"delivered so far: {seen}"
                for record in await consumer.poll(500):
                    seen.append(record.value)
                    if record.value == b"reject":
                        consumer.acknowledge(record, REJECT, error=ValueError("no way"))
                    elif record.value == b"fail":
                        consumer.acknowledge(record, RELEASE, error=RuntimeError("boom"))
                    else:
                        consumer.acknowledge(record, ACCEPT)
                await consumer.commit_sync()
            letters = await read_all(kafka_bootstrap, dlq, 3)
            # Redrive: a dry run counts, the run moves them back, the group handles them.
            result = await asyncio.to_thread(  # the CLI runs its own event loop
                CliRunner().invoke,
                cli,
                [
                    "share-groups",
                    "--bootstrap-server",
                    kafka_bootstrap,
                    "--app",
                    app_id,
                    "--redrive",
                    "--group",
                    "g-dlq",
                    "--dry-run",
                ],
                catch_exceptions=False,
            )
            assert result.exit_code == 0 and f"Would move 3 records from {dlq!r}" in result.output
            moved = await admin_of(kafka_bootstrap, app_id).redrive("g-dlq")
            assert moved.moved == {topic: 3} and not moved.skipped and not moved.missing
            again = await admin_of(kafka_bootstrap, app_id).redrive("g-dlq")
            assert again.moved == {}  # its progress is committed
            handled: list[bytes] = []
            while len(handled) < 3:
                assert time.monotonic() < deadline, f"redriven records handled: {handled}"
                for record in await consumer.poll(500):
                    consumer.acknowledge(record, ACCEPT)
                    handled.append(record.value)
            await consumer.commit_sync()
            assert sorted(handled) == [b"bad-header", b"fail", b"reject"]
            return letters
        finally:
            await consumer.close()

    letters = asyncio.run(scenario())
    by_offset = {int(headers(r)["queueflow.dead_letter.offset"]): r for r in letters}
    assert sorted(by_offset) == [0, 1, 3]
    common = {H + "group": "g-dlq", H + "topic": topic, H + "partition": "0"}
    assert headers(by_offset[0]) == {
        **common,
        H + "offset": "0",
        H + "delivery_count": "1",
        H + "reason": "rejected",
        H + "exception.type": "ValueError",
        H + "exception.message": "no way",
    }
    assert headers(by_offset[1]) == {
        **common,
        H + "offset": "1",
        H + "delivery_count": "2",
        H + "reason": "delivery_limit",
        H + "exception.type": "RuntimeError",
        H + "exception.message": "boom",
    }
    assert headers(by_offset[3])[H + "reason"] == "undecodable"
    assert [by_offset[o].value for o in (0, 1, 3)] == [b"reject", b"fail", b"bad-header"]
    assert ("ok", b"1") in by_offset[0].headers  # the source record's headers come along
    events = app["worker"].events("dead_letters_written")
    assert sum(e["records"] for e in events if e["group"] == "g-dlq") == 3


def test_missing_dlq_topic_loses_nothing_across_a_leader_crash(
    kafka_bootstrap: str, app: dict[str, Any]
) -> None:
    topic, app_id = app["topics"][1], app["app_id"]
    dlq = f"qf-dlq-late-{app['suffix']}"
    worker: LeaderWorker = app["worker"]
    admin = admin_of(kafka_bootstrap, app_id)

    async def archiving() -> int | None:
        (offsets,) = await admin.list_offsets("g-held")
        return offsets.in_flight.get("ARCHIVING")

    async def scenario() -> list[Any]:
        consumer = await configure(kafka_bootstrap, app, "g-held", topic, {DLQ: dlq, COPY: "false"})
        try:
            await produce_records(kafka_bootstrap, topic, ["a", "b", "c"], partition=0)
            deadline = time.monotonic() + WAIT_S
            rejected = 0
            while rejected < 3:
                assert time.monotonic() < deadline, "the records were never delivered"
                for record in await consumer.poll(500):
                    consumer.acknowledge(record, REJECT)
                    rejected += 1
                await consumer.commit_sync()
            while not worker.events("dead_letter_write_failed"):
                assert time.monotonic() < deadline, "no dead_letter_write_failed logged"
                await asyncio.sleep(0.2)
            (failed,) = worker.events("dead_letter_write_failed")[:1]
            assert (
                failed["dead_letter_topic"] == dlq
                and f"create the topic {dlq!r}" in (failed["action"])
            )
            while await archiving() != 3:  # held, visible, nothing lost
                assert time.monotonic() < deadline, "the held records are not described"
                await asyncio.sleep(0.2)
            worker.kill()  # the leader dies holding them
            worker.start()
            create_topic(kafka_bootstrap, dlq, 1)
            reading = asyncio.ensure_future(read_all(kafka_bootstrap, dlq, 3))
            while not reading.done():  # a poll loads the share-partition on the new leader
                assert time.monotonic() < deadline + WAIT_S, "nothing written after takeover"
                for record in await consumer.poll(200):
                    consumer.acknowledge(record, ACCEPT)
            letters = await reading
            while await archiving():  # archived once written
                assert time.monotonic() < deadline, "the written records stay held"
                for record in await consumer.poll(200):  # keeps the share-partition loaded
                    consumer.acknowledge(record, ACCEPT)
                await consumer.commit_sync()
            (offsets,) = await admin.list_offsets("g-held")
            assert offsets.start_offset == 3
            return letters
        finally:
            await consumer.close()

    letters = asyncio.run(scenario())
    assert sorted(int(headers(r)[H + "offset"]) for r in letters) == [0, 1, 2]
    for r in letters:
        assert r.key is None and r.value == b""  # copy.record.enable=false
        # After the crash the reason comes from the delivery count (below the limit).
        assert headers(r)[H + "reason"] == "rejected"
