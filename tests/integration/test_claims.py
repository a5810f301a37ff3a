"""Claims of the docs checked on the real broker, one leader worker (``queueflow leader``) for
the module, members in this process (:class:`ShareConsumer`):

* GAP (KIP-932 "unmaterialized record batch" gaps): offsets of a compacted topic whose records
  the log cleaner removed, and the transaction markers of a transactional topic (read
  uncommitted: aborted records are delivered, markers are not records), are never delivered:
  the member acknowledges them as GAP (``queueflow_acknowledgements_total{type="gap"}`` counts
  them) until the leader, told by the first GAP, reads them as holes and archives them itself
  (docs/concepts.md "Acquisition counts records"); the SPSO moves past them;
* RENEW (KIP-1222): a member renewing its lock past the lock duration keeps the record;
* ``commit_async()`` with the acknowledgement commit callback (docs/guide.md "ShareConsumer");
* ``share.auto.offset.reset=by_duration:PT1H`` (a group config): a new share-partition starts
  at the first record at most an hour old (docs/concepts.md).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from aiokafka import AIOKafkaProducer

from queueflow import ACCEPT, RENEW, ShareConsumer, ShareRecord
from queueflow.admin import ShareGroupAdmin, SharePartitionOffsets
from queueflow.devtools.broker import create_topic
from queueflow.kafka.config import KafkaClientConfig
from queueflow.structs import TopicPartition
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records
from tests.integration.topic_reads import COMPACTED, log_offsets

LOCK_MS = 3000
LEADER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.delivery.count.limit": 3,
    "group.share.record.lock.duration.ms": LOCK_MS,
    "group.share.session.timeout.ms": 6000,
    "group.share.heartbeat.interval.ms": 500,
    "queueflow.lock.check.interval.ms": 100,
}
MEMBER_SETTINGS = {
    "group.share.heartbeat.interval.ms": 500,
    "group.share.session.timeout.ms": 6000,
    "max.poll.records": 5,
}
TOPICS = ("compacted", "transactional", "renew", "commit", "duration")
WAIT_S = 40.0


@pytest.fixture(scope="module")
def topics(kafka_bootstrap: str) -> dict[str, str]:
    """The module's topics (one partition each), created before the leader starts."""
    names = {key: f"qf-claims-{key}-{uuid.uuid4().hex[:8]}" for key in TOPICS}
    for key, name in names.items():
        create_topic(kafka_bootstrap, name, 1, config=COMPACTED if key == "compacted" else None)
    return names


@pytest.fixture(scope="module")
def leader(
    kafka_bootstrap: str, topics: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LeaderWorker]:
    worker = LeaderWorker(
        f"qf-claims-{uuid.uuid4().hex[:8]}",
        list(topics.values()),
        kafka_bootstrap,
        tmp_path_factory.mktemp("leader") / "data",
        LEADER_SETTINGS,
    )
    with worker.start():
        yield worker


def member(bootstrap: str, leader: LeaderWorker, group: str) -> ShareConsumer:
    return ShareConsumer(
        group,
        app_id=leader.app_id,
        bootstrap_servers=bootstrap,
        acknowledgement_mode="explicit",
        settings=MEMBER_SETTINGS,
    )


def gap_count(c: ShareConsumer, topic: str) -> float:
    """``queueflow_acknowledgements_total{type="gap"}`` of ``c``'s group and ``topic``."""
    value = c.ctx.metrics.registry.get_sample_value(
        "queueflow_acknowledgements_total", {"group": c.group, "topic": topic, "type": "gap"}
    )
    return value or 0.0


async def accept_until(
    c: ShareConsumer, done: Callable[[list[ShareRecord]], bool], timeout_s: float = WAIT_S
) -> list[ShareRecord]:
    """Poll and ACCEPT until ``done(records so far)``; commit; within a timeout."""
    seen: list[ShareRecord] = []
    deadline = time.monotonic() + timeout_s
    while not done(seen):
        assert time.monotonic() < deadline, f"timed out with {[r.offset for r in seen]}"
        for record in await c.poll(timeout_ms=500):
            seen.append(record)
            c.acknowledge(record, ACCEPT)
    assert all(e is None for e in (await c.commit_sync()).values())
    return seen


async def offsets_when(
    bootstrap: str,
    leader: LeaderWorker,
    group: str,
    topic: str,
    done: Callable[[SharePartitionOffsets], bool],
) -> SharePartitionOffsets:
    """The share-partition's offsets (admin ``list_offsets``) once ``done(offsets)``."""
    admin = ShareGroupAdmin(leader.app_id, KafkaClientConfig(bootstrap))
    deadline = time.monotonic() + WAIT_S
    while True:
        (offsets,) = await admin.list_offsets(group, [topic])
        if done(offsets):
            return offsets
        assert time.monotonic() < deadline, offsets
        await asyncio.sleep(0.3)


