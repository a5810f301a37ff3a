"""How a leader learns the keys of a key-ordered share-partition (``share.ordering=key``;
docs/architecture.md "Key-ordered sharing").

Members read record payloads themselves; a leader only knows offsets. For each share-partition
of a key-ordered group, the leader tails the source partition from the SPSO with a group-less
reader (:class:`~queueflow.server.context.KeySource`) and indexes each record's key hash into the
share-partition's :class:`~queueflow.engine.key_order.KeyOrder`. It reads at most
``share.partition.max.record.locks`` records past the SPSO (what may be in flight), and goes on
as the SPSO moves. A record whose key is not indexed yet is not acquired; when the index grows,
parked long polls of the partition are woken.

The parked keys are loaded from the state table (:func:`~queueflow.protocol.state_codec.
parked_keys_key`) when key ordering begins for a share-partition, so they survive a leader
failover.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from queueflow.engine.key_order import NULL_KEY_HASH, KeyOrder
from queueflow.logging import get_logger
from queueflow.protocol import messages as protocol
from queueflow.protocol.state_codec import decode_parked_keys, parked_keys_key
from queueflow.server.context import KeyTail, ServerContext
from queueflow.server.durable import DurableSharePartition
from queueflow.server.leader.key_actions import act_on_key
from queueflow.server.leader.results import LeaderResult
from queueflow.server.leader.tails import TailTasks
from queueflow.structs import TopicPartition

__all__ = ["KEY_READ_WAIT_MS", "KeyIndexes"]

#: How long one read of a source partition's keys waits for a record (ms).
KEY_READ_WAIT_MS = 500


@dataclass(slots=True, eq=False)
class _Tail:
    durable: DurableSharePartition
    order: KeyOrder
    #: Set when the SPSO may have moved (the reader waits for it when its window is full).
    moved: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    null_logged: bool = False


class KeyIndexes(TailTasks[_Tail]):
    """The key indexes of one leader's key-ordered share-partitions (one source topic).

    Args:
        ctx: the server context (its ``key_source`` reads the keys).
        topic: the source topic.
        notify: ``notify(partition)`` wakes the parked long polls of a request partition.
    """

    STOPPED_EVENT = "key_ordering_stopped"
    FAILED_EVENT = "key_reader_failed"

    def __init__(self, ctx: ServerContext, topic: str, notify: Callable[[int], None]) -> None:
        super().__init__(get_logger("queueflow.server.leader", topic=topic))
        self.ctx = ctx
        self.topic = topic
        self.notify = notify

    def ensure(self, durable: DurableSharePartition, ordering: str) -> None:
        """Make ``durable`` acquire by key when its group's ``share.ordering`` is ``key`` (and
        in offset order again when it is ``none``); wakes its key reader (its SPSO may have
        moved).

        Raises:
            CorruptStateError: the stored parked keys can't be read (the share-partition
                stays as it was).
        """
        key = (durable.group, durable.partition)
        tail = self._tails.get(key)
        if tail is not None and (tail.durable is not durable or ordering != "key"):
            self._stop(key, "key ordering ended" if ordering != "key" else "reloaded")
            tail = None
        if ordering != "key":
            if durable.engine.key_order is not None:
                durable.engine.order_by_key(None)
            return
        if tail is None:
            tail = self._start(durable)
        tail.moved.set()

    def act(
        self,
        message: protocol.ResetSharePartition,
        durable: DurableSharePartition | None,
        offset: int,
    ) -> LeaderResult:
        """An operator's release or skip of a parked key (:func:`~.key_actions.act_on_key`),
        with the share-partition's parked keys loaded first: just after a leader change no
        ShareFetch (whose ticket brings the group's ``share.ordering``) may have loaded them
        yet, so they are loaded whatever this leader knows of the group's configs (its next
        ShareFetch applies them).

        Raises:
            ShareGroupError: as :func:`~.key_actions.act_on_key`; ``CORRUPT_STATE`` for
                unreadable parked keys.
        """
        if durable is not None and durable.engine.key_order is None:
            self.ensure(durable, "key")
        return act_on_key(message, durable, partition=message.partition, offset=offset)

    def poke(self, durable: DurableSharePartition) -> None:
        """``durable``'s SPSO may have moved: its key reader may read further."""
        tail = self._tails.get((durable.group, durable.partition))
        if tail is not None:
            tail.moved.set()

    def _start(self, durable: DurableSharePartition) -> _Tail:
        where = durable.where
        raw = durable.table.get(parked_keys_key(durable.group, durable.partition))
        parked = [] if raw is None else decode_parked_keys(raw, where=where)
        order = durable.engine.key_order
        if order is None:
            order = KeyOrder(durable.engine.start_offset, parked)
            durable.engine.order_by_key(order)
        tail = _Tail(durable, order)
        self._tails[(durable.group, durable.partition)] = tail
        if self.ctx.key_source is None:
            self._log.error(
                "key_ordering_unavailable",
                group=durable.group,
                partition=durable.partition,
                detail="this worker has no key source: the share-partition acquires nothing",
            )
        else:
            tail.task = asyncio.get_running_loop().create_task(self._run(tail))
        self._log.info(
            "key_ordering_started",
            group=durable.group,
            partition=durable.partition,
            start_offset=order.indexed_end,
            parked_keys=len(parked),
        )
        return tail

    async def _run(self, tail: _Tail) -> None:
        """Index ``tail``'s source partition from the SPSO, at most the in-flight limit ahead,
        until cancelled."""
        source = self.ctx.key_source
        assert source is not None
        tp = TopicPartition(self.topic, tail.durable.partition)
        await self._follow(tp.partition, lambda: source.open(tp), lambda r: self._tail(tail, r))

    async def _tail(self, tail: _Tail, reader: KeyTail) -> None:
        read = reader.read
        engine, order = tail.durable.engine, tail.order
        while True:
            start = order.indexed_end
            room = engine.start_offset + engine.config.max_in_flight_records - start
            if room <= 0:  # the in-flight window is indexed: wait for the SPSO to move
                tail.moved.clear()
                await tail.moved.wait()
                continue
            records, following = await read(start, room, KEY_READ_WAIT_MS)
            if order.indexed_end != start or engine.key_order is not order:
                continue  # restarted (an SPSO reset) or replaced meanwhile
            order.index(records, following)
            if not tail.null_logged and any(k is None for _, k in records):
                tail.null_logged = True
                first = next(o for o, k in records if k is None)
                self._log.info(
                    "key_ordering_null_keys",
                    group=tail.durable.group,
                    partition=tail.durable.partition,
                    offset=first,
                    key_hash=f"{NULL_KEY_HASH:016x}",
                    detail="records with a null key are one key: handled one at a time",
                )
            if following > start:
                self.notify(tail.durable.partition)
