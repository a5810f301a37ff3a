"""Membership of one member in its share group (KIP-932 ShareGroupHeartbeat).

Join (member epoch 0), heartbeat every ``group.share.heartbeat.interval.ms`` with the current
epoch, leave (epoch -1). The coordinator answers each heartbeat with the member's epoch and its
assigned share-partitions; :attr:`Membership.assignment` follows the last answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import Iterable

import stamina
import structlog
from aiokafka.errors import KafkaError

from queueflow.engine.fencing import CoordinatorEpochs
from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.logging import get_logger
from queueflow.member.lifecycle import MEMBERSHIP_TRANSITIONS, Lifecycle, MembershipState
from queueflow.member.transport import Requester
from queueflow.metrics import Metrics
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics as internal
from queueflow.protocol.roles import ControlAuth
from queueflow.settings import ShareGroupSettings
from queueflow.structs import TopicPartition

__all__ = ["JOIN_ATTEMPTS", "Membership"]

log = structlog.get_logger("queueflow.member.membership")

#: Join attempts while no coordinator answers (e.g. during a leader failover); the waits
#: between them grow 1, 2, 4, 8, 10 s.
JOIN_ATTEMPTS = 6
#: How long (s) a leave may take before the member gives up on it.
LEAVE_TIMEOUT_S = 5.0


def _no_answer(exc: Exception) -> bool:
    return isinstance(exc, ShareGroupError) and exc.code is ErrorCode.REQUEST_TIMED_OUT


class Membership:
    """One member's share-group membership.

    Args:
        requester: sends heartbeats and correlates the answers.
        app_id: the app id whose coordinator serves the group.
        group: the share group id.
        topics: the subscribed topics.
        settings: share-group settings (heartbeat interval).
        client_id: shown by admin tooling.
        member_id: the member id (a new UUID when not given).
        metrics: where refused answers of a superseded coordinator are counted.
        principal: the Kafka principal sent in heartbeats ("": not known).
        sealer: seals the heartbeats instead of the member's own key (``None``): a worker
            running a member for a client it authenticated (the Kafka-protocol listener) sends
            them as the worker, so the member id is bound to no member key at the coordinator
            (the client may join again through another worker's listener with the same id).
    """

    def __init__(
        self,
        requester: Requester,
        app_id: str,
        group: str,
        topics: Iterable[str],
        settings: ShareGroupSettings,
        client_id: str,
        member_id: str | None = None,
        metrics: Metrics | None = None,
        principal: str = "",
        sealer: ControlAuth | None = None,
    ) -> None:
        self.requester = requester
        self.sealer = sealer
        #: The Kafka principal sent in heartbeats (bound into the tickets; "": not known).
        self.principal = principal
        self.metrics = metrics
        #: The newest coordinator epoch heard from: answers of older coordinators are dropped.
        self.coordinators = CoordinatorEpochs(settings.session_timeout_ms)
        self.app_id = app_id
        self.group = group
        self.topics = sorted(set(topics))
        self.settings = settings
        self.client_id = client_id
        self.member_id = member_id or str(uuid.uuid4())
        #: What it advertises (``queueflow.member.assignors``, ``client.rack``): the coordinator
        #: picks an assignor every member supports (queueflow.engine.assignors).
        self.assignors = [n.strip() for n in settings.member_assignors.split(",") if n.strip()]
        self.rack_id = settings.client_rack
        self.member_epoch = 0
        #: The partition of the coordinator topic that coordinates :attr:`group` (set by the
        #: session from the topic's partition count before it joins; see
        #: :meth:`~queueflow.member.context.MemberIO.coordinator_partitions`).
        self.coordinator_partition = 0
        self.assignment: set[TopicPartition] = set()
        #: Set whenever :attr:`assignment` changes.
        self.assignment_changed = asyncio.Event()
        #: The direct endpoints (``host:port``) of the assigned share-partitions' leaders, as
        #: the last heartbeat answer named them (see :mod:`queueflow.member.direct`).
        self.leaders: dict[TopicPartition, str] = {}
        #: The assignment ticket of the last successful heartbeat answer (opaque bytes; empty
        #: before the join and after a leave): attached to every ShareFetch, it proves to the
        #: leaders that this member is in the group at :attr:`member_epoch` with
        #: :attr:`assignment` (see queueflow.server.tickets).
        self.ticket = b""
        #: How often (ms) to heartbeat: the coordinator's ``share.heartbeat.interval.ms`` for
        #: the group from its last answer (KIP-932: the coordinator sets it), until then ours.
        self.heartbeat_interval_ms = settings.heartbeat_interval_ms
        self._refreshing: asyncio.Future[None] | None = None
        self._heartbeats: asyncio.Task[None] | None = None
        self._lifecycle: Lifecycle[MembershipState] = Lifecycle(
            f"membership of member {self.member_id}",
            MembershipState.CREATED,
            MEMBERSHIP_TRANSITIONS,
        )
        self._log = get_logger("queueflow.member.membership", group=group, member_id=self.member_id)

    @property
    def state(self) -> MembershipState:
        """Where the membership is in its lifecycle."""
        return self._lifecycle.state

    async def join(self) -> None:
        """Join, retrying with back-off while no coordinator answers (at most
        :data:`JOIN_ATTEMPTS` attempts within ``queueflow.member.join.timeout.ms``), then
        heartbeat in the background.

        Raises:
            ShareGroupError: the coordinator refused the join, or ``REQUEST_TIMED_OUT`` when no
                coordinator answered in time (no worker of the app leads the group).
        """
        if self._lifecycle.state is MembershipState.CLOSED:  # stopped before it joined
            return
        self._lifecycle.move(MembershipState.JOINING)
        limit_s = self.settings.join_timeout_ms / 1000

        async def attempts() -> None:
            async for attempt in stamina.retry_context(
                on=_no_answer,
                attempts=JOIN_ATTEMPTS,
                timeout=None,
                wait_initial=1.0,
                wait_max=10.0,
                wait_jitter=0.0,
            ):
                with attempt:
                    if attempt.num > 1:
                        self._log.warning("join_retry", attempt=attempt.num - 1)
                    await self._heartbeat(join=True)

        try:
            await asyncio.wait_for(attempts(), limit_s)
        except asyncio.TimeoutError:
            raise ShareGroupError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"no share-group coordinator of app {self.app_id!r} answered the join of "
                f"group {self.group!r} within {limit_s:g} s: start a worker of the app with role "
                "'all' or 'leader', or raise queueflow.member.join.timeout.ms",
            ) from None
        if self.state is MembershipState.CLOSED:  # stopped while it joined
            return
        self._lifecycle.move(MembershipState.JOINED)
        self._heartbeats = asyncio.create_task(self._heartbeat_loop(), name="queueflow-heartbeat")

    async def leave(self) -> None:
        """Leave the group, so its leaders release what this member holds; a failure to leave
        is logged (the session timeout then does it)."""
        self._lifecycle.move(MembershipState.CLOSED)
        await self._stop_heartbeats()
        try:
            await asyncio.wait_for(self._heartbeat(leave=True), timeout=LEAVE_TIMEOUT_S)
        except (asyncio.TimeoutError, ShareGroupError, KafkaError) as exc:
            self._log.warning("leave_failed", error=repr(exc))

    async def stop(self) -> None:
        """Stop heartbeating without leaving."""
        self._lifecycle.move(MembershipState.CLOSED)
        await self._stop_heartbeats()

    async def _stop_heartbeats(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._heartbeats
            self._heartbeats = None

    async def refresh(self) -> None:
        """Heartbeat now (a leader refused this member's ticket as expired, removed or of an
        older epoch): the answer brings the current epoch, assignment and ticket. Concurrent
        callers share one heartbeat.

        Raises:
            ShareGroupError: the coordinator refused it or did not answer in time.
            aiokafka.errors.KafkaError: it could not be sent.
        """
        if self._lifecycle.state is MembershipState.CLOSED:
            return
        task = self._refreshing
        if task is None or task.done():
            task = self._refreshing = asyncio.ensure_future(self._heartbeat())
        await asyncio.shield(task)

    async def _heartbeat(self, join: bool = False, leave: bool = False) -> None:
        epoch = -1 if leave else (0 if join else self.member_epoch)
        rid = self.requester.next_id()
        request = protocol.HeartbeatRequest(
            group=self.group,
            member_id=self.member_id,
            member_epoch=epoch,
            subscribed_topics=self.topics,
            reply_partition=self.requester.reply_partition,
            request_id=rid,
            client_id=self.client_id,
            host=socket.gethostname(),
            assignors=[] if leave else self.assignors,
            rack_id="" if leave else self.rack_id,
            reply_key=self.requester.reply_key.public if self.requester.reply_key else b"",
            principal=self.principal,
        )
        response = await self._ask_coordinator(request, rid, "a heartbeat")
        if response.error == ErrorCode.UNKNOWN_MEMBER_ID.value and not leave:
            # The coordinator dropped us (session timeout): rejoin; our records were released.
            self._log.warning("member_rejoining", reason=response.error_message)
            self.member_epoch = 0
            return await self._heartbeat(join=True)
        if response.error != ErrorCode.NONE.value:
            raise ShareGroupError(ErrorCode(response.error), response.error_message)
        if leave:
            self.assignment = set()
            self.leaders = {}
            self.ticket = b""
            self.assignment_changed.set()
            return None
        self.member_epoch = response.member_epoch
        self.ticket = response.ticket
        if response.heartbeat_interval_ms > 0:
            self.heartbeat_interval_ms = response.heartbeat_interval_ms
        self.leaders = {TopicPartition(t, p): address for t, p, address in response.leaders}
        new = {TopicPartition(t, p) for t, parts in response.assignment.items() for p in parts}
        if new != self.assignment:
            self._log.info("assignment", member_epoch=self.member_epoch, assignment=sorted(new))
            self.assignment = new
            self.assignment_changed.set()
        return None

    async def _ask_coordinator(
        self, request: protocol.Message, rid: int, what: str
    ) -> protocol.HeartbeatResponse:
        """Send ``request`` (request id ``rid``) to the group's coordinator partition and wait
        for the current coordinator's answer.

        Raises:
            ShareGroupError: ``INVALID_REQUEST`` when it answers ``what`` with anything but a
                HeartbeatResponse; the requester's errors (``REQUEST_TIMED_OUT``).
        """
        response = await self.requester.call(
            internal.coordinator_topic(self.app_id),
            self.coordinator_partition,
            rid,
            protocol.encode(request),
            accept=self._from_current_coordinator,
            sealer=self.sealer,
        )
        if not isinstance(response, protocol.HeartbeatResponse):
            raise ShareGroupError(
                ErrorCode.INVALID_REQUEST,
                f"the coordinator answered {what} with {type(response).__name__}",
            )
        return response

    def _from_current_coordinator(self, reply: protocol.Message) -> bool:
        """Drop (log, count) a heartbeat answer of a coordinator older than the newest this
        member heard from (a superseded coordinator still running); the current one answers
        the same request too."""
        epoch = getattr(reply, "coordinator_epoch", -1)
        now_ms = int(asyncio.get_running_loop().time() * 1000)
        if self.coordinators.admit(self.group, epoch, now_ms):
            return True
        if self.metrics is not None:
            self.metrics.stale_coordinator_refusals.labels("member", "heartbeat_response").inc()
        self._log.warning(
            "stale_coordinator_answer_refused",
            coordinator_epoch=epoch,
            newest_coordinator_epoch=self.coordinators.newest(self.group),
        )
        return False

    async def _heartbeat_loop(self) -> None:
        while self._lifecycle.state is not MembershipState.CLOSED:
            await asyncio.sleep(self.heartbeat_interval_ms / 1000)
            try:
                await self._heartbeat()
            except (ShareGroupError, KafkaError) as exc:
                self._log.warning("heartbeat_failed", error=str(exc))
