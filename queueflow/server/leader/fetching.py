"""What a ShareFetch needs before its pure handler runs: its ticket checked, its group's
configs adopted, its share-partition loaded and, to acquire, the log end (KIP-932 "ShareFetch
API")."""

from __future__ import annotations

from dataclasses import replace

from queueflow.errors import CorruptStateError
from queueflow.protocol import messages as protocol
from queueflow.server.context import ServerContext
from queueflow.server.durable import DurableSharePartition
from queueflow.server.group_configs import LeaderGroupConfigs
from queueflow.server.leader import handlers
from queueflow.server.leader.ack_clock import AckClock
from queueflow.server.leader.cache import SharePartitionCache
from queueflow.server.leader.dead_letter_notes import DeadLetterNotes
from queueflow.server.leader.holes import HoleReaders
from queueflow.server.leader.key_index import KeyIndexes
from queueflow.server.leader.results import NOTHING, FetchResult, LeaderResult, LogEvent
from queueflow.server.tickets import TicketGate, TicketRefusal
from queueflow.structs import TopicPartition

__all__ = ["AcquireFrom", "ShareFetcher"]

#: ``(log end, None)`` to acquire below the log end, or ``(None, refusal)``.
AcquireFrom = tuple[int | None, TicketRefusal | None]


class ShareFetcher:
    """Prepares and applies the ShareFetch requests of one leader (no state writes: the
    caller writes, once per request or per batch).

    Args:
        ctx: the server context (log offsets).
        topic: the source topic.
        tickets: the leader's ticket gate.
        configs: the leader's group configs.
        cache: the leader's share-partitions.
    """

    def __init__(
        self,
        ctx: ServerContext,
        topic: str,
        tickets: TicketGate,
        configs: LeaderGroupConfigs,
        cache: SharePartitionCache,
        keys: KeyIndexes | None = None,
    ) -> None:
        self.ctx = ctx
        #: The key indexes of key-ordered share-partitions (``share.ordering=key``).
        self.keys = keys
        self.topic = topic
        self.tickets = tickets
        self.configs = configs
        self.cache = cache
        #: The hole readers (set by the leader; docs/architecture.md "Holes").
        self.holes: HoleReaders | None = None
        #: The lock clock of an exactly-once leader (set by its ack reader), else ``None``.
        self.lock_clock: AckClock | None = None
        #: The errors members sent with REJECTs and RELEASEs, for the dead-letter headers.
        self.dead_letter_notes = DeadLetterNotes()

    def expiry_ms(self, partition: int, now: int) -> int:
        """The time to expire locks of ``partition`` as of: ``now``, or on an exactly-once
        leader ``min(now, ack_safe_ms)`` (:mod:`~queueflow.server.leader.ack_clock`)."""
        clock = self.lock_clock
        return now if clock is None else clock.expiry_ms(partition, now)

    def check_ticket(
        self, request: protocol.ShareFetchRequest, partition: int, now: int, *, acquiring: bool
    ) -> tuple[TicketRefusal | None, LeaderResult]:
        """Check the request's assignment ticket (:class:`~queueflow.server.tickets.TicketGate`;
        ``acquiring``: also its epoch and assignment); once it passes, the group's configs of
        the ticket are enforced from now on (logged when they changed)."""
        refusal = self.tickets.check(
            request.group,
            request.member_id,
            request.ticket,
            now,
            topic=self.topic,
            partition=partition,
            acquiring=acquiring,
        )
        if refusal is not None:
            return refusal, NOTHING
        ticket = self.tickets.verified(request.ticket)
        config = None if ticket is None else self.configs.adopt(ticket)
        if ticket is None or config is None:
            return None, NOTHING
        for (group, _partition), durable in self.cache.live():
            if group == ticket.group:
                durable.engine.reconfigure(config)
        fields = {
            "group": ticket.group,
            "config_version": ticket.config_version,
            "configs": dict(ticket.configs),
        }
        return None, LeaderResult(logs=(LogEvent("info", "share_group_configs_applied", fields),))

    async def fetch(
        self, request: protocol.ShareFetchRequest, partition: int, now: int, acquire: bool
    ) -> FetchResult:
        """Apply a request's acknowledgements, then acquire (if ``acquire``), writing nothing
        yet (:func:`~queueflow.server.leader.handlers.share_fetch`).

        Before anything else the request's assignment ticket must prove a current member:
        otherwise the answer is ``UNKNOWN_MEMBER_ID`` for the fetch and its acknowledgements,
        and nothing is loaded or changed. A share-partition whose state is corrupt is answered
        with ``CORRUPT_STATE``.

        Raises:
            FencedStateEpochError: the partition was dropped while its share-partition was
                initialised.
            Exception: what the broker's offset lookups raise.
        """
        refusal, effects = self.check_ticket(request, partition, now, acquiring=False)
        if refusal is not None:
            return handlers.refused_fetch(request, self.topic, partition, refusal)
        try:
            durable = await self.cache.get(request.group, partition)
            if self.keys is not None:  # share.ordering=key: acquire by key
                self.keys.ensure(durable, self.configs.ordering(request.group))
        except CorruptStateError as exc:
            return handlers.unloadable_fetch(request, self.topic, partition, exc)
        acquire_from = None
        if acquire and request.max_records > 0 and now < request.deadline_ms:
            acquire_from, more = await self.acquire_from(request, durable, now)
            effects = effects + more
        fetched = handlers.share_fetch(
            durable,
            request,
            now,
            acquire_from=acquire_from,
            expire_ms=self.expiry_ms(partition, now),
            notes=self.dead_letter_notes,
        )
        if self.keys is not None:
            self.keys.poke(durable)
        self.note_acknowledgements(request, durable)
        self._mark_isolation(request, fetched.response)
        return replace(fetched, effects=effects + fetched.effects)

    def note_acknowledgements(
        self, request: protocol.ShareFetchRequest, durable: DurableSharePartition
    ) -> None:
        """After ``request``'s acknowledgements: a GAP starts ``durable``'s hole reader, which
        is woken on every request (:meth:`~queueflow.server.leader.holes.HoleReaders.note`)."""
        if self.holes is not None:
            self.holes.note(durable, request.acks, self.configs.read_committed(request.group))

    def _mark_isolation(
        self, request: protocol.ShareFetchRequest, response: protocol.ShareFetchResponse
    ) -> None:
        """Tell the member to read what it acquired with ``read_committed`` when the group
        reads committed records only (so aborted records come back as gaps it acknowledges as
        GAP; docs/concepts.md "read_committed")."""
        if response.acquired and self.configs.read_committed(request.group):
            response.read_committed = True

    async def acquire_from(
        self, request: protocol.ShareFetchRequest, durable: DurableSharePartition, now: int
    ) -> tuple[AcquireFrom, LeaderResult]:
        """What acquiring for ``request`` needs: ``(log end, None)``, or ``(None, refusal)``
        when its ticket is not of the member's latest epoch or does not assign it the
        share-partition (checked again for a parked request: the member may have been removed
        or its ticket expired meanwhile)."""
        refusal, effects = self.check_ticket(request, durable.partition, now, acquiring=True)
        if refusal is not None:
            return (None, refusal), effects
        if self.holes is not None:  # holes found under another isolation level are forgotten
            self.holes.check(durable, self.configs.read_committed(request.group))
        tp = TopicPartition(self.topic, durable.partition)
        log_end = await self._log_end(tp, request, durable.engine.end_offset)
        if self.configs.read_committed(request.group):
            log_end = min(log_end, await self._stable_end(tp, log_end))
        return (log_end, None), effects

    async def _log_end(
        self, tp: TopicPartition, request: protocol.ShareFetchRequest, speo: int
    ) -> int:
        """The log end to acquire below: exact whenever it matters. The known end serves while
        it leaves at least ``max_records`` past the SPEO (a backlog: no round trip); short of
        that the broker is asked (ListOffsets, shared by the requests of the partition waiting
        at that moment), except for a long poll that knows of nothing past the SPEO: it parks,
        and its wait reads the partition from the SPEO (``wait_end_beyond``), which finds the
        records already there at once; an idle fleet asks nothing."""
        offsets = self.ctx.log_offsets
        known = offsets.known_end(tp)
        if known is not None and known - speo >= max(request.max_records, 1):
            return known
        if known is not None and known <= speo and request.max_wait_ms:
            return known
        return await offsets.log_end(tp)

    async def _stable_end(self, tp: TopicPartition, end: int) -> int:
        """The last stable offset of ``tp`` (``share.isolation.level=read_committed``): records
        at or past it are in (or after) an open transaction and are not acquired yet. The
        broker is asked when the known one is behind the high watermark ``end`` (a transaction
        may have ended since; a parked request wakes when anything is written, a transaction's
        end marker too)."""
        offsets = self.ctx.log_offsets
        stable = offsets.known_stable_end(tp)
        if stable is None or stable < end:
            stable = await offsets.stable_end(tp)
        return stable

    async def reacquire(
        self,
        request: protocol.ShareFetchRequest,
        durable: DurableSharePartition,
        response: protocol.ShareFetchResponse,
        now: int,
    ) -> LeaderResult:
        """Try a parked request's acquisition again, into ``response``."""
        acquire_from, effects = await self.acquire_from(request, durable, now)
        effects = effects + handlers.acquire(durable, request, response, now, *acquire_from)
        self._mark_isolation(request, response)
        return effects
