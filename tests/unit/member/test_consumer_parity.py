"""``ShareConsumer`` parity with ``KafkaShareConsumer``: subscription and unsubscribe,
acknowledge by topic/partition/offset, metrics, close with a timeout, KIP-1206
``share.acquire.mode``, and a late acknowledgement below the SPSO skipped as Kafka skips it;
through ``InProcessCluster`` (real coordinator and leaders, in memory) and the pure parts alone."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from inprocess_helpers import TOPIC, cluster_with, run, settle

import queueflow
from queueflow.engine.partition import RecordState
from queueflow.errors import ConfigurationError
from queueflow.member.acquire_mode import split_budget
from queueflow.member.consumer import IllegalStateError
from queueflow.member.consumer_metrics import FETCH_GROUP, SHARE_GROUP, ShareConsumerMetrics
from queueflow.structs import TopicPartition
from queueflow.testing import FakeClock

TP0 = TopicPartition(TOPIC, 0)


# -- pure parts ------------------------------------------------------------------------------


def test_split_budget_spreads_the_remainder_by_turn() -> None:
    assert split_budget(7, ["a", "b", "c"], 0) == {"a": 3, "b": 2, "c": 2}
    assert split_budget(7, ["a", "b", "c"], 1) == {"a": 2, "b": 3, "c": 2}
    assert split_budget(2, ["a", "b", "c"], 2) == {"a": 1, "b": 0, "c": 1}
    assert split_budget(-4, ["a"], 0) == {"a": 0}
    assert split_budget(5, [], 3) == {}


@given(st.integers(-5, 50), st.integers(0, 12), st.integers(0, 100))
def test_property_split_budget_never_gives_more_than_the_budget(
    budget: int, n: int, turn: int
) -> None:
    out = split_budget(budget, list(range(n)), turn)
    assert set(out) == set(range(n)) and all(v >= 0 for v in out.values())
    assert sum(out.values()) == (max(budget, 0) if n else 0)
    assert max(out.values(), default=0) - min(out.values(), default=0) <= 1


def test_metrics_have_the_java_client_s_names() -> None:
    m = ShareConsumerMetrics(started=100.0)
    assert m.snapshot(100.0)[SHARE_GROUP]["last-poll-seconds-ago"] == -1
    m.poll_started(101.0)
    m.fetched(0.004, 3)
    m.poll_ended(101.5, 3, 30)
    m.acknowledged(3, error=False)
    m.poll_started(102.5)  # 1 s in the application
    m.acknowledged(1, error=True)
    snap = m.snapshot(104.0)
    fetch, share = snap[FETCH_GROUP], snap[SHARE_GROUP]
    assert fetch["records-consumed-total"] == 3 and fetch["bytes-consumed-total"] == 30
    assert fetch["fetch-total"] == 1 and fetch["fetch-latency-avg"] == pytest.approx(4.0)
    assert fetch["records-per-request-max"] == 3 and fetch["records-consumed-rate"] == 0.75
    assert fetch["acknowledgements-send-total"] == 4 and fetch["acknowledgements-error-total"] == 1
    assert share["last-poll-seconds-ago"] == 1 and share["time-between-poll-avg"] == 1500
    assert share["poll-idle-ratio-avg"] == pytest.approx(1 / 3)


# -- in process ------------------------------------------------------------------------------


def test_subscription_and_unsubscribe_as_kafka_share_consumer() -> None:
    """``unsubscribe()`` leaves (records not acknowledged are released, the member is gone)
    and the consumer can subscribe again; ``subscription()`` follows."""

    async def scenario() -> None:
        async with cluster_with(2) as cluster:
            consumer = cluster.consumer("g")
            assert consumer.subscription() == set()
            await consumer.unsubscribe()  # not subscribed: nothing to do
            await consumer.subscribe([TOPIC])
            assert consumer.subscription() == {TOPIC}
            assert len(await consumer.poll(timeout_ms=0)) == 2
            await consumer.unsubscribe()
            await settle(cluster)
            assert consumer.subscription() == set() and consumer.assignment() == set()
            assert not cluster.coordinator.groups["g"].members
            engine = cluster.share_partition("g", TOPIC, 0)
            assert [engine.record(o).state for o in (0, 1)] == [RecordState.AVAILABLE] * 2
            with pytest.raises(IllegalStateError, match="subscribe"):
                await consumer.poll(timeout_ms=0)
            await consumer.subscribe([TOPIC])
            again = await consumer.poll(timeout_ms=0)
            assert [(r.offset, r.delivery_count) for r in again] == [(0, 2), (1, 2)]
            await consumer.close()
            with pytest.raises(IllegalStateError, match="closed"):
                await consumer.unsubscribe()

    run(scenario())


def test_acknowledge_by_topic_partition_and_offset() -> None:
    """``acknowledge(topic, partition, offset, type)``, as ``KafkaShareConsumer``: only for a
    record of the last poll, once."""

    async def scenario() -> None:
        async with cluster_with(3) as cluster:
            consumer = cluster.consumer("g", acknowledgement_mode="explicit")
            await consumer.subscribe([TOPIC])
            assert len(await consumer.poll(timeout_ms=0)) == 3
            consumer.acknowledge(TOPIC, 0, 0, queueflow.ACCEPT)
            consumer.acknowledge(TOPIC, 0, 1)  # ACCEPT by default
            consumer.acknowledge(TOPIC, 0, 2, queueflow.REJECT)
            with pytest.raises(IllegalStateError, match=r"\[0\]@2 was not returned"):
                consumer.acknowledge(TOPIC, 0, 2, queueflow.ACCEPT)
            with pytest.raises(IllegalStateError, match=r"\[0\]@9 was not returned"):
                consumer.acknowledge(TOPIC, 0, 9, queueflow.ACCEPT)
            with pytest.raises(TypeError, match="takes"):
                consumer.acknowledge(TOPIC, 0)  # type: ignore[call-overload]
            assert all(e is None for e in (await consumer.commit_sync()).values())
            engine = cluster.share_partition("g", TOPIC, 0)
            assert engine.start_offset == 3
            await consumer.close()

    run(scenario())


def test_record_limit_keeps_each_poll_within_max_poll_records_across_share_partitions() -> None:
    """KIP-1206 ``share.acquire.mode=record_limit``: 3 share-partitions of 4 records each and
    ``max_poll_records=5``: no poll returns more than 5 (batch_optimized returns 12 at once),
    and every record is delivered once."""

    async def scenario(mode: str) -> list[int]:
        async with cluster_with(12, partitions=3) as cluster:
            consumer = cluster.consumer("g", max_poll_records=5, acquire_mode=mode)
            await consumer.subscribe([TOPIC])
            sizes: list[int] = []
            seen: Counter[tuple[int, int]] = Counter()
            for _ in range(20):
                got = await consumer.poll(timeout_ms=0)
                sizes.append(len(got))
                seen.update((r.partition, r.offset) for r in got)
                if sum(seen.values()) == 12:
                    break
            assert sorted(seen) == [(p, o) for p in range(3) for o in range(4)]
            assert set(seen.values()) == {1}
            await consumer.close()
            return [s for s in sizes if s]

    strict = asyncio.run(scenario("record_limit"))
    assert max(strict) <= 5 and sum(strict) == 12, strict
    assert asyncio.run(scenario("batch_optimized")) == [12]

    async def refused() -> None:
        async with cluster_with(0) as cluster:
            with pytest.raises(ConfigurationError, match=r"share\.acquire\.mode='strict'"):
                cluster.consumer("g", acquire_mode="strict")

    run(refused())


def test_a_late_acknowledgement_below_the_spso_is_skipped_and_close_reports_no_error() -> None:
    """Kafka 4.3's broker skips acknowledgements of records below the start offset (another
    member finished them after this one's lock elapsed): no INVALID_REQUEST to commit_sync,
    nothing for the commit callback to report as an error at close."""
    clock = FakeClock()

    async def scenario() -> None:
        async with cluster_with(2, clock=clock) as cluster:
            late = cluster.consumer("g", acknowledgement_mode="explicit", lock_duration_ms=1000)
            reports: list[Exception | None] = []
            late.set_acknowledgement_commit_callback(lambda _offsets, exc: reports.append(exc))
            await late.subscribe([TOPIC])
            held = await late.poll(timeout_ms=0)
            assert [r.offset for r in held] == [0, 1]
            clock.advance(1500)  # its locks elapse
            other = cluster.consumer("g", acknowledgement_mode="explicit")
            await other.subscribe([TOPIC])
            taken = []
            for _ in range(50):
                taken += await other.poll(timeout_ms=0)
                if len(taken) == 2:
                    break
                clock.advance(100)
            for r in taken:
                other.acknowledge(r, queueflow.ACCEPT)
            assert all(e is None for e in (await other.commit_sync()).values())
            assert cluster.share_partition("g", TOPIC, 0).start_offset == 2
            late.acknowledge(held[0], queueflow.ACCEPT)
            assert await late.commit_sync() == {TP0: None}
            late.acknowledge(held[1], queueflow.REJECT)
            await late.close()
            assert reports == [None, None]
            await other.close()

    run(scenario())
