"""The direct member ↔ leader path against a real Faust leader worker and the real broker:
members learn the leader's endpoint from their heartbeat and fetch over it (long polls), and
the state the leader writes on that path reaches the changelog: a leader started on an empty
data directory restores it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from queueflow import ACCEPT, RELEASE, ShareConsumer, ShareRecord
from queueflow.structs import TopicPartition
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records

LEADER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.record.lock.duration.ms": 5000,
    "group.share.session.timeout.ms": 6000,
    "group.share.heartbeat.interval.ms": 500,
    "queueflow.lock.check.interval.ms": 100,
}
MEMBER_SETTINGS = {
    "group.share.heartbeat.interval.ms": 500,
    "group.share.session.timeout.ms": 6000,
    "fetch.max.wait.ms": 2000,
}
WAIT_S = 30.0


async def wait_for(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {what}"
        await asyncio.sleep(0.05)


async def poll_until(
    bootstrap: str,
    app_id: str,
    group: str,
    topic: str,
    wanted: list[bytes],
    check: Callable[[ShareConsumer], None] | None = None,
) -> list[ShareRecord]:
    """A new member of ``group`` polls (implicit mode) until it has every value of ``wanted``;
    ``check(member)`` runs before it leaves."""
    member = ShareConsumer(
        group, app_id=app_id, bootstrap_servers=bootstrap, settings=MEMBER_SETTINGS
    )
    await member.subscribe([topic])
    got: list[ShareRecord] = []
    deadline = time.monotonic() + WAIT_S
    while not set(wanted) <= {r.value for r in got}:
        assert time.monotonic() < deadline, f"not within {WAIT_S} s: {wanted}"
        got += await member.poll(timeout_ms=1000)
    if check is not None:
        check(member)
    await member.close()
    return got


def test_members_fetch_over_the_endpoint_and_its_writes_survive_a_restore(
    kafka_bootstrap: str, topic_factory: object, tmp_path: Path
) -> None:
    topic = topic_factory(2)  # type: ignore[operator]
    app_id = f"qf-direct-{uuid.uuid4().hex[:8]}"
    values = [f"d-{i}" for i in range(20)]
    asyncio.run(produce_records(kafka_bootstrap, topic, values, partitions=2))

    async def first_run() -> tuple[list[ShareRecord], list[int]]:
        """Everything delivered and acknowledged over the direct path, then five long polls
        each answered by a record produced while it was parked."""
        member = ShareConsumer(
            "direct",
            app_id=app_id,
            bootstrap_servers=kafka_bootstrap,
            acknowledgement_mode="explicit",
            settings=MEMBER_SETTINGS,
        )
        await member.subscribe([topic])
        session = member._session
        assert session is not None
        await wait_for(
            lambda: set(session._membership.leaders) == {TopicPartition(topic, p) for p in (0, 1)},
            "the heartbeat naming both partitions' leader endpoint",
        )
        # First deliveries: ACCEPT the even ones, RELEASE the odd ones; the odd ones come back
        # with delivery count 2 and are ACCEPTed then.
        first_seen: set[bytes] = set()
        again: list[ShareRecord] = []
        deadline = time.monotonic() + WAIT_S
        while len(first_seen) < len(values) or len(again) < len(values) // 2:
            assert time.monotonic() < deadline, (len(first_seen), len(again))
            for record in await member.poll(timeout_ms=1000):
                number = int(record.value.decode().split("-")[1])
                if record.delivery_count == 1:
                    first_seen.add(record.value)
                    member.acknowledge(record, ACCEPT if number % 2 == 0 else RELEASE)
                else:
                    again.append(record)
                    member.acknowledge(record, ACCEPT)
        await member.commit_sync()
        latencies = []
        for i in range(5):
            poll = asyncio.ensure_future(member.poll(timeout_ms=5000))
            await asyncio.sleep(0.3)  # (for the figure only: let the ShareFetch park first)
            sent = time.monotonic()
            await produce_records(kafka_bootstrap, topic, [f"late-{i}"], partition=0)
            records = await poll
            latencies.append(int((time.monotonic() - sent) * 1000))
            assert [r.value for r in records] == [f"late-{i}".encode()], [
                (r.value, r.delivery_count, r.partition, r.offset) for r in records
            ]
            member.acknowledge(records[0], ACCEPT)
        await member.commit_sync()
        assert TopicPartition(topic, 0) in session._membership.leaders  # never re-routed
        await member.close()
        return again, latencies

    with LeaderWorker(
        app_id, [topic], kafka_bootstrap, tmp_path / "first", LEADER_SETTINGS
    ).start():
        again, latencies = asyncio.run(first_run())
    assert sorted(int(r.value.decode().split("-")[1]) for r in again) == list(range(1, 20, 2))
    assert {r.delivery_count for r in again} == {2}
    print(f"produce -> poll over the direct path (ms): {latencies}")

    # A new leader on an empty data directory recovers the state from the changelog: every
    # record was ACCEPTed, so one new record is all a member gets.
    asyncio.run(produce_records(kafka_bootstrap, topic, ["after"], partition=1))

    with LeaderWorker(
        app_id, [topic], kafka_bootstrap, tmp_path / "second", LEADER_SETTINGS
    ).start():
        got = asyncio.run(poll_until(kafka_bootstrap, app_id, "direct", topic, [b"after"]))
        assert [r.value for r in got] == [b"after"]


@pytest.mark.parametrize("listener", [""])
def test_with_the_endpoint_off_members_use_the_request_topics(
    kafka_bootstrap: str, topic_factory: object, tmp_path: Path, listener: str
) -> None:
    topic = topic_factory(1)  # type: ignore[operator]
    app_id = f"qf-nodirect-{uuid.uuid4().hex[:8]}"
    asyncio.run(produce_records(kafka_bootstrap, topic, ["a", "b"], partition=0))

    def no_direct_path(member: ShareConsumer) -> None:
        assert member._session is not None and member._session._membership.leaders == {}

    settings = {**LEADER_SETTINGS, "queueflow.leader.listener": listener}
    with LeaderWorker(app_id, [topic], kafka_bootstrap, tmp_path / "d", settings).start():
        got = asyncio.run(
            poll_until(kafka_bootstrap, app_id, "g", topic, [b"a", b"b"], no_direct_path)
        )
        assert sorted(r.value for r in got) == [b"a", b"b"]