def test_compacted_away_offsets_are_gaps(
    kafka_bootstrap: str, topics: dict[str, str], leader: LeaderWorker
) -> None:
    """Offsets whose records the log cleaner removed are never delivered: acknowledged GAP
    (the first ones at least) or archived by the leader's hole reader; the SPSO moves past them
    to the log end."""
    topic = topics["compacted"]

    async def scenario() -> None:
        # offset 0: "first"; 1..10: k0..k9; 11..15: k0, k2, k4, k6, k8 again, so compaction
        # removes offsets 1, 3, 5, 7, 9 (between records that stay).
        keys = ["first", *(f"k{i}" for i in range(10)), *(f"k{i}" for i in range(0, 10, 2))]
        await produce_records(kafka_bootstrap, topic, [f"v{o}" for o in range(16)], keys=keys)
        removed = {1, 3, 5, 7, 9}
        # The cleaner only compacts closed segments: keep appending (each append after
        # segment.ms rolls one) until it has removed them.
        deadline = time.monotonic() + WAIT_S
        while True:
            found, _end = await log_offsets(kafka_bootstrap, topic)
            if not removed & set(found):
                break
            assert time.monotonic() < deadline, f"not compacted within {WAIT_S} s: {found}"
            await produce_records(kafka_bootstrap, topic, ["tick"], keys=["tick"])
            await asyncio.sleep(0.2)  # > segment.ms, so the next append rolls a segment
        c = member(kafka_bootstrap, leader, "compacted")
        await c.subscribe([topic])
        found, end = await log_offsets(kafka_bootstrap, topic)
        records = await accept_until(c, lambda s: len(s) >= len(found))
        delivered = {r.offset for r in records}
        gaps = gap_count(c, topic)
        await c.close()
        assert len(delivered) == len(records), "a record was delivered twice"
        assert delivered == set(found)
        assert not removed & delivered
        assert {0, 2, 4, 6, 8, 10, 11, 12, 13, 14, 15} <= delivered
        # The first fetch (offsets 0..4) held removed ones: acknowledged GAP; later ones the
        # leader may have archived itself.
        assert 1 <= gaps <= end - len(delivered)
        offsets = await offsets_when(
            kafka_bootstrap, leader, "compacted", topic, lambda o: o.start_offset == end
        )
        assert offsets.lag == 0, offsets

    asyncio.run(scenario())


def test_transaction_markers_are_gaps_and_aborted_records_are_delivered(
    kafka_bootstrap: str, topics: dict[str, str], leader: LeaderWorker
) -> None:
    """Read uncommitted (the default ``share.isolation.level``): a committed, an aborted and a
    committed transaction of 3 records each. Every record is delivered, aborted ones too; the
    three control records (markers) are not: acknowledged GAP (the first at least) or archived
    by the leader's hole reader, and the SPSO moves past the last."""
    topic = topics["transactional"]

    async def scenario() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap, transactional_id=f"claims-{uuid.uuid4().hex[:8]}"
        )
        await producer.start()
        try:
            for commit in (True, False, True):
                await producer.begin_transaction()
                for i in range(3):
                    await producer.send_and_wait(topic, f"{commit}-{i}".encode(), partition=0)
                if commit:
                    await producer.commit_transaction()
                else:
                    await producer.abort_transaction()
        finally:
            await producer.stop()
        # 0..2 committed, 3 marker, 4..6 aborted, 7 marker, 8..10 committed, 11 marker
        found, end = await log_offsets(kafka_bootstrap, topic)
        assert (found, end) == ([0, 1, 2, 4, 5, 6, 8, 9, 10], 12)
        c = member(kafka_bootstrap, leader, "transactional")
        await c.subscribe([topic])
        records = await accept_until(c, lambda s: len(s) >= 9)
        gaps = gap_count(c, topic)
        await c.close()
        assert sorted(r.offset for r in records) == found
        assert [r.value for r in records if 4 <= r.offset <= 6] == [
            b"False-0",
            b"False-1",
            b"False-2",
        ]
        assert 1 <= gaps <= 3  # the first fetch (0..4) held the first marker
        offsets = await offsets_when(
            kafka_bootstrap, leader, "transactional", topic, lambda o: o.start_offset == end
        )
        assert offsets.lag == 0, offsets

    asyncio.run(scenario())


