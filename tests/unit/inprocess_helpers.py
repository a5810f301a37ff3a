"""What the in-process tests (``test_inprocess*.py``) share: a cluster with records, running a
scenario with a deadline, waiting on a condition, and picking log events."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from queueflow.settings import ShareGroupSettings
from queueflow.testing import FakeClock
from queueflow.testing.inprocess import InProcessCluster

TOPIC = "jobs"


def run(coro: Awaitable[Any]) -> Any:
    """Run a scenario; fail it after 30 s."""
    return asyncio.run(asyncio.wait_for(coro, timeout=30))


def settings(**overrides: Any) -> ShareGroupSettings:
    """The in-process cluster's default test settings, with ``overrides`` (attribute names)."""
    values: dict[str, Any] = {
        "auto_offset_reset": "earliest",
        "heartbeat_interval_ms": 200,
        "session_timeout_ms": 10_000,
        "request_timeout_ms": 2_000,
    }
    values.update(overrides)
    return ShareGroupSettings(**values)


def produce(cluster: InProcessCluster, records: int, partitions: int = 1) -> None:
    """``records`` records spread round-robin over the partitions, ``r<n>`` numbered on."""
    done = sum(len(log) for log in cluster.records.values())
    for i in range(done, done + records):
        cluster.produce(TOPIC, f"r{i}".encode(), partition=i % partitions)


def cluster_with(
    records: int, partitions: int = 1, clock: FakeClock | None = None, **overrides: Any
) -> InProcessCluster:
    """A cluster with one topic of ``partitions`` partitions holding ``records`` records."""
    cluster = InProcessCluster(
        {TOPIC: partitions}, clock=clock or FakeClock(), settings=settings(**overrides)
    )
    produce(cluster, records, partitions)
    return cluster


async def eventually(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    """Wait until ``condition()`` holds, checking every 10 ms; fail after ``timeout_s``."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.01)


async def until(
    condition: Callable[[], bool], what: str, clock: FakeClock, timeout_s: float = 5.0
) -> None:
    """Wait until ``condition()`` holds, checking every 10 ms and moving ``clock`` 10 ms each
    time (past the fetch loops' back-off; far from the 30 s locks); fail after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        clock.advance(10)
        await asyncio.sleep(0.01)


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The captured log events named ``name`` (from ``structlog.testing.capture_logs``)."""
    return [e for e in logs if e["event"] == name]


async def settle(cluster: InProcessCluster) -> None:
    """Wait until every request sent so far, and those their handling sent, is handled."""
    await cluster.bus.drain()


async def poll_until(consumer: Any, count: int, clock: FakeClock) -> list[Any]:
    """Poll ``consumer`` until ``count`` records came, moving ``clock`` 10 ms a poll (``run``
    bounds the scenario)."""
    got: list[Any] = []
    while len(got) < count:
        got += await consumer.poll(timeout_ms=100)
        clock.advance(10)
    return got
