"""The member side through ``InProcessCluster``: the ShareFetch session, ``ShareConsumer`` and
``ShareAgent`` against the real coordinator and leaders, in memory, on a
:class:`~queueflow.testing.FakeClock`.

With a FakeClock, time moves only when a test advances it: a ``poll`` that finds nothing returns
only with ``timeout_ms=0``, and an agent's fetch loop backing off after an empty ShareFetch
fetches again only once the clock has moved past the back-off."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from inprocess_helpers import TOPIC, cluster_with, events, eventually, produce, run, settle
from structlog.testing import capture_logs

import queueflow
from queueflow.engine.partition import RecordState
from queueflow.errors import ConfigurationError, ErrorCode, ShareGroupError
from queueflow.member.consumer import IllegalStateError
from queueflow.member.session import ShareFetchSession
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.structs import ShareRecord, TopicPartition
from queueflow.testing import FakeClock, ShareAgentHarness
from queueflow.testing.inprocess import InProcessCluster

TP0, TP1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)


def spso(cluster: InProcessCluster, partition: int = 0) -> int | None:
    engine = cluster.share_partition("g", TOPIC, partition)
    return None if engine is None else int(engine.start_offset)


def state(cluster: InProcessCluster, offset: int, partition: int = 0) -> tuple[RecordState, int]:
    view = cluster.share_partition("g", TOPIC, partition).record(offset)
    return view.state, view.delivery_count


# -- session -------------------------------------------------------------------------------


def test_a_members_own_lock_duration_is_the_lock_the_leader_takes() -> None:
    """KIP-932 lets a member ask for its own acquisition lock duration: the leader locks the
    records for that long and says so (KIP-1222 AcquisitionLockTimeoutMs), and the session
    sets each record's lock deadline from it."""
    clock = FakeClock()

    async def scenario() -> None:
        async with cluster_with(2, clock=clock) as cluster:
            session = ShareFetchSession(
                cluster.member_context, "g", [TOPIC], "test", lock_duration_ms=5000
            )
            await session.start()
            fetched = await session.fetch(TP0, 10)
            assert fetched.error is None and fetched.acquired == 2
            assert fetched.lock_timeout_ms == 5000
            assert [r.lock_deadline for r in fetched.records] == [clock.monotonic() + 5] * 2
            lock = cluster.share_partition("g", TOPIC, 0).record(0)
            assert lock.member_id == session.member_id
            assert lock.lock_deadline_ms == clock.now_ms() + 5000
            await session.close()

    run(scenario())


# -- consumer ------------------------------------------------------------------------------


def test_implicit_mode_accepts_the_previous_poll_on_the_next_poll() -> None:
    """KIP-932 "Acknowledgement modes", implicit: the records of a poll are ACCEPTed by the
    next poll (riding along with its ShareFetch), without a commit."""

    async def scenario() -> None:
        async with cluster_with(3) as cluster:
            consumer = cluster.consumer("g")
            await consumer.subscribe([TOPIC])
            assert [r.offset for r in await consumer.poll(timeout_ms=0)] == [0, 1, 2]
            assert spso(cluster) == 0
            assert state(cluster, 0) == (RecordState.ACQUIRED, 1)
            produce(cluster, 3)
            assert [r.offset for r in await consumer.poll(timeout_ms=0)] == [3, 4, 5]
            assert spso(cluster) == 3  # 0..2 accepted by the second poll
            assert state(cluster, 3) == (RecordState.ACQUIRED, 1)
            await consumer.close()

    run(scenario())


def test_explicit_mode_refuses_to_poll_with_unacknowledged_records() -> None:
    """KIP-932 "Acknowledgement modes", explicit: every record must be acknowledged before
    the next poll, which otherwise raises IllegalStateError and sends nothing."""

    async def scenario() -> None:
        async with cluster_with(2) as cluster:
            consumer = cluster.consumer("g", acknowledgement_mode="explicit")
            await consumer.subscribe([TOPIC])
            first, second = await consumer.poll(timeout_ms=0)
            consumer.acknowledge(first, queueflow.ACCEPT)
            with pytest.raises(IllegalStateError, match="1 records from the last poll"):
                await consumer.poll(timeout_ms=0)
            assert spso(cluster) == 0  # the ACCEPT of 0 was not sent either
            consumer.acknowledge(second, queueflow.REJECT)
            assert await consumer.poll(timeout_ms=0) == []
            assert spso(cluster) == 2
            await consumer.close()

    run(scenario())


