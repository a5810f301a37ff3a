"""``share.isolation.level=read_committed`` through the real coordinator, leaders and members,
in process (docs/concepts.md "read_committed"): nothing at or past the last stable offset is
acquired, aborted records come back as gaps the member acknowledges as GAP (Archived, never
handed to a handler, counted in ``queueflow_acknowledgements_total{type="gap"}``), and a
``read_uncommitted`` group of the same topic still gets everything."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest
from inprocess_helpers import TOPIC, eventually, produce, run, settings, settle

from queueflow.engine.group_config import (
    ISOLATION_LEVEL,
    GroupConfig,
    describe_group_configs,
    validate_group_config,
)
from queueflow.engine.state import RecordState
from queueflow.errors import ConfigurationError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.server.leader.fetching import ShareFetcher
from queueflow.server.log_offsets import LogOffsets
from queueflow.structs import TopicPartition
from queueflow.testing.inprocess import InProcessCluster

TP = TopicPartition(TOPIC, 0)


def cluster_with(records: int) -> InProcessCluster:
    """A one-partition cluster on the system clock holding ``records`` records."""
    cluster = InProcessCluster({TOPIC: 1}, settings=settings())
    produce(cluster, records)
    return cluster


async def values_of(cluster: InProcessCluster, group: str, polls: int = 5) -> list[bytes]:
    """What a member of ``group`` is handed over a few polls (auto-acknowledged)."""
    consumer = cluster.consumer(group)
    await consumer.subscribe([TOPIC])
    got: list[bytes] = []
    for _ in range(polls):
        got.extend(r.value for r in await consumer.poll(timeout_ms=300))
    await consumer.close()
    await settle(cluster)
    return got


def test_a_read_committed_group_acquires_below_the_lso_and_archives_aborted_records() -> None:
    async def scenario() -> None:
        async with cluster_with(6) as cluster:  # r0..r5
            cluster.aborted.update({(TP, 1), (TP, 2)})  # an aborted transaction's records
            cluster.open_transactions[TP] = 4  # r4, r5: a transaction still open
            admin = cluster.admin()
            consumer = cluster.consumer("committed")
            await consumer.subscribe([TOPIC])
            await consumer.close()
            await admin.alter_group_configs("committed", {ISOLATION_LEVEL: "read_committed"})
            gaps_before = cluster.metrics.acknowledgements.labels(
                "committed", TOPIC, "gap"
            )._value.get()
            assert await values_of(cluster, "committed") == [b"r0", b"r3"]
            engine = cluster.share_partition("committed", TOPIC, 0)
            assert engine.end_offset == 4  # nothing at or past the LSO was acquired
            for offset in (1, 2):
                assert engine.record(offset).state in (RecordState.ARCHIVED,)
            gaps = cluster.metrics.acknowledgements.labels("committed", TOPIC, "gap")._value.get()
            assert gaps - gaps_before == 2
            del cluster.open_transactions[TP]  # the transaction commits
            assert await values_of(cluster, "committed") == [b"r4", b"r5"]
            # A read_uncommitted group of the same topic sees every record.
            assert await values_of(cluster, "everything") == [f"r{i}".encode() for i in range(6)]

    run(scenario())


def test_share_isolation_level_is_validated_and_described() -> None:
    cluster = cluster_with(0)
    settings = cluster.settings
    assert validate_group_config(ISOLATION_LEVEL, " read_committed ", settings) == (
        "read_committed"
    )
    assert validate_group_config(ISOLATION_LEVEL, "READ_COMMITTED", settings) == "read_committed"
    with pytest.raises(ConfigurationError, match="choose one of read_uncommitted, read_committed"):
        validate_group_config(ISOLATION_LEVEL, "serializable", settings)
    assert GroupConfig.resolve(settings).isolation_level == "read_uncommitted"
    assert GroupConfig.resolve(settings, {ISOLATION_LEVEL: "read_committed"}).read_committed
    (entry,) = [e for e in describe_group_configs(settings, {}, {}) if e.name == ISOLATION_LEVEL]
    assert (entry.value, entry.source, entry.synonym) == (
        "read_uncommitted",
        "DEFAULT_CONFIG",
        ISOLATION_LEVEL,
    )


def test_a_long_poll_parked_behind_an_open_transaction_wakes_when_it_commits() -> None:
    """A read_committed member's long poll (the direct path) that finds only records past the
    LSO parks; the transaction's commit marker wakes it, and it acquires the committed
    records then, within the same poll."""

    async def scenario() -> None:
        cluster = InProcessCluster(
            {TOPIC: 1},
            settings=settings(leader_listener="127.0.0.1:0", fetch_max_wait_ms=3_000),
            direct=True,
            group_configs={"g": {ISOLATION_LEVEL: "read_committed"}},
        )
        produce(cluster, 3)
        async with cluster:
            cluster.open_transactions[TP] = 1  # r1, r2 are in an open transaction
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            first: list[bytes] = []
            while not first:
                first = [r.value for r in await consumer.poll(timeout_ms=2000)]
            assert first == [b"r0"]
            polling = asyncio.ensure_future(consumer.poll(timeout_ms=5000))
            queues = cluster.leaders[TOPIC].long_polls.queues
            await eventually(lambda: 0 in queues and bool(queues[0].parked), "a parked poll")
            assert cluster.share_partition("g", TOPIC, 0).end_offset == 1
            del cluster.open_transactions[TP]
            cluster.produce(TOPIC, None)  # the commit marker (an offset without a record)
            assert [r.value for r in await polling] == [b"r1", b"r2"]
            await consumer.close()

    run(scenario())


class _Offsets:
    """Log offsets whose known LSO lags the broker's (as after a commit nobody asked about)."""

    def __init__(self) -> None:
        self.known_stable: int | None = 4
        self.broker_stable = 9
        self.asked = 0

    def known_end(self, tp: TopicPartition) -> int | None:
        return 10

    def known_stable_end(self, tp: TopicPartition) -> int | None:
        return self.known_stable

    async def stable_end(self, tp: TopicPartition) -> int:
        self.asked += 1
        self.known_stable = self.broker_stable
        return self.broker_stable


def test_the_broker_is_asked_for_the_lso_when_the_known_one_is_behind() -> None:
    """A read_committed acquisition sees the exact LSO: when the one it knows is behind the
    high watermark (a transaction may have ended since), it asks the broker; once the LSO is
    known to have caught up with the high watermark, it asks nothing."""
    offsets = _Offsets()
    fetcher = ShareFetcher(
        cast(Any, SimpleNamespace(log_offsets=offsets)),
        TOPIC,
        cast(Any, None),
        cast(Any, None),
        cast(Any, None),
    )

    async def scenario() -> None:
        assert await fetcher._stable_end(TP, 10) == 9 and offsets.asked == 1
        offsets.known_stable = offsets.broker_stable = 10
        assert await fetcher._stable_end(TP, 10) == 10 and offsets.asked == 1
        offsets.known_stable = None  # never asked: ask
        assert await fetcher._stable_end(TP, 10) == 10 and offsets.asked == 2

    run(scenario())


def test_a_stale_lso_answer_never_lowers_the_known_one() -> None:
    """As the high watermark: an older ListOffsets answer arriving late must not hide records
    below the LSO already seen."""
    offsets = LogOffsets(KafkaClientConfig("localhost:1"))
    assert offsets.known_stable_end(TP) is None
    assert offsets._raise_stable(TP, 30) == 30
    assert offsets._raise_stable(TP, 22) == 30
    assert offsets.known_stable_end(TP) == 30
