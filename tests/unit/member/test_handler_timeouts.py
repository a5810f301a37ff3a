"""Handler calls that overrun or hang (``queueflow.member.agent``), through ``InProcessCluster``
on a :class:`~queueflow.testing.FakeClock`: a call past its deadline is cancelled and its record
RELEASEd while the lock holds; a member whose handler calls all ignore the cancellation releases
its queued records and acquires nothing, and the share-partition drains through another member.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable

import pytest
from inprocess_helpers import TOPIC, cluster_with, events, eventually, run, until
from structlog.testing import capture_logs

import queueflow
from queueflow.errors import ConfigurationError
from queueflow.member.agent import ShareAgent
from queueflow.structs import ShareRecord
from queueflow.testing import FakeClock, RecordState, ShareAgentHarness
from queueflow.testing.inprocess import InProcessCluster

ACCEPT = queueflow.ACCEPT


def hangs_on_first_delivery(
    clock: FakeClock, cancelled_at: list[float], calls: list[int] | None = None
) -> Callable[[ShareRecord], Awaitable[object]]:
    """A handler that waits forever on a record's first delivery (noting when it is
    cancelled, on ``clock``) and ACCEPTs later ones; ``calls`` gets each delivery count."""

    async def handler(record: ShareRecord) -> object:
        if calls is not None:
            calls.append(record.delivery_count)
        if record.delivery_count == 1:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled_at.append(clock.monotonic())
                raise
        return ACCEPT

    return handler


def test_a_call_past_its_handler_timeout_is_cancelled_and_its_record_released() -> None:
    calls: list[int] = []
    cancelled = asyncio.Event()

    async def handler(record: ShareRecord) -> object:
        calls.append(record.delivery_count)
        if record.delivery_count == 1:
            try:
                await asyncio.Event().wait()  # never set: only the timeout ends it
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return ACCEPT

    async def scenario() -> None:
        async with ShareAgentHarness(handler, topic=TOPIC, group="g", handler_timeout_ms=500) as h:
            h.put(b"r0")
            assert not (await h.run_until_idle()).done
            assert calls == [1]  # the first call started
            await h.advance(ms=400)  # the watchdog ran: not due yet
            assert not cancelled.is_set()
            assert h.history(0).outcome_types == []
            assert (await h.advance(ms=200)).done  # cancelled at 500 ms, delivered again
            assert cancelled.is_set() and calls == [1, 2]
            record = h.history(0)
            assert record.outcome_types == [queueflow.RELEASE, ACCEPT]
            assert record.state is RecordState.ACKNOWLEDGED  # the SPSO moved
            (agent,) = h.members
            assert agent.stats.handler_timeouts == 1 and agent.stats.accepted == 1
            (timed_out,) = h.handler_errors
            assert timed_out.event == "handler_timed_out_records_released"
            assert timed_out.line["offset"] == 0
            assert timed_out.line["handler_timeout_ms"] == 500
            metric = h.cluster.metrics.handler_errors.labels("g", TOPIC, "timeout")
            assert metric._value.get() == 1

    run(scenario())


def test_a_call_is_cancelled_before_its_lock_expires_without_a_handler_timeout() -> None:
    clock = FakeClock()
    cancelled_at: list[float] = []
    calls: list[int] = []
    handler = hangs_on_first_delivery(clock, cancelled_at, calls)

    async def scenario() -> None:
        # 5 s locks: the margin is a tenth, 0.5 s; the call is cancelled at 4.5 s.
        async with cluster_with(1, clock=clock, record_lock_duration_ms=5_000) as cluster:
            await cluster.agent(handler, TOPIC, "g")
            view = cluster.share_partition
            # the call must be running before time moves: a record whose lock ends within
            # the margin when it reaches the agent is released unhandled instead
            await eventually(lambda: calls == [1], "the handler started")
            clock.advance(4_400)
            await asyncio.sleep(0.3)
            assert cancelled_at == []
            clock.advance(200)
            await eventually(lambda: bool(cancelled_at), "cancelled before the lock expired")
            await until(
                lambda: int(view("g", TOPIC, 0).start_offset) == 1,
                "delivered again and ACCEPTed, the lock never having expired",
                clock,
            )
            assert calls == [1, 2]

    run(scenario())


def test_a_call_longer_than_its_lock_renews_the_lock_up_to_its_handler_timeout() -> None:
    """KIP-1222 RENEW: with handler_timeout_ms beyond the lock and RENEW allowed, the agent
    renews the record's lock a margin before it elapses, as often as needed, so a slow handler
    keeps its record (no second delivery) until it returns."""
    clock = FakeClock()
    calls: list[int] = []
    done = asyncio.Event()

    async def handler(record: ShareRecord) -> object:
        calls.append(record.delivery_count)
        await done.wait()  # returns once the test says so, three lock durations later
        return ACCEPT

    async def scenario() -> None:
        # 5 s locks, margin 0.5 s: renewed 0.5 s before each lock elapses; timeout 20 s.
        async with cluster_with(1, clock=clock, record_lock_duration_ms=5_000) as cluster:
            with capture_logs() as logs:
                agent = await cluster.agent(handler, TOPIC, "g", handler_timeout_ms=20_000)
                await eventually(lambda: calls == [1], "the first call started")
                engine = cluster.share_partition("g", TOPIC, 0)
                first_deadline = engine.record(0).lock_deadline_ms
                for _ in range(3):  # three lock durations and more
                    deadline = engine.record(0).lock_deadline_ms
                    assert deadline is not None
                    clock.advance(deadline - clock.now_ms() - 400)  # inside the 500 ms margin
                    await eventually(
                        lambda d=deadline: (engine.record(0).lock_deadline_ms or 0) > d,
                        "the lock renewed before it elapsed",
                    )
                    assert engine.record(0).delivery_count == 1
                assert engine.record(0).lock_deadline_ms > first_deadline + 3 * 4_000
                done.set()
                await until(lambda: int(engine.start_offset) == 1, "ACCEPTed", clock)
            assert calls == [1]
            assert agent.stats.renewed == 3 and agent.stats.handler_timeouts == 0
            renewals = events(logs, "handler_locks_renewed")
            assert len(renewals) == agent.stats.renewed
            assert renewals[0]["offset"] == 0 and renewals[0]["handler_timeout_ms"] == 20_000

    run(scenario())


def test_without_renew_a_call_longer_than_its_lock_is_cancelled_before_it() -> None:
    """share.renew.acknowledge.enable=false: the lock bounds the call even with a longer
    handler_timeout_ms, and a RENEW sent anyway is refused by the leader."""
    clock = FakeClock()
    cancelled_at: list[float] = []
    calls: list[int] = []
    handler = hangs_on_first_delivery(clock, cancelled_at, calls)

    async def scenario() -> None:
        async with cluster_with(
            1, clock=clock, record_lock_duration_ms=5_000, renew_acknowledge_enable="false"
        ) as cluster:
            agent = await cluster.agent(handler, TOPIC, "g", handler_timeout_ms=20_000)
            engine = await wait_for_engine(cluster)
            await eventually(lambda: calls == [1], "the handler started")  # before time moves
            started = clock.monotonic()
            clock.advance(4_600)
            await eventually(lambda: bool(cancelled_at), "cancelled before the lock expired")
            assert cancelled_at[0] - started == pytest.approx(4.6, abs=0.01)
            await until(lambda: int(engine.start_offset) == 1, "redelivered, ACCEPTed", clock)
            assert agent.stats.renewed == 0 and agent.stats.handler_timeouts == 1

    run(scenario())


async def wait_for_engine(cluster: InProcessCluster) -> object:
    """The share-partition ``g``/TOPIC/0 once a record has been acquired."""
    await eventually(
        lambda: (
            cluster.share_partition("g", TOPIC, 0) is not None
            and cluster.share_partition("g", TOPIC, 0).acquired_count > 0
        ),
        "acquired",
    )
    return cluster.share_partition("g", TOPIC, 0)


def test_a_member_whose_handlers_all_hang_releases_its_queue_and_the_partition_drains() -> None:
    """Both handler tasks of member A hang and ignore their cancellation. A releases the
    records queued behind them and acquires nothing more; member B handles everything,
    including A's two records once their locks expire."""
    clock = FakeClock()
    unblock = asyncio.Event()
    hung: list[int] = []
    handled_by_b: Counter[int] = Counter()

    async def hangs(record: ShareRecord) -> object:
        hung.append(record.offset)
        while not unblock.is_set():
            try:
                await unblock.wait()
            except asyncio.CancelledError:
                continue  # ignores its cancellation: stuck
        return ACCEPT

    async def works(record: ShareRecord) -> object:
        handled_by_b[record.offset] += 1
        return ACCEPT

    async def hang_and_drain(cluster: InProcessCluster) -> None:
        with capture_logs() as logs:
            a = await cluster.agent(hangs, TOPIC, "g", concurrency=2, name="a")
            await eventually(lambda: len(hung) == 2 and a.runner.queued > 0, "A hangs")
            queued = a.runner.queued
            clock.advance(4_600)  # past both calls' deadlines (lock - 0.5 s)
            await eventually(lambda: all(c.cancelled_at for c in a.deadlines.calls), "cancelled")
            clock.advance(600)  # a lock margin later: stuck
            await eventually(lambda: a.deadlines.all_stuck, "A's handlers all stuck")
            (stuck,) = events(logs, "share_agent_handlers_stuck")
            # The hung calls become stuck when their locks end at the leader: a fetch may
            # acquire (and queue) more in that instant, and those are released too.
            assert stuck["stuck"] == 2 and stuck["queued_released"] >= queued
            assert a.runner.queued == 0
            gauge = cluster.metrics.stuck_handlers.labels("g", TOPIC)
            assert gauge._value.get() == 2
            b = await cluster.agent(works, TOPIC, "g", name="b")
            view = cluster.share_partition

            def drained() -> bool:
                clock.advance(100)  # A's two locks expire at the leader meanwhile
                return int(view("g", TOPIC, 0).start_offset) == 8

            await eventually(drained, "every record ACCEPTed", timeout_s=10)
            assert set(handled_by_b) == set(range(8))  # A's hung ones too
            assert sorted(hung) == sorted(set(hung)) and len(hung) == 2  # A took no more
            unblock.set()
            await eventually(lambda: not a.deadlines.all_stuck, "A recovered")
            assert events(logs, "share_agent_handlers_recovered")
            assert gauge._value.get() == 0
            await a.stop()
            await b.stop()

    async def scenario() -> None:
        async with cluster_with(8, clock=clock, record_lock_duration_ms=5_000) as cluster:
            try:
                await hang_and_drain(cluster)
            finally:
                unblock.set()  # whatever failed: the hung calls end, so the loop can close

    run(scenario())


def test_handler_timeout_must_be_positive() -> None:
    async def handler(record: ShareRecord) -> None:
        return None

    async def scenario() -> None:
        async with cluster_with(0) as cluster:
            with pytest.raises(ConfigurationError, match="handler_timeout_ms=0"):
                ShareAgent(cluster.member_context, handler, TOPIC, "g", handler_timeout_ms=0)

    run(scenario())
