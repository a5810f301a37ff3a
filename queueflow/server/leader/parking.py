"""The direct path's request queues and long polls (Kafka's ``DelayedShareFetch``).

Requests that come over the direct path (:mod:`queueflow.server.endpoint`) are served per
request partition in batches, by one task per partition: every request waiting when the
partition's turn comes is applied in arrival order (:meth:`ShareLeader._apply_batch
<queueflow.server.leader.manager.ShareLeader._apply_batch>`). A request that acquires nothing,
has ``max_wait_ms`` and carries no acknowledgements is parked (KIP-932 long poll) until records
become available (new records at the log end, releases, expired locks), its wait ends, or its
member cancels it (:class:`~queueflow.protocol.messages.ShareFetchCancel`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from queueflow.errors import ErrorCode, FencedStateEpochError
from queueflow.logging import get_logger
from queueflow.protocol import messages as protocol
from queueflow.server.context import ServerContext
from queueflow.server.durable import DurableSharePartition
from queueflow.server.leader.lease import LeaseGate
from queueflow.structs import TopicPartition

__all__ = ["LongPolls", "ParkedFetch", "PartitionQueue", "should_park"]

Response = protocol.ShareFetchResponse
#: ``answer(request, failure)``: the ``NOT_LEADER_OR_FOLLOWER`` answer to a request not served.
NotLeader = Callable[[protocol.ShareFetchRequest, "Exception | None"], Response]
#: ``apply(partition, items)``: serve a batch (see ``ShareLeader._apply_batch``).
ApplyBatch = Callable[[int, "list[ParkedFetch]"], Awaitable[None]]


@dataclass(slots=True, eq=False)
class ParkedFetch:
    """A direct request being answered, or parked until records arrive or ``until``."""

    request: protocol.ShareFetchRequest
    future: asyncio.Future[Response]
    #: The answer so far (None until the request was applied).
    response: Response | None
    durable: DurableSharePartition | None
    #: Monotonic seconds when the long poll ends (the request's ``max_wait_ms``).
    until: float
    #: The log end known before it last tried to acquire (None: unknown): records from
    #: there on may not have been seen by that try.
    seen_end: int | None = None


@dataclass(slots=True, eq=False)
class PartitionQueue:
    """The direct path's requests of one request partition."""

    pending: list[tuple[protocol.ShareFetchRequest, asyncio.Future[Response]]] = field(
        default_factory=list
    )
    parked: list[ParkedFetch] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set when state changed since the parked requests last tried to acquire.
    changed: bool = False
    task: asyncio.Future[None] | None = None
    watcher: asyncio.Future[None] | None = None

    def fail(self, answer: Callable[[protocol.ShareFetchRequest], Response]) -> None:
        """Answer every pending and parked request with ``answer(request)``."""
        for request, future in self.pending:
            if not future.done():
                future.set_result(answer(request))
        for parked in self.parked:
            if not parked.future.done():
                parked.future.set_result(answer(parked.request))
        self.pending, self.parked = [], []


def should_park(item: ParkedFetch, now_monotonic: float) -> bool:
    """True when ``item``'s answer waits for records (a long poll): it acquired nothing
    without error, wants records, carries no acknowledgements (their result never waits), its
    wait has not ended and its share-partition is loaded."""
    response = item.response
    assert response is not None
    return (
        not response.acquired
        and response.error == ErrorCode.NONE.value
        and item.request.max_records > 0
        and not item.request.acks
        and item.until > now_monotonic
        and item.durable is not None
    )


