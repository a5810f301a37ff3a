"""The share-group coordinator's one dispatcher: :class:`ShareGroupCoordinator`.

It reads each record of its coordinator partitions, opens it, lets the gate
(:mod:`.gate`) decide whether this worker may serve it, ``match``-es the message kind to its
pure handler (:mod:`.membership`, :mod:`.admin`, :mod:`.announcements`), fetches the topic
metadata a heartbeat or an offsets alteration needs, and performs each handler's
:class:`~queueflow.server.coordinator.results.CoordinatorResult`: the only place the coordinator
writes the ``share-groups`` table, sends to leaders and replies.
"""

from __future__ import annotations

import contextlib

import structlog

from queueflow.engine.assignors import check_known, parse_names
from queueflow.engine.fencing import PartitionFencing
from queueflow.engine.group import ShareGroup
from queueflow.errors import ShareGroupError
from queueflow.logging import SkipLogLimiter
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.auth import AuthenticationError
from queueflow.protocol.envelope import topic_dest
from queueflow.protocol.roles import refusal_labels
from queueflow.server.context import ServerContext
from queueflow.server.coordinator import admin, membership
from queueflow.server.coordinator.admin_state import PendingAdmin, ResetRequest
from queueflow.server.coordinator.announcements import handle_announcement
from queueflow.server.coordinator.gate import CoordinatorGate
from queueflow.server.coordinator.member_keys import MemberKeys
from queueflow.server.coordinator.parked_keys import handle_parked_key
from queueflow.server.coordinator.results import (
    CoordinatorResult,
    DeleteGroup,
    PersistGroup,
)
from queueflow.server.coordinator.state import CoordinatorState
from queueflow.server.durable import StateTable
from queueflow.server.junk import JunkGate
from queueflow.server.transport import control_auth, monotonic_ms, send_reply
from queueflow.structs import TopicPartition

__all__ = ["ShareGroupCoordinator"]

log = structlog.get_logger("queueflow.server.coordinator")