def test_close_in_implicit_mode_releases_the_last_poll() -> None:
    """``close()`` RELEASEs the records of the last poll rather than accepting them (as
    KafkaShareConsumer.close does); they are delivered again with delivery count 2."""

    async def scenario() -> None:
        async with cluster_with(3) as cluster:
            first = cluster.consumer("g")
            await first.subscribe([TOPIC])
            assert len(await first.poll(timeout_ms=0)) == 3
            await first.close()
            await settle(cluster)
            assert [state(cluster, o) for o in range(3)] == [(RecordState.AVAILABLE, 1)] * 3
            second = cluster.consumer("g")
            await second.subscribe([TOPIC])
            again = await second.poll(timeout_ms=0)
            assert [(r.offset, r.delivery_count) for r in again] == [(0, 2), (1, 2), (2, 2)]
            await second.close()

    with capture_logs() as logs:
        run(scenario())
    # Released by the consumer's RELEASE, not by the leader when the member left.
    assert not events(logs, "member_records_released")


def test_commit_sync_answers_per_share_partition() -> None:
    """``commit_sync`` returns the result of each share-partition's acknowledgements: None
    where the leader applied them, its error where it refused them (here the leader released
    the member's records of partition 1), and the commit callback hears of both."""
    reports: list[tuple[dict[Any, set[int]], Exception | None]] = []

    async def scenario() -> dict[Any, Exception | None]:
        async with cluster_with(4, partitions=2) as cluster:
            consumer = cluster.consumer("g", acknowledgement_mode="explicit")
            consumer.set_acknowledgement_commit_callback(
                lambda offsets, exc: reports.append((offsets, exc))
            )
            await consumer.subscribe([TOPIC])
            records = await consumer.poll(timeout_ms=0)
            assert sorted((r.partition, r.offset) for r in records) == [
                (0, 0),
                (0, 1),
                (1, 0),
                (1, 1),
            ]
            member_id = consumer.member_id
            assert member_id is not None
            release = protocol.ReleaseMember("g", TOPIC, 1, member_id, "test")
            request_topic = topics.request_topic(cluster.app_id, TOPIC)
            await cluster.bus.send(request_topic, 1, protocol.encode(release))
            await cluster.bus.drain()
            for r in records:
                consumer.acknowledge(r, queueflow.ACCEPT)
            results = await consumer.commit_sync()
            assert (spso(cluster, 0), spso(cluster, 1)) == (2, 0)
            await consumer.close()
            return results

    results = run(scenario())
    assert set(results) == {TP0, TP1}
    assert results[TP0] is None
    error = results[TP1]
    assert isinstance(error, ShareGroupError) and error.code is ErrorCode.INVALID_RECORD_STATE
    by_partition = {next(iter(offsets)): (offsets, exc) for offsets, exc in reports}
    assert by_partition[TP0] == ({TP0: {0, 1}}, None)
    assert by_partition[TP1][0] == {TP1: {0, 1}} and by_partition[TP1][1] is error


def test_commit_async_reports_the_offsets_to_the_commit_callback() -> None:
    """``commit_async`` sends the acknowledgements without waiting; the commit callback gets
    ``{(topic, partition): offsets}`` and no exception once the leader applied them."""
    reports: list[tuple[dict[Any, set[int]], Exception | None]] = []

    async def scenario() -> dict[Any, Exception | None]:
        async with cluster_with(3) as cluster:
            consumer = cluster.consumer("g")
            consumer.set_acknowledgement_commit_callback(
                lambda offsets, exc: reports.append((offsets, exc))
            )
            await consumer.subscribe([TOPIC])
            assert len(await consumer.poll(timeout_ms=0)) == 3
            results = await consumer.commit_async()
            assert spso(cluster) == 3
            await consumer.close()
            return results

    assert run(scenario()) == {TP0: None}
    assert reports == [({TP0: {0, 1, 2}}, None)]


