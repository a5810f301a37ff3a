"""Leader, coordinator, ShareFetch session, ShareConsumer and ShareAgent together, in process
(``queueflow.testing.inprocess``): real wire encoding, in-memory topics and tables, no Kafka."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from inprocess_helpers import TOPIC, cluster_with, events, eventually, run
from structlog.testing import capture_logs

import queueflow
from queueflow.errors import ConfigurationError, ErrorCode, ShareGroupError
from queueflow.member.session import ShareFetchSession
from queueflow.protocol import messages as protocol
from queueflow.structs import TopicPartition
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster

TP = TopicPartition(TOPIC, 0)


def test_a_consumer_acquires_accepts_and_the_spso_moves() -> None:
    async def scenario() -> None:
        async with cluster_with(10) as cluster:
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            records = await consumer.poll(timeout_ms=2000)
            assert [r.offset for r in records] == list(range(10))
            assert {r.delivery_count for r in records} == {1}
            assert [r.value for r in records] == [f"r{i}".encode() for i in range(10)]
            results = await consumer.commit_sync()
            assert results == {(TOPIC, 0): None}
            engine = cluster.share_partition("g", TOPIC, 0)
            assert engine.start_offset == 10 and engine.in_flight_count == 0
            await consumer.close()

    with capture_logs() as logs:
        run(scenario())
    assert events(logs, "share_partition_initialised")[0]["start_offset"] == 0
    assert events(logs, "leader_live")


def test_released_records_come_back_with_a_higher_delivery_count() -> None:
    async def scenario() -> None:
        async with cluster_with(3) as cluster:
            consumer = cluster.consumer("g", acknowledgement_mode="explicit")
            await consumer.subscribe([TOPIC])
            first = await consumer.poll(timeout_ms=2000)
            for r in first:
                consumer.acknowledge(r, queueflow.RELEASE if r.offset == 1 else queueflow.ACCEPT)
            again = await consumer.poll(timeout_ms=2000)
            assert [(r.offset, r.delivery_count) for r in again] == [(1, 2)]
            consumer.acknowledge(again[0], queueflow.REJECT)
            await consumer.commit_sync()
            assert cluster.share_partition("g", TOPIC, 0).start_offset == 3
            await consumer.close()

    run(scenario())


def session_of(cluster: InProcessCluster, reports: list[Any]) -> ShareFetchSession:
    return ShareFetchSession(
        cluster.member_context,
        "g",
        [TOPIC],
        "test",
        on_acknowledged=lambda tp, offsets, exc: reports.append((offsets, exc)),
    )


def test_one_stale_offset_does_not_take_the_batch_down() -> None:
    """A leader refuses a request's acknowledgements as a whole; the session drops the stale
    offset it names and sends the others again, so only the stale one is lost."""
    reports: list[Any] = []

    async def scenario() -> ShareGroupError | None:
        async with cluster_with(4) as cluster:
            session = session_of(cluster, reports)
            await session.start()
            fetched = await session.fetch(TP, 4)
            assert [r.offset for r in fetched.records] == [0, 1, 2, 3]
            session.acknowledge(TP, 2, queueflow.RELEASE)
            assert await session.flush(TP) is None  # applied: 2 is no longer this member's
            for offset in (0, 1, 2, 3):
                session.acknowledge(TP, offset, queueflow.ACCEPT)
            result = await session.flush(TP)
            engine = cluster.share_partition("g", TOPIC, 0)
            assert engine.start_offset == 2  # 0 and 1 accepted
            assert engine.record(2).state.name == "AVAILABLE"
            assert engine.record(3).state.name == "ACKNOWLEDGED"
            assert session.acks_dropped == 1
            await session.close()
            return result

    with capture_logs() as logs:
        result = run(scenario())
    assert result is None  # the last batch (0, 1, 3) was applied
    assert reports[0] == ([2], None)
    assert reports[1][0] == [2] and reports[1][1].code is ErrorCode.INVALID_RECORD_STATE
    assert reports[2] == ([0, 1, 3], None)
    assert events(logs, "stale_acknowledgements_dropped")[0]["offsets"] == "2"


def test_acknowledgements_after_the_lock_expired_are_refused_and_dropped() -> None:
    clock = FakeClock()
    reports: list[Any] = []

    async def scenario() -> None:
        async with cluster_with(3, clock=clock) as cluster:
            session = session_of(cluster, reports)
            await session.start()
            assert len((await session.fetch(TP, 3)).records) == 3
            clock.advance(cluster.settings.record_lock_duration_ms + 1)
            await cluster.tick()  # the locks expire: Available again, delivery count kept
            for offset in range(3):
                session.acknowledge(TP, offset, queueflow.ACCEPT)
            error = await session.flush(TP)
            assert error is not None and error.code is ErrorCode.INVALID_RECORD_STATE
            again = await session.fetch(TP, 3)
            assert [(r.offset, r.delivery_count) for r in again.records] == [
                (0, 2),
                (1, 2),
                (2, 2),
            ]
            await session.close()

    run(scenario())
    assert reports == [([0, 1, 2], reports[0][1])]
    assert reports[0][1].code is ErrorCode.INVALID_RECORD_STATE


def test_members_share_partitions_and_a_leaving_member_releases_its_records() -> None:
    async def scenario() -> None:
        async with cluster_with(8, partitions=2) as cluster:
            a = cluster.consumer("g", acknowledgement_mode="explicit")
            await a.subscribe([TOPIC])
            held = await a.poll(timeout_ms=2000)
            assert len(held) == 8
            b = cluster.consumer("g")
            await b.subscribe([TOPIC])
            await eventually(  # a's next heartbeat gives one partition up
                lambda: bool(a.assignment()) and not a.assignment() & b.assignment(),
                "the share-partitions divided between the two members",
            )
            assert a.assignment() | b.assignment() == {(TOPIC, 0), (TOPIC, 1)}
            assert not a.assignment() & b.assignment()
            a._delivered.clear()
            await a.close()  # RELEASEs nothing (cleared), then leaves: the leader releases
            await cluster.bus.drain()
            for p in (0, 1):
                assert cluster.share_partition("g", TOPIC, p).acquired_count == 0
            await b.close()

    with capture_logs() as logs:
        run(scenario())
    released = events(logs, "member_records_released")
    assert sum(e["records"] for e in released) == 8


def test_subscribing_to_an_unknown_topic_is_a_clear_error() -> None:
    async def scenario() -> None:
        async with cluster_with(0) as cluster:
            consumer = cluster.consumer("g")
            with pytest.raises(ConfigurationError, match="unknown topic 'nope'"):
                await consumer.subscribe(["nope"])

    run(scenario())


def test_a_share_agent_handles_every_record_with_its_outcome() -> None:
    seen: dict[int, list[int]] = {}

    async def handler(record: queueflow.ShareRecord) -> object:
        seen.setdefault(record.offset, []).append(record.delivery_count)
        if record.offset == 1 and record.delivery_count == 1:
            raise RuntimeError("first try fails")
        if record.offset == 2 and record.delivery_count == 1:
            return "junk"
        if record.offset == 3:
            return queueflow.REJECT
        return None

    async def scenario(cluster: InProcessCluster) -> None:
        async with cluster:
            agent = await cluster.agent(handler, TOPIC, "g", concurrency=2)

            def done() -> bool:
                engine = cluster.share_partition("g", TOPIC, 0)
                return engine is not None and engine.start_offset == 6

            await eventually(done, "every record acknowledged (SPSO 6)")
            await agent.stop()
            assert agent.stats.redelivered == 2
            assert agent.stats.accepted == 5 and agent.stats.rejected == 1
            assert agent.stats.handler_errors == 2

    cluster = cluster_with(6)
    with capture_logs() as logs:
        run(scenario(cluster))
    assert seen == {0: [1], 1: [1, 2], 2: [1, 2], 3: [1], 4: [1], 5: [1]}
    assert events(logs, "handler_raised_record_released")[0]["offset"] == 1
    assert events(logs, "handler_returned_invalid_outcome_record_released")[0]["offset"] == 2
    assert events(logs, "share_agent_drained")


def test_a_record_past_its_lock_deadline_is_released_unhandled() -> None:
    clock = FakeClock()
    handled: list[int] = []

    async def slow(record: queueflow.ShareRecord) -> None:
        handled.append(record.offset)
        clock.advance(cluster.settings.record_lock_duration_ms)  # the queue waits past its lock

    cluster = cluster_with(4, clock=clock)

    async def scenario() -> int:
        async with cluster:
            agent = await cluster.agent(slow, TOPIC, "g", concurrency=1)
            await eventually(lambda: agent.stats.lock_expired > 0, "a record released unhandled")
            await agent.stop()
            return agent.stats.lock_expired

    with capture_logs() as logs:
        expired = run(scenario())
    assert handled[0] == 0 and expired >= 1
    assert events(logs, "acquisition_lock_expired_before_handling")


def test_a_record_whose_lock_ends_within_the_margin_is_released_unhandled() -> None:
    """A queued record whose acquisition lock ends within the lock margin when a handler is
    free is not started: its outcome would reach the leader after the lock elapsed and the
    record would be handled twice (the chaos run's duplicates of 2026-11-25). ``concurrency=1``
    keeps 2 records acquired: record 1 waits while record 0's handler runs until record 1 has
    half a margin left."""
    clock = FakeClock()
    proceed = asyncio.Event()
    handled: list[tuple[int, int]] = []
    agents: list[queueflow.ShareAgent] = []

    async def handler(record: queueflow.ShareRecord) -> None:
        handled.append((record.offset, record.delivery_count))
        if record.offset == 0:
            await proceed.wait()
            margin_ms = agents[0].deadlines.lock_margin_s() * 1000
            clock.advance(1000 - margin_ms / 2)

    async def scenario() -> dict[str, int]:
        async with cluster_with(2, clock=clock) as cluster:
            agent = await cluster.agent(handler, TOPIC, "g", concurrency=1, lock_duration_ms=1000)
            agents.append(agent)
            await eventually(
                lambda: handled == [(0, 1)] and agent.stats.delivered == 2,
                "record 0 in the handler, record 1 queued",
            )
            proceed.set()
            await eventually(lambda: agent.stats.lock_expired == 1, "record 1 released")
            await agent.stop()
            return agent.stats.as_dict()

    with capture_logs() as logs:
        stats = run(scenario())
    assert (1, 1) not in handled  # its first delivery was never handled
    assert stats["lock_expired"] == 1
    (line,) = events(logs, "acquisition_lock_expired_before_handling")
    assert (line["offset"], line["delivery_count"]) == (1, 1)


def test_a_leader_that_reads_a_newer_fence_steps_down_and_writes_nothing() -> None:
    async def scenario() -> None:
        async with cluster_with(2) as cluster:
            leader = cluster.leaders[TOPIC]
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            assert await consumer.poll(timeout_ms=2000)
            fence = protocol.Fence(leader_epoch=2)
            await cluster.bus.send(leader.request_topic, 0, protocol.encode(fence))
            await cluster.bus.drain()
            assert not leader.partitions
            before = dict(cluster.tables[TOPIC])
            with pytest.raises(ShareGroupError) as refused:
                await consumer._require_session().fetch(TopicPartition(TOPIC, 0), 5)
            assert refused.value.code is ErrorCode.REQUEST_TIMED_OUT
            assert cluster.tables[TOPIC] == before

    with capture_logs() as logs:
        run(scenario())
    assert events(logs, "leader_stepped_down")[0]["partitions"] == [0]


def test_a_member_of_an_unsupported_protocol_version_is_refused() -> None:
    from queueflow.protocol import messages, topics

    async def scenario() -> Any:
        async with cluster_with(0) as cluster:
            replies: list[bytes] = []
            cluster.bus.members[b"m-future"] = replies.append
            request = messages.HeartbeatRequest(
                group="g",
                member_id="m-future",
                member_epoch=0,
                subscribed_topics=[TOPIC],
                reply_partition=0,
                request_id=1,
                protocol_version=99,
            )
            await cluster.bus.send(
                topics.coordinator_topic(cluster.app_id),
                0,
                messages.encode(request),
                b"m-future",
            )
            await cluster.bus.drain()
            await eventually(lambda: bool(replies), "the coordinator's answer")
            assert (
                cluster.coordinator.groups.get("g") is None
                or not cluster.coordinator.groups["g"].members
            )
            return messages.decode(replies[0])

    with capture_logs() as logs:
        reply = run(scenario())
    assert reply.error == ErrorCode.UNSUPPORTED_VERSION.value
    assert "protocol version 99" in reply.error_message
    assert events(logs, "unsupported_protocol_version")


def test_renew_keeps_a_record_past_its_first_lock() -> None:
    """KIP-1222 RENEW: a consumer still working on a record extends its lock; the record is
    not redelivered when the first lock would have elapsed, and the final ACCEPT is applied."""
    clock = FakeClock()

    async def scenario() -> None:
        async with cluster_with(1, clock=clock) as cluster:
            consumer = cluster.consumer("g", acknowledgement_mode="explicit")
            await consumer.subscribe([TOPIC])
            [record] = await consumer.poll(timeout_ms=1000)
            lock = cluster.settings.record_lock_duration_ms
            clock.advance(lock - 1000)
            consumer.acknowledge(record, queueflow.RENEW)
            assert await consumer.commit_sync() == {TP: None}
            clock.advance(2000)  # past the first lock, within the renewed one
            await cluster.tick()
            engine = cluster.share_partition("g", TOPIC, 0)
            assert engine.record(0).state.name == "ACQUIRED"
            consumer.acknowledge(record)  # ACCEPT
            assert await consumer.commit_sync() == {TP: None}
            assert engine.start_offset == 1
            await consumer.close()

    run(scenario())


def test_acquire_returns_coordinates_without_reading() -> None:
    reports: list[Any] = []

    async def scenario() -> None:
        async with cluster_with(5) as cluster:
            session = session_of(cluster, reports)
            await session.start()
            got = await session.acquire(TP, 3)
            assert (got.ranges, got.count, got.error) == ([(0, 2, 1)], 3, None)
            assert got.lock_timeout_ms == cluster.settings.record_lock_duration_ms
            session.acknowledge_range(TP, 0, 2, queueflow.ACCEPT)
            again = await session.acquire(TP, 10)  # the ACCEPTs ride along
            assert again.ranges == [(3, 4, 1)]
            assert cluster.share_partition("g", TOPIC, 0).start_offset == 3
            await session.close()

    run(scenario())
    assert reports == [([0, 1, 2], None)]