class ShareGroupCoordinator:
    """Coordinator of every share group whose coordinator partition this worker owns (KIP-932
    "Share group coordinator"): membership, member epochs and assignment, admin requests, and
    what leaders announce.

    Requests arrive through :meth:`handle`, in log order, from the host's stream of the
    coordinator topic ``<app>-share-coordinator``.

    Args:
        ctx: the server context.
        table: the group metadata table (``share-groups``).

    Raises:
        ConfigurationError: ``group.share.assignors`` names an assignor that isn't registered
            (checked now, so a typo stops the worker at start-up, not at the first rebalance).
    """

    def __init__(self, ctx: ServerContext, table: StateTable) -> None:
        self.ctx = ctx
        self.table = table
        self.request_topic = topics.coordinator_topic(ctx.app_id)
        self.auth = control_auth(ctx, "coordinator")
        #: Member id -> member key bindings (hmac; refuses takeovers).
        self.member_keys = MemberKeys()
        self.skipped = SkipLogLimiter(lambda: monotonic_ms(ctx.clock))
        #: Junk is dropped by its first bytes before any decode or await.
        self.junk = JunkGate(ctx, self.auth, "coordinator", self.request_topic, log)
        assignors = parse_names(ctx.settings.assignors, "group.share.assignors")
        check_known(assignors, "group.share.assignors")
        self.gate = CoordinatorGate(ctx, self.auth, self.request_topic, self._forget)
        self.state = CoordinatorState(ctx, table, self.gate.fencing, assignors)

    # -- what the host and tests read ----------------------------------------------------------
    @property
    def groups(self) -> dict[str, ShareGroup]:
        """The share groups served now, by id (loaded from the table on first use)."""
        return self.state.groups

    @property
    def pending(self) -> dict[str, PendingAdmin]:
        """Admin requests forwarded to leaders and not yet answered, by group."""
        return self.state.pending

    @property
    def lag(self) -> dict[str, dict[tuple[str, int], tuple[int, int]]]:
        """Leaders' lag reports: ``group -> (topic, partition) -> (lag, received wall ms)``."""
        return self.state.directory.lag

    @property
    def leader_addresses(self) -> dict[tuple[str, int], tuple[int, str, int]]:
        """Leaders' direct endpoints: ``(topic, partition) -> (leader epoch, "host:port",
        received wall ms)``."""
        return self.state.directory.addresses

    def live_partitions(self) -> list[tuple[int, int]]:
        """``(coordinator partition, coordinator epoch)`` of the partitions served, live."""
        fencing = self.gate.fencing
        return [
            (p, fencing.partitions[p].epoch) for p in list(fencing.partitions) if fencing.is_live(p)
        ]

    def kafka_coordinator(self, group_id: str, now_ms: int) -> str | None:
        """``host:port`` of the Kafka-protocol listener of the worker serving ``group_id``'s
        coordinator partition, as its announcements named it (None: unknown, or none)."""
        return self.state.directory.kafka_coordinator(
            self.ctx.coordinator_partition(group_id), now_ms
        )

    def kafka_leaders(self, now_ms: int) -> dict[tuple[str, int], tuple[int, str]]:
        """Leaders' Kafka-protocol listeners: ``(topic, partition) -> (leader epoch,
        "host:port")``, as their announcements named them (wall ms ``now_ms``)."""
        return self.state.directory.kafka_leaders(now_ms)

    @property
    def ticket_key(self) -> bytes:
        """The key of the assignment tickets (:mod:`queueflow.server.tickets`)."""
        return self.state.ticket_key

    @property
    def assignors(self) -> tuple[str, ...]:
        """``group.share.assignors``, most preferred first."""
        return self.state.assignors

    @property
    def fencing(self) -> PartitionFencing:
        """The fencing of the coordinator partitions this worker owns."""
        return self.gate.fencing

    @property
    def lease_wait_ms(self) -> int:
        """How long (ms) a request waits for the membership lease before it is skipped."""
        return self.gate.lease_wait_ms

    @lease_wait_ms.setter
    def lease_wait_ms(self, value: int) -> None:
        self.gate.lease_wait_ms = value

    def epoch(self, group_id: str) -> int:
        """The coordinator epoch this worker serves ``group_id`` under (-1: not its own)."""
        return self.state.epoch(group_id)

    # -- ownership (called by the host) --------------------------------------------------------
    def assign(self, partitions: set[int], epoch: int) -> None:
        """Own coordinator ``partitions`` under coordinator epoch ``epoch`` (the Faust consumer
        generation); the stall guard sends its fence once Faust has finished rebalancing."""
        self.gate.assign(partitions, epoch)
        log.info("coordinator_assigned", partitions=sorted(partitions), coordinator_epoch=epoch)

    def revoke(self, partitions: set[int]) -> None:
        """Forget groups whose coordinator partition moved away (and their gauges: the new
        coordinator reports them)."""
        self.gate.revoke(partitions)
        self._forget(sorted(partitions))

    def step_down(self, partitions: list[int], reason: str) -> None:
        """Stop serving coordinator ``partitions`` (see :meth:`CoordinatorGate.step_down`)."""
        self.gate.step_down(partitions, reason)

    async def send_fences(self) -> None:
        """Append this worker's fence to the coordinator partitions it owns but isn't live on
        yet, once Faust has finished rebalancing."""
        await self.gate.send_fences()

    async def watch_stalls(self, now_monotonic_ms: int) -> None:
        """The stall guard, then the fences due (see :meth:`CoordinatorGate.watch_stalls`)."""
        await self.gate.watch_stalls(now_monotonic_ms)

    def check_stalls(self, now_monotonic_ms: int) -> None:
        """The stall guard alone, no I/O (see :meth:`CoordinatorGate.check_stalls`)."""
        self.gate.check_stalls(now_monotonic_ms)

    def _forget(self, partitions: list[int]) -> None:
        m = self.ctx.metrics
        for group_id in self.state.forget(partitions):
            for gauge in (m.group_members, m.group_epoch):
                with contextlib.suppress(KeyError):
                    gauge.remove(group_id)

    # -- requests ------------------------------------------------------------------------------
    async def handle(self, partition: int, offset: int, value: bytes) -> None:
        """Handle one record of the coordinator topic (``partition``, ``offset``: its position).

        Never raises: a bad or failed request is logged and skipped.
        """
        if self.junk.is_junk(partition, value):
            return
        try:
            await self._dispatch(partition, value)
        except Exception:
            log.exception("coordinator_request_failed", partition=partition, offset=offset)

    async def _dispatch(self, partition: int, value: bytes) -> None:
        try:
            message = protocol.decode(
                self.auth.open(value, topic_dest(self.request_topic, partition))
            )
            self.auth.check_sender(message)
            self._bind_member(message)
        except ShareGroupError as exc:
            self.ctx.auth_health.refused(value, getattr(exc, "reason", ""))
            suppressed = self.skipped.admit()
            if suppressed is not None:
                reason, _matches = refusal_labels(exc)
                log.error(
                    "undecodable_coordinator_request",
                    reason=reason,
                    error=str(exc),
                    suppressed=suppressed,
                )
            return
        self.ctx.auth_health.verified(self.auth.last_sender)
        if isinstance(message, protocol.Fence):
            self.gate.on_fence(partition, message.leader_epoch)
            return
        if self._misrouted(partition, message):
            return
        if not await self.gate.may_serve(partition, message):
            return
        now = self.ctx.clock.now_ms()
        membership.touch_after_silence(self.state, now)
        await self.perform(admin.expire_pending(self.state, now))
        match message:
            case protocol.ResetSharePartitionResult():
                await self.perform(admin.handle_reset_result(self.state, message, now))
            case protocol.ParkedKeyRequest():
                await self.perform(handle_parked_key(self.state, message, now))
            case protocol.DescribeGroupConfigsRequest() | protocol.AlterGroupConfigsRequest():
                await self.perform(admin.handle_group_configs(self.state, message, now))
            case (
                protocol.AlterShareGroupOffsetsRequest()
                | protocol.DeleteShareGroupOffsetsRequest()
                | protocol.DeleteShareGroupRequest()
            ):
                await self._admin(message, now)
            case protocol.Tick():
                await self.perform(membership.handle_tick(self.state, now))
            case protocol.LeaderAnnouncement():
                await self.perform(handle_announcement(self.state.directory, message, now))
            case protocol.HeartbeatRequest():
                await self._heartbeat(message, now)
            case protocol.MemberTicketRequest():
                await self.perform(membership.handle_member_ticket(self.state, message, now))
            case _:
                log.error("unexpected_coordinator_message", kind=type(message).__name__)

    def _misrouted(self, partition: int, message: protocol.Message) -> bool:
        """A request for a share group whose coordinator partition is not ``partition`` (its
        sender hashed the group with another partition count: a member of a release before
        the coordinator was sharded, or a coordinator topic re-created with another count) is
        skipped, never served: the group's own partition may be another worker's, and two
        coordinators of one group would each assign its partitions (docs/architecture.md
        "Coordinator sharding"). Logged ``coordinator_request_misrouted`` (rate-limited)."""
        group = getattr(message, "group", None)
        if not isinstance(group, str):
            return False
        expected = self.ctx.coordinator_partition(group)
        if expected == partition:
            return False
        self.ctx.metrics.coordinator_unserved.labels("misrouted").inc()
        suppressed = self.gate.unserved.admit()
        if suppressed is not None:
            log.error(
                "coordinator_request_misrouted",
                group=group,
                partition=partition,
                expected_partition=expected,
                coordinator_partitions=self.ctx.coordinator_partitions,
                kind=getattr(message, "kind", "?"),
                detail="the sender hashed the group to another partition of "
                f"{self.request_topic}: it is of an older release or saw another partition "
                "count; upgrade it (members find the count from the topic's metadata)",
                suppressed=suppressed,
            )
        return True

    def _bind_member(self, message: protocol.Message) -> None:
        """Refuse a member's heartbeat for a member id bound to another member key (a
        takeover; :mod:`queueflow.server.coordinator.member_keys`).

        Raises:
            AuthenticationError: ``wrong_member``.
        """
        opened = self.auth.last
        if not isinstance(message, protocol.HeartbeatRequest) or opened is None:
            return
        if opened.role != "member":
            return
        leaving = message.member_epoch == -1
        if not self.member_keys.bind(
            message.group, message.member_id, opened.member_pub, leaving=leaving
        ):
            raise AuthenticationError(
                "wrong_member",
                f"member {message.member_id!r} of share group {message.group!r} is bound to "
                "another member key: a heartbeat for it from this key is refused",
            )

    async def _heartbeat(self, message: protocol.HeartbeatRequest, now: int) -> None:
        checked = membership.check_heartbeat(self.state, message, now)
        if isinstance(checked, CoordinatorResult):
            await self.perform(checked)
            return
        group = checked
        counts: dict[str, int] | ShareGroupError
        try:
            counts = await self.ctx.topic_metadata.partition_counts(list(message.subscribed_topics))
        except ShareGroupError as exc:
            counts = exc
        racks = None if isinstance(counts, ShareGroupError) else await self._racks(group, message)
        await self.perform(
            membership.handle_heartbeat(self.state, message, group, counts, racks, now)
        )

    async def _racks(
        self, group: ShareGroup, message: protocol.HeartbeatRequest
    ) -> dict[TopicPartition, str] | None:
        """The racks of the group's partitions' leader brokers (the ``rack`` assignor's input),
        when a member has a rack and the host can tell (``partition_racks``; cached). A failure
        leaves them unknown (``None``): the assignor then only spreads racks."""
        lookup = getattr(self.ctx.topic_metadata, "partition_racks", None)
        names = membership.rack_topics(group, message)
        if lookup is None or names is None:
            return None
        try:
            racks: dict[TopicPartition, str] = await lookup(names)
        except Exception as exc:  # metadata is a refinement: never fail a heartbeat on it
            log.warning("partition_racks_unavailable", group=group.group_id, error=repr(exc))
            return None
        return racks

    async def _admin(self, message: ResetRequest, now: int) -> None:
        begun, group = admin.begin_admin(self.state, message, now)
        await self.perform(begun)
        if group is None:
            return
        counts: dict[str, int] | ShareGroupError = {}
        names = admin.count_topics(message)
        if names:
            try:
                counts = await self.ctx.topic_metadata.partition_counts(names)
            except ShareGroupError as exc:
                counts = exc
        await self.perform(admin.forward_admin(self.state, message, group, counts, now))

    async def perform(self, result: CoordinatorResult) -> None:
        """Do what a handler decided: log its events, write its group records (and their
        gauges), send its messages to leaders, then its replies."""
        for event in result.events:
            getattr(log, event.level)(event.event, **event.fields)
        metrics = self.ctx.metrics
        for record in result.records:
            # In the group's own coordinator partition, whichever partition's record led here
            # (a Tick on one partition touches every group this worker coordinates): the
            # table picks the changelog partition from the current event.
            key = record.group_id.encode()
            partition = self.ctx.coordinator_partition(record.group_id)
            with self.ctx.state_scope(self.request_topic, partition):
                match record:
                    case PersistGroup():
                        self.table[key] = record.value
                        metrics.group_members.labels(record.group_id).set(record.members)
                        metrics.group_epoch.labels(record.group_id).set(record.group_epoch)
                        if record.rebalances > 0:
                            metrics.group_rebalances.labels(record.group_id).inc(record.rebalances)
                    case DeleteGroup():
                        if self.table.get(key) is not None:
                            del self.table[key]
                        metrics.group_members.labels(record.group_id).set(0)
        for sent in result.to_leaders:
            topic = topics.request_topic(self.ctx.app_id, sent.message.topic)
            p = sent.message.partition
            body = self.auth.seal(protocol.encode(sent.message), topic_dest(topic, p))
            await self.ctx.sender.send(topic, p, body)
        for reply in result.replies:
            await send_reply(
                self.ctx,
                self.auth,
                reply.recipient,
                reply.reply_partition,
                protocol.encode(reply.message),
                reply.reply_key,
                member=isinstance(reply.message, protocol.HeartbeatResponse),
            )
