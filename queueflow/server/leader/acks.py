"""Applying the transactional acknowledgements of an exactly-once leader (docs/architecture.md
"Exactly-once: transactional acknowledgements").

With ``queueflow.processing.guarantee=exactly_once`` a member produces, inside the Kafka
transaction of its results, one ShareAcknowledge per share-partition to partition ``p`` of the
ack topic ``<app>-share-ack-<topic>``: exactly the bytes of a standalone ShareAcknowledge on the
request topic, sealed for ``topic_dest(ack topic, p)``. The leader's read_committed reader
(:mod:`~queueflow.server.leader.acks_reader`) hands each committed message here, in log order;
it is applied like a ShareAcknowledge of the request log (no answer is sent), under the same
per-request-partition lock as the request and direct paths, and the offset of the last message
applied is written to the state table after its state change (``A/<partition>``), so a new
leader applies each committed acknowledgement once.

Two checks differ from the request path, because a committed acknowledgement's results are
already published and refusing it would deliver the records again: a member removed from the
group (session expiry, leave) may still acknowledge the records it holds (on an exactly-once app
a removal only ends the member's locks: :class:`~queueflow.engine.partition.SharePartition`),
and so may a member fenced for release abuse. Everything else is checked as on the request
path: the envelope's signature and destination, the ticket's MAC and member, and the engine's
rule that only the member holding a record's lock can acknowledge it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import msgspec

from queueflow.engine.partition import AcknowledgementBatch
from queueflow.errors import CorruptStateError, ErrorCode, ShareGroupError
from queueflow.logging import get_logger
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.envelope import topic_dest
from queueflow.protocol.messages import WireAck
from queueflow.protocol.roles import refusal_labels
from queueflow.protocol.state_codec import ack_position_key
from queueflow.server.junk import JunkGate
from queueflow.server.leader import handlers
from queueflow.server.leader.positions import RequestPositions
from queueflow.server.leader.results import NOTHING, LeaderResult, LogEvent
from queueflow.settings import StateDurability

if TYPE_CHECKING:
    from queueflow.server.leader.manager import ShareLeader

__all__ = ["AckApplier", "check_ack", "without_offsets"]

#: A ticket refusal a committed acknowledgement is applied despite (see the module docstring).
_REMOVED = "removed"


def check_ack(message: protocol.Message, topic: str, partition: int) -> str | None:
    """Why ``message``, read from partition ``partition`` of ``topic``'s ack topic, is not a
    transactional acknowledgement (``None``: it is one): it must be a ShareFetch of that
    share-partition that acquires nothing and carries acknowledgements."""
    if not isinstance(message, protocol.ShareFetchRequest):
        return f"a {getattr(message, 'kind', '?')!r} message, not a ShareAcknowledge"
    if message.topic != topic or message.partition != partition:
        return (
            f"a ShareAcknowledge of {message.topic}[{message.partition}] on ack partition "
            f"{partition} of {topic}"
        )
    if message.max_records != 0 or not message.acks:
        return "a ShareFetch that acquires, or acknowledges nothing"
    return None


def without_offsets(acks: list[WireAck], drop: list[tuple[int, int]]) -> list[WireAck]:
    """``acks`` (wire ranges ``(first, last, types)``, one type or one per offset) without the
    offsets in the inclusive ranges ``drop``; the rest refolded into ranges of one type. Pure.

    >>> without_offsets([(5, 8, (1,))], [(6, 6)])
    [(5, 5, (1,)), (7, 8, (1,))]
    """
    kept: list[tuple[int, int]] = []
    for first, last, types in acks:
        for i, offset in enumerate(range(first, last + 1)):
            if not any(lo <= offset <= hi for lo, hi in drop):
                kept.append((offset, types[0] if len(types) == 1 else types[i]))
    out: list[WireAck] = []
    for offset, kind in sorted(kept):
        if out and out[-1][1] == offset - 1 and out[-1][2] == (kind,):
            out[-1] = (out[-1][0], offset, (kind,))
        else:
            out.append((offset, offset, (kind,)))
    return out


class AckApplier:
    """Applies the committed acknowledgements of one leader's ack topic.

    Args:
        leader: the share-partition leaders of one source topic.
    """

    def __init__(self, leader: ShareLeader) -> None:
        self.leader = leader
        self.ack_topic = topics.ack_topic(leader.ctx.app_id, leader.topic)
        self.positions = RequestPositions(
            leader.table, leader.topic, self.ack_topic, key=ack_position_key
        )
        self._log = get_logger("queueflow.server.leader", topic=leader.topic)
        #: Junk is dropped by its first bytes, as on the request topic.
        self.junk = JunkGate(leader.ctx, leader.auth, "leader", self.ack_topic, self._log)
        self._applied = leader.ctx.metrics.transactional_acks

    async def apply(self, partition: int, offset: int, value: bytes | None) -> None:
        """Apply the message at ``offset`` of ack partition ``partition`` (committed, in log
        order) unless it was applied before; its position is written after its state change.

        Never raises for a bad message (logged, rate-limited, and skipped).

        Raises:
            FencedStateEpochError: this worker no longer leads ``partition``; nothing written.
            Exception: what a state write or flush raises.
        """
        leader = self.leader
        if not self.positions.admit(partition, offset):
            return  # applied before, here or by the previous leader
        result, applied = NOTHING, False
        message = self._open(partition, value)
        async with leader._lock(partition):
            leader.fencing.check(partition)
            with leader.ctx.state_scope(leader.request_topic, partition):
                if isinstance(message, protocol.ShareFetchRequest):
                    result, applied = await self._acknowledge(message, partition)
                elif message is not None:
                    result = message
                await leader.applier.apply(replace(result, flush=False), partition)
                self.positions.write(partition, offset)
        settings = leader.ctx.settings
        if result.flush and settings.state_durability is StateDurability.ACKED:
            await leader.ctx.flush_state()
        if applied:  # counted once durable (with durability acked)
            self._applied.labels(leader.topic).inc()
        if result.changed:
            leader.long_polls.notify(partition)

    def _open(
        self, partition: int, value: bytes | None
    ) -> protocol.ShareFetchRequest | LeaderResult | None:
        """The acknowledgement in ``value``; or what refusing it makes happen; ``None`` for
        junk dropped by its first bytes."""
        leader = self.leader
        if value is None or self.junk.is_junk(partition, value):
            return None
        try:
            message = protocol.decode(
                leader.auth.open(value, topic_dest(self.ack_topic, partition))
            )
            leader.auth.check_sender(message, leader.tickets.bound_key)
        except ShareGroupError as exc:
            leader.ctx.auth_health.refused(value, getattr(exc, "reason", ""))
            return self._refused(partition, refusal_labels(exc)[0], str(exc))
        leader.ctx.auth_health.verified(leader.auth.last_sender)
        problem = check_ack(message, leader.topic, partition)
        if problem is not None:
            return self._refused(partition, "not_an_acknowledgement", problem)
        assert isinstance(message, protocol.ShareFetchRequest)
        return message

    def _refused(self, partition: int, reason: str, error: str) -> LeaderResult:
        fields = {"partition": partition, "reason": reason, "error": error}
        event = LogEvent("error", "undecodable_transactional_ack", fields, limiter="skipped")
        return LeaderResult(logs=(event,))

    async def _acknowledge(
        self, request: protocol.ShareFetchRequest, partition: int
    ) -> tuple[LeaderResult, bool]:
        """Apply ``request``'s acknowledgements (no answer); the share-partition's change is
        written by the caller. Returns what to perform and whether they were applied."""
        leader = self.leader
        now = leader.ctx.clock.now_ms()
        fetcher = leader.fetcher
        refusal, effects = fetcher.check_ticket(request, partition, now, acquiring=False)
        if refusal is not None and refusal.reason != _REMOVED:
            refused = handlers.refused_fetch(request, leader.topic, partition, refusal)
            lost = self._lost(request, partition, refusal.message)
            return effects + refused.effects + lost, False
        try:
            durable = await leader.cache.existing(request.group, partition)
        except CorruptStateError as exc:
            return effects + self._lost(request, partition, str(exc)), False
        if durable is None:
            lost = self._lost(request, partition, "the share-partition has no state")
            return effects + lost, False
        expire_ms = fetcher.expiry_ms(partition, now)
        # A committed transaction's results are published: apply every acknowledgement that
        # still can be, not all or nothing as a request's (the stale ones are logged).
        stale = durable.engine.stale_acknowledgements(
            request.member_id,
            [AcknowledgementBatch(first, last, ()) for first, last, _ in request.acks],
        )
        if stale:
            effects = effects + self._lost(request, partition, f"stale offsets {stale}")
            request = msgspec.structs.replace(request, acks=without_offsets(request.acks, stale))
            if not request.acks:
                return effects, False
        fetched = handlers.share_fetch(
            durable,
            request,
            now,
            acquire_from=None,
            expire_ms=expire_ms,
            notes=fetcher.dead_letter_notes,
        )
        effects = effects + fetched.effects
        fetcher.note_acknowledgements(request, durable)  # a GAP starts its hole reader
        ok = fetched.response.ack_error == ErrorCode.NONE.value
        if not ok:
            effects = effects + self._lost(request, partition, fetched.response.ack_error_message)
        return effects + LeaderResult(writes=(durable,), changed=True, flush=True), ok

    def _lost(
        self, request: protocol.ShareFetchRequest, partition: int, error: str
    ) -> LeaderResult:
        """A committed acknowledgement that could not be applied: its records are delivered
        again although its results were published (logged as an error)."""
        fields = {
            "group": request.group,
            "partition": partition,
            "member_id": request.member_id,
            "acknowledgements": len(request.acks),
            "error": error,
        }
        return LeaderResult(logs=(LogEvent("error", "transactional_ack_refused", fields),))
