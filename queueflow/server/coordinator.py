"""The share-group coordinator, served from the coordinator topic ``<app>-share-coordinator``.

It handles ShareGroupHeartbeat requests (join, heartbeat, leave) and clock ticks with the pure
:class:`~queueflow.engine.group.ShareGroup` state machine, keeps group metadata in the
``share-groups`` Faust table (so a new coordinator picks up where the old one stopped), and tells
share-partition leaders to release the records of members that left or timed out
(:class:`~queueflow.protocol.messages.ReleaseMember`).

It also serves the admin's write requests (``alterShareGroupOffsets``,
``deleteShareGroupOffsets``, ``deleteShareGroups``; :mod:`queueflow.admin`). The coordinator owns
membership and the share-partition leaders own share-partition state, so an admin request is
checked here (the group exists, has no members, names share-partitions of its topics) and
forwarded to the leaders as :class:`~queueflow.protocol.messages.ResetSharePartition`; the
leaders apply it and answer here, and the coordinator answers the admin once every leader has
(or the request's deadline passed).

The join race: between the emptiness check and a leader applying the reset, a member could join
and acquire records, which the reset would then discard. Two rules close it. (1) While an admin
request is pending for a group, the coordinator refuses joins of that group with the retriable
``REQUEST_TIMED_OUT`` (members retry their join with back-off), so no member can join before
every leader has applied or refused the request, or its deadline passed. (2) A leader refuses a
reset or delete while any record of the share-partition is Acquired (``NON_EMPTY_GROUP``), and
refuses one read after the request's deadline, when (1) no longer holds joins back. (2) also
covers a coordinator failover mid-request (the pending set is in memory only): the
share-partitions a new member already fetched from are refused, and the admin, whose answer is
lost with the old coordinator, times out naming the request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import structlog

from queueflow.engine.assignors import check_known, parse_names
from queueflow.engine.fencing import FenceOutcome, PartitionFencing
from queueflow.engine.group import ShareGroup
from queueflow.engine.group_config import validate_group_configs
from queueflow.errors import ConfigurationError, ErrorCode, ShareGroupError
from queueflow.logging import SkipLogLimiter
from queueflow.protocol import group_codec, topics
from queueflow.protocol import messages as protocol
from queueflow.protocol.auth import issue_ticket, ticket_key
from queueflow.protocol.sealed_replies import PUBLIC_KEY_BYTES
from queueflow.server import group_configs
from queueflow.server.context import ServerContext
from queueflow.server.durable import StateTable
from queueflow.server.transport import control_auth, monotonic_ms, send_due_fences, send_reply
from queueflow.structs import TopicPartition

__all__ = ["ShareGroupCoordinator"]

log = structlog.get_logger("queueflow.server.coordinator")

#: A leader address not announced again within this many ms is no longer handed out (leaders
#: announce every 2 s; see :mod:`queueflow.server.endpoint`).
LEADER_ADDRESS_TTL_MS = 6000
#: A share-partition's lag not reported again within this many ms counts as unknown.
LAG_TTL_MS = 10_000
#: How long (ms) a request waits for this worker's membership lease before it is skipped: after
#: a rebalance the new generation's first heartbeat comes one Faust heartbeat interval later.
LEASE_WAIT_MS = 3000
_LEASE_POLL_S = 0.05


class ShareGroupCoordinator:
    """Coordinator of every share group whose coordinator partition this worker owns (KIP-932
    "Share group coordinator"): membership, member epochs and assignment.

    Requests arrive through :meth:`handle`, in log order, from the host's stream of the
    coordinator topic ``<app>-share-coordinator``.

    Args:
        ctx: the server context.
        table: the group metadata table (``share-groups``).
    """

    def __init__(self, ctx: ServerContext, table: StateTable) -> None:
        self.ctx = ctx
        self.table = table
        self.request_topic = topics.coordinator_topic(ctx.namespace)
        self.groups: dict[str, ShareGroup] = {}
        self.auth = control_auth(ctx, "coordinator")
        s = ctx.settings
        #: The key of the assignment tickets in heartbeat answers (see
        #: :mod:`queueflow.server.tickets`); the leaders of the app derive the same.
        self.ticket_key = ticket_key(s.control_auth_mode, s.auth_secret, ctx.namespace)
        self.skipped = SkipLogLimiter(lambda: monotonic_ms(ctx.clock))
        #: Direct endpoints of share-partition leaders, from their announcements:
        #: ``(topic, partition) -> (leader epoch, "host:port", received wall ms)``.
        self.leader_addresses: dict[tuple[str, int], tuple[int, str, int]] = {}
        self._last_event_ms = ctx.clock.now_ms()
        #: Admin requests forwarded to leaders and not yet answered, by group.
        self.pending: dict[str, _PendingAdmin] = {}
        #: ``group.share.assignors``, most preferred first (checked against the registry now,
        #: so a typo stops the worker at start-up rather than at the first rebalance).
        self.assignors = parse_names(s.assignors, "group.share.assignors")
        check_known(self.assignors, "group.share.assignors")
        #: Lag of share-partitions from the leaders' announcements (the ``lag`` assignor's
        #: input): ``group -> (topic, partition) -> (lag, received wall ms)``.
        self.lag: dict[str, dict[tuple[str, int], tuple[int, int]]] = {}
        self._logged_assignor: dict[str, str] = {}
        #: When each group's assignment was last recomputed with fresh inputs (wall ms).
        self._refreshed_at: dict[str, int] = {}
        #: Which coordinator partitions this worker owns, under which coordinator epoch, and
        #: whether it stepped down (see the module docstring).
        self.fencing = PartitionFencing(ctx.stall_limit_ms, role="coordinator")
        #: How long (ms) a request waits for the membership lease before it is skipped.
        self.lease_wait_ms = LEASE_WAIT_MS
        self.unserved = SkipLogLimiter(lambda: monotonic_ms(ctx.clock))
        # Group epoch up to which queueflow_share_group_rebalances_total has counted, by group.
        self._epochs_counted: dict[str, int] = {}

    def assign(self, partitions: set[int], epoch: int) -> None:
        """Own coordinator ``partitions`` under coordinator epoch ``epoch`` (the Faust consumer
        generation); the stall guard sends its fence once Faust has finished rebalancing."""
        self.fencing.assign(partitions, epoch)
        log.info("coordinator_assigned", partitions=sorted(partitions), coordinator_epoch=epoch)

    def revoke(self, partitions: set[int]) -> None:
        """Forget groups whose coordinator partition moved away (and their gauges: the new
        coordinator reports them)."""
        self.fencing.revoke(partitions)
        self._forget(partitions)

    def _forget(self, partitions: set[int] | list[int]) -> None:
        m = self.ctx.metrics
        for group_id in [g for g in self.groups if topics.coordinator_partition(g) in partitions]:
            del self.groups[group_id]
            self._epochs_counted.pop(group_id, None)
            for gauge in (m.group_members, m.group_epoch):
                with contextlib.suppress(KeyError):
                    gauge.remove(group_id)
        for group_id in [g for g in self.pending if topics.coordinator_partition(g) in partitions]:
            del self.pending[group_id]  # its leaders' answers now go to the new coordinator
        for group_id in [g for g in self.lag if topics.coordinator_partition(g) in partitions]:
            del self.lag[group_id]

    def epoch(self, group_id: str) -> int:
        """The coordinator epoch this worker serves ``group_id`` under (-1: not its own)."""
        own = self.fencing.partitions.get(topics.coordinator_partition(group_id))
        return -1 if own is None else own.epoch

    async def send_fences(self) -> None:
        """Append this worker's fence to the coordinator partitions it owns but isn't live on
        yet, once Faust has finished rebalancing (see :mod:`queueflow.engine.fencing`)."""
        sent = await send_due_fences(self.ctx, self.fencing, self.auth, self.request_topic)
        for p, epoch in sent:
            log.info("coordinator_fence_sent", partition=p, coordinator_epoch=epoch)

    def step_down(self, partitions: list[int], reason: str) -> None:
        """Stop serving coordinator ``partitions``: forget their groups and pending admin
        requests (the new coordinator reloads them from the table) and log why."""
        if not partitions:
            return
        self._forget(partitions)
        self.ctx.metrics.coordinator_step_downs.inc(len(partitions))
        log.warning(
            "coordinator_stepped_down",
            partitions=sorted(partitions),
            reason=reason,
            code=ErrorCode.FENCED_STATE_EPOCH.value,
        )

    async def watch_stalls(self, now_monotonic_ms: int) -> None:
        """The stall guard (called every 100 ms, as the leaders'): step down after a stall
        longer than the Faust session timeout, take the partitions back if the membership
        survived it, send own fences that are due."""
        stalled = self.fencing.alive(now_monotonic_ms)
        if stalled:
            self.step_down(stalled, self.fencing.partitions[stalled[0]].fenced or "stalled")
        runtime = self.ctx.runtime
        for p in self.fencing.resume_after_stall(
            now_monotonic_ms, runtime.generation, runtime.rebalancing
        ):
            log.info(
                "coordinator_resumed_after_stall",
                partition=p,
                coordinator_epoch=self.fencing.partitions[p].epoch,
            )
        await self.send_fences()

    def _on_fence(self, partition: int, epoch: int) -> None:
        outcome = self.fencing.on_fence(partition, epoch)
        if outcome is FenceOutcome.LIVE:
            log.info("coordinator_live", partition=partition, coordinator_epoch=epoch)
        elif outcome is FenceOutcome.SUPERSEDED:
            self.step_down([partition], self.fencing.partitions[partition].fenced or "fenced")

    async def _may_serve(self, partition: int, message: protocol.Message) -> bool:
        """Whether this worker may handle ``message`` of coordinator ``partition``: it owns the
        partition, has not stepped down, and its membership lease holds (waiting up to
        :attr:`lease_wait_ms` for the first heartbeat of a new generation). Otherwise the
        request is skipped (``coordinator_request_unserved``, rate-limited; counted)."""
        reason = None
        deadline = self.ctx.clock.monotonic() + self.lease_wait_ms / 1000
        while True:
            try:
                self.fencing.check(partition)
            except ShareGroupError as exc:
                reason, detail = "not_owner", exc.message
                break
            remaining = self.ctx.runtime.lease_remaining_ms()
            if remaining is None or remaining > 0:
                return True
            if self.ctx.clock.monotonic() >= deadline:
                reason = "lease"
                detail = (
                    "this worker's Faust group membership is not proven by a recent heartbeat "
                    "(it was frozen or cut off from the broker, and has probably been replaced)"
                )
                break
            await asyncio.sleep(_LEASE_POLL_S)
        self.ctx.metrics.coordinator_unserved.labels(reason).inc()
        suppressed = self.unserved.admit()
        if suppressed is not None:
            log.warning(
                "coordinator_request_unserved",
                partition=partition,
                kind=getattr(message, "kind", "?"),
                reason=reason,
                detail=detail,
                suppressed=suppressed,
            )
        return False

    async def handle(self, partition: int, offset: int, value: bytes) -> None:
        """Handle one record of the coordinator topic (``partition``, ``offset``: its position).

        Never raises: a bad or failed request is logged and skipped.
        """
        try:
            await self._handle(partition, value)
        except Exception:
            log.exception("coordinator_request_failed", partition=partition, offset=offset)

    def _group(self, group_id: str) -> ShareGroup:
        group = self.groups.get(group_id)
        if group is None:
            s = self.ctx.settings
            raw = self.table.get(group_id.encode())
            if raw is None:
                group = ShareGroup(group_id, s.session_timeout_ms, s.max_size)
            else:
                group = group_codec.decode_group(
                    group_id, raw, s.session_timeout_ms, s.max_size, self.ctx.clock.now_ms()
                )
                self._logged_assignor[group_id] = group.assignor
            group.assignor_preference = self.assignors
            self._refreshed_at[group_id] = self.ctx.clock.now_ms()
            group.session_timeout_ms = group_configs.effective(self.ctx, group).session_timeout_ms
            self.groups[group_id] = group
            self._epochs_counted[group_id] = group.group_epoch
        return group

    def _refresh(self, group: ShareGroup, now: int) -> None:
        """Every ``queueflow.assignor.refresh.interval.ms``, recompute a group's assignment with
        the lag and racks known now; rebalance if it changed (ShareGroup.refresh)."""
        interval = self.ctx.settings.assignor_refresh_interval_ms
        last = self._refreshed_at.setdefault(group.group_id, now)
        if interval <= 0 or now - last < interval:
            return
        self._refreshed_at[group.group_id] = now
        if group.refresh():
            self._persist(group, reason=f"{group.assignor} assignment inputs changed")

    def _feed(self, group: ShareGroup, now: int) -> None:
        """Give the group the lag its leaders reported lately (older reports, or none: the
        share-partition's lag is unknown to the assignors)."""
        reports = self.lag.get(group.group_id, {})
        group.lag = {
            TopicPartition(t, p): lag
            for (t, p), (lag, at) in reports.items()
            if now - at <= LAG_TTL_MS
        }

    def _persist(self, group: ShareGroup, reason: str | None = None) -> None:
        """Store ``group`` and update its gauges; with ``reason`` (its epoch or membership
        changed) also log ``share_group_epoch``."""
        self.table[group.group_id.encode()] = group_codec.encode_group(group)
        if reason is not None:
            log.info(
                "share_group_epoch",
                group=group.group_id,
                group_epoch=group.group_epoch,
                members=len(group.members),
                state=group.state.value,
                reason=reason,
            )
        m, group_id = self.ctx.metrics, group.group_id
        m.group_members.labels(group_id).set(len(group.members))
        m.group_epoch.labels(group_id).set(group.group_epoch)
        bumps = group.group_epoch - self._epochs_counted.get(group_id, group.group_epoch)
        if bumps > 0:
            m.group_rebalances.labels(group_id).inc(bumps)
        self._epochs_counted[group_id] = group.group_epoch
        if self._logged_assignor.get(group_id) != group.assignor:
            self._logged_assignor[group_id] = group.assignor
            selection = group.selection
            log.info(
                "assignor_selected",
                group=group_id,
                assignor=group.assignor,
                reason=selection.reason if selection is not None else "stored",
                members=len(group.members),
                group_epoch=group.group_epoch,
            )

    async def _handle(self, partition: int, value: bytes) -> None:
        try:
            message = protocol.decode(self.auth.open(value))
            self.auth.check_sender(message)
        except ShareGroupError as exc:
            suppressed = self.skipped.admit()
            if suppressed is not None:
                log.error("undecodable_coordinator_request", error=str(exc), suppressed=suppressed)
            return
        if isinstance(message, protocol.Fence):
            self._on_fence(partition, message.leader_epoch)
            return
        if not await self._may_serve(partition, message):
            return
        now = self.ctx.clock.now_ms()
        gap = now - self._last_event_ms
        self._last_event_ms = now
        settings = self.ctx.settings
        # Members heartbeat and the ticker ticks at their intervals; a longer silence means this
        # coordinator was not running (broker outage, pause, rebalance): members could not
        # heartbeat either, so that time doesn't count against their sessions.
        expected_gap_ms = max(settings.heartbeat_interval_ms, settings.lock_check_interval_ms)
        if self._last_event_ms and gap > 2 * expected_gap_ms:
            for group in self.groups.values():
                group.touch_all(now)
        await self._expire_pending(now)
        if isinstance(message, protocol.ResetSharePartitionResult):
            await self._on_reset_result(message)
            return
        if isinstance(
            message, protocol.DescribeGroupConfigsRequest | protocol.AlterGroupConfigsRequest
        ):
            await self._on_group_configs(message, now)
            return
        if isinstance(
            message,
            protocol.AlterShareGroupOffsetsRequest
            | protocol.DeleteShareGroupOffsetsRequest
            | protocol.DeleteShareGroupRequest,
        ):
            await self._on_admin(message, now)
            return
        if isinstance(message, protocol.Tick):
            for group in list(self.groups.values()):
                self._feed(group, now)
                released = group.expire(now)
                if released:
                    for member_id, _ in released:
                        log.warning(
                            "member_session_expired",
                            group=group.group_id,
                            member_id=member_id,
                            session_timeout_ms=group.session_timeout_ms,
                        )
                    self._persist(group)
                    await self._release(group, released, "session timeout")
                self._refresh(group, now)
            return
        if isinstance(message, protocol.LeaderAnnouncement):
            self._on_announcement(message, now)
            return
        if not isinstance(message, protocol.HeartbeatRequest):
            log.error("unexpected_coordinator_message", kind=type(message).__name__)
            return
        response = protocol.HeartbeatResponse(
            member_id=message.member_id,
            request_id=message.request_id,
            heartbeat_interval_ms=self.ctx.settings.heartbeat_interval_ms,
            coordinator_epoch=self.epoch(message.group),
        )
        if message.protocol_version not in protocol.SUPPORTED_PROTOCOL_VERSIONS:
            supported = protocol.SUPPORTED_PROTOCOL_VERSIONS
            response.error = ErrorCode.UNSUPPORTED_VERSION.value
            response.error_message = (
                f"member protocol version {message.protocol_version} is not supported by this "
                f"coordinator (versions {supported.start}..{supported.stop - 1}); run the same "
                "queueflow version on the leaders and members, or upgrade the leaders first"
            )
            log.warning(
                "unsupported_protocol_version",
                group=message.group,
                member_id=message.member_id,
                protocol_version=message.protocol_version,
            )
            await self._reply(message, response)
            return
        if len(message.reply_key) not in (0, PUBLIC_KEY_BYTES):
            response.error = ErrorCode.INVALID_REQUEST.value
            response.error_message = (
                f"reply_key must be a {PUBLIC_KEY_BYTES}-byte X25519 public key, got "
                f"{len(message.reply_key)} bytes"
            )
            await send_reply(  # unsealed: there is no key to seal it to
                self.ctx,
                message.member_id,
                message.reply_partition,
                self.auth.seal(protocol.encode(response)),
            )
            return
        try:
            group = self._group(message.group)
        except ShareGroupError as exc:  # corrupt group metadata: answer, don't go silent
            log.error("share_group_refused", group=message.group, error=str(exc))
            response.error, response.error_message = exc.code.value, exc.message
            await self._reply(message, response)
            return
        config = group_configs.effective(self.ctx, group)
        response.heartbeat_interval_ms = config.heartbeat_interval_ms
        epoch_before, members_before = group.group_epoch, len(group.members)
        pending = self.pending.get(group.group_id)
        if pending is not None and message.member_id not in group.members:
            response.error = ErrorCode.REQUEST_TIMED_OUT.value  # retriable: the member retries
            response.error_message = (
                f"share group {group.group_id!r} is being changed by an admin request "
                f"({pending.operation}); retry the join"
            )
            await self._reply(message, response)
            return
        try:
            counts = await self.ctx.topic_metadata.partition_counts(list(message.subscribed_topics))
            self._feed(group, now)
            await self._feed_racks(group, message)
            result = group.heartbeat(
                message.member_id,
                message.member_epoch,
                message.subscribed_topics,
                now,
                counts,
                message.client_id,
                message.host,
                message.assignors,
                message.rack_id,
            )
            response.member_epoch = result.member_epoch
            response.assignment = {}
            for t, p in result.assignment:
                response.assignment.setdefault(t, []).append(p)
            response.leaders = self._addresses(result.assignment, now)
            if result.member_epoch > 0:  # not a leave: the member's proof for the leaders
                response.ticket = issue_ticket(
                    self.ticket_key,
                    group=group.group_id,
                    member_id=message.member_id,
                    member_epoch=result.member_epoch,
                    partitions=((t, p) for t, p in result.assignment),
                    ttl_ms=group.session_timeout_ms,
                    now_ms=now,
                    coordinator_epoch=response.coordinator_epoch,
                    reply_key=message.reply_key,
                    config_version=group.config_version,
                    configs=group_configs.ticket_configs(self.ctx, group),
                    added_partitions=sorted(group.added_partitions.items()),
                )
            if result.released:
                await self._release(group, result.released, "member left")
        except ShareGroupError as exc:
            response.error, response.error_message = exc.code.value, exc.message
        if group.group_epoch != epoch_before or len(group.members) != members_before:
            self._persist(group, reason="membership")
        await self._reply(message, response)

    async def _feed_racks(self, group: ShareGroup, message: protocol.HeartbeatRequest) -> None:
        """Give the group the racks of its partitions' leader brokers (the ``rack`` assignor's
        input), when a member has a rack and the host can tell (``partition_racks``; cached).
        A failure leaves the racks unknown: the assignor then only spreads racks."""
        lookup = getattr(self.ctx.topic_metadata, "partition_racks", None)
        has_rack = bool(message.rack_id) or any(m.rack_id for m in group.members.values())
        if lookup is None or not has_rack:
            return
        names = sorted(group.subscribed_topics() | set(message.subscribed_topics))
        try:
            group.partition_racks = await lookup(names)
        except Exception as exc:  # metadata is a refinement: never fail a heartbeat on it
            log.warning("partition_racks_unavailable", group=group.group_id, error=repr(exc))

    def _on_announcement(self, message: protocol.LeaderAnnouncement, now: int) -> None:
        """Remember a leader's direct endpoint; a higher leader epoch (a later Faust generation)
        replaces a lower one, and an equal one refreshes it. Its lag reports are kept."""
        for group_id, partition, lag in message.lag:
            self.lag.setdefault(group_id, {})[(message.topic, partition)] = (lag, now)
        for partition in message.partitions:
            key = (message.topic, partition)
            known = self.leader_addresses.get(key)
            if known is None or message.leader_epoch >= known[0] or self._expired(known, now):
                if known is None or known[1] != message.address:
                    log.info(
                        "share_partition_leader",
                        topic=message.topic,
                        partition=partition,
                        address=message.address,
                        leader_epoch=message.leader_epoch,
                    )
                self.leader_addresses[key] = (message.leader_epoch, message.address, now)

    @staticmethod
    def _expired(known: tuple[int, str, int], now: int) -> bool:
        # Not refreshed for three announcement periods: its worker is gone or no longer leads.
        return now - known[2] > LEADER_ADDRESS_TTL_MS

    def _addresses(
        self, assignment: Iterable[TopicPartition], now: int
    ) -> list[tuple[str, int, str]]:
        """``(topic, partition, address)`` of the assigned share-partitions' leaders."""
        out = []
        for tp in assignment:
            known = self.leader_addresses.get((tp.topic, tp.partition))
            if known is not None and not self._expired(known, now):
                out.append((tp.topic, tp.partition, known[1]))
        return out

    async def _reply(
        self, request: protocol.HeartbeatRequest, response: protocol.HeartbeatResponse
    ) -> None:
        await send_reply(
            self.ctx,
            request.member_id,
            request.reply_partition,
            self.auth.seal(protocol.encode(response)),
            request.reply_key,
        )

    async def _release(
        self, group: ShareGroup, released: list[tuple[str, list[TopicPartition]]], reason: str
    ) -> None:
        """Tell the leaders of every partition of the group's topics to release the members'
        records (a member may hold records of partitions it was assigned earlier), and to refuse
        their tickets issued up to now (``member_epoch``: the group epoch, which every later
        ticket of a rejoining member exceeds)."""
        names = sorted(group.partitions)
        for member_id, _assignment in released:
            for name in names:
                for partition in range(group.partitions[name]):
                    message = protocol.ReleaseMember(
                        group.group_id,
                        name,
                        partition,
                        member_id,
                        reason,
                        member_epoch=group.group_epoch,
                        coordinator_epoch=self.epoch(group.group_id),
                    )
                    await self.ctx.sender.send(
                        topics.fetch_topic(self.ctx.namespace, name),
                        partition,
                        self.auth.seal(protocol.encode(message)),
                    )

    # -- admin requests ----------------------------------------------------------------------
    async def _on_admin(
        self,
        message: protocol.AlterShareGroupOffsetsRequest
        | protocol.DeleteShareGroupOffsetsRequest
        | protocol.DeleteShareGroupRequest,
        now: int,
    ) -> None:
        """Check an admin request and forward it to the share-partitions' leaders (see the
        module docstring); refusals are answered at once and change nothing."""
        response = protocol.AdminResponse(message.admin_id, message.request_id)
        if _admin_expired(message, now):
            return
        try:
            group = await self._admin_group(message.group, now)
            if isinstance(message, protocol.AlterShareGroupOffsetsRequest):
                operation = "alter offsets"
                targets = await self._alter_targets(group, message.offsets)
            elif isinstance(message, protocol.DeleteShareGroupOffsetsRequest):
                operation = "delete offsets"
                self._check_topics(group, message.topics)
                targets = {
                    (t, p): None for t in sorted(set(message.topics))
                    for p in range(group.partitions[t])
                }  # fmt: skip
            else:
                operation = "delete group"
                targets = {
                    (t, p): None for t in sorted(group.partitions)
                    for p in range(group.partitions[t])
                }  # fmt: skip
        except ShareGroupError as exc:
            _refuse_admin(message, response, exc)
            await self._answer_admin(message.admin_id, message.reply_partition, response)
            return
        pending = _PendingAdmin(
            message, operation, set(targets), message.deadline_ms or now + _ADMIN_DEADLINE_MS
        )
        log.info(
            "share_group_admin_request",
            group=group.group_id,
            operation=operation,
            admin_id=message.admin_id,
            share_partitions=len(targets),
        )
        if not targets:
            await self._finish_admin(pending)
            return
        self.pending[group.group_id] = pending
        for (topic, partition), start in sorted(targets.items()):
            reset = protocol.ResetSharePartition(
                group=group.group_id,
                topic=topic,
                partition=partition,
                admin_id=message.admin_id,
                request_id=message.request_id,
                start_offset=start,
                deadline_ms=pending.deadline_ms,
                coordinator_epoch=self.epoch(group.group_id),
            )
            await self.ctx.sender.send(
                topics.fetch_topic(self.ctx.namespace, topic),
                partition,
                self.auth.seal(protocol.encode(reset)),
            )

    async def _on_group_configs(
        self,
        message: protocol.DescribeGroupConfigsRequest | protocol.AlterGroupConfigsRequest,
        now: int,
    ) -> None:
        """Describe or alter a group's configs (issue #14): the group must exist; an alter is
        validated against the broker-level bounds as a whole (``INVALID_CONFIG``: nothing
        changes), stored with the group under a new config version, and answered with every
        config after it. The session timeout applies at once, the heartbeat interval at the
        members' next heartbeat, the leaders' configs with the tickets of their next
        heartbeat."""
        response = protocol.AdminResponse(message.admin_id, message.request_id)
        if _admin_expired(message, now):
            return
        try:
            group = self._existing_group(message.group)
            if isinstance(message, protocol.AlterGroupConfigsRequest):
                try:
                    dynamic = validate_group_configs(
                        message.set_configs,
                        self.ctx.settings,
                        base=group.configs,
                        delete=message.delete_configs,
                        defaults=self.ctx.group_configs.get(group.group_id, {}),
                    )
                except ConfigurationError as exc:
                    raise ShareGroupError(ErrorCode.INVALID_CONFIG, str(exc)) from None
                if dynamic != group.configs:
                    group.configs = dynamic
                    group.config_version += 1
                    group.session_timeout_ms = group_configs.effective(
                        self.ctx, group
                    ).session_timeout_ms
                    self._persist(group)
                log.info(
                    "share_group_configs_altered",
                    group=group.group_id,
                    admin_id=message.admin_id,
                    set=message.set_configs,
                    deleted=message.delete_configs,
                    config_version=group.config_version,
                )
            response.configs = [
                (e.name, e.value, e.source, e.synonym)
                for e in group_configs.describe(self.ctx, group)
            ]
        except ShareGroupError as exc:
            _refuse_admin(message, response, exc)
        await self._answer_admin(message.admin_id, message.reply_partition, response)

    def _existing_group(self, group_id: str) -> ShareGroup:
        """The group an admin request names (``GROUP_ID_NOT_FOUND`` if it was never stored)."""
        if group_id not in self.groups and self.table.get(group_id.encode()) is None:
            raise ShareGroupError(
                ErrorCode.GROUP_ID_NOT_FOUND, f"share group {group_id!r} does not exist"
            )
        return self._group(group_id)

    async def _admin_group(self, group_id: str, now: int) -> ShareGroup:
        """The group an admin request names, which must exist and be empty (members whose
        session lapsed are expired first, as a tick would)."""
        if group_id in self.pending:
            raise ShareGroupError(
                ErrorCode.INVALID_REQUEST,
                f"another admin request on share group {group_id!r} is in progress; retry",
            )
        group = self._existing_group(group_id)
        self._feed(group, now)
        released = group.expire(now) if group.members else []
        if released:
            self._persist(group)
            await self._release(group, released, "session timeout")
        if group.members:
            raise ShareGroupError(
                ErrorCode.NON_EMPTY_GROUP,
                f"share group {group_id!r} is not empty: it has {len(group.members)} "
                "member(s); stop its consumers (or wait for their sessions to time out) first",
            )
        return group

    @staticmethod
    def _check_topics(group: ShareGroup, names: Iterable[str]) -> None:
        unknown = sorted({t for t in names if t not in group.partitions})
        if unknown:
            known = ", ".join(sorted(group.partitions)) or "none"
            raise ShareGroupError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"share group {group.group_id!r} has no share-partitions of topic(s) "
                f"{', '.join(unknown)} (its topics: {known})",
            )

    async def _alter_targets(
        self, group: ShareGroup, offsets: list[tuple[str, int, int]]
    ) -> dict[tuple[str, int], int | None]:
        self._check_topics(group, (t for t, _, _ in offsets))
        counts = await self.ctx.topic_metadata.partition_counts(sorted({t for t, _, _ in offsets}))
        targets: dict[tuple[str, int], int | None] = {}
        for topic, partition, start in offsets:
            count = max(counts.get(topic, 0), group.partitions[topic])
            if not 0 <= partition < count:
                raise ShareGroupError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"topic {topic!r} has no partition {partition} (partitions 0..{count - 1})",
                )
            if start < 0:
                raise ShareGroupError(
                    ErrorCode.INVALID_REQUEST,
                    f"start offset of {topic}[{partition}] must be >= 0, got {start}",
                )
            targets[(topic, partition)] = start
        return targets

    async def _on_reset_result(self, message: protocol.ResetSharePartitionResult) -> None:
        pending = self.pending.get(message.group)
        key = (message.topic, message.partition)
        if (
            pending is None
            or (pending.request.admin_id, pending.request.request_id)
            != (message.admin_id, message.request_id)
            or key not in pending.waiting
        ):
            return  # late (the request timed out) or repeated
        pending.waiting.discard(key)
        pending.results[key] = message
        if not pending.waiting:
            del self.pending[message.group]
            await self._finish_admin(pending)

    async def _finish_admin(self, pending: _PendingAdmin) -> None:
        """Answer the admin; a successful group deletion also deletes the group's metadata,
        and a successful offsets deletion forgets the topics."""
        request = pending.request
        response = protocol.AdminResponse(request.admin_id, request.request_id)
        failed = []
        for (topic, partition), result in sorted(pending.results.items()):
            response.results.append(
                (topic, partition, result.error, result.error_message, result.start_offset)
            )
            if result.error != ErrorCode.NONE.value:
                failed.append(result)
        if failed:
            response.error = failed[0].error
            response.error_message = (
                f"{len(failed)} of {len(pending.results)} share-partitions refused the "
                f"{pending.operation}: "
                + "; ".join(f"{r.topic}[{r.partition}]: {r.error_message}" for r in failed)
            )
        elif isinstance(request, protocol.DeleteShareGroupRequest):
            self.groups.pop(request.group, None)
            self.lag.pop(request.group, None)
            if self.table.get(request.group.encode()) is not None:
                del self.table[request.group.encode()]
            self.ctx.metrics.group_members.labels(request.group).set(0)
        elif isinstance(request, protocol.DeleteShareGroupOffsetsRequest):
            group = self._group(request.group)
            for topic in request.topics:
                group.partitions.pop(topic, None)
                group.added_partitions.pop(topic, None)
            self._persist(group)
        log.info(
            "share_group_admin_done",
            group=request.group,
            operation=pending.operation,
            admin_id=request.admin_id,
            error=response.error,
        )
        await self._answer_admin(request.admin_id, request.reply_partition, response)

    async def _expire_pending(self, now: int) -> None:
        """Give up on admin requests past their deadline: joins are allowed again (the leaders
        refuse a reset they read later), and the admin is told which share-partitions'
        leaders did not answer (``REQUEST_TIMED_OUT``) and what the others did."""
        for group_id, pending in list(self.pending.items()):
            if now <= pending.deadline_ms:
                continue
            del self.pending[group_id]
            unanswered = sorted(f"{t}[{p}]" for t, p in pending.waiting)
            log.warning(
                "share_group_admin_timed_out",
                group=group_id,
                operation=pending.operation,
                admin_id=pending.request.admin_id,
                unanswered=unanswered,
            )
            request = pending.request
            response = protocol.AdminResponse(
                request.admin_id,
                request.request_id,
                error=ErrorCode.REQUEST_TIMED_OUT.value,
                error_message=(
                    f"the {pending.operation} of share group {group_id!r} timed out: the "
                    f"leaders of {', '.join(unanswered)} did not answer (is a worker leading "
                    "them?); they will not apply it now. " + _applied(pending)
                ),
                results=[
                    (t, p, r.error, r.error_message, r.start_offset)
                    for (t, p), r in sorted(pending.results.items())
                ],
            )
            await self._answer_admin(request.admin_id, request.reply_partition, response)

    async def _answer_admin(
        self, admin_id: str, reply_partition: int, response: protocol.AdminResponse
    ) -> None:
        await send_reply(
            self.ctx, admin_id, reply_partition, self.auth.seal(protocol.encode(response))
        )


