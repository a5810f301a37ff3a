"""The share-partition leaders of one source topic: request routing and the one place their
results are performed (Kafka's ``SharePartitionManager``).

The worker that owns partition ``p`` of the request topic ``<app>-share-fetch-<topic>`` (which is
co-partitioned with ``<topic>`` and with the state table's changelog) leads every share-partition
``(group, <topic>, p)``. Leadership therefore moves with the host's rebalances, the state is local
to the leader (RocksDB), and every state change happens while handling a record of request
partition ``p``, which is what Faust tables require.

Per request, in order (KIP-932 "ShareFetch API"): expire elapsed locks, apply the piggy-backed
acknowledgements atomically, acquire up to ``max_records`` records, write the state change as one
delta, answer on the reply topic. :class:`ShareLeader` gathers what a request needs from the
broker and the state table (:mod:`~queueflow.server.leader.cache`), a pure handler
(:mod:`~queueflow.server.leader.handlers`, :mod:`~queueflow.server.leader.resets`,
:mod:`~queueflow.server.leader.fencing`) decides, and :meth:`ShareLeader._apply` performs the
result. Direct-path requests and long polls go through :mod:`~queueflow.server.leader.parking`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import replace

import structlog

from queueflow.engine.fencing import LeaderFencing
from queueflow.engine.reserved import DEAD_LETTER_OWNER
from queueflow.errors import ErrorCode, FencedStateEpochError, ShareGroupError
from queueflow.logging import get_logger
from queueflow.metrics import SharePartitionSample
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.auth import ticket_key
from queueflow.protocol.envelope import topic_dest
from queueflow.protocol.roles import refusal_labels
from queueflow.server.context import ServerContext
from queueflow.server.durable import DurableSharePartition, StateTable
from queueflow.server.group_configs import LeaderGroupConfigs
from queueflow.server.junk import JunkGate
from queueflow.server.leader import fencing, handlers, reports, resets
from queueflow.server.leader.applier import ResultApplier
from queueflow.server.leader.cache import SharePartitionCache, initial_offset
from queueflow.server.leader.fetching import ShareFetcher
from queueflow.server.leader.holes import HoleReaders
from queueflow.server.leader.key_index import KeyIndexes
from queueflow.server.leader.parking import LongPolls, ParkedFetch
from queueflow.server.leader.positions import RequestPositions
from queueflow.server.leader.results import NOTHING, FetchResult, LeaderResult, LogEvent
from queueflow.server.tickets import TicketGate
from queueflow.server.transport import (
    control_auth,
    monotonic_ms,
    send_due_fences,
)
from queueflow.settings import StateDurability, TicketPolicy
from queueflow.structs import TopicPartition

__all__ = ["MAX_REPLAYED_REQUESTS", "ShareLeader"]

log = structlog.get_logger("queueflow.server.leader")

#: The most requests a new leader reads back that its host skipped (see
#: ``ShareLeader._replay_skipped``); older ones are long answered or timed out.
MAX_REPLAYED_REQUESTS = 10_000


class ShareLeader:
    """The share-partition leaders of one source topic on this worker (KIP-932
    "Share-partition leader"): every share group's share-partitions of the request partitions
    this worker owns.

    Requests arrive through :meth:`handle`, one request partition at a time and in log order,
    from the host's stream of the request topic ``<app>-share-fetch-<topic>``, and through
    :meth:`serve` from the direct endpoint.

    Args:
        ctx: the server context.
        topic: the source topic name.
        table: the share-partition state table of ``topic`` (co-partitioned with it).
    """

    def __init__(self, ctx: ServerContext, topic: str, table: StateTable) -> None:
        self.ctx = ctx
        self.topic = topic
        self.table = table
        self.request_topic = topics.request_topic(ctx.app_id, topic)
        #: Each group's configs (lock duration, delivery count limit, in-flight limit,
        #: share.auto.offset.reset), from the tickets of its requests.
        self.group_configs = LeaderGroupConfigs(ctx.settings, ctx.group_configs)
        self.auth = control_auth(ctx, "leader")
        #: Junk is dropped by its first bytes before any lock, decode or await.
        self.junk = JunkGate(ctx, self.auth, "leader", self.request_topic, log)
        s = ctx.settings
        #: Membership, member epoch and assignment of each request, from its assignment
        #: ticket (KIP-932 checks them on every ShareFetch; see queueflow.server.tickets).
        self.tickets = TicketGate(
            ticket_key(s.control_auth_mode, s.auth_secret, ctx.app_id),
            required=s.auth_tickets is TicketPolicy.REQUIRED,
            coordinator_forget_ms=s.session_timeout_ms,
        )
        self.fencing = LeaderFencing(ctx.stall_limit_ms)
        self.cache = SharePartitionCache(
            table,
            topic,
            self.group_configs,
            s.snapshot_update_records_per_snapshot,
            self._epoch,
            lambda group, p: initial_offset(ctx, self.group_configs, topic, group, p),
        )
        self.positions = RequestPositions(table, topic, self.request_topic)
        self.keys = KeyIndexes(ctx, topic, lambda p: self.long_polls.notify(p))  # share.ordering
        self.fetcher = ShareFetcher(ctx, topic, self.tickets, self.group_configs, self.cache)
        self.fetcher.keys, self.fetcher.holes = self.keys, HoleReaders(self)
        self.applier = ResultApplier(
            ctx, topic, self.cache, self.positions, self.auth, self.tickets, self.step_down
        )
        #: Rate limiter of the log of undecodable requests.
        self.skipped = self.applier.skipped
        # The direct path: one lock per request partition shared with the stream path.
        self._locks: dict[int, asyncio.Lock] = {}
        self.long_polls = LongPolls(
            ctx, topic, lambda p, items: self._apply_batch(p, items), self._not_leader
        )
        self._log = get_logger("queueflow.server.leader", topic=topic)
        ctx.metrics.add_partition_source(self.samples)

    @property
    def partitions(self) -> Mapping[tuple[str, int], DurableSharePartition]:
        """The share-partitions served now (``LIVE``), by ``(group, partition)``; a copy."""
        return dict(self.cache.live())

    # -- leadership ------------------------------------------------------------------------
    def assign(self, partitions: set[int], epoch: int) -> None:
        """Lead ``partitions`` under leader epoch ``epoch`` (the Faust consumer generation);
        the stall guard announces it once Faust has recovered the tables."""
        self.fencing.assign(partitions, epoch)
        self.cache.forget_retained(partitions, epoch)  # led elsewhere now: reload if it comes back
        self._log.info("leader_assigned", partitions=sorted(partitions), leader_epoch=epoch)

    async def send_fences(self) -> None:
        """Append this worker's fence to the partitions it leads but isn't live on yet, once
        Faust has finished rebalancing (see :mod:`queueflow.engine.fencing`)."""
        sent = await send_due_fences(self.ctx, self.fencing, self.auth, self.request_topic)
        for p, epoch in sent:
            self._log.info("leader_fence_sent", partition=p, leader_epoch=epoch)

    def revoke(self, partitions: set[int], lease_held: bool = True) -> None:
        """Forget the share-partitions of revoked partitions (kept in memory only if the lease
        held until the rebalance began); a request still running for one can't write state."""
        self.fencing.revoke(partitions)
        self._drop(partitions, "its partition was revoked by a Faust rebalance", lease_held)
        for p in partitions:  # re-read from the table if it comes back: others may apply more
            self.positions.forget(p)

    def _drop(self, partitions: set[int], reason: str, resumable: bool) -> None:
        for p in partitions:  # waiting direct requests: refused, their members re-route
            self.long_polls.fail(p)
        self.keys.stop(partitions)
        self.cache.drop(partitions, reason, resumable)

    def step_down(self, partitions: list[int], reason: str) -> None:
        """Stop serving ``partitions``: fence their share-partitions so any later write is
        refused with ``FENCED_STATE_EPOCH``, and log why."""
        if not partitions:
            return
        self._drop(set(partitions), reason, resumable=False)  # a successor may have written
        self.ctx.metrics.leader_step_downs.labels(self.topic).inc(len(partitions))
        self._log.warning(
            "leader_stepped_down",
            partitions=sorted(partitions),
            reason=reason,
            code=ErrorCode.FENCED_STATE_EPOCH.value,
        )

    async def watch_stalls(self, now_monotonic_ms: int) -> None:
        """:meth:`check_stalls`, then send the own fences that are due."""
        self.check_stalls(now_monotonic_ms)
        await self.send_fences()

    def check_stalls(self, now_monotonic_ms: int) -> None:
        """The stall guard (called every 100 ms, and never behind I/O: a send blocked across
        a freeze must not delay it): step down after a stall longer than the Faust session
        timeout; take the partitions back if the membership survived it."""
        self._step_down_if_stalled(now_monotonic_ms)
        runtime = self.ctx.runtime
        resumed = self.fencing.resume_after_stall(
            now_monotonic_ms, runtime.generation, runtime.rebalancing
        )
        for p in resumed:
            epoch = self.fencing.partitions[p].epoch
            self._log.info("leader_resumed_after_stall", partition=p, leader_epoch=epoch)

    def _step_down_if_stalled(self, now_monotonic_ms: int) -> None:
        stalled = self.fencing.alive(now_monotonic_ms)
        if stalled:
            self.step_down(stalled, self.fencing.partitions[stalled[0]].fenced or "stalled")

    def _epoch(self, partition: int) -> int:
        lead = self.fencing.partitions.get(partition)
        return lead.epoch if lead is not None else -1

    # -- reports ---------------------------------------------------------------------------
    def lag_report(self, partitions: Iterable[int]) -> list[tuple[str, int, int]]:
        """``(group, partition, lag)`` of the loaded share-partitions of ``partitions``, sorted
        (KIP-1226 lag; see :func:`~queueflow.server.leader.reports.lag_report`). For the
        ``lag`` assignor, sent with the leader's announcements."""
        return reports.lag_report(self.cache.live(), self.topic, self.ctx.log_offsets, partitions)

    def samples(self) -> list[SharePartitionSample]:
        """The state of every share-partition this worker serves now, for the share-partition
        gauges (:meth:`queueflow.metrics.Metrics.add_partition_source`)."""
        return reports.samples(self.cache.live(), self.topic, self.ctx.log_offsets)

    async def refresh_log_ends(self) -> None:
        """Ask the broker for the high watermark of every partition this worker serves a
        share-partition of (before a scrape). Raises what the broker call raises."""
        partitions = sorted({p for (_group, p), _durable in self.cache.live()})
        await asyncio.gather(
            *(self.ctx.log_offsets.log_end(TopicPartition(self.topic, p)) for p in partitions)
        )

    def has_acquired(self, partition: int) -> bool:
        """True if a share-partition of request partition ``partition`` has Acquired records
        (whose locks the ticker must expire)."""
        return any(_has_locks(d) for _key, d in self.cache.live(partition))

    # -- the request log -------------------------------------------------------------------
    async def handle(self, partition: int, offset: int, value: bytes) -> None:
        """Handle one record of request partition ``partition`` at ``offset`` (in log order).

        Never raises for a bad or failed request: it is logged and skipped, so one bad request
        can't stop the leader.
        """
        if not self.positions.known(partition):
            await self._replay_skipped(partition, offset)
        if not self.junk.is_junk(partition, value):
            await self._handle_safely(partition, offset, value)

    async def _handle_safely(
        self, partition: int, offset: int, value: bytes, replayed: bool = False
    ) -> None:
        try:
            await self._handle(partition, offset, value, replayed)
        except FencedStateEpochError as exc:  # stepped down while handling it
            self._log.warning(
                "stale_write_refused", partition=partition, error=str(exc), code=exc.code.value
            )
        except Exception:  # never let one bad request stop the leader
            self._log.exception("leader_request_failed", partition=partition)

    async def _replay_skipped(self, partition: int, offset: int) -> None:
        """Before the first request the host delivers on ``partition`` (at ``offset``), handle
        the requests after the last one a leader applied (its persisted position) that the host
        skipped: Faust resumes from its committed offset, which a rebalance can leave past
        requests read but never applied; their acknowledgements would be lost and their members
        would wait out the request timeout. At most :data:`MAX_REPLAYED_REQUESTS`; never fails
        the request at ``offset``."""
        applied = self.positions.load(partition)
        request_log = self.ctx.request_log
        if request_log is None or applied < 0 or offset <= applied + 1:
            return
        start = max(applied + 1, offset - MAX_REPLAYED_REQUESTS)
        try:
            records = await request_log.read(self.request_topic, partition, start, offset)
        except Exception as exc:  # the broker may be restarting: carry on without them
            self._log.warning(
                "skipped_requests_unread", partition=partition, first=start, error=repr(exc)
            )
            return
        for skipped, value in records:
            if not self.junk.is_junk(partition, value):
                await self._handle_safely(partition, skipped, value, replayed=True)
        self._log.info(
            "skipped_requests_replayed",
            partition=partition,
            first=start,
            last=offset - 1,
            requests=len(records),
        )

    async def _handle(
        self, partition: int, offset: int, value: bytes, replayed: bool = False
    ) -> None:
        if not self.positions.admit(partition, offset):
            return  # applied before, here or by the previous leader (Faust re-delivers)
        async with self._lock(partition):  # never interleaved with the direct path's batches
            changed = await self._handle_locked(partition, offset, value, replayed)
        if changed:
            self.long_polls.notify(partition)  # records may be available to parked requests

    def _lock(self, partition: int) -> asyncio.Lock:
        lock = self._locks.get(partition)
        if lock is None:
            lock = self._locks[partition] = asyncio.Lock()
        return lock

    async def _handle_locked(
        self, partition: int, offset: int, value: bytes, replayed: bool = False
    ) -> bool:
        """Handle the request-log record at ``offset`` and perform its result; True if it
        changed share-partition state. With ``queueflow.leader.state.durability=acked`` the
        answer leaves once the broker acknowledged the state change (so no delivery is
        answered that a new leader would not know of). A ``replayed`` request is answered only
        if its member still waits (before its ``deadline_ms``)."""
        try:
            dest = topic_dest(self.request_topic, partition)
            message = protocol.decode(self.auth.open(value, dest))
            self.auth.check_sender(message, self.tickets.bound_key)
        except ShareGroupError as exc:
            self.ctx.auth_health.refused(value, getattr(exc, "reason", ""))
            reason = refusal_labels(exc)[0]
            fields = {"partition": partition, "reason": reason, "error": str(exc)}
            undecodable = LogEvent("error", "undecodable_request", fields, limiter="skipped")
            await self._apply(LeaderResult(logs=(undecodable,)), partition)
            return False
        self.ctx.auth_health.verified(self.auth.last_sender)
        # Captured before any await (``last`` is this leader's, shared by its partitions): the
        # key this request was encrypted with, so that a refusal of an invalid ticket (which
        # binds no key) still reaches its member, readable by it alone.
        sender_key = b"" if self.auth.last is None else self.auth.last.member_pub
        result = await self._route(message, partition, offset, replayed)
        try:
            await self._apply(result, partition, sender_key)
        except ShareGroupError as exc:
            if not isinstance(message, protocol.ResetSharePartition):
                raise
            # The reset's state write was refused (fenced, an invalid offset): nothing changed.
            await self._apply(resets.refused_reset(message, partition, exc), partition)
            return False
        return result.changed

    async def _route(
        self, message: protocol.Message, partition: int, offset: int, replayed: bool
    ) -> LeaderResult:
        """Gather what ``message`` needs (its share-partition, the log end) and hand it to its
        pure handler; returns the handler's result."""
        now = self.ctx.clock.now_ms()
        if not isinstance(message, protocol.Fence) and not fencing.leads(self.fencing, partition):
            return NOTHING  # stepped down: the partition's new leader answers
        match message:
            case protocol.Fence(leader_epoch=epoch):
                return fencing.on_fence(self.fencing, partition, epoch)
            case protocol.Tick():
                held = [d for _key, d in self.cache.live(partition)]
                return handlers.tick(held, self.fetcher.expiry_ms(partition, now))
            case protocol.ReleaseMember():
                return await self._release(message, partition, offset, now)
            case protocol.ResetSharePartition():
                return await self._reset(message, partition, offset, now)
            case protocol.ShareFetchRequest():
                # A request before this worker's own fence belongs to the previous leader,
                # which may have answered it already: apply its acknowledgements (atomic, so
                # a repeat is refused harmlessly) but acquire nothing, or the records would
                # be locked for a member not waiting for them.
                live = self.fencing.is_live(partition)
                fetched = await self._share_fetch(message, partition, now, acquire=live)
                return handlers.answer_from_log(fetched, message, offset, now, replayed=replayed)
            case _:
                return NOTHING

    async def _release(
        self, message: protocol.ReleaseMember, partition: int, offset: int, now: int
    ) -> LeaderResult:
        epochs = self.tickets.coordinator_epochs
        stale = fencing.stale_coordinator(epochs, message, partition, now)
        if stale is not None:
            return stale
        # Its tickets issued so far are refused from now on: nothing is acquired for it after
        # this release (the records of a removed member are released once).
        self.tickets.remove(message.group, message.member_id, partition, message.member_epoch)
        # A share-partition without state has nothing to release: don't initialise it here
        # (its group's configs, share.auto.offset.reset included, come with a ticket).
        holder = await self.cache.existing(message.group, partition)
        return handlers.release_member(message, holder, now, offset)

    async def _reset(
        self, message: protocol.ResetSharePartition, partition: int, offset: int, now: int
    ) -> LeaderResult:
        epochs = self.tickets.coordinator_epochs
        stale = fencing.stale_coordinator(epochs, message, partition, now)
        if stale is not None:
            return stale
        error = resets.check_reset(
            message,
            topic=self.topic,
            request_topic=self.request_topic,
            partition=partition,
            now_ms=now,
        )
        try:
            if error is None:
                durable = await self.cache.existing(message.group, partition)
                if message.key_action:  # a parked key released or skipped (share.ordering=key)
                    return self.keys.act(message, durable, offset)
                return resets.reset(message, durable, partition=partition, offset=offset)
        except ShareGroupError as exc:
            error = exc
        return resets.refused_reset(message, partition, error)

    # -- ShareFetch ------------------------------------------------------------------------
    async def _share_fetch(
        self, request: protocol.ShareFetchRequest, partition: int, now: int, acquire: bool = True
    ) -> FetchResult:
        """Apply a request's acknowledgements, then acquire (if ``acquire``), writing nothing
        yet (:meth:`~queueflow.server.leader.fetching.ShareFetcher.fetch`)."""
        return await self.fetcher.fetch(request, partition, now, acquire)

    # -- the direct path -------------------------------------------------------------------
    async def serve(self, request: protocol.ShareFetchRequest) -> protocol.ShareFetchResponse:
        """Answer a ShareFetch that came over the direct path (:mod:`queueflow.server.endpoint`;
        batches and long polls: :mod:`queueflow.server.leader.parking`).

        Returns:
            The answer; ``NOT_LEADER_OR_FOLLOWER`` when this worker does not lead (or has not
            yet gone live on) the request's partition, so the member re-routes.
        """
        if not self.fencing.is_live(request.partition):
            return self._not_leader(request)
        return await self.long_polls.serve(request)

    def end_long_poll(self, cancel: protocol.ShareFetchCancel) -> bool:
        """Answer the member's parked ShareFetch ``cancel.request_id`` now, acquiring nothing
        (:class:`~queueflow.protocol.messages.ShareFetchCancel`); True if it was parked."""
        return self.long_polls.cancel(cancel)

    def _not_leader(
        self, request: protocol.ShareFetchRequest, failure: Exception | None = None
    ) -> protocol.ShareFetchResponse:
        return fencing.not_leader_answer(self.fencing, self.topic, request, failure)

    async def _apply_batch(self, partition: int, items: list[ParkedFetch]) -> None:
        """Serve a batch of direct requests of one request partition: parked ones (``response``
        set) only acquire, new ones apply their acknowledgements and acquire; then each changed
        share-partition is written once and, with durability ``acked``, flushed.

        Raises:
            Exception: the stall guard or fencing stopped this worker leading ``partition``
                (``FencedStateEpochError``), or a state write failed.
        """
        clock = self.ctx.clock
        self._step_down_if_stalled(monotonic_ms(clock))  # the stall guard, at serve time
        self.fencing.check(partition)
        if not self.fencing.is_live(partition):
            raise FencedStateEpochError(f"not live on partition {partition} yet")
        result = NOTHING
        async with self._lock(partition):
            with self.ctx.state_scope(self.request_topic, partition):
                now = clock.now_ms()
                for item in items:
                    if item.response is None:
                        fetched = await self._share_fetch(item.request, partition, now)
                        item.response, item.durable = fetched.response, fetched.durable
                        result = result + fetched.effects
                    elif item.durable is not None and now < item.request.deadline_ms:
                        result = result + await self.fetcher.reacquire(
                            item.request, item.durable, item.response, now
                        )
                    if item.durable is not None:
                        result = result + LeaderResult(writes=(item.durable,), flush=True)
                await self._apply(replace(result, flush=False), partition)
        if result.flush and self.ctx.settings.state_durability is StateDurability.ACKED:
            await self.ctx.flush_state()

    async def _apply(self, result: LeaderResult, partition: int, sender_key: bytes = b"") -> None:
        """Perform ``result`` (:meth:`~queueflow.server.leader.applier.ResultApplier.apply`)."""
        await self.applier.apply(result, partition, sender_key)


def _has_locks(durable: DurableSharePartition) -> bool:
    """Records Acquired with a lock that elapses (those held for the DLQ don't)."""
    return durable.engine.acquired_count > durable.engine.held_by(DEAD_LETTER_OWNER)