def test_a_record_is_acknowledged_once_and_only_with_a_consumer_type() -> None:
    """ShareConsumer.acknowledge: a second acknowledgement of the same record raises
    IllegalStateError (the first one stands); GAP is not a consumer's acknowledge type."""

    async def scenario() -> None:
        async with cluster_with(2) as cluster:
            consumer = cluster.consumer("g", acknowledgement_mode="explicit")
            await consumer.subscribe([TOPIC])
            first, second = await consumer.poll(timeout_ms=0)
            consumer.acknowledge(first, queueflow.REJECT)
            with pytest.raises(IllegalStateError, match=r"jobs\[0\]@0 .*already acknowledged"):
                consumer.acknowledge(first, queueflow.ACCEPT)
            with pytest.raises(ConfigurationError, match="use ACCEPT, RELEASE, REJECT or RENEW"):
                consumer.acknowledge(second, queueflow.AcknowledgeType.GAP)
            consumer.acknowledge(second, queueflow.RELEASE)  # the refused GAP took nothing
            await consumer.commit_sync()
            assert state(cluster, 1) == (RecordState.AVAILABLE, 1)
            assert spso(cluster) == 1  # 0 was REJECTed (Archived), not ACCEPTed twice
            await consumer.close()

    run(scenario())


def test_offsets_without_a_record_are_acknowledged_as_gap() -> None:
    """KIP-932 AcknowledgeType GAP: acquired offsets that hold no record (a transaction
    marker, a compacted record) are never shown to the application; the session
    acknowledges them as GAP, so the SPSO moves past them."""

    async def scenario() -> None:
        async with cluster_with(0) as cluster:
            for value in (b"r0", None, b"r2", None, b"r4"):
                cluster.produce(TOPIC, value)
            consumer = cluster.consumer("g", acknowledgement_mode="explicit")
            await consumer.subscribe([TOPIC])
            records = await consumer.poll(timeout_ms=0)
            assert [r.offset for r in records] == [0, 2, 4]
            assert state(cluster, 1) == (RecordState.ACQUIRED, 1)  # acquired, not shown
            for r in records:
                consumer.acknowledge(r, queueflow.ACCEPT)
            assert await consumer.commit_sync() == {TP0: None}
            assert spso(cluster) == 5
            # Those GAPs started the leader's hole reader: it archives later offsets without a
            # record itself (docs/concepts.md "Acquisition counts records").
            holes = cluster.leaders[TOPIC].fetcher.holes
            assert holes is not None and holes.reading("g", 0)
            cluster.produce(TOPIC, None)
            cluster.produce(TOPIC, None)
            await eventually(lambda: spso(cluster) == 7, "holes archived by the leader")
            assert await consumer.poll(timeout_ms=0) == []
            engine = cluster.share_partition("g", TOPIC, 0)
            assert engine.in_flight_count == 0
            gaps = {"group": "g", "topic": TOPIC, "type": "gap"}  # docs/operations.md metrics
            registry = consumer.ctx.metrics.registry
            assert registry.get_sample_value("queueflow_acknowledgements_total", gaps) == 2
            await consumer.close()

    run(scenario())


# -- agent ---------------------------------------------------------------------------------


def test_an_undecodable_record_is_rejected_without_calling_the_handler() -> None:
    """A record the agent's decoder can't decode is REJECTed (Archived, never delivered
    again) with ``undecodable_record_rejected``; the handler sees the others, decoded."""
    seen: dict[int, Any] = {}

    def decode(record: ShareRecord) -> None:
        if record.offset == 1:
            raise ValueError("not UTF-8 enough")
        record.value = record.value.decode()

    async def handler(record: ShareRecord) -> None:
        seen[record.offset] = record.value

    async def scenario() -> tuple[dict[str, int], list[Any]]:
        async with ShareAgentHarness(handler, topic=TOPIC, group="g", decode=decode) as h:
            h.put_many(f"r{i}".encode() for i in range(4))
            assert (await h.run_until_idle()).done
            assert [r.offset for r in h.archived()] == [1]
            assert h.history(1).outcome_types == [queueflow.REJECT]
            assert h.history(1).delivery_count == 1
            (agent,) = h.members
            await agent.stop()
            return agent.stats.as_dict(), h.handler_errors

    stats, errors = run(scenario())
    assert seen == {0: "r0", 2: "r2", 3: "r3"}
    assert (stats["undecodable"], stats["rejected"], stats["accepted"]) == (1, 1, 3)
    assert stats["delivered"] == 4 and stats["redelivered"] == 0
    assert [(e.event, e.line["offset"], e.line["delivery_count"]) for e in errors] == [
        ("undecodable_record_rejected", 1, 1)
    ]
    assert "not UTF-8 enough" in errors[0].error