def _applied(pending: _PendingAdmin) -> str:
    done = sorted(
        f"{t}[{p}]" for (t, p), r in pending.results.items() if r.error == ErrorCode.NONE.value
    )
    return f"Applied to: {', '.join(done)}." if done else "Nothing was applied."


#: How long (ms) an admin request without a deadline holds joins back at most.
_ADMIN_DEADLINE_MS = 30_000


@dataclass(slots=True)
class _PendingAdmin:
    """An admin request forwarded to leaders: which share-partitions have yet to answer."""

    request: (
        protocol.AlterShareGroupOffsetsRequest
        | protocol.DeleteShareGroupOffsetsRequest
        | protocol.DeleteShareGroupRequest
    )
    operation: str
    waiting: set[tuple[str, int]]
    deadline_ms: int
    results: dict[tuple[str, int], protocol.ResetSharePartitionResult] = field(default_factory=dict)


_AdminRequest = (
    protocol.AlterShareGroupOffsetsRequest
    | protocol.DeleteShareGroupOffsetsRequest
    | protocol.DeleteShareGroupRequest
    | protocol.DescribeGroupConfigsRequest
    | protocol.AlterGroupConfigsRequest
)


def _admin_expired(message: _AdminRequest, now: int) -> bool:
    """Whether an admin request was read after its deadline (logged; it is dropped unanswered):
    read again after a restart or rebalance (Faust resumes from its committed offset), or read
    late. Its admin has given up, and applying it now could discard what members did since."""
    if message.deadline_ms and now > message.deadline_ms:
        log.warning(
            "share_group_admin_expired",
            group=message.group,
            kind=message.kind,
            admin_id=message.admin_id,
            late_ms=now - message.deadline_ms,
        )
        return True
    return False


def _refuse_admin(
    message: _AdminRequest, response: protocol.AdminResponse, exc: ShareGroupError
) -> None:
    """Put ``exc`` in the admin's answer and log the refusal (nothing was changed)."""
    response.error, response.error_message = exc.code.value, exc.message
    log.warning(
        "share_group_admin_refused",
        group=message.group,
        kind=message.kind,
        admin_id=message.admin_id,
        error=str(exc),
    )
