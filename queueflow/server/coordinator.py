"""The share-group coordinator, served from the coordinator topic ``<app>-share-coordinator``.

It handles ShareGroupHeartbeat requests (join, heartbeat, leave) and clock ticks with the pure
:class:`~queueflow.engine.group.ShareGroup` state machine, keeps group metadata in the
``share-groups`` Faust table (so a new coordinator picks up where the old one stopped), and tells
share-partition leaders to release the records of members that left or timed out
(:class:`~queueflow.protocol.messages.ReleaseMember`).
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from queueflow.engine.group import ShareGroup
from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.protocol import group_codec, topics
from queueflow.protocol import messages as protocol
from queueflow.protocol.auth import SkipLogLimiter, issue_ticket, ticket_key
from queueflow.server.context import ServerContext
from queueflow.server.durable import StateTable
from queueflow.server.leader import control_auth, monotonic_ms, send_reply
from queueflow.structs import TopicPartition

__all__ = ["ShareGroupCoordinator"]

log = structlog.get_logger("queueflow.server.coordinator")

#: A leader address not announced again within this many ms is no longer handed out (leaders
#: announce every 2 s; see :mod:`queueflow.server.endpoint`).
LEADER_ADDRESS_TTL_MS = 6000


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
        self.ticket_key = ticket_key(s.auth_mode, s.auth_secret, ctx.namespace)
        self.skipped = SkipLogLimiter(lambda: monotonic_ms(ctx.clock))
        #: Direct endpoints of share-partition leaders, from their announcements:
        #: ``(topic, partition) -> (leader epoch, "host:port", received wall ms)``.
        self.leader_addresses: dict[tuple[str, int], tuple[int, str, int]] = {}
        self._last_event_ms = ctx.clock.now_ms()

    def revoke(self, partitions: set[int]) -> None:
        """Forget groups whose coordinator partition moved away."""
        for group_id in [g for g in self.groups if topics.coordinator_partition(g) in partitions]:
            del self.groups[group_id]

    async def handle(self, partition: int, offset: int, value: bytes) -> None:
        """Handle one record of the coordinator topic (``partition``, ``offset``: its position).

        Never raises: a bad or failed request is logged and skipped.
        """
        try:
            await self._handle(value)
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
            self.groups[group_id] = group
        return group

    def _persist(self, group: ShareGroup) -> None:
        self.table[group.group_id.encode()] = group_codec.encode_group(group)
        self.ctx.metrics.group_members.labels(group.group_id).set(len(group.members))
        self.ctx.metrics.group_epoch.labels(group.group_id).set(group.group_epoch)

    async def _handle(self, value: bytes) -> None:
        try:
            message = protocol.decode(self.auth.open(value))
            self.auth.check_sender(message)
        except ShareGroupError as exc:
            suppressed = self.skipped.admit()
            if suppressed is not None:
                log.error("undecodable_coordinator_request", error=str(exc), suppressed=suppressed)
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
        if isinstance(message, protocol.Tick):
            for group in list(self.groups.values()):
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
        try:
            group = self._group(message.group)
        except ShareGroupError as exc:  # corrupt group metadata: answer, don't go silent
            log.error("share_group_refused", group=message.group, error=str(exc))
            response.error, response.error_message = exc.code.value, exc.message
            await self._reply(message, response)
            return
        epoch_before, members_before = group.group_epoch, len(group.members)
        try:
            counts = await self.ctx.topic_metadata.partition_counts(list(message.subscribed_topics))
            result = group.heartbeat(
                message.member_id,
                message.member_epoch,
                message.subscribed_topics,
                now,
                counts,
                message.client_id,
                message.host,
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
                )
            if result.released:
                await self._release(group, result.released, "member left")
        except ShareGroupError as exc:
            response.error, response.error_message = exc.code.value, exc.message
        if group.group_epoch != epoch_before or len(group.members) != members_before:
            self._persist(group)
            log.info(
                "share_group_epoch",
                group=group.group_id,
                group_epoch=group.group_epoch,
                members=len(group.members),
                state=group.state.value,
            )
        await self._reply(message, response)

    def _on_announcement(self, message: protocol.LeaderAnnouncement, now: int) -> None:
        """Remember a leader's direct endpoint; a higher leader epoch (a later Faust generation)
        replaces a lower one, and an equal one refreshes it."""
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
            known = self.leader_addresses.get((tp[0], tp[1]))
            if known is not None and not self._expired(known, now):
                out.append((tp[0], tp[1], known[1]))
        return out

    async def _reply(
        self, request: protocol.HeartbeatRequest, response: protocol.HeartbeatResponse
    ) -> None:
        await send_reply(
            self.ctx,
            request.member_id,
            request.reply_partition,
            self.auth.seal(protocol.encode(response)),
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
                    )
                    await self.ctx.sender.send(
                        topics.fetch_topic(self.ctx.namespace, name),
                        partition,
                        self.auth.seal(protocol.encode(message)),
                    )
