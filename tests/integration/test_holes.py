"""Acquisition counts records, not offsets, on the real broker (docs/concepts.md "Acquisition
counts records"): a transactional topic has a marker offset after every transaction, which holds
no record. A member's first GAP starts the leader's hole reader; from then on a ShareFetch for
``n`` records gets ``n`` records (the first fetches may still count the markers), and every
record is delivered exactly once. A ``read_committed`` group's reader skips the aborted records
too.

Each transaction holds ``n - 1`` records, so any ``n`` consecutive offsets hold a marker: a
leader that counts offsets never hands out ``n`` records in one fetch. The same holds for a
compacted topic whose cleaner removed every ``n``-th record.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaProducer

from queueflow import ACCEPT, ShareConsumer
from queueflow.admin import ShareGroupAdmin
from queueflow.devtools.broker import create_topic
from queueflow.kafka.config import KafkaClientConfig
from queueflow.testing import LeaderWorker
from queueflow.testing import produce as produce_records
from tests.integration.topic_reads import COMPACTED, log_offsets

N = 5  # max.poll.records: records per ShareFetch
TRANSACTIONS = 24
LEADER_SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "group.share.session.timeout.ms": 6000,
    "group.share.heartbeat.interval.ms": 500,
}
MEMBER_SETTINGS = {
    "group.share.heartbeat.interval.ms": 500,
    "group.share.session.timeout.ms": 6000,
    "max.poll.records": N,
}
WAIT_S = 40.0


@pytest.fixture(scope="module")
def topic(kafka_bootstrap: str) -> str:
    name = f"qf-holes-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, name, 1)
    return name


@pytest.fixture(scope="module")
def compacted(kafka_bootstrap: str) -> str:
    name = f"qf-holes-compacted-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, name, 1, config=COMPACTED)
    return name


@pytest.fixture(scope="module")
def leader(
    kafka_bootstrap: str, topic: str, compacted: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LeaderWorker]:
    worker = LeaderWorker(
        f"qf-holes-{uuid.uuid4().hex[:8]}",
        [topic, compacted],
        kafka_bootstrap,
        tmp_path_factory.mktemp("leader") / "data",
        LEADER_SETTINGS,
    )
    with worker.start():
        yield worker


@pytest.fixture(scope="module")
def produced(kafka_bootstrap: str, topic: str) -> tuple[list[bytes], list[bytes], int]:
    """``TRANSACTIONS`` transactions of ``N - 1`` records, every third one aborted: (every
    value, the committed values, the log end)."""

    async def produce() -> tuple[list[bytes], list[bytes], int]:
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap, transactional_id=f"holes-{uuid.uuid4().hex[:8]}"
        )
        await producer.start()
        everything: list[bytes] = []
        committed: list[bytes] = []
        last = -1
        try:
            for t in range(TRANSACTIONS):
                values = [f"t{t}-{i}".encode() for i in range(N - 1)]
                await producer.begin_transaction()
                for value in values:
                    last = (await producer.send_and_wait(topic, value, partition=0)).offset
                if t % 3 == 1:
                    await producer.abort_transaction()
                else:
                    await producer.commit_transaction()
                    committed += values
                everything += values
        finally:
            await producer.stop()
        return everything, committed, last + 2  # the last marker follows the last record

    return asyncio.run(produce())


async def consume(c: ShareConsumer, wanted: list[bytes]) -> tuple[list[bytes], list[int]]:
    """Poll and ACCEPT until every value of ``wanted`` came (within WAIT_S): (the values in
    the order they came, the size of each non-empty poll)."""
    got: list[bytes] = []
    sizes: list[int] = []
    deadline = time.monotonic() + WAIT_S
    while not set(wanted) <= set(got):
        assert time.monotonic() < deadline, (sizes, sorted(set(wanted) - set(got)))
        batch = await c.poll(timeout_ms=500)
        for record in batch:
            got.append(record.value)
            c.acknowledge(record, ACCEPT)
        if batch:
            sizes.append(len(batch))
    assert all(e is None for e in (await c.commit_sync()).values())
    return got, sizes


async def start_offset_reaches(
    bootstrap: str, app_id: str, group: str, topic: str, end: int
) -> None:
    admin = ShareGroupAdmin(app_id, KafkaClientConfig(bootstrap))
    deadline = time.monotonic() + WAIT_S
    while True:
        (offsets,) = await admin.list_offsets(group, [topic])
        if offsets.start_offset == end:
            assert offsets.lag == 0, offsets
            return
        assert time.monotonic() < deadline, offsets
        await asyncio.sleep(0.3)


def check_sizes(sizes: list[int]) -> None:
    """The first fetch counted its marker; once the leader knows the holes every fetch gets
    ``N`` records, but the last."""
    assert sizes[0] < N, sizes
    assert N in sizes, f"no ShareFetch got {N} records: {sizes}"
    full = sizes[sizes.index(N) :]
    assert all(s == N for s in full[:-1]), sizes


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_markers_and_aborted_records_do_not_use_up_max_records(
    kafka_bootstrap: str,
    topic: str,
    leader: LeaderWorker,
    produced: tuple[list[bytes], list[bytes], int],
    isolation: str,
) -> None:
    everything, committed, end = produced
    wanted = committed if isolation == "read_committed" else everything
    group = f"holes-{isolation}"

    async def scenario() -> None:
        admin = ShareGroupAdmin(leader.app_id, KafkaClientConfig(kafka_bootstrap))
        await admin.alter_group_configs(group, {"share.isolation.level": isolation})
        c = ShareConsumer(
            group,
            app_id=leader.app_id,
            bootstrap_servers=kafka_bootstrap,
            acknowledgement_mode="explicit",
            settings=MEMBER_SETTINGS,
        )
        await c.subscribe([topic])
        try:
            got, sizes = await consume(c, wanted)
        finally:
            await c.close()
        assert sorted(got) == sorted(wanted) and len(got) == len(wanted), "delivered twice"
        check_sizes(sizes)
        await start_offset_reaches(kafka_bootstrap, leader.app_id, group, topic, end)

    asyncio.run(asyncio.wait_for(scenario(), 2 * WAIT_S))
    assert "hole_reader_started" in leader.log_path.read_text()


def test_compacted_away_offsets_do_not_use_up_max_records(
    kafka_bootstrap: str, compacted: str, leader: LeaderWorker
) -> None:
    """A compacted topic whose cleaner removed every fifth offset of the first 100: after the
    first GAP, each ShareFetch for ``N`` gets ``N`` records."""

    async def scenario() -> None:
        keys = [f"k{o}" for o in range(100)] + [f"k{o}" for o in range(N - 1, 100, N)]
        await produce_records(
            kafka_bootstrap, compacted, [f"v{i}" for i in range(len(keys))], keys=keys
        )
        removed = set(range(N - 1, 100, N))
        # The cleaner compacts closed segments only: append (each append after segment.ms rolls
        # one; unique keys, so nothing else is compacted) until it has removed them.
        deadline = time.monotonic() + WAIT_S
        for tick in range(10_000):
            found, end = await log_offsets(kafka_bootstrap, compacted)
            if not removed & set(found):
                break
            assert time.monotonic() < deadline, f"not compacted within {WAIT_S} s: {found}"
            await produce_records(kafka_bootstrap, compacted, ["tick"], keys=[f"tick-{tick}"])
            await asyncio.sleep(0.2)  # > segment.ms, so the next append rolls a segment
        c = ShareConsumer(
            "holes-compacted",
            app_id=leader.app_id,
            bootstrap_servers=kafka_bootstrap,
            acknowledgement_mode="explicit",
            settings=MEMBER_SETTINGS,
        )
        await c.subscribe([compacted])
        try:
            batches = await consume_offsets(c, len(found))
        finally:
            await c.close()
        records = [o for batch in batches for o in batch]
        assert sorted(records) == found, "a record was delivered twice, or not at all"
        check_sizes([len(batch) for batch in batches])
        # Full fetches among the offsets with holes, not only past them.
        assert any(len(b) == N and b[-1] < 100 for b in batches), batches
        await start_offset_reaches(
            kafka_bootstrap, leader.app_id, "holes-compacted", compacted, end
        )

    asyncio.run(asyncio.wait_for(scenario(), 2 * WAIT_S))


async def consume_offsets(c: ShareConsumer, count: int) -> list[list[int]]:
    """Poll and ACCEPT until ``count`` records came (within WAIT_S): the offsets of each
    non-empty poll."""
    batches: list[list[int]] = []
    deadline = time.monotonic() + WAIT_S
    while sum(map(len, batches)) < count:
        assert time.monotonic() < deadline, batches
        batch = await c.poll(timeout_ms=500)
        for record in batch:
            c.acknowledge(record, ACCEPT)
        if batch:
            batches.append([r.offset for r in batch])
    assert all(e is None for e in (await c.commit_sync()).values())
    return batches