def test_concurrent_handlers_process_every_record_exactly_once() -> None:
    """``concurrency=4``: four handlers run at once (the first four wait for each other, so
    fewer would never finish), never more, and every record is handled exactly once."""
    handled: Counter[tuple[int, int]] = Counter()
    running = peak = 0
    four_running = asyncio.Event()

    async def handler(record: ShareRecord) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 4:
            four_running.set()
        await four_running.wait()
        handled[(record.partition, record.offset)] += 1
        running -= 1

    async def scenario() -> dict[str, int]:
        h = ShareAgentHarness(handler, topic=TOPIC, group="g", partitions=2, concurrency=4)
        for i in range(20):
            h.put(f"r{i}".encode(), partition=i % 2)
        async with h:
            assert (await h.run_until_idle()).done
            for p in (0, 1):
                view = h.share_partition(p)
                assert view is not None and (view.spso, view.speo) == (10, 10)
            assert all(r.outcome_types == [queueflow.ACCEPT] for r in h.records())
            (agent,) = h.members
            await agent.stop()
            return agent.stats.as_dict()

    stats = run(scenario())
    assert handled == Counter({(p, o): 1 for p in (0, 1) for o in range(10)})
    assert peak == 4
    assert (stats["delivered"], stats["accepted"], stats["redelivered"]) == (20, 20, 0)


def test_stop_lets_a_running_handler_finish_and_releases_the_queued_records() -> None:
    """Graceful drain: ``stop()`` stops fetching, RELEASEs the records still queued at once,
    waits (within queueflow.shutdown.timeout.ms) for the handler in progress and sends its
    outcome, then leaves; ``share_agent_drained`` reports the counters."""
    started, proceed = asyncio.Event(), asyncio.Event()
    handled: list[int] = []

    async def handler(record: ShareRecord) -> None:
        handled.append(record.offset)
        started.set()
        await proceed.wait()

    async def scenario() -> dict[str, int]:
        async with cluster_with(5) as cluster:
            agent = await cluster.agent(handler, TOPIC, "g", concurrency=1)
            await eventually(started.is_set, "the first record in its handler")
            delivered = agent.stats.delivered
            assert delivered >= 2  # one in the handler, the others queued
            stopping = asyncio.ensure_future(agent.stop())
            await eventually(lambda: agent.stats.released > 0, "the queued records released")
            assert not stopping.done()  # still waiting for the handler
            proceed.set()
            await stopping
            await settle(cluster)
            assert spso(cluster) == 1  # 0 was handled and ACCEPTed
            engine = cluster.share_partition("g", TOPIC, 0)
            assert engine.acquired_count == 0
            for offset in range(1, delivered):  # queued, never handled: delivery given back
                assert state(cluster, offset) == (RecordState.AVAILABLE, 0)
            return agent.stats.as_dict()

    with capture_logs() as logs:
        stats = run(scenario())
    assert handled == [0]
    assert stats["accepted"] == 1 and stats["released"] == stats["delivered"] - 1
    drained = events(logs, "share_agent_drained")
    assert len(drained) == 1
    assert {k: drained[0][k] for k in stats} == stats
    assert not events(logs, "drain_timeout")
    assert not events(logs, "member_records_released")  # the agent released them itself


def test_stop_gives_up_on_a_handler_past_the_shutdown_timeout() -> None:
    """A handler still running when queueflow.shutdown.timeout.ms ends is cancelled
    (``drain_timeout``); its record goes back when the member leaves (the leader releases
    what the member still holds)."""
    started = asyncio.Event()

    async def handler(record: ShareRecord) -> None:
        started.set()
        await asyncio.Event().wait()  # never finishes

    async def scenario() -> None:
        async with cluster_with(3, shutdown_timeout_ms=0) as cluster:
            agent = await cluster.agent(handler, TOPIC, "g", concurrency=1)
            await eventually(started.is_set, "the first record in its handler")
            await agent.stop()
            await settle(cluster)
            engine = cluster.share_partition("g", TOPIC, 0)
            assert engine.acquired_count == 0 and engine.start_offset == 0
            assert state(cluster, 0) == (RecordState.AVAILABLE, 1)

    with capture_logs() as logs:
        run(scenario())
    assert [e["unfinished"] for e in events(logs, "drain_timeout")] == [1]
    released = events(logs, "member_records_released")
    assert [(e["records"], e["reason"]) for e in released] == [(1, "member left")]


