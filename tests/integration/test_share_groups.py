"""Share groups end to end on the real local broker: leaders and coordinator in a Faust worker
subprocess (``queueflow leader``), members in this process (:class:`ShareConsumer`) or in
subprocesses that get SIGKILLed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from queueflow import ACCEPT, REJECT, RELEASE, ShareConsumer, ShareRecord
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

DELIVERY_LIMIT = 3
LOCK_MS = 3000
#: Group settings of the leader worker (KIP-932 names); short timeouts keep the tests quick.
LEADER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.delivery.count.limit": DELIVERY_LIMIT,
    "group.share.record.lock.duration.ms": LOCK_MS,
    "group.share.session.timeout.ms": 6000,
    "group.share.heartbeat.interval.ms": 500,
    "queueflow.lock.check.interval.ms": 100,
}
#: Member-side settings.
MEMBER_SETTINGS = {
    "group.share.heartbeat.interval.ms": 500,
    "group.share.session.timeout.ms": 6000,
    "max.poll.records": 5,
}
CONSUMER_SCRIPT = Path(__file__).with_name("crashing_consumer.py")


async def produce(bootstrap: str, topic: str, count: int, partitions: int = 1) -> None:
    """``record-<i>`` for i in 0..count-1, round-robin over ``partitions``."""
    values = [f"record-{i}" for i in range(count)]
    await produce_records(bootstrap, topic, values, partitions=partitions)


def consumer(bootstrap: str, app_id: str, group: str, mode: str = "explicit") -> ShareConsumer:
    return ShareConsumer(
        group,
        app_id=app_id,
        bootstrap_servers=bootstrap,
        acknowledgement_mode=mode,
        settings=MEMBER_SETTINGS,
    )


async def poll_until(
    c: ShareConsumer, done: Callable[[list[ShareRecord]], bool], timeout_s: float = 30.0
) -> list[ShareRecord]:
    """Poll (ACCEPTing in explicit mode) until ``done(all records so far)``, within a timeout."""
    seen: list[ShareRecord] = []
    deadline = time.monotonic() + timeout_s
    while not done(seen):
        assert time.monotonic() < deadline, (
            f"timed out after {timeout_s} s with {len(seen)} records"
        )
        for record in await c.poll(timeout_ms=500):
            seen.append(record)
            if c.mode == "explicit":
                c.acknowledge(record, ACCEPT)
    return seen


@pytest.fixture(scope="module")
def topics(kafka_bootstrap: str) -> dict[str, str]:
    """The module's source topics, created before the leader starts (it leads them all)."""
    from queueflow.devtools.broker import create_topic

    names = {
        key: f"qf-share-{key}-{uuid.uuid4().hex[:8]}"
        for key in ("spread", "release", "reject", "limit", "kill")
    }
    for key, name in names.items():
        create_topic(kafka_bootstrap, name, 2 if key == "spread" else 1)
    return names


@pytest.fixture(scope="module")
def leader(
    kafka_bootstrap: str, topics: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LeaderWorker]:
    app_id = f"qf-test-{uuid.uuid4().hex[:8]}"
    worker = LeaderWorker(
        app_id,
        list(topics.values()),
        kafka_bootstrap,
        tmp_path_factory.mktemp("leader") / "data",
        LEADER_SETTINGS,
    )
    with worker.start():
        yield worker


def test_more_consumers_than_partitions_all_get_work(
    kafka_bootstrap: str, topics: dict[str, str], leader: LeaderWorker
) -> None:
    topic, total = topics["spread"], 200

    async def scenario() -> list[list[ShareRecord]]:
        await produce(kafka_bootstrap, topic, total, partitions=2)
        members = [
            consumer(kafka_bootstrap, leader.app_id, "spread", mode="implicit") for _ in range(4)
        ]
        for m in members:
            await m.subscribe([topic])
        got: list[list[ShareRecord]] = [[] for _ in members]

        async def run(i: int) -> None:
            deadline = time.monotonic() + 60
            while sum(len(g) for g in got) < total and time.monotonic() < deadline:
                records = await members[i].poll(timeout_ms=300)
                got[i].extend(records)
                await asyncio.sleep(0.02 * len(records))  # "process" them

        await asyncio.gather(*(run(i) for i in range(len(members))))
        assignments = [m.assignment() for m in members]
        for m in members:
            await m.close()
        assert all(len(a) == 1 for a in assignments), assignments  # 4 members, 2 partitions
        return got

    got = asyncio.run(scenario())
    delivered = Counter((r.partition, r.offset) for g in got for r in g)
    assert len(delivered) == total
    assert all(len(g) > 0 for g in got), [len(g) for g in got]


def test_release_delivers_again_with_delivery_count_plus_one(
    kafka_bootstrap: str, topics: dict[str, str], leader: LeaderWorker
) -> None:
    topic = topics["release"]

    async def scenario() -> list[tuple[int, int]]:
        await produce(kafka_bootstrap, topic, 1)
        c = consumer(kafka_bootstrap, leader.app_id, "release")
        await c.subscribe([topic])
        deliveries = []
        first = await poll_until_one(c)
        deliveries.append((first.offset, first.delivery_count))
        c.acknowledge(first, RELEASE)
        second = await poll_until_one(c)
        deliveries.append((second.offset, second.delivery_count))
        c.acknowledge(second, ACCEPT)
        assert await c.poll(timeout_ms=1500) == []
        await c.close()
        return deliveries

    assert asyncio.run(scenario()) == [(0, 1), (0, 2)]


