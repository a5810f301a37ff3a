"""Share-partition leaders: one :class:`ShareLeader` per source topic serves ShareFetch requests.

The worker that owns partition ``p`` of the request topic ``<app>-share-fetch-<topic>`` (which is
co-partitioned with ``<topic>`` and with the state table's changelog) leads every share-partition
``(group, <topic>, p)``. Leadership therefore moves with the host's rebalances, the state is local
to the leader (RocksDB), and every state change happens while handling a record of request
partition ``p``, which is what Faust tables require.

Per request, in order (KIP-932 "ShareFetch API"): expire elapsed locks, apply the piggy-backed
acknowledgements atomically, acquire up to ``max_records`` records, write the state change as one
delta, answer on the reply topic. The engine (:mod:`queueflow.engine.partition`) owns the rules;
:mod:`queueflow.engine.fencing` decides when this worker may serve a partition; this module owns
the I/O, through its :class:`~queueflow.server.context.ServerContext`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import structlog

from queueflow.engine.fencing import FenceOutcome, LeaderFencing
from queueflow.engine.partition import AcknowledgementBatch
from queueflow.errors import CorruptStateError, ErrorCode, FencedStateEpochError, ShareGroupError
from queueflow.logging import SkipLogLimiter
from queueflow.metrics import SharePartitionSample
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.auth import ticket_key
from queueflow.protocol.state_codec import (
    decode_request_position,
    encode_request_position,
    request_position_key,
)
from queueflow.server.context import ServerContext
from queueflow.server.durable import DurableSharePartition, StateTable, snapshot_key
from queueflow.server.group_configs import LeaderGroupConfigs
from queueflow.server.tickets import TicketGate
from queueflow.server.transport import (
    control_auth,
    monotonic_ms,
    not_leader,
    send_due_fences,
    send_reply,
)
from queueflow.structs import AcknowledgeType, TopicPartition

__all__ = ["ShareLeader"]

log = structlog.get_logger("queueflow.server.leader")

#: The most requests a new leader reads back that its host skipped (see
#: ``ShareLeader._replay_skipped``); older ones are long answered or timed out.
MAX_REPLAYED_REQUESTS = 10_000


class ShareLeader:
    """The share-partition leaders of one source topic on this worker (KIP-932
    "Share-partition leader"): every share group's share-partitions of the request partitions
    this worker owns.

    Requests arrive through :meth:`handle`, one request partition at a time and in log order,
    from the host's stream of the request topic ``<app>-share-fetch-<topic>``.

    Args:
        ctx: the server context.
        topic: the source topic name.
        table: the share-partition state table of ``topic`` (co-partitioned with it).
    """

    def __init__(self, ctx: ServerContext, topic: str, table: StateTable) -> None:
        self.ctx = ctx
        self.topic = topic
        self.table = table
        self.request_topic = topics.fetch_topic(ctx.namespace, topic)
        #: Each group's configs (lock duration, delivery count limit, in-flight limit,
        #: share.auto.offset.reset), from the tickets of its requests (issue #14).
        self.group_configs = LeaderGroupConfigs(ctx.settings, ctx.group_configs)
        self.auth = control_auth(ctx, "leader")
        self.skipped = SkipLogLimiter(lambda: monotonic_ms(ctx.clock))
        s = ctx.settings
        #: Membership, member epoch and assignment of each request, from its assignment
        #: ticket (KIP-932 checks them on every ShareFetch; see queueflow.server.tickets).
        self.tickets = TicketGate(
            ticket_key(s.control_auth_mode, s.auth_secret, ctx.namespace),
            required=s.auth_tickets == "required",
            coordinator_forget_ms=s.session_timeout_ms,
        )
        self.refusals = SkipLogLimiter(lambda: monotonic_ms(ctx.clock))
        self.partitions: dict[tuple[str, int], DurableSharePartition] = {}
        self.refused: dict[tuple[str, int], CorruptStateError] = {}
        # Share-partitions of partitions this worker lost, kept in case a rebalance gives the
        # partition straight back (see DurableSharePartition.resume).
        self._retained: dict[tuple[str, int], DurableSharePartition] = {}
        # Request partition -> offset of the last request applied. Faust resumes a partition
        # from its committed offset, which lags (commit interval, and faust-streaming #606), so
        # requests already applied come round again; applied twice, an old RELEASE would
        # release a record acquired since. The offset is persisted with the state
        # (request_position_key), so a new leader skips what its predecessor applied.
        self._applied: dict[int, int] = {}
        # (group, partition) -> (engine, its archived_total already counted): the archived
        # counter's progress (a restored or resumed share-partition has a new engine).
        self._archived_seen: dict[tuple[str, int], tuple[object, int]] = {}
        self.fencing = LeaderFencing(ctx.stall_limit_ms)
        # The direct path (serve()): one lock per request partition shared with the stream
        # path, and one queue of waiting and parked requests per partition.
        self._locks: dict[int, asyncio.Lock] = {}
        self._direct: dict[int, _DirectQueue] = {}
        self._log = log.bind(topic=topic)
        self._state_writes = ctx.metrics.state_writes.labels(topic)
        ctx.metrics.add_partition_source(self.samples)

    def assign(self, partitions: set[int], epoch: int) -> None:
        """Lead ``partitions`` under leader epoch ``epoch`` (the Faust consumer generation);
        the stall guard announces it once Faust has recovered the tables."""
        self.fencing.assign(partitions, epoch)
        for key in [k for k in self._retained if k[1] not in partitions]:
            del self._retained[key]  # led elsewhere now: reload if it ever comes back
        self._log.info("leader_assigned", partitions=sorted(partitions), leader_epoch=epoch)

    async def send_fences(self) -> None:
        """Append this worker's fence to the partitions it leads but isn't live on yet, once
        Faust has finished rebalancing (see :mod:`queueflow.engine.fencing`)."""
        sent = await send_due_fences(self.ctx, self.fencing, self.auth, self.request_topic)
        for p, epoch in sent:
            self._log.info("leader_fence_sent", partition=p, leader_epoch=epoch)

    def lag_report(self, partitions: Iterable[int]) -> list[tuple[str, int, int]]:
        """``(group, partition, lag)`` of the loaded share-partitions of ``partitions``, sorted:
        KIP-1226's lag (records not yet delivered to completion: those past the SPEO up to the
        last known log end, plus the Available and Acquired in flight). Share-partitions whose
        log end this worker doesn't know yet are left out. For the ``lag`` assignor, sent with
        the leader's announcements (:mod:`queueflow.server.endpoint`)."""
        wanted = set(partitions)
        out = []
        for (group, p), durable in self.partitions.items():
            end = self.ctx.log_offsets.known_end(TopicPartition(self.topic, p))
            if p not in wanted or end is None:
                continue
            engine = durable.engine
            lag = max(end - engine.end_offset, 0) + engine.available_count + engine.acquired_count
            out.append((group, p, lag))
        return sorted(out)

    def revoke(self, partitions: set[int]) -> None:
        """Forget the share-partitions of revoked partitions; their new leader restores them.
        A request still in progress for one of them can no longer write its state."""
        self.fencing.revoke(partitions)
        self._drop(partitions, fenced="its partition was revoked by a Faust rebalance")
        for p in partitions:  # re-read from the table if it comes back: others may apply more
            self._applied.pop(p, None)

    def _drop(self, partitions: set[int], fenced: str | None = None) -> None:
        for p in partitions:  # waiting direct requests: refused, their members re-route
            queue = self._direct.get(p)
            if queue is not None:
                queue.fail(self._not_leader)
        for key in [k for k in self.partitions if k[1] in partitions]:
            durable = self.partitions.pop(key)
            if fenced is not None:
                durable.fence(fenced)
            self._retained[key] = durable
        for key in [k for k in self.refused if k[1] in partitions]:
            del self.refused[key]

    def step_down(self, partitions: list[int], reason: str) -> None:
        """Stop serving ``partitions``: fence their share-partitions so any later write is
        refused with ``FENCED_STATE_EPOCH``, and log why."""
        if not partitions:
            return
        self._drop(set(partitions), fenced=reason)
        self.ctx.metrics.leader_step_downs.labels(self.topic).inc(len(partitions))
        self._log.warning(
            "leader_stepped_down",
            partitions=sorted(partitions),
            reason=reason,
            code=ErrorCode.FENCED_STATE_EPOCH.value,
        )

    async def watch_stalls(self, now_monotonic_ms: int) -> None:
        """The stall guard (called every 100 ms): step down after a stall longer than the
        Faust session timeout; take the partitions back if the membership survived it; send
        own fences that are due."""
        stalled = self.fencing.alive(now_monotonic_ms)
        if stalled:
            self.step_down(stalled, self.fencing.partitions[stalled[0]].fenced or "stalled")
        runtime = self.ctx.runtime
        resumed = self.fencing.resume_after_stall(
            now_monotonic_ms, runtime.generation, runtime.rebalancing
        )
        for p in resumed:
            self._log.info(
                "leader_resumed_after_stall",
                partition=p,
                leader_epoch=self.fencing.partitions[p].epoch,
            )
        await self.send_fences()

    async def handle(self, partition: int, offset: int, value: bytes) -> None:
        """Handle one record of request partition ``partition`` at ``offset`` (in log order).

        Never raises for a bad or failed request: it is logged and skipped, so one bad request
        can't stop the leader.
        """
        if partition not in self._applied:
            await self._replay_skipped(partition, offset)
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
        would wait out the request timeout (issue #13, "Takeover"). At most
        :data:`MAX_REPLAYED_REQUESTS`; never fails the request at ``offset``."""
        applied = self._applied[partition] = self._persisted_position(partition)
        log = self.ctx.request_log
        if log is None or applied < 0 or offset <= applied + 1:
            return
        start = max(applied + 1, offset - MAX_REPLAYED_REQUESTS)
        try:
            records = await log.read(self.request_topic, partition, start, offset)
        except Exception as exc:  # the broker may be restarting: carry on without them
            self._log.warning(
                "skipped_requests_unread", partition=partition, first=start, error=repr(exc)
            )
            return
        for skipped, value in records:
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
        applied = self._applied.get(partition)
        if applied is None:
            applied = self._applied[partition] = self._persisted_position(partition)
        if offset <= applied:
            return  # applied before, here or by the previous leader (Faust re-delivers)
        self._applied[partition] = offset
        async with self._lock(partition):  # never interleaved with the direct path's batches
            changed = await self._handle_locked(partition, offset, value, replayed)
        if changed:
            self._notify(partition)  # records may have become available to parked requests

    def _persisted_position(self, partition: int) -> int:
        """The offset of the last request of ``partition`` whose changes a leader wrote (-1:
        none, or unreadable: then requests are applied from Faust's committed offset)."""
        raw = self.table.get(request_position_key(partition))
        if raw is None:
            return -1
        try:
            return decode_request_position(raw, where=f"{self.request_topic}[{partition}]")
        except CorruptStateError as exc:
            self._log.error("request_position_refused", partition=partition, error=str(exc))
            return -1

    def _write_position(self, partition: int, offset: int) -> None:
        """Persist ``offset`` as the last request of ``partition`` applied (after its state)."""
        self.table[request_position_key(partition)] = encode_request_position(offset)

    def _lock(self, partition: int) -> asyncio.Lock:
        lock = self._locks.get(partition)
        if lock is None:
            lock = self._locks[partition] = asyncio.Lock()
        return lock

    async def _handle_locked(
        self, partition: int, offset: int, value: bytes, replayed: bool = False
    ) -> bool:
        """Handle the request-log record at ``offset``; True if it changed share-partition
        state. With ``queueflow.leader.state.durability=acked`` the answer leaves once the
        broker acknowledged the state change (so no delivery is answered that a new leader
        would not know of). A ``replayed`` request is answered only if its member still
        waits (before its ``deadline_ms``)."""
        try:
            message = protocol.decode(self.auth.open(value))
            self.auth.check_sender(message)
        except ShareGroupError as exc:
            suppressed = self.skipped.admit()
            if suppressed is not None:
                self._log.error(
                    "undecodable_request",
                    partition=partition,
                    error=str(exc),
                    suppressed=suppressed,
                )
            return False
        now = self.ctx.clock.now_ms()
        if isinstance(message, protocol.Fence):
            self._on_fence(partition, message.leader_epoch)
            return False
        try:
            self.fencing.check(partition)
        except FencedStateEpochError:
            return False  # stepped down: the partition's new leader answers
        changed = False
        if isinstance(message, protocol.Tick):
            for (group, p), durable in list(self.partitions.items()):
                if p == partition and self._expire(group, durable, now):
                    durable.persist()
                    self._count_archived(group, durable)
                    changed = True
        elif isinstance(
            message, protocol.ReleaseMember | protocol.ResetSharePartition
        ) and self._stale_coordinator(message, partition, now):
            return False
        elif isinstance(message, protocol.ReleaseMember):
            # Its tickets issued so far are refused from now on: nothing is acquired for it
            # after this release (the records of a removed member are released once).
            self.tickets.remove(message.group, message.member_id, partition, message.member_epoch)
            # A share-partition without state has nothing to release: don't initialise it here
            # (its group's configs, share.auto.offset.reset included, come with a ticket).
            holder = await self._existing_share_partition(message.group, partition)
            released = 0 if holder is None else holder.engine.release_member(message.member_id, now)
            if released and holder is not None:
                holder.persist()
                self._count_archived(message.group, holder)
                self._write_position(partition, offset)
                changed = True
                self._log.info(
                    "member_records_released",
                    group=message.group,
                    partition=partition,
                    member_id=message.member_id,
                    records=released,
                    reason=message.reason,
                )
        elif isinstance(message, protocol.ResetSharePartition):
            changed = await self._reset(message, partition, offset, now)
        elif isinstance(message, protocol.ShareFetchRequest):
            # A request before this worker's own fence belongs to the previous leader, which may
            # have answered it already: apply its acknowledgements (atomic, so a repeat is
            # refused harmlessly) but acquire nothing, or the records would be locked for a
            # member not waiting for them.
            live = self.fencing.is_live(partition)
            response, fetched = await self._share_fetch(message, partition, now, acquire=live)
            if fetched is not None and (message.acks or response.acquired):
                self._write_position(partition, offset)
                if self.ctx.settings.state_durability == "acked":
                    await self.ctx.flush_state()
            if not replayed or now < message.deadline_ms:
                await send_reply(
                    self.ctx,
                    message.member_id,
                    message.reply_partition,
                    self.auth.seal(protocol.encode(response)),
                    self.tickets.reply_key(message.ticket),
                )
            changed = bool(message.acks)
        return changed

    def _stale_coordinator(
        self,
        message: protocol.ReleaseMember | protocol.ResetSharePartition,
        partition: int,
        now: int,
    ) -> bool:
        """True (logged rate-limited as ``stale_coordinator_refused``, counted) when
        ``message`` comes from a coordinator older than the newest seen for its group: a
        coordinator that lost its partition (frozen, cut off) must not release members' records
        or reset state (:class:`~queueflow.engine.fencing.CoordinatorEpochs`)."""
        epochs = self.tickets.coordinator_epochs
        if epochs.admit(message.group, message.coordinator_epoch, now):
            return False
        self.ctx.metrics.stale_coordinator_refusals.labels("leader", message.kind).inc()
        suppressed = self.refusals.admit()
        if suppressed is not None:
            self._log.warning(
                "stale_coordinator_refused",
                group=message.group,
                partition=partition,
                kind=message.kind,
                coordinator_epoch=message.coordinator_epoch,
                newest_coordinator_epoch=epochs.newest(message.group),
                suppressed=suppressed,
            )
        return True

    async def _reset(
        self, message: protocol.ResetSharePartition, partition: int, offset: int, now: int
    ) -> bool:
        """Apply an admin reset (``start_offset`` set) or delete (``None``) of one
        share-partition's state, forwarded by the coordinator once it found the group empty,
        and answer the coordinator (a
        :class:`~queueflow.protocol.messages.ResetSharePartitionResult`).

        Refused, changing nothing, when a record is Acquired (``NON_EMPTY_GROUP``: a member
        fetched since the coordinator's check), after the request's deadline
        (``REQUEST_TIMED_OUT``: the coordinator no longer holds joins back), or for a
        partition of another topic (``UNKNOWN_TOPIC_OR_PARTITION``). A reset discards every
        in-flight record and delivery count (KIP-932 "Managing the SPSO and SPEO"). Returns
        True if state changed.
        """
        result = protocol.ResetSharePartitionResult(
            group=message.group,
            topic=message.topic,
            partition=partition,
            admin_id=message.admin_id,
            request_id=message.request_id,
        )
        changed = False
        key = (message.group, partition)
        try:
            if message.topic != self.topic or message.partition != partition:
                raise ShareGroupError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"share-partition {message.topic}[{message.partition}] is not served on "
                    f"{self.request_topic}[{partition}]",
                )
            if message.deadline_ms and now > message.deadline_ms:
                raise ShareGroupError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"the admin request's deadline passed {now - message.deadline_ms} ms "
                    "before this leader read it; nothing was changed",
                )
            durable = await self._existing_share_partition(message.group, partition)
            if durable is not None and durable.engine.acquired_count:
                raise ShareGroupError(
                    ErrorCode.NON_EMPTY_GROUP,
                    f"share group {message.group!r} is not empty: "
                    f"{durable.engine.acquired_count} records of {self.topic}[{partition}] "
                    "are Acquired by members",
                )
            if message.start_offset is None:
                if durable is not None:
                    durable.delete()
                    self.partitions.pop(key, None)
                    self._retained.pop(key, None)
                    changed = True
            else:
                if durable is None:
                    durable = DurableSharePartition.create(
                        self.table,
                        message.group,
                        self.topic,
                        partition,
                        self.group_configs.engine(message.group),
                        self.ctx.settings.snapshot_update_records_per_snapshot,
                        message.start_offset,
                        leader_epoch=self._epoch(partition),
                    )
                    self.partitions[key] = durable
                else:
                    durable.engine.reset_start_offset(message.start_offset)
                    self._persist(message.group, durable)
                result.start_offset = durable.engine.start_offset
                changed = True
            if changed:
                self._write_position(partition, offset)
                if self.ctx.settings.state_durability == "acked":
                    await self.ctx.flush_state()
            self._log.info(
                "share_partition_reset" if message.start_offset is not None else
                "share_partition_deleted",
                group=message.group,
                partition=partition,
                start_offset=message.start_offset,
                admin_id=message.admin_id,
            )  # fmt: skip
        except ShareGroupError as exc:
            result.error, result.error_message = exc.code.value, exc.message
            self._log.warning(
                "share_partition_reset_refused",
                group=message.group,
                partition=partition,
                error=str(exc),
            )
        await self.ctx.sender.send(
            topics.coordinator_topic(self.ctx.namespace),
            topics.coordinator_partition(message.group),
            self.auth.seal(protocol.encode(result)),
        )
        return changed

    async def _existing_share_partition(
        self, group: str, partition: int
    ) -> DurableSharePartition | None:
        """The share-partition if it has state (in memory or in the table), else None (it is
        not initialised, unlike :meth:`_share_partition`)."""
        key = (group, partition)
        if key in self.partitions or key in self._retained or key in self.refused:
            return await self._share_partition(group, partition)
        if self.table.get(snapshot_key(group, partition)) is None:
            return None
        return await self._share_partition(group, partition)

    def has_acquired(self, partition: int) -> bool:
        """True if a share-partition of request partition ``partition`` has Acquired records
        (whose locks the ticker must expire)."""
        return any(
            p == partition and durable.engine.acquired_count
            for (_group, p), durable in self.partitions.items()
        )

    def _epoch(self, partition: int) -> int:
        lead = self.fencing.partitions.get(partition)
        return lead.epoch if lead is not None else -1

    def _on_fence(self, partition: int, epoch: int) -> None:
        outcome = self.fencing.on_fence(partition, epoch)
        if outcome is FenceOutcome.LIVE:
            self._log.info("leader_live", partition=partition, leader_epoch=epoch)
        elif outcome is FenceOutcome.SUPERSEDED:
            self.step_down([partition], self.fencing.partitions[partition].fenced or "fenced")
        else:
            self._log.debug("fence_ignored", partition=partition, leader_epoch=epoch)

    async def _share_partition(self, group: str, partition: int) -> DurableSharePartition:
        key = (group, partition)
        durable = self.partitions.get(key)
        if durable is not None:
            return durable
        if key in self.refused:
            raise self.refused[key]
        retained = self._retained.pop(key, None)
        if retained is not None and retained.resume(self._epoch(partition)):
            retained.engine.reconfigure(self.group_configs.engine(group))
            self.partitions[key] = retained
            self._log.info(
                "share_partition_resumed",
                group=group,
                partition=partition,
                start_offset=retained.engine.start_offset,
                end_offset=retained.engine.end_offset,
                acquired=retained.engine.acquired_count,
                state_epoch=retained.state_epoch,
            )
            return retained
        try:
            durable = DurableSharePartition.load(
                self.table,
                group,
                self.topic,
                partition,
                self.group_configs.engine(group),
                self.ctx.settings.snapshot_update_records_per_snapshot,
                leader_epoch=self._epoch(partition),
            )
        except CorruptStateError as exc:
            self.refused[key] = exc
            self._log.error(
                "share_partition_refused", group=group, partition=partition, error=str(exc)
            )
            raise
        if durable is None:
            start = await self._initial_offset(group, partition)
            durable = DurableSharePartition.create(
                self.table,
                group,
                self.topic,
                partition,
                self.group_configs.engine(group),
                self.ctx.settings.snapshot_update_records_per_snapshot,
                start,
                leader_epoch=self._epoch(partition),
            )
            self._log.info(
                "share_partition_initialised", group=group, partition=partition, start_offset=start
            )
        else:
            self._log.info(
                "share_partition_restored",
                group=group,
                partition=partition,
                start_offset=durable.engine.start_offset,
                end_offset=durable.engine.end_offset,
                state_epoch=durable.state_epoch,
            )
        self.partitions[key] = durable
        return durable

    async def _initial_offset(self, group: str, partition: int) -> int:
        """Where a new share-partition of ``group`` starts: the group's
        ``share.auto.offset.reset`` (``earliest``: the log start; ``latest``: the log end;
        ``by_duration:D``: the first record at most ``D`` old, else the log end), or the log
        start for a partition added to the topic at runtime (issue #14 item 4)."""
        tp = TopicPartition(self.topic, partition)
        offsets = self.ctx.log_offsets
        reset = self.group_configs.offset_reset(group, self.topic, partition)
        if reset.kind == "earliest":
            return await offsets.log_start(tp)
        if reset.kind == "by_duration":
            found = await offsets.offset_for_time(tp, self.ctx.clock.now_ms() - reset.duration_ms)
            if found is not None:
                return max(found, await offsets.log_start(tp))
        return await offsets.log_end(tp)

    def _adopt_configs(self, request: protocol.ShareFetchRequest) -> None:
        """Take the group configs of the request's (verified) ticket; when they changed, the
        group's loaded share-partitions enforce them from now on."""
        ticket = self.tickets.verified(request.ticket)
        if ticket is None:
            return
        config = self.group_configs.adopt(ticket)
        if config is None:
            return
        for (group, _partition), durable in self.partitions.items():
            if group == ticket.group:
                durable.engine.reconfigure(config)
        self._log.info(
            "share_group_configs_applied",
            group=ticket.group,
            config_version=ticket.config_version,
            configs=dict(ticket.configs),
        )

    async def _share_fetch(
        self,
        request: protocol.ShareFetchRequest,
        partition: int,
        now: int,
        acquire: bool = True,
        persist: bool = True,
    ) -> tuple[protocol.ShareFetchResponse, DurableSharePartition | None]:
        """Apply a request's acknowledgements, then acquire (KIP-932 "ShareFetch API").

        Before anything else the request's assignment ticket must prove a current member
        (:meth:`_refused`): otherwise the answer is ``UNKNOWN_MEMBER_ID`` for the fetch and its
        acknowledgements, and nothing is loaded or changed.

        Returns the answer and the share-partition it changed (``None`` when its state could
        not be loaded, or the request was refused). With ``persist=False`` the caller persists
        (one write per batch).
        """
        response = protocol.ShareFetchResponse(
            member_id=request.member_id,
            request_id=request.request_id,
            topic=self.topic,
            partition=partition,
        )
        if self._refused(request, partition, now, response, acquiring=False):
            if request.acks:
                response.ack_error, response.ack_error_message = (
                    response.error,
                    response.error_message,
                )
            return response, None
        try:
            durable = await self._share_partition(request.group, partition)
        except CorruptStateError as exc:
            response.error, response.error_message = exc.code.value, exc.message
            return response, None
        engine = durable.engine
        self._expire(request.group, durable, now)
        if request.acks:
            try:
                engine.acknowledge(
                    request.member_id,
                    [
                        AcknowledgementBatch(first, last, tuple(AcknowledgeType(t) for t in types))
                        for first, last, types in request.acks
                    ],
                    now,
                    request.lock_duration_ms,
                )
            except (ShareGroupError, ValueError) as exc:
                code = exc.code if isinstance(exc, ShareGroupError) else ErrorCode.INVALID_REQUEST
                response.ack_error, response.ack_error_message = code.value, str(exc)
                response.ack_stale = engine.stale_acknowledgements(
                    request.member_id,
                    [AcknowledgementBatch(first, last, ()) for first, last, _ in request.acks],
                )
        if acquire and request.max_records > 0 and now < request.deadline_ms:
            await self._acquire(request, durable, response, now)
        if persist:
            self._persist(request.group, durable)
        return response, durable

    async def _acquire(
        self,
        request: protocol.ShareFetchRequest,
        durable: DurableSharePartition,
        response: protocol.ShareFetchResponse,
        now: int,
    ) -> None:
        """Acquire up to the request's ``max_records`` into ``response``, if its ticket is of
        the member's latest epoch and assigns it the share-partition (checked again for a
        parked request: the member may have been removed or its ticket expired meanwhile)."""
        if self._refused(request, durable.partition, now, response, acquiring=True):
            return
        tp = TopicPartition(self.topic, durable.partition)
        offsets = self.ctx.log_offsets
        # A long poll that finds nothing parks, and its wait refreshes the log end: it needs no
        # background refresh (which would poll the broker while the fleet is idle).
        log_end = offsets.known_end(tp) if request.max_wait_ms else offsets.cached_end(tp)
        if log_end is None:
            log_end = await self.ctx.log_offsets.log_end(tp)
        try:
            acquired = durable.engine.acquire(
                request.member_id, request.max_records, log_end, now, request.lock_duration_ms
            )
        except ShareGroupError as exc:
            response.error, response.error_message = exc.code.value, exc.message
            acquired = []
        response.acquired = [(a.first_offset, a.last_offset, a.delivery_count) for a in acquired]
        if acquired:
            m, labels = self.ctx.metrics, (request.group, self.topic, str(durable.partition))
            for a in acquired:
                n = a.last_offset - a.first_offset + 1
                m.acquisitions.labels(*labels).inc(n)
                m.deliveries.labels(*labels, str(a.delivery_count)).inc(n)
        response.lock_timeout_ms = (
            request.lock_duration_ms or durable.engine.config.record_lock_duration_ms
        )

    def _refused(
        self,
        request: protocol.ShareFetchRequest,
        partition: int,
        now: int,
        response: protocol.ShareFetchResponse,
        *,
        acquiring: bool,
    ) -> bool:
        """Check the request's assignment ticket (:class:`~queueflow.server.tickets.TicketGate`;
        ``acquiring``: also its epoch and assignment); on a refusal set ``response.error``,
        count it (``queueflow_ticket_refusals``), log it rate-limited (``share_fetch_refused``)
        and return True."""
        refusal = self.tickets.check(
            request.group,
            request.member_id,
            request.ticket,
            now,
            topic=self.topic,
            partition=partition,
            acquiring=acquiring,
        )
        if refusal is None:
            self._adopt_configs(request)
            return False
        response.error, response.error_message = refusal.code.value, refusal.message
        self.ctx.metrics.ticket_refusals.labels(self.topic, refusal.reason).inc()
        suppressed = self.refusals.admit()
        if suppressed is not None:
            self._log.warning(
                "share_fetch_refused",
                group=request.group,
                partition=partition,
                member_id=request.member_id,
                code=refusal.code.value,
                reason=refusal.reason,
                detail=refusal.message,
                acknowledgements=len(request.acks),
                suppressed=suppressed,
            )
        return True

    def _persist(self, group: str, durable: DurableSharePartition) -> None:
        """Write what changed (one delta) and count the records it Archived."""
        if durable.persist():
            self._state_writes.inc()
        self._count_archived(group, durable)

    def _expire(self, group: str, durable: DurableSharePartition, now: int) -> int:
        """Expire the share-partition's elapsed acquisition locks; count and return them."""
        expired = durable.engine.expire_locks(now)
        if expired:
            labels = (group, self.topic, str(durable.partition))
            self.ctx.metrics.lock_expiries.labels(*labels).inc(expired)
        return expired

    def _count_archived(self, group: str, durable: DurableSharePartition) -> None:
        engine = durable.engine
        key = (group, durable.partition)
        seen_engine, seen = self._archived_seen.get(key, (None, 0))
        if seen_engine is not engine:
            seen = 0
        if engine.archived_total > seen:
            labels = (group, self.topic, str(durable.partition))
            self.ctx.metrics.archived.labels(*labels).inc(engine.archived_total - seen)
        self._archived_seen[key] = (engine, engine.archived_total)

    def samples(self) -> list[SharePartitionSample]:
        """The state of every share-partition this worker serves now, for the share-partition
        gauges (:meth:`queueflow.metrics.Metrics.add_partition_source`); the log end is the
        last known high watermark (:meth:`refresh_log_ends` refreshes it). O(runs)."""
        out = []
        for (group, partition), durable in list(self.partitions.items()):
            engine = durable.engine
            counts = dict.fromkeys(("available", "acquired", "acknowledged", "archived"), 0)
            for run in engine.in_flight():
                counts[run.state.name.lower()] += run.last_offset - run.first_offset + 1
            end = self.ctx.log_offsets.known_end(TopicPartition(self.topic, partition))
            lag = None
            if end is not None:
                end = max(end, engine.end_offset)
                complete = counts["acknowledged"] + counts["archived"]
                lag = max(end - engine.start_offset - complete, 0)
            out.append(
                SharePartitionSample(
                    group,
                    self.topic,
                    partition,
                    engine.start_offset,
                    engine.end_offset,
                    counts,
                    end,
                    lag,
                )
            )
        return out

    async def refresh_log_ends(self) -> None:
        """Ask the broker for the high watermark of every partition this worker serves a
        share-partition of (before a scrape: records produced while nobody fetches move the
        lag too). Raises what the broker call raises."""
        partitions = sorted({p for _group, p in self.partitions})
        await asyncio.gather(
            *(self.ctx.log_offsets.log_end(TopicPartition(self.topic, p)) for p in partitions)
        )

    # -- the direct path -------------------------------------------------------------------
    async def serve(self, request: protocol.ShareFetchRequest) -> protocol.ShareFetchResponse:
        """Answer a ShareFetch that came over the direct path (:mod:`queueflow.server.endpoint`).

        Requests of one request partition are served in batches: every request waiting when the
        partition's turn comes is applied in arrival order, each share-partition's state is
        written once (one delta) for the batch, and, with
        ``queueflow.leader.state.durability=acked``, the answers leave only once the broker has
        acknowledged that write. A request that acquires nothing, has ``max_wait_ms`` and
        carries no acknowledgements is parked (KIP-932 long poll): it is answered when records
        become available (new records at the log end, releases, expired locks) or when its
        wait ends. One that carries acknowledgements is answered at once, so that their
        result never waits for records; the member then polls again without them.

        Args:
            request: the decoded request.

        Returns:
            The answer; ``NOT_LEADER_OR_FOLLOWER`` when this worker does not lead (or has not
            yet gone live on) the request's partition, so the member re-routes.
        """
        partition = request.partition
        if not self.fencing.is_live(partition):
            return self._not_leader(request)
        queue = self._direct.get(partition)
        if queue is None or queue.task is None or queue.task.done():
            queue = self._direct[partition] = _DirectQueue()
            queue.task = asyncio.ensure_future(self._serve_partition(partition, queue))
        future: asyncio.Future[protocol.ShareFetchResponse] = (
            asyncio.get_running_loop().create_future()
        )
        queue.pending.append((request, future))
        queue.wake.set()
        return await future

    def end_long_poll(self, cancel: protocol.ShareFetchCancel) -> bool:
        """Answer the member's parked ShareFetch ``cancel.request_id`` now, with nothing
        acquired (see :class:`~queueflow.protocol.messages.ShareFetchCancel`); True if it was
        parked."""
        queue = self._direct.get(cancel.partition)
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

    def _not_leader(
        self, request: protocol.ShareFetchRequest, failure: Exception | None = None
    ) -> protocol.ShareFetchResponse:
        lead = self.fencing.partitions.get(request.partition)
        if failure is not None and lead is not None and lead.fenced is None:
            why = f"could not be served by this worker ({failure!r}); re-send it elsewhere"
        elif lead is None:
            why = "is not led by this worker"
        else:
            why = lead.fenced or "is led by this worker, which is not live on it yet"
        return not_leader(request, f"partition {self.topic}[{request.partition}] {why}")

    def _notify(self, partition: int) -> None:
        """Something changed in ``partition``: parked requests try again."""
        queue = self._direct.get(partition)
        if queue is not None and queue.parked:
            queue.changed = True
            queue.wake.set()

    async def _serve_partition(self, partition: int, queue: _DirectQueue) -> None:
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

    async def _serve_batch(self, partition: int, queue: _DirectQueue) -> None:
        clock = self.ctx.clock
        batch, queue.pending = queue.pending, []
        mono = clock.monotonic()
        queue.parked = [p for p in queue.parked if not p.future.done()]  # gone: don't acquire
        retry = queue.parked if queue.changed else [p for p in queue.parked if p.until <= mono]
        queue.parked = [p for p in queue.parked if p not in retry]
        queue.changed = False
        items = retry + [
            _Parked(request, future, None, None, mono + request.max_wait_ms / 1000)
            for request, future in batch
        ]
        if not items:
            return
        seen_end = self.ctx.log_offsets.known_end(TopicPartition(self.topic, partition))
        for item in items:
            item.seen_end = seen_end
        try:
            await self._apply_batch(partition, items)
        except Exception as exc:  # answered as refused: the members re-send elsewhere
            self._log.exception("direct_batch_failed", partition=partition)
            for item in items:
                if not item.future.done():
                    item.future.set_result(self._not_leader(item.request, exc))
            return
        if queue.parked and any(request.acks for request, _ in batch):
            queue.changed = True  # releases may have made records available to parked requests
            queue.wake.set()
        for item in items:
            response = item.response
            assert response is not None
            if (
                not response.acquired
                and response.error == ErrorCode.NONE.value
                and item.request.max_records > 0
                and not item.request.acks  # answered at once: "ack answered" never waits
                and item.until > clock.monotonic()
                and item.durable is not None
            ):
                queue.parked.append(item)  # long poll: wait for records
                self._watch(partition, item.durable)
            elif not item.future.done():
                item.future.set_result(response)

    async def _apply_batch(self, partition: int, items: list[_Parked]) -> None:
        """Serve a batch of direct requests of one request partition: parked ones (``response``
        set) only acquire, new ones apply their acknowledgements and acquire; then each changed
        share-partition is written once and, with durability ``acked``, flushed.

        Raises:
            Exception: the stall guard or fencing stopped this worker leading ``partition``
                (``FencedStateEpochError``), or a state write failed.
        """
        clock = self.ctx.clock
        stalled = self.fencing.alive(monotonic_ms(clock))  # the stall guard, at serve time
        if stalled:
            self.step_down(stalled, self.fencing.partitions[stalled[0]].fenced or "stalled")
        self.fencing.check(partition)
        if not self.fencing.is_live(partition):
            raise FencedStateEpochError(f"not live on partition {partition} yet")
        changed: dict[str, DurableSharePartition] = {}
        async with self._lock(partition):
            with self.ctx.state_scope(self.request_topic, partition):
                now = clock.now_ms()
                for item in items:
                    if item.response is None:
                        item.response, item.durable = await self._share_fetch(
                            item.request, partition, now, persist=False
                        )
                    elif item.durable is not None and now < item.request.deadline_ms:
                        await self._acquire(item.request, item.durable, item.response, now)
                    if item.durable is not None:
                        changed[item.request.group] = item.durable
                for group, durable in changed.items():
                    self._persist(group, durable)
        if changed and self.ctx.settings.state_durability == "acked":
            await self.ctx.flush_state()

    def _watch(self, partition: int, durable: DurableSharePartition) -> None:
        """Wake the partition's parked requests when records arrive past the SPEO."""
        queue = self._direct.get(partition)
        if queue is None or (queue.watcher is not None and not queue.watcher.done()):
            return
        queue.watcher = asyncio.ensure_future(self._watch_log_end(partition, queue, durable))

    async def _watch_log_end(
        self, partition: int, queue: _DirectQueue, durable: DurableSharePartition
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
                self._notify(partition)
                return


@dataclass(slots=True, eq=False)
class _Parked:
    """A direct request being answered, or parked until records arrive or ``until``."""

    request: protocol.ShareFetchRequest
    future: asyncio.Future[protocol.ShareFetchResponse]
    #: The answer so far (None until the request was applied).
    response: protocol.ShareFetchResponse | None
    durable: DurableSharePartition | None
    #: Monotonic seconds when the long poll ends (the request's ``max_wait_ms``).
    until: float
    #: The log end known before it last tried to acquire (None: unknown): records from
    #: there on may not have been seen by that try.
    seen_end: int | None = None


@dataclass(slots=True, eq=False)
class _DirectQueue:
    """The direct path's requests of one request partition."""

    pending: list[
        tuple[protocol.ShareFetchRequest, asyncio.Future[protocol.ShareFetchResponse]]
    ] = field(default_factory=list)
    parked: list[_Parked] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set when state changed since the parked requests last tried to acquire.
    changed: bool = False
    task: asyncio.Future[None] | None = None
    watcher: asyncio.Future[None] | None = None

    def fail(
        self,
        answer: Callable[[protocol.ShareFetchRequest], protocol.ShareFetchResponse],
    ) -> None:
        """Answer every pending and parked request with ``answer(request)``."""
        for request, future in self.pending:
            if not future.done():
                future.set_result(answer(request))
        for parked in self.parked:
            if not parked.future.done():
                parked.future.set_result(answer(parked.request))
        self.pending, self.parked = [], []