def test_two_agents_in_a_group_share_the_work() -> None:
    """Two agents of one group on a 2-partition topic: the second one's join divides the
    share-partitions between them, each handles the records of its own, and every record is
    handled exactly once."""
    clock = FakeClock()
    handled: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}

    def handler_of(name: str) -> Callable[[ShareRecord], Awaitable[None]]:
        async def handler(record: ShareRecord) -> None:
            handled[name].append((record.partition, record.offset))

        return handler

    async def scenario() -> TopicPartition:
        async with cluster_with(10, partitions=2, clock=clock) as cluster:
            a = await cluster.agent(handler_of("a"), TOPIC, "g", name="a")
            await eventually(
                lambda: (spso(cluster, 0), spso(cluster, 1)) == (5, 5), "the first batch"
            )
            b = await cluster.agent(handler_of("b"), TOPIC, "g", name="b")
            assert a.session is not None and b.session is not None
            sa, sb = a.session, b.session
            await eventually(
                lambda: (
                    bool(sb.assignment)
                    and bool(sa.assignment)
                    and not sa.assignment & sb.assignment
                ),
                "the share-partitions divided between the agents",
            )
            (b_partition,) = sb.assignment  # one each
            produce(cluster, 10, partitions=2)
            clock.advance(1000)  # past the fetch loops' back-off after their empty fetches
            await eventually(
                lambda: (spso(cluster, 0), spso(cluster, 1)) == (10, 10), "the second batch"
            )
            await b.stop()
            await a.stop()
            return b_partition

    mine = run(scenario()).partition
    every = [(p, o) for p in (0, 1) for o in range(10)]
    assert Counter(handled["a"] + handled["b"]) == Counter(every)
    # b handled the second batch of its share-partition, a everything else.
    assert sorted(handled["b"]) == [(mine, o) for o in range(5, 10)]


class _StalledTransports:
    """``io.transport`` of a cluster whose first ``stalled`` transports never finish starting
    (the broker went away while the member set up its reply channel), counting the starts."""

    def __init__(self, cluster: InProcessCluster, stalled: int) -> None:
        self.io = cluster.member_context.io
        self.make = self.io.transport
        self.stalled = stalled
        self.starts = 0

    def __call__(self, member_id: str, client_id: str, reply_route: str | None = None) -> Any:
        transport = self.make(member_id, client_id, reply_route)
        start = transport.start

        async def stalling_start(on_reply: Callable[[bytes], None]) -> None:
            self.starts += 1
            if self.starts <= self.stalled:
                await asyncio.Event().wait()  # never set
            await start(on_reply)

        transport.start = stalling_start
        return transport


def test_a_reply_channel_that_never_starts_fails_the_join_within_the_join_timeout() -> None:
    cluster = cluster_with(1, join_timeout_ms=1_000)
    stalled = _StalledTransports(cluster, stalled=1)
    cluster.member_context.io.transport = stalled  # type: ignore[method-assign]

    async def scenario() -> None:
        async with cluster:
            consumer = cluster.consumer("g")
            with pytest.raises(ShareGroupError) as refused:
                await consumer.subscribe([TOPIC])
            assert refused.value.code is ErrorCode.REQUEST_TIMED_OUT
            assert "queueflow.member.join.timeout.ms" in str(refused.value)
            await consumer.close()

    run(scenario())
    assert stalled.starts == 1


def test_a_share_agent_whose_reply_channel_stalled_starts_over_and_handles_its_records() -> None:
    cluster = cluster_with(3, join_timeout_ms=1_000)
    stalled = _StalledTransports(cluster, stalled=1)
    cluster.member_context.io.transport = stalled  # type: ignore[method-assign]
    handled: list[int] = []

    async def handler(record: ShareRecord) -> None:
        handled.append(record.offset)

    async def scenario() -> None:
        async with cluster:
            with capture_logs() as logs:
                await cluster.agent(handler, TOPIC, "g")
                await eventually(lambda: len(handled) == 3, "the records handled", 10.0)
            assert [e["event"] for e in logs].count("share_agent_join_failed") == 1

    run(scenario())
    assert stalled.starts == 2 and sorted(handled) == [0, 1, 2]
