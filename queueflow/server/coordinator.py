"""The share-group coordinator: a Faust agent on ``<app>-share-coordinator``.

It handles ShareGroupHeartbeat requests (join, heartbeat, leave) and clock ticks with the pure
:class:`~queueflow.engine.group.ShareGroup` state machine, keeps group metadata in the
``share-groups`` Faust table (so a new coordinator picks up where the old one stopped), and tells
share-partition leaders to release the records of members that left or timed out
(:class:`~queueflow.protocol.messages.ReleaseMember`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import structlog

from queueflow import metrics
from queueflow.engine.assignor import TopicPartition
from queueflow.engine.group import ShareGroup
from queueflow.errors import ShareGroupError
from queueflow.kafka.admin import TopicMetadata
from queueflow.member.client import now_ms
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.server.leader import raw_table, send_control, send_reply

if TYPE_CHECKING:
    from faust.types import EventT, StreamT

    from queueflow.faust_app import App

log = structlog.get_logger("queueflow.server.coordinator")


class ShareGroupCoordinator:
    """Coordinator of every share group whose coordinator partition this worker owns."""

    def __init__(self, app: App, metadata: TopicMetadata) -> None:
        self.app = app
        self.metadata = metadata
        self.topic = app.topic(
            topics.coordinator_topic(app.share_namespace),
            internal=True,
            partitions=topics.COORDINATOR_PARTITIONS,
            key_serializer="raw",
            value_serializer="raw",
            config=topics.CONTROL_TOPIC_CONFIG,
        )
        self.table = raw_table(app, topics.GROUPS_TABLE, partitions=topics.COORDINATOR_PARTITIONS)
        self.groups: dict[str, ShareGroup] = {}
        self._last_event_ms = now_ms()
        self.agent = app.agent(self.topic, name="share-group-coordinator")(self._run)

    def revoke(self, partitions: set[int]) -> None:
        """Forget groups whose coordinator partition moved away."""
        for group_id in [g for g in self.groups if topics.coordinator_partition(g) in partitions]:
            del self.groups[group_id]

    async def _run(self, stream: StreamT[Any]) -> None:
        async for event in stream.events():
            try:
                await self._handle(event)
            except Exception:
                log.exception("coordinator_request_failed")

    def _group(self, group_id: str) -> ShareGroup:
        group = self.groups.get(group_id)
        if group is None:
            s = self.app.share_settings
            raw = self.table.get(group_id.encode())
            if raw is None:
                group = ShareGroup(group_id, s.session_timeout_ms, s.max_size)
            else:
                group = ShareGroup.from_dict(
                    group_id, json.loads(raw), s.session_timeout_ms, s.max_size, now_ms()
                )
            self.groups[group_id] = group
        return group

    def _persist(self, group: ShareGroup) -> None:
        self.table[group.group_id.encode()] = json.dumps(group.to_dict()).encode()
        metrics.GROUP_MEMBERS.labels(group.group_id).set(len(group.members))
        metrics.GROUP_EPOCH.labels(group.group_id).set(group.group_epoch)

    async def _handle(self, event: EventT[Any]) -> None:
        try:
            message = protocol.decode(event.value)
        except ShareGroupError as exc:
            log.error("undecodable_coordinator_request", error=str(exc))
            return
        now = now_ms()
        gap = now - self._last_event_ms
        self._last_event_ms = now
        if self._last_event_ms and gap > 2 * self.app.share_settings.heartbeat_interval_ms:
            # This coordinator was not running (broker outage, pause, rebalance): members could
            # not heartbeat either, so that time doesn't count against their sessions.
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
        if not isinstance(message, protocol.HeartbeatRequest):
            log.error("unexpected_coordinator_message", kind=message.kind)
            return
        response = protocol.HeartbeatResponse(
            member_id=message.member_id,
            request_id=message.request_id,
            heartbeat_interval_ms=self.app.share_settings.heartbeat_interval_ms,
        )
        try:
            group = self._group(message.group)
        except ShareGroupError as exc:  # corrupt group metadata: answer, don't go silent
            log.error("share_group_refused", group=message.group, error=str(exc))
            response.error, response.error_message = exc.code.value, exc.message
            await self._reply(message, response)
            return
        epoch_before, members_before = group.group_epoch, len(group.members)
        try:
            counts = await self.metadata.partition_counts(list(message.subscribed_topics))
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

    async def _reply(
        self, request: protocol.HeartbeatRequest, response: protocol.HeartbeatResponse
    ) -> None:
        await send_reply(
            self.app, request.member_id, request.reply_partition, protocol.encode(response)
        )

    async def _release(
        self, group: ShareGroup, released: list[tuple[str, list[TopicPartition]]], reason: str
    ) -> None:
        """Tell the leaders of every partition of the group's topics to release the members'
        records (a member may hold records of partitions it was assigned earlier)."""
        names = sorted(group.partitions)
        for member_id, _assignment in released:
            for name in names:
                for partition in range(group.partitions[name]):
                    message = protocol.ReleaseMember(
                        group.group_id, name, partition, member_id, reason
                    )
                    await send_control(
                        self.app,
                        topics.fetch_topic(self.app.share_namespace, name),
                        partition,
                        protocol.encode(message),
                    )
