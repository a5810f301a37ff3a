"""How a leader learns the holes of a share-partition: the offsets that hold no record
(transaction markers, compaction; with ``share.isolation.level=read_committed`` aborted records
too), so that acquiring counts records, not offsets (docs/concepts.md "Acquisition counts
records"; docs/architecture.md "Holes").

A leader knows offsets only: members read the payloads and acknowledge an offset without a
record as GAP. Reading every source partition to find holes would double the broker's read
load on plain topics, which have none. So the reader is adaptive: a share-partition whose
member acknowledges a GAP gets a hole reader, which tails the source partition with the
group-less reader of key-ordered sharing (:class:`~queueflow.server.context.KeySource`, with
the group's isolation level) from the SPSO, at most ``share.partition.max.record.locks``
offsets ahead of it, and goes on as the SPSO moves. Each read's holes are applied to the
engine (:meth:`~queueflow.engine.partition.SharePartition.mark_holes`) under the request
partition's lock and written to the changelog like any state change. Key-ordered
share-partitions get none (their key index already reads the log; they hand out holes as
before).

The reader lives as long as the share-partition is served here: a new leader starts without
one, until a member acknowledges a GAP again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from queueflow.engine.key_order import consecutive
from queueflow.errors import FencedStateEpochError
from queueflow.logging import get_logger
from queueflow.protocol.messages import WireAck
from queueflow.server.context import KeyTail
from queueflow.server.durable import DurableSharePartition
from queueflow.server.leader.results import LeaderResult
from queueflow.server.leader.tails import RETRY_S, TailTasks
from queueflow.structs import AcknowledgeType, TopicPartition

if TYPE_CHECKING:
    from queueflow.server.leader.manager import ShareLeader

__all__ = ["HOLE_READ_WAIT_MS", "HoleReaders", "holes_between"]

#: How long one read of a source partition waits for a record (ms).
HOLE_READ_WAIT_MS = 500
_GAP = AcknowledgeType.GAP.value


def holes_between(start: int, end: int, offsets: Iterable[int]) -> list[tuple[int, int]]:
    """The inclusive ranges of ``start..end-1`` that hold none of ``offsets`` (ascending).

    >>> holes_between(10, 16, [11, 12, 14])
    [(10, 10), (13, 13), (15, 15)]
    """
    have = set(offsets)
    return list(consecutive(o for o in range(start, end) if o not in have))


@dataclass(slots=True, eq=False)
class _Tail:
    durable: DurableSharePartition
    read_committed: bool
    #: Set when the SPSO may have moved (the reader waits for it when its window is read).
    moved: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class HoleReaders(TailTasks[_Tail]):
    """The hole readers of one leader's share-partitions (one source topic).

    Args:
        leader: the share-partition leaders of the source topic (its lock, cache, applier).
    """

    STOPPED_EVENT = "hole_reader_stopped"
    FAILED_EVENT = "hole_reader_failed"

    def __init__(self, leader: ShareLeader) -> None:
        super().__init__(get_logger("queueflow.server.leader", topic=leader.topic))
        self.leader = leader

    def reading(self, group: str, partition: int) -> bool:
        """True while a hole reader runs for ``(group, partition)``."""
        return (group, partition) in self._tails

    def note(
        self, durable: DurableSharePartition, acks: list[WireAck], read_committed: bool
    ) -> None:
        """After ``durable``'s acknowledgements ``acks`` (wire ranges) were applied: start its
        hole reader when one of them is a GAP (not for a key-ordered share-partition, nor
        without a :class:`~queueflow.server.context.KeySource`); restart it when the group's
        isolation level changed; wake it (the SPSO may have moved). O(1) per request while
        nothing was ever GAPped, apart from scanning ``acks``' types."""
        tail = self.check(durable, read_committed)
        if tail is None:
            if (
                durable.engine.key_order is not None
                or self.leader.ctx.key_source is None
                or not any(_GAP in types for _first, _last, types in acks)
            ):
                return
            tail = self._start(durable, read_committed)
        tail.moved.set()

    def check(self, durable: DurableSharePartition, read_committed: bool) -> _Tail | None:
        """``durable``'s hole reader, or ``None``. Before acquiring: a reader of another
        isolation level than the group's now (an aborted record is a hole under
        ``read_committed`` only), of a reloaded share-partition, or of one that acquires by key
        is stopped, and the holes it had found ahead of the SPEO are forgotten."""
        key = (durable.group, durable.partition)
        tail = self._tails.get(key)
        if tail is not None and (
            tail.durable is not durable
            or tail.read_committed != read_committed
            or durable.engine.key_order is not None
        ):
            self._stop(key, "isolation level changed" if tail.durable is durable else "reloaded")
            durable.engine.forget_holes()
            tail = None
        return tail

    def _start(self, durable: DurableSharePartition, read_committed: bool) -> _Tail:
        tail = _Tail(durable, read_committed)
        self._tails[(durable.group, durable.partition)] = tail
        tail.task = asyncio.get_running_loop().create_task(self._run(tail))
        self._log.info(
            "hole_reader_started",
            group=durable.group,
            partition=durable.partition,
            start_offset=durable.engine.start_offset,
            isolation_level="read_committed" if read_committed else "read_uncommitted",
        )
        return tail

    async def _run(self, tail: _Tail) -> None:
        """Read ``tail``'s source partition for holes until its share-partition is dropped or
        the task is cancelled."""
        source = self.leader.ctx.key_source
        assert source is not None
        tp = TopicPartition(self.leader.topic, tail.durable.partition)
        await self._follow(
            tp.partition,
            lambda: source.open(tp, read_committed=tail.read_committed),
            lambda reader: self._tail(tail, reader),
        )

    async def _tail(self, tail: _Tail, reader: KeyTail) -> None:
        durable = tail.durable
        engine, key = durable.engine, (durable.group, durable.partition)
        while True:
            if self.leader.cache.get_live(key) is not durable:  # dropped (revoked, stepped down)
                if self._tails.get(key) is tail:
                    del self._tails[key]
                    self._log.info(
                        "hole_reader_stopped", group=key[0], partition=key[1], reason="dropped"
                    )
                return
            start = engine.holes_read_to
            room = engine.start_offset + engine.config.max_in_flight_records - start
            if room <= 0:  # the in-flight window is read: wait for the SPSO to move
                tail.moved.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(tail.moved.wait(), RETRY_S)
                continue
            records, following = await reader.read(start, room, HOLE_READ_WAIT_MS)
            if following > start:
                await self._apply(tail, start, following, [o for o, _key in records])

    async def _apply(self, tail: _Tail, start: int, end: int, offsets: list[int]) -> None:
        """Mark the holes of ``start..end-1`` (the log holds ``offsets`` there) under the
        request partition's lock and write the change."""
        leader, durable = self.leader, tail.durable
        holes = holes_between(start, end, offsets)
        partition = durable.partition
        async with leader._lock(partition):
            key = (durable.group, partition)
            if self._tails.get(key) is not tail or leader.cache.get_live(key) is not durable:
                return  # stopped or moved away meanwhile
            try:
                leader.fencing.check(partition)
            except FencedStateEpochError:
                return  # stepped down: the share-partition is dropped (and this reader)
            engine = durable.engine
            # Read up to ``end`` only counts when the read began where the knowledge ended (a
            # reset may have moved the SPSO back meanwhile).
            read_to = end if engine.holes_read_to >= start else None
            archived = engine.mark_holes(holes, read_to=read_to)
            if archived:
                with leader.ctx.state_scope(leader.request_topic, partition):
                    await leader.applier.apply(
                        LeaderResult(writes=(durable,), changed=True), partition
                    )
        if archived:
            leader.long_polls.notify(partition)  # the SPSO may have moved: more may be acquired