def test_a_renewed_lock_outlives_the_lock_duration(
    kafka_bootstrap: str, topics: dict[str, str], leader: LeaderWorker
) -> None:
    """A member RENEWs (KIP-1222) its records every second for 2.5 lock durations while a
    second member of the group polls: the second member gets none of them, and the first one's
    ACCEPT afterwards is taken (delivered once, delivery count 1)."""
    topic = topics["renew"]

    async def scenario() -> None:
        await produce_records(kafka_bootstrap, topic, [f"r{i}" for i in range(3)])
        holder, other = (member(kafka_bootstrap, leader, "renew") for _ in range(2))
        await holder.subscribe([topic])
        held: list[ShareRecord] = []
        deadline = time.monotonic() + WAIT_S
        while not held:  # explicit mode: one poll, then every record is acknowledged
            assert time.monotonic() < deadline, "the holder acquired nothing"
            held = await holder.poll(timeout_ms=500)
        await other.subscribe([topic])
        stolen: list[ShareRecord] = []
        renewals = 0
        until = time.monotonic() + 2.5 * LOCK_MS / 1000
        while time.monotonic() < until:
            for record in held:
                holder.acknowledge(record, RENEW)
            assert all(e is None for e in (await holder.commit_sync()).values())
            renewals += 1
            # the other member polls for a second (a long poll: the leader answers once
            # something becomes Available)
            for record in await other.poll(timeout_ms=1000):
                stolen.append(record)
                other.acknowledge(record, ACCEPT)
        for record in held:
            holder.acknowledge(record, ACCEPT)
        results = await holder.commit_sync()
        await other.close()
        await holder.close()
        assert renewals >= 3
        assert stolen == [], [(r.offset, r.delivery_count) for r in stolen]
        assert all(e is None for e in results.values()), results
        assert [(r.offset, r.delivery_count) for r in held] == [(0, 1), (1, 1), (2, 1)]
        offsets = await offsets_when(
            kafka_bootstrap, leader, "renew", topic, lambda o: o.start_offset == 3
        )
        assert offsets.lag == 0, offsets

    asyncio.run(scenario())


def test_commit_async_reports_to_the_callback(
    kafka_bootstrap: str, topics: dict[str, str], leader: LeaderWorker
) -> None:
    """``commit_async()`` returns a task; the commit callback hears of every acknowledgement
    batch: ``None`` for the accepted records, and ``None`` too for an ACCEPT that arrives
    after the record's lock expired and another member finished it (below the SPSO: skipped,
    as Kafka 4.3's broker skips it)."""
    topic = topics["commit"]
    tp = TopicPartition(topic, 0)

    async def scenario() -> None:
        await produce_records(kafka_bootstrap, topic, [f"c{i}" for i in range(4)])
        heard: list[tuple[dict[TopicPartition, set[int]], Exception | None]] = []
        slow, fast = (member(kafka_bootstrap, leader, "commit") for _ in range(2))
        slow.set_acknowledgement_commit_callback(lambda o, e: heard.append((o, e)))
        await slow.subscribe([topic])
        first: list[ShareRecord] = []
        deadline = time.monotonic() + WAIT_S
        while not first:
            assert time.monotonic() < deadline
            first = await slow.poll(timeout_ms=500)
        assert len(first) >= 2, first  # produced before the join: acquired together
        late, on_time = first[0], first[1:]
        for record in on_time:
            slow.acknowledge(record, ACCEPT)
        task = slow.commit_async()
        assert isinstance(task, asyncio.Task)
        assert await asyncio.wait_for(task, WAIT_S) == {tp: None}
        assert heard == [({tp: {r.offset for r in on_time}}, None)]
        # ``late`` is held past its lock; another member gets it (delivery 2) and ACCEPTs it.
        await fast.subscribe([topic])
        taken = await accept_until(fast, lambda s: late.offset in {r.offset for r in s})
        assert [r.delivery_count for r in taken if r.offset == late.offset] == [2]
        slow.acknowledge(late, ACCEPT)
        await asyncio.wait_for(slow.commit_async(), WAIT_S)
        await fast.close()
        await slow.close()
        assert len(heard) == 2, heard
        offsets, error = heard[1]
        assert offsets == {tp: {late.offset}}
        assert error is None, heard  # skipped below the SPSO, no error (as Kafka's client)

    asyncio.run(scenario())


def test_by_duration_starts_at_the_first_record_at_most_that_old(
    kafka_bootstrap: str, topics: dict[str, str], leader: LeaderWorker
) -> None:
    """``share.auto.offset.reset=by_duration:PT1H``: of 3 records stamped two hours ago and 3
    stamped now, a new group gets the 3 recent ones (ListOffsets by timestamp)."""
    topic = topics["duration"]

    async def scenario() -> None:
        now_ms = int(time.time() * 1000)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            for i, stamp in enumerate([now_ms - 7_200_000] * 3 + [now_ms] * 3):
                await producer.send_and_wait(
                    topic, f"d{i}".encode(), partition=0, timestamp_ms=stamp
                )
        finally:
            await producer.stop()
        # The group exists once a member joined (on another topic); its config is then set
        # before any member fetches from ``topic``.
        joiner = member(kafka_bootstrap, leader, "duration")
        await joiner.subscribe([topics["renew"]])
        await joiner.close()
        admin = ShareGroupAdmin(leader.app_id, KafkaClientConfig(kafka_bootstrap))
        await admin.alter_group_configs("duration", {"share.auto.offset.reset": "by_duration:PT1H"})
        c = member(kafka_bootstrap, leader, "duration")
        await c.subscribe([topic])
        records = await accept_until(c, lambda s: len(s) >= 3)
        # nothing older comes later: the SPSO started at 3 and is now at the log end
        offsets = await offsets_when(
            kafka_bootstrap, leader, "duration", topic, lambda o: o.start_offset == 6
        )
        more = await c.poll(timeout_ms=1000)
        await c.close()
        assert [r.offset for r in records] == [3, 4, 5]
        assert more == []
        assert offsets.lag == 0, offsets

    asyncio.run(scenario())
