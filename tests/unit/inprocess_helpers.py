"""What the in-process tests share: a cluster with records (or with the direct path), running
a scenario with a deadline, waiting on a condition, picking log events, a member that speaks the
wire protocol by hand (:class:`RawMember`) and ShareFetch requests with a ticket."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.auth import issue_ticket, ticket_key
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


class RawMember:
    """A member that speaks the wire protocol by hand: one request, one answer."""

    def __init__(self, cluster: InProcessCluster, member_id: str, group: str = "g") -> None:
        self.cluster = cluster
        self.member_id = member_id
        self.group = group
        self.replies: list[Any] = []
        self._request_id = 0
        #: Its assignment ticket: its last heartbeat answer's, else one the coordinator would
        #: issue for every partition (so that requests sent without joining are served).
        self.ticket = b""
        cluster.bus.members[member_id.encode()] = lambda raw: self.replies.append(
            protocol.decode(raw)
        )

    async def call(
        self,
        topic: str,
        partition: int,
        request: Any,
        handler: Callable[[int, int, bytes], Awaitable[None]] | None = None,
        offset: int = 0,
    ) -> Any:
        """Send ``request`` through the bus (or straight to ``handler`` at ``offset``) and
        return the answer."""
        before = len(self.replies)
        if handler is None:
            await self.cluster.bus.send(
                topic, partition, protocol.encode(request), self.member_id.encode()
            )
            await self.cluster.bus.drain()
        else:
            await handler(partition, offset, protocol.encode(request))
        await eventually(lambda: len(self.replies) > before, f"an answer to {request!r}")
        return self.replies[-1]

    def _next_id(self) -> int:
        self._request_id += 1
        return self._request_id

    def heartbeat_request(self, epoch: int, subscribed: Iterable[str] = (TOPIC,)) -> Any:
        return protocol.HeartbeatRequest(
            group=self.group,
            member_id=self.member_id,
            member_epoch=epoch,
            subscribed_topics=list(subscribed),
            reply_partition=0,
            request_id=self._next_id(),
        )

    async def heartbeat(self, epoch: int, **kwargs: Any) -> protocol.HeartbeatResponse:
        topic = topics.coordinator_topic(self.cluster.app_id)
        reply = await self.call(topic, 0, self.heartbeat_request(epoch), **kwargs)
        assert isinstance(reply, protocol.HeartbeatResponse)
        if reply.ticket:
            self.ticket = reply.ticket
        return reply

    def fetch_request(
        self,
        partition: int,
        max_records: int,
        acks: list[tuple[int, int, tuple[int, ...]]] | None = None,
        deadline_ms: int | None = None,
    ) -> Any:
        clock = self.cluster.clock
        return protocol.ShareFetchRequest(
            group=self.group,
            topic=TOPIC,
            partition=partition,
            member_id=self.member_id,
            request_id=self._next_id(),
            reply_partition=0,
            max_records=max_records,
            acks=acks or [],
            deadline_ms=clock.now_ms() + 1000 if deadline_ms is None else deadline_ms,
            ticket=self.ticket or self.cluster.ticket(self.group, self.member_id),
        )

    async def fetch(
        self, partition: int, max_records: int, **kwargs: Any
    ) -> protocol.ShareFetchResponse:
        handler = kwargs.pop("handler", None)
        offset = kwargs.pop("offset", 0)
        request = self.fetch_request(partition, max_records, **kwargs)
        request_topic = topics.request_topic(self.cluster.app_id, TOPIC)
        reply = await self.call(request_topic, partition, request, handler=handler, offset=offset)
        assert isinstance(reply, protocol.ShareFetchResponse)
        return reply


def direct_cluster(records: int = 0, partitions: int = 1, **overrides: Any) -> InProcessCluster:
    values: dict[str, Any] = {
        "auto_offset_reset": "earliest",
        "heartbeat_interval_ms": 200,
        "session_timeout_ms": 10_000,
        "request_timeout_ms": 2_000,
        "leader_listener": "127.0.0.1:0",
        "fetch_max_wait_ms": 3_000,
    }
    values.update(overrides)
    cluster = InProcessCluster(
        {TOPIC: partitions}, settings=ShareGroupSettings(**values), direct=True
    )
    for i in range(records):
        cluster.produce(TOPIC, f"r{i}".encode(), partition=i % partitions)
    return cluster


def member_ticket(member: str, partitions: int = 8) -> bytes:
    """The ticket the coordinator of an in-process cluster (app ``inprocess``, auth mode
    ``none``) would give ``member`` of group ``g`` for partitions ``0..partitions-1``."""
    return issue_ticket(
        ticket_key("none", "", "inprocess"),
        group="g",
        member_id=member,
        member_epoch=1,
        partitions=[(TOPIC, p) for p in range(partitions)],
        ttl_ms=60_000,
    )


def fetch(
    member: str, rid: int, max_records: int = 10, max_wait_ms: int = 0, **kw: Any
) -> protocol.ShareFetchRequest:
    kw.setdefault("ticket", member_ticket(member))
    return protocol.ShareFetchRequest(
        group="g",
        topic=TOPIC,
        partition=0,
        member_id=member,
        request_id=rid,
        reply_partition=0,
        max_records=max_records,
        deadline_ms=int(time.time() * 1000) + 10_000,
        max_wait_ms=max_wait_ms,
        **kw,
    )
