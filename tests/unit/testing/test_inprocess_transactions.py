"""The in-memory Kafka transactions of an exactly_once ``InProcessCluster``
(queueflow/testing/transactions.py): begin/send/commit/abort, fencing, the transaction timeout,
the ack topics and the lock clock they drive."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import pytest
from aiokafka.errors import IllegalStateError, ProducerFenced, UnknownTopicOrPartitionError

from queueflow.errors import ConfigurationError
from queueflow.protocol import topics
from queueflow.settings import ProcessingGuarantee, ShareGroupSettings
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster
from queueflow.testing.transactions import TransactionalProducer

ACK = topics.ack_topic("inprocess", "jobs")


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def cluster(guarantee: str = "exactly_once", **kwargs: Any) -> InProcessCluster:
    settings = ShareGroupSettings(
        auto_offset_reset="earliest",
        processing_guarantee=ProcessingGuarantee(guarantee),
        session_timeout_ms=10_000,
        heartbeat_interval_ms=200,
    )
    return InProcessCluster({"jobs": 2, "out": 1}, settings=settings, clock=FakeClock(), **kwargs)


def producer(c: InProcessCluster, tid: str = "t1", timeout_ms: int = 10_000) -> Any:
    return c.member_context.io.result_producer("client", tid, timeout_ms)


def test_an_exactly_once_cluster_has_the_ack_topics_with_the_source_partitions() -> None:
    c = cluster()
    assert c.acks is not None
    assert c.acks.partitions == {ACK: 2, topics.ack_topic("inprocess", "out"): 1}
    assert c.leaders["jobs"].fetcher.lock_clock is not None

    async def scenario() -> None:
        async with c:
            await c.add_partitions("jobs", 3)
            assert c.acks is not None and c.acks.partitions[ACK] == 3

    run(scenario())
    plain = cluster("at_least_once")
    assert plain.acks is None and plain.leaders["jobs"].fetcher.lock_clock is None


def test_results_are_visible_only_at_commit_and_never_after_an_abort() -> None:
    c = cluster()

    async def scenario() -> None:
        p = producer(c)
        assert isinstance(p, TransactionalProducer)
        await p.start()
        await p.begin()
        await p.check_topic("out")
        await p.check_topic(ACK)
        fut = await p.send("out", b"v1", b"k", [("h", b"1")], None)
        assert fut.done() and c.sink_records("out") == []
        await p.commit()
        assert [(r.key, r.value, r.headers) for r in c.sink_records("out")] == [
            (b"k", b"v1", (("h", b"1"),))
        ]
        await p.begin()
        await p.send("out", b"v2", None, [], 0)
        await p.abort()
        assert [r.value for r in c.sink_records("out")] == [b"v1"]
        await p.close()

    run(scenario())


def test_the_producer_enforces_kafkas_transaction_states() -> None:
    c = cluster()

    async def scenario() -> None:
        p = producer(c)
        with pytest.raises(IllegalStateError):
            await p.begin()  # not started
        await p.start()
        with pytest.raises(IllegalStateError):
            await p.send("out", b"v", None, [], None)  # no transaction
        with pytest.raises(IllegalStateError):
            await p.commit()
        await p.begin()
        with pytest.raises(IllegalStateError):
            await p.begin()  # one is open
        with pytest.raises(UnknownTopicOrPartitionError):
            await p.check_topic("missing")
        await p.send("out", b"buffered", None, [], None)
        with pytest.raises(UnknownTopicOrPartitionError):
            await p.send("out", b"v", None, [], 5)  # no such partition
        with pytest.raises(IllegalStateError, match="abort"):
            await p.commit()  # a send failed: only abort is allowed
        await p.abort()
        assert c.sink_records("out") == []

    run(scenario())


def test_a_newer_producer_of_the_same_id_fences_the_older_one() -> None:
    c = cluster()

    async def scenario() -> None:
        old, new = producer(c), producer(c)
        await old.start()
        await old.begin()
        await old.send("out", b"zombie", None, [], None)
        await new.start()  # aborts the old one's open transaction
        with pytest.raises(ProducerFenced):
            await old.commit()
        await new.begin()
        await new.send("out", b"fresh", None, [], None)
        await new.commit()
        assert [r.value for r in c.sink_records("out")] == [b"fresh"]

    run(scenario())


def test_an_open_transaction_holds_the_lock_clock_until_its_timeout() -> None:
    """Its ack message was appended at t0: the leader expires locks of that partition only as
    of t0 until it commits (and the leader applied it) or aborts; the other partition runs."""
    c = cluster()
    clock = c.clock
    assert isinstance(clock, FakeClock)
    lock_clock = c.leaders["jobs"].fetcher.lock_clock
    assert lock_clock is not None

    async def scenario() -> None:
        p = producer(c, timeout_ms=5_000)
        await p.start()
        t0 = clock.now_ms()
        await p.begin()
        await p.send(ACK, b"junk-ack", None, [], 1)
        clock.advance(3_000)
        assert lock_clock.expiry_ms(1, clock.now_ms()) == t0
        assert lock_clock.expiry_ms(0, clock.now_ms()) == clock.now_ms()
        assert lock_clock.lag_ms(1, clock.now_ms()) == 3_000
        clock.advance(2_001)  # past its timeout: aborted by the cluster
        assert lock_clock.expiry_ms(1, clock.now_ms()) == clock.now_ms()
        with pytest.raises(ProducerFenced, match="open longer than 5000 ms"):
            await p.commit()
        await p.abort()
        # Committed: held until the leader applied it (junk: logged and skipped).
        t1 = clock.now_ms()
        await p.begin()
        await p.send(ACK, b"junk-ack", None, [], 1)
        clock.advance(10)
        await p.commit()  # handed to the leader, not applied yet (the bus runs next)
        assert lock_clock.expiry_ms(1, clock.now_ms()) == t1
        await c.bus.drain()
        assert lock_clock.expiry_ms(1, clock.now_ms()) == clock.now_ms()
        assert c.acks is not None and c.acks.messages(ACK, 1) == [b"junk-ack"] * 2

    run(scenario())


def test_a_cluster_without_transactions_refuses_a_transactional_producer() -> None:
    c = cluster(transactions=False)

    async def scenario() -> None:
        with pytest.raises(ConfigurationError, match="no transactions"):
            await producer(c).start()
        with pytest.raises(ConfigurationError, match="exactly_once"):
            await producer(cluster("at_least_once")).start()

    run(scenario())
