"""The ticker's run loop (:meth:`queueflow.server.ticker.LeaderTicker.run`): idle, it sends
no lock checks and ticks only the coordinator partitions that serve a share group; once a
leader acquires records it ticks their request partition every lock check interval."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

from inprocess_helpers import TOPIC, RawMember, eventually, produce, run, settings

from queueflow.protocol import topics
from queueflow.server.ticker import LeaderTicker
from queueflow.testing.inprocess import InProcessCluster

#: 10 ms lock checks, the coordinator every 100 ms (half the 200 ms heartbeat interval).
INTERVAL_MS = 10


def spied(cluster: InProcessCluster) -> Counter[tuple[str, int]]:
    """Count what the cluster's control sender sends, by (topic, partition)."""
    sent: Counter[tuple[str, int]] = Counter()
    send = cluster.bus.send

    async def counting(topic: str, partition: int, value: bytes, key: bytes | None = None) -> None:
        sent[(topic, partition)] += 1
        await send(topic, partition, value, key)

    cluster.bus.send = counting  # type: ignore[method-assign]
    return sent


async def ticking(ticker: LeaderTicker) -> asyncio.Task[None]:
    """``ticker.run()`` as a task."""
    return asyncio.ensure_future(ticker.run())


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def test_an_idle_ticker_ticks_only_the_coordinator_partitions_serving_a_group() -> None:
    cluster = InProcessCluster(
        {TOPIC: 2}, settings=settings(lock_check_interval_ms=INTERVAL_MS), coordinator_partitions=4
    )
    produce(cluster, 5)
    coordinator = topics.coordinator_topic(cluster.app_id)
    serving = cluster.server.coordinator_partition("g")

    async def scenario() -> Counter[tuple[str, int]]:
        async with cluster:
            sent = spied(cluster)
            task = await ticking(LeaderTicker(cluster.server, cluster.leaders, lambda: ["g"]))
            try:
                await eventually(lambda: sent[(coordinator, serving)] >= 4, "coordinator ticks")
            finally:
                await stop(task)
            return sent

    sent = run(scenario())
    # no lock check (nothing acquired), and no tick of a coordinator partition without a group
    assert set(sent) == {(coordinator, serving)}, sent


def test_an_idle_ticker_resumes_lock_checks_once_records_are_acquired() -> None:
    cluster = InProcessCluster({TOPIC: 2}, settings=settings(lock_check_interval_ms=INTERVAL_MS))
    produce(cluster, 5)
    request = topics.request_topic(cluster.app_id, TOPIC)
    coordinator = topics.coordinator_topic(cluster.app_id)

    async def scenario() -> tuple[Counter[tuple[str, int]], Counter[tuple[str, int]]]:
        async with cluster:
            sent = spied(cluster)
            task = await ticking(LeaderTicker(cluster.server, cluster.leaders))
            try:
                await eventually(lambda: sent[(coordinator, 0)] >= 3, "coordinator ticks")
                idle = Counter(sent)
                member = RawMember(cluster, "m-a")
                await member.heartbeat(0)
                fetched = await member.fetch(0, 5)
                assert fetched.acquired, "the member acquired nothing"
                # lock checks every 10 ms: 5 within the 5 s of eventually()
                await eventually(lambda: sent[(request, 0)] >= 5, "lock checks")
            finally:
                await stop(task)
            return idle, sent

    idle, busy = run(scenario())
    assert not any(topic == request for topic, _p in idle), idle
    assert busy[(request, 1)] == 0  # nothing acquired there: no tick