async def poll_until_one(c: ShareConsumer, timeout_s: float = 30.0) -> ShareRecord:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = await c.poll(timeout_ms=500)
        if records:
            assert len(records) == 1, records
            return records[0]
    raise AssertionError(f"no record within {timeout_s} s")


def test_reject_archives_the_record(
    kafka_bootstrap: str, topics: dict[str, str], leader: LeaderWorker
) -> None:
    topic = topics["reject"]

    async def scenario() -> None:
        await produce(kafka_bootstrap, topic, 1)
        c = consumer(kafka_bootstrap, leader.app_id, "reject")
        await c.subscribe([topic])
        record = await poll_until_one(c)
        c.acknowledge(record, REJECT)
        await c.commit_sync()
        # Archived: never delivered again, not even after the lock duration has passed.
        assert await c.poll(timeout_ms=LOCK_MS + 1500) == []
        await c.close()
        other = consumer(kafka_bootstrap, leader.app_id, "reject")
        await other.subscribe([topic])
        assert await other.poll(timeout_ms=1500) == []
        await other.close()

    asyncio.run(scenario())


def test_record_past_the_delivery_limit_is_archived(
    kafka_bootstrap: str, topics: dict[str, str], leader: LeaderWorker
) -> None:
    topic = topics["limit"]

    async def scenario() -> list[int]:
        await produce(kafka_bootstrap, topic, 1)
        c = consumer(kafka_bootstrap, leader.app_id, "limit")
        await c.subscribe([topic])
        counts = []
        for _ in range(DELIVERY_LIMIT):
            record = await poll_until_one(c)
            counts.append(record.delivery_count)
            c.acknowledge(record, RELEASE)
        await c.commit_sync()
        assert await c.poll(timeout_ms=LOCK_MS + 1500) == []
        await c.close()
        return counts

    assert asyncio.run(scenario()) == list(range(1, DELIVERY_LIMIT + 1))


def test_killed_consumer_records_go_to_another_consumer(
    kafka_bootstrap: str, topics: dict[str, str], leader: LeaderWorker
) -> None:
    topic = topics["kill"]
    asyncio.run(produce(kafka_bootstrap, topic, 5))
    proc = subprocess.Popen(
        [
            sys.executable,
            str(CONSUMER_SCRIPT),
            kafka_bootstrap,
            leader.app_id,
            "kill",
            topic,
            json.dumps(MEMBER_SETTINGS),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        line = _read_line(proc, timeout_s=60)
        while not line.startswith("["):  # skip structlog lines
            line = _read_line(proc, timeout_s=60)
        held = set(json.loads(line))
        assert held, "the consumer subprocess acquired nothing"
    finally:
        proc.kill()  # SIGKILL: no acknowledgement, no leave
        proc.wait(timeout=30)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()

    async def scenario() -> list[ShareRecord]:
        c = consumer(kafka_bootstrap, leader.app_id, "kill")
        await c.subscribe([topic])
        records = await poll_until(c, lambda seen: {r.offset for r in seen} >= held)
        await c.close()
        return records

    records = asyncio.run(scenario())
    redelivered = {r.offset: r.delivery_count for r in records if r.offset in held}
    assert redelivered == dict.fromkeys(held, 2)


def _read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    """One line of the subprocess's stdout, within a timeout."""
    result: list[bytes] = []

    async def read() -> None:
        loop = asyncio.get_running_loop()
        assert proc.stdout is not None
        result.append(await loop.run_in_executor(None, proc.stdout.readline))

    try:
        asyncio.run(asyncio.wait_for(read(), timeout_s))
    except asyncio.TimeoutError:
        stderr = proc.stderr.read1(20000).decode() if proc.stderr else ""  # type: ignore[union-attr]
        raise AssertionError(
            f"consumer subprocess printed nothing in {timeout_s} s: {stderr}"
        ) from None
    if not result[0]:
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        raise AssertionError(f"consumer subprocess exited: {stderr[-3000:]}")
    return result[0].decode()


def test_restarted_leader_keeps_acknowledged_records_acknowledged(
    kafka_bootstrap: str, topic_factory: Callable[..., str], tmp_path: Path
) -> None:
    topic = topic_factory(1)
    app_id = f"qf-restart-{uuid.uuid4().hex[:8]}"
    asyncio.run(produce(kafka_bootstrap, topic, 20))

    async def accept_first_ten() -> set[int]:
        c = consumer(kafka_bootstrap, app_id, "restart")
        await c.subscribe([topic])
        accepted: set[int] = set()
        deadline = time.monotonic() + 30
        while len(accepted) < 10:
            assert time.monotonic() < deadline, "timed out before 10 records were accepted"
            for record in await c.poll(timeout_ms=500):
                if record.offset < 10:
                    c.acknowledge(record, ACCEPT)
                    accepted.add(record.offset)
                else:
                    c.acknowledge(record, RELEASE)
        result = await c.commit_sync()
        assert all(error is None for error in result.values()), result
        await c.close()
        return accepted

    async def drain() -> list[ShareRecord]:
        c = consumer(kafka_bootstrap, app_id, "restart")
        await c.subscribe([topic])
        records = await poll_until(c, lambda seen: {r.offset for r in seen} >= set(range(10, 20)))
        records += await c.poll(timeout_ms=1500)  # anything more would be a redelivery
        await c.close()
        return records

    first = LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path / "first", LEADER_SETTINGS)
    with first.start():
        assert asyncio.run(accept_first_ten()) == set(range(10))
    # A new worker with an empty data directory: the state comes back from the changelog.
    second = LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path / "second", LEADER_SETTINGS)
    with second.start():
        records = asyncio.run(drain())
    assert sorted(r.offset for r in records) == list(range(10, 20))