class LongPolls:
    """The direct-path queues of one leader's request partitions.

    Args:
        ctx: the server context (its clock; the log ends parked requests wait on).
        topic: the source topic.
        apply: serves a batch of one request partition.
        not_leader: the answer to requests that can't be served here.
    """

    def __init__(
        self,
        ctx: ServerContext,
        topic: str,
        apply: ApplyBatch,
        not_leader: NotLeader,
    ) -> None:
        self.ctx = ctx
        self.topic = topic
        self._apply = apply
        self._not_leader = not_leader
        #: Queued and parked requests acquire only while the membership lease holds.
        self.lease = LeaseGate(ctx)
        self.queues: dict[int, PartitionQueue] = {}
        self._log = get_logger("queueflow.server.leader", topic=topic)

    async def serve(self, request: protocol.ShareFetchRequest) -> Response:
        """Queue ``request`` for its partition's next batch and wait for its answer."""
        partition = request.partition
        queue = self.queues.get(partition)
        if queue is None or queue.task is None or queue.task.done():
            queue = self.queues[partition] = PartitionQueue()
            queue.task = asyncio.ensure_future(self._serve_partition(partition, queue))
        future: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        queue.pending.append((request, future))
        queue.wake.set()
        return await future

    def cancel(self, cancel: protocol.ShareFetchCancel) -> bool:
        """Answer the member's parked request ``cancel.request_id`` now, with nothing acquired;
        True if it was parked."""
        queue = self.queues.get(cancel.partition)
        if queue is None:
            return False
        for item in queue.parked:
            request = item.request
            if request.member_id == cancel.member_id and request.request_id == cancel.request_id:
                queue.parked.remove(item)
                if not item.future.done() and item.response is not None:
                    item.future.set_result(item.response)
                return True
        return False

    def fail(self, partition: int) -> None:
        """Refuse every waiting request of ``partition`` (``NOT_LEADER_OR_FOLLOWER``: its
        members re-route)."""
        queue = self.queues.get(partition)
        if queue is not None:
            queue.fail(lambda request: self._not_leader(request, None))

    def notify(self, partition: int) -> None:
        """Something changed in ``partition``: parked requests try again."""
        queue = self.queues.get(partition)
        if queue is not None and queue.parked:
            queue.changed = True
            queue.wake.set()

    async def _serve_partition(self, partition: int, queue: PartitionQueue) -> None:
        clock = self.ctx.clock
        while True:
            timeout = None
            if queue.parked:
                timeout = max(min(p.until for p in queue.parked) - clock.monotonic(), 0.0)
            if timeout is None or timeout > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(queue.wake.wait(), timeout)
            queue.wake.clear()
            try:
                await self._serve_batch(partition, queue)
            except Exception:  # never let one batch stop the partition's server
                self._log.exception("direct_batch_failed", partition=partition)

    async def _serve_batch(self, partition: int, queue: PartitionQueue) -> None:
        batch, queue.pending = queue.pending, []
        mono = self.ctx.clock.monotonic()
        queue.parked = [p for p in queue.parked if not p.future.done()]  # gone: don't acquire
        retry = queue.parked if queue.changed else [p for p in queue.parked if p.until <= mono]
        queue.parked = [p for p in queue.parked if p not in retry]
        queue.changed = False
        items = retry + [
            ParkedFetch(request, future, None, None, mono + request.max_wait_ms / 1000)
            for request, future in batch
        ]
        if not items:
            return
        seen_end = self.ctx.log_offsets.known_end(TopicPartition(self.topic, partition))
        for item in items:
            item.seen_end = seen_end
        try:
            self.lease.check("acquire", len(items))  # the successor may be assigned it by now
            await self._apply(partition, items)
        except Exception as exc:  # answered as refused: the members re-send elsewhere
            if not isinstance(exc, FencedStateEpochError):  # stepped down, lease: logged there
                self._log.exception("direct_batch_failed", partition=partition)
            for item in items:
                if not item.future.done():
                    item.future.set_result(self._not_leader(item.request, exc))
            return
        if queue.parked and any(request.acks for request, _ in batch):
            queue.changed = True  # releases may have made records available to parked requests
            queue.wake.set()
        for item in items:
            if should_park(item, self.ctx.clock.monotonic()):
                queue.parked.append(item)  # long poll: wait for records
                assert item.durable is not None
                self._watch(partition, item.durable)
            elif not item.future.done():
                assert item.response is not None
                item.future.set_result(item.response)

    def _watch(self, partition: int, durable: DurableSharePartition) -> None:
        """Wake the partition's parked requests when records arrive past the SPEO."""
        queue = self.queues.get(partition)
        if queue is None or (queue.watcher is not None and not queue.watcher.done()):
            return
        queue.watcher = asyncio.ensure_future(self._watch_log_end(partition, queue, durable))

    async def _watch_log_end(
        self, partition: int, queue: PartitionQueue, durable: DurableSharePartition
    ) -> None:
        tp = TopicPartition(self.topic, partition)
        clock = self.ctx.clock
        # Records below the log end a parked request's last try knew of, that it could not
        # acquire, wait for acknowledgements or expired locks (those notify); records from
        # there on are waited for (the end may have risen while the try was under way).
        while True:
            now = clock.monotonic()
            waiting = [p for p in queue.parked if p.until > now and not p.future.done()]
            if not waiting:
                return  # parked later: _watch starts a new watcher
            until = max(p.until for p in waiting)
            seen = [p.seen_end for p in waiting if p.seen_end is not None]
            end = min(seen) if seen else durable.engine.end_offset
            try:
                new_end = await self.ctx.log_offsets.wait_end_beyond(
                    tp, end, max(until - clock.monotonic(), 0.0)
                )
            except Exception as exc:  # the broker may be restarting: the waits still end
                self._log.warning("log_end_watch_failed", partition=partition, error=repr(exc))
                return
            if new_end > end:
                self.notify(partition)
                return
