"""``spark.read.format("queueflow-state")`` against a real leader worker: what consumers did to a
share group (accept, release, reject, hold, redeliver to the limit) read back from the state
changelog as ranges and as records; plus the replay rules on hand-made tables (no Spark)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from queueflow import ACCEPT, REJECT, RELEASE, AcknowledgeType, ShareConsumer, ShareRecord
from queueflow.engine.state import RecordState, ShareSnapshot, ShareUpdate, StateBatch
from queueflow.errors import ConfigurationError
from queueflow.protocol.state_codec import encode_snapshot, encode_update
from queueflow.protocol.topics import state_changelog
from queueflow.spark.state import (
    QueueflowStateReader,
    latest_values,
    state_rows,
)
from queueflow.testing import LeaderWorker, produce

DELIVERY_LIMIT = 3
LEADER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.delivery.count.limit": DELIVERY_LIMIT,
    "group.share.record.lock.duration.ms": 60000,  # the held record stays Acquired
    "group.share.heartbeat.interval.ms": 500,
    "share.coordinator.snapshot.update.records.per.snapshot": 3,  # snapshots, tombstones
}
MEMBER_SETTINGS = {
    "group.share.heartbeat.interval.ms": 500,
    "max.poll.records": 1,  # one record per poll: the order of deliveries is fixed
    "queueflow.request.timeout.ms": 2000,
}
WAIT_S = 30.0

# What consumer B does with each delivery of each offset, by delivery count. Offset 0 is held
# by consumer A (Acquired) throughout; offsets 6 and 7 are never delivered.
SCRIPT: dict[int, dict[int, AcknowledgeType]] = {
    1: {1: RELEASE, 2: RELEASE, 3: RELEASE},  # the third release hits the limit: Archived
    2: {1: REJECT},
    3: {1: RELEASE, 2: ACCEPT},
    4: {1: ACCEPT},
    5: {1: RELEASE},  # then B stops polling: Available, delivered once
}
EXPECTED_RANGES = [  # (first, last, state, delivery count) of group "g", SPSO 0, SPEO 6
    (0, 0, "ACQUIRED", 1),  # Acquired by A: persisted with its lock
    (1, 1, "ARCHIVED", 3),
    (2, 2, "ARCHIVED", 1),
    (3, 3, "ACKNOWLEDGED", 2),
    (4, 4, "ACKNOWLEDGED", 1),
    (5, 5, "AVAILABLE", 1),
]


@pytest.fixture(scope="module")
def session(spark: Any) -> Any:
    """The session's SparkSession (queueflow's formats registered by the fixture)."""
    return spark


def _consumer(bootstrap: str, app_id: str, group: str, **settings: Any) -> ShareConsumer:
    return ShareConsumer(
        group,
        app_id=app_id,
        bootstrap_servers=bootstrap,
        acknowledgement_mode="explicit",
        settings={**MEMBER_SETTINGS, **settings},
    )


async def _poll(c: ShareConsumer, what: str) -> list[ShareRecord]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        records = await c.poll(timeout_ms=500)
        if records:
            return records
    raise AssertionError(f"no record for {what} within {WAIT_S} s")


async def _scenario(bootstrap: str, app_id: str, topic: str, leader: LeaderWorker) -> None:
    await produce(bootstrap, topic, [f"job-{i}" for i in range(8)])
    holder = _consumer(bootstrap, app_id, "g")
    worker = _consumer(bootstrap, app_id, "g")
    other = _consumer(bootstrap, app_id, "other", **{"max.poll.records": 500})
    try:
        await holder.subscribe([topic])
        held = await _poll(holder, "the holder")
        assert [(r.offset, r.delivery_count) for r in held] == [(0, 1)]

        await worker.subscribe([topic])
        done = False
        while not done:
            records = await _poll(worker, "the worker")
            assert len(records) == 1, records
            r = records[0]
            action = SCRIPT.get(r.offset, {}).get(r.delivery_count)
            assert action is not None, f"unexpected delivery {r.offset} #{r.delivery_count}"
            worker.acknowledge(r, action)
            done = (r.offset, r.delivery_count) == (5, 1)
        assert all(e is None for e in (await worker.commit_sync()).values())

        # Group "other" finishes everything: SPSO = SPEO = 8, nothing in flight.
        await other.subscribe([topic])
        seen: set[int] = set()
        while seen != set(range(8)):
            for r in await _poll(other, "group other"):
                other.acknowledge(r, ACCEPT)
                seen.add(r.offset)
        assert all(e is None for e in (await other.commit_sync()).values())
        await other.close()
        await worker.close()
        # Stop the leader while the holder still holds offset 0 (SIGTERM flushes the
        # changelog); the state says Available, delivery count 1.
        await asyncio.get_running_loop().run_in_executor(None, leader.stop)
    finally:
        for c in (other, worker, holder):
            # The leader is gone: the holder's release and leave time out.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.close(), 10)


async def _changelogs(bootstrap: str, app_id: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return sorted(t for t in await admin.list_topics() if t.startswith(f"{app_id}-"))
    finally:
        await admin.close()


async def _send(bootstrap: str, topic: str, key: bytes, value: bytes | None) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key, partition=0)
    finally:
        await producer.stop()


@pytest.fixture(scope="module")
def state_topic(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str]]:
    """``(app_id, topic)`` after the scenario ran and the leader stopped; plus a corrupt
    snapshot of a group "broken" in the changelog."""
    from queueflow.devtools.broker import create_topic

    app_id = f"qf-state-{uuid.uuid4().hex[:8]}"
    topic = f"qf-state-jobs-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, 1)
    leader = LeaderWorker(
        app_id,
        [topic],
        kafka_bootstrap,
        tmp_path_factory.mktemp("state") / "leader",
        settings=LEADER_SETTINGS,
    )
    leader.start()
    try:
        asyncio.run(_scenario(kafka_bootstrap, app_id, topic, leader))
    finally:
        leader.stop()
    changelog = state_changelog(app_id, topic)
    # The name Faust gives the table's changelog, as listed by the broker.
    assert changelog in asyncio.run(_changelogs(kafka_bootstrap, app_id))
    assert changelog == f"{app_id}-share-state-{topic}-changelog"
    asyncio.run(_send(kafka_bootstrap, changelog, b"S/broken/0", b'{"v":1,"t":"snap'))
    yield app_id, topic


def _read(session: Any, bootstrap: str, app_id: str, topic: str, **options: str) -> Any:
    reader = session.read.format("queueflow-state").option("bootstrap.servers", bootstrap)
    reader = reader.option("app.id", app_id).option("topic", topic)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_ranges_show_spso_speo_states_and_delivery_counts(
    session: Any, kafka_bootstrap: str, state_topic: tuple[str, str]
) -> None:
    app_id, topic = state_topic
    df = _read(session, kafka_bootstrap, app_id, topic)
    assert df.columns == [
        "group",
        "topic",
        "partition",
        "spso",
        "speo",
        "first_offset",
        "last_offset",
        "state",
        "delivery_count",
        "state_epoch",
        "snapshot_epoch",
        "error",
    ]
    rows = [r.asDict() for r in df.orderBy("group", "first_offset").collect()]
    by_group: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_group.setdefault(r["group"], []).append(r)
    assert set(by_group) == {"g", "other", "broken"}

    g = by_group["g"]
    assert {(r["topic"], r["partition"], r["spso"], r["speo"], r["error"]) for r in g} == {
        (topic, 0, 0, 6, None)
    }
    got = [(r["first_offset"], r["last_offset"], r["state"], r["delivery_count"]) for r in g]
    assert got == EXPECTED_RANGES
    # A snapshot after every 3 deltas: the snapshot epoch moved on (old deltas tombstoned).
    assert all(r["snapshot_epoch"] >= 2 and r["state_epoch"] >= 0 for r in g)

    (other,) = by_group["other"]
    assert (other["spso"], other["speo"], other["first_offset"], other["state"]) == (
        8,
        8,
        None,
        None,
    )
    (broken,) = by_group["broken"]
    assert broken["spso"] is None and broken["state"] is None
    assert "corrupt share-partition state for group=broken" in broken["error"]

    only_g = _read(session, kafka_bootstrap, app_id, topic, group="g").collect()
    assert {r["group"] for r in only_g} == {"g"} and len(only_g) == len(EXPECTED_RANGES)


def test_records_view_finds_poison_records_and_hot_spots(
    session: Any, kafka_bootstrap: str, state_topic: tuple[str, str]
) -> None:
    app_id, topic = state_topic
    df = _read(session, kafka_bootstrap, app_id, topic, view="records", group="g")
    assert df.columns == [
        "group",
        "topic",
        "partition",
        "offset",
        "state",
        "delivery_count",
        "error",
    ]
    df.createOrReplaceTempView("qf_records")
    poison = session.sql(
        f"select offset from qf_records where state = 'ARCHIVED' and delivery_count >= "
        f"{DELIVERY_LIMIT}"
    ).collect()
    assert [r["offset"] for r in poison] == [1]
    hot = session.sql(
        "select delivery_count, count(*) as n from qf_records group by delivery_count "
        "order by delivery_count"
    ).collect()
    assert [(r["delivery_count"], r["n"]) for r in hot] == [(1, 4), (2, 1), (3, 1)]
    offsets = [r["offset"] for r in df.orderBy("offset").collect()]
    assert offsets == list(range(6))


def test_bad_options_are_named(
    kafka_bootstrap: str, state_topic: tuple[str, str], session: Any
) -> None:
    app_id, topic = state_topic
    with pytest.raises(ConfigurationError, match=r"'app\.id'"):
        QueueflowStateReader({"bootstrap.servers": kafka_bootstrap, "topic": topic})
    with pytest.raises(ConfigurationError, match=r"'bootstrap\.servers'"):
        QueueflowStateReader({"app.id": app_id, "topic": topic})
    with pytest.raises(ConfigurationError, match="'view'"):
        QueueflowStateReader(
            {"bootstrap.servers": kafka_bootstrap, "app.id": app_id, "topic": topic, "view": "x"}
        )
    nowhere = f"no-such-app-{uuid.uuid4().hex[:8]}"
    reader = QueueflowStateReader(
        {"bootstrap.servers": kafka_bootstrap, "app.id": nowhere, "topic": topic}
    )
    with pytest.raises(ConfigurationError, match=r"no state changelog topic.*'app\.id'"):
        reader.partitions()
    # Through Spark, the message reaches the user too.
    with pytest.raises(Exception, match="no state changelog topic"):
        _read(session, kafka_bootstrap, nowhere, topic).collect()
    # Looking did not create it (a metadata request naming a topic would, on this broker).
    assert asyncio.run(_changelogs(kafka_bootstrap, nowhere)) == []


# --------------------------------------------------------------------------------------------
# Replay rules on hand-made tables (no Kafka, no Spark)
# --------------------------------------------------------------------------------------------


def _b(first: int, last: int, state: RecordState, count: int) -> StateBatch:
    return StateBatch(first, last, state, count)


def _snapshot(state_epoch: int, snapshot_epoch: int, spso: int, *batches: StateBatch) -> bytes:
    return encode_snapshot(ShareSnapshot(snapshot_epoch, state_epoch, 0, spso, tuple(batches)))


def _delta(se: int, sne: int, index: int, spso: int, *batches: StateBatch) -> bytes:
    return encode_update(
        ShareUpdate(spso, tuple(batches)), snapshot_epoch=sne, state_epoch=se, delta_index=index
    )


def _key(*parts: object) -> bytes:
    kind, group, partition, *rest = parts
    tail = "".join(f"/{p:010d}" for p in rest[:2]) + "".join(f"/{p:06d}" for p in rest[2:])
    return f"{kind}/{group}/{partition}{tail}".encode()


A, K, X = RecordState.AVAILABLE, RecordState.ACKNOWLEDGED, RecordState.ARCHIVED


def test_replay_follows_the_leaders_rule() -> None:
    table = latest_values(
        iter(
            [
                (_key("S", "a/b", 3), _snapshot(1, 1, 10, _b(10, 11, A, 1))),
                (_key("D", "a/b", 3, 1, 1, 0), _delta(1, 1, 0, 10, _b(10, 10, K, 1))),
                (_key("D", "a/b", 3, 1, 1, 1), _delta(1, 1, 1, 10, _b(14, 15, X, 5))),
                # A fenced leader's late delta (older state epoch) and a superseded one: ignored.
                (_key("D", "a/b", 3, 0, 1, 2), _delta(0, 1, 2, 10, _b(11, 11, K, 9))),
                (_key("D", "a/b", 3, 1, 0, 2), _delta(1, 0, 2, 10, _b(11, 11, K, 9))),
                # A tombstoned delta is gone, so index 3 after a gap at 2 is not reached.
                (_key("D", "a/b", 3, 1, 1, 2), _delta(1, 1, 2, 10, _b(11, 11, X, 7))),
                (_key("D", "a/b", 3, 1, 1, 2), None),
                (_key("D", "a/b", 3, 1, 1, 3), _delta(1, 1, 3, 10, _b(11, 11, X, 8))),
                (None, b"no key"),
            ]
        )
    )
    rows = list(state_rows("t", table))
    assert [r[5:9] for r in rows] == [
        (10, 10, "ACKNOWLEDGED", 1),
        (11, 11, "AVAILABLE", 1),
        (12, 13, "AVAILABLE", 0),  # never delivered: not in the state
        (14, 15, "ARCHIVED", 5),
    ]
    assert {r[:5] for r in rows} == {("a/b", "t", 3, 10, 16)}
    assert {(r[9], r[10], r[11]) for r in rows} == {(1, 1, None)}
    records = list(state_rows("t", table, view="records"))
    assert [(r[3], r[4], r[5]) for r in records][:3] == [
        (10, "ACKNOWLEDGED", 1),
        (11, "AVAILABLE", 1),
        (12, "AVAILABLE", 0),
    ]
    assert len(records) == 6


def test_corrupt_state_becomes_an_error_row_and_a_warning() -> None:
    from structlog.testing import capture_logs

    table = {
        _key("S", "ok", 0): _snapshot(0, 0, 4),
        _key("S", "bad", 0): _snapshot(0, 0, 0, _b(0, 1, A, 1)),
        _key("D", "bad", 0, 0, 0, 0): _delta(0, 1, 0, 0, _b(0, 0, K, 1)),  # wrong epochs
        _key("S", "v2", 0): b'{"v":2,"t":"snapshot"}',
        b"X/strange": b"?",
    }
    with capture_logs() as logs:
        rows = {r[0]: r for r in state_rows("t", table)}
    assert rows["ok"] == ("ok", "t", 0, 4, 4, None, None, None, None, 0, 0, None)
    assert "says state epoch 0, snapshot epoch 1" in rows["bad"][11]
    assert "unknown share-partition state format version 2" in rows["v2"][11]
    assert "unrecognised state table key b'X/strange'" in rows[None][11]
    assert all(r[3] is None for g, r in rows.items() if g != "ok")
    assert sorted(e["event"] for e in logs) == ["state_corrupt"] * 3
    only_ok = list(state_rows("t", table, group="ok", view="records"))
    assert only_ok == []  # in-flight records: none
