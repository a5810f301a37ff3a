"""How one member's ShareFetch reaches its share-partition's leader.

:class:`FetchRouter` sends a ShareFetch straight to the leader's endpoint when the last heartbeat
named one (:mod:`queueflow.member.direct`), else, or when that fails, through the request topic;
and when a leader refuses the member's assignment ticket it heartbeats and sends once more. It
keeps the long polls under way on the direct path so that a reassignment can end them (KIP-932
``MaxWaitMs``).
"""

from __future__ import annotations

import structlog

from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.logging import get_logger
from queueflow.member.acks import AcknowledgementBuffer
from queueflow.member.context import MemberContext
from queueflow.member.direct import DirectClient, DirectPathError
from queueflow.member.membership import Membership
from queueflow.member.transport import Requester
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics as internal
from queueflow.protocol.envelope import topic_dest
from queueflow.structs import TopicPartition

__all__ = ["FetchRouter"]

log = structlog.get_logger("queueflow.member.session")

#: Leader errors that refused the member's assignment ticket: a heartbeat may bring a better one.
_TICKET_REFUSALS = {ErrorCode.UNKNOWN_MEMBER_ID.value, ErrorCode.FENCED_MEMBER_EPOCH.value}


class FetchRouter:
    """Sends one member's ShareFetches (see the module docstring).

    Args:
        ctx: the member context (clock, settings, app id).
        group: the share group id.
        member_id: the member id.
        lock_duration_ms: the member's own acquisition lock duration (ms), or None.
        requester: the request-topic transport.
        membership: the member's membership (its ticket and the leaders' endpoints).
        direct: the direct-path client.
    """

    def __init__(
        self,
        ctx: MemberContext,
        group: str,
        member_id: str,
        lock_duration_ms: int | None,
        requester: Requester,
        membership: Membership,
        direct: DirectClient,
    ) -> None:
        self.ctx = ctx
        self.group = group
        self.member_id = member_id
        self.lock_duration_ms = lock_duration_ms
        self.requester = requester
        self.membership = membership
        self.direct = direct
        #: The member's pending acknowledgements (and their errors, sent along with them).
        self.acks = AcknowledgementBuffer()
        #: Long polls under way on the direct path: tp -> {request_id: leader address}.
        self.long_polls: dict[TopicPartition, dict[int, str]] = {}
        self._log = get_logger("queueflow.member.session", group=group, member_id=member_id)

    async def request(
        self,
        tp: TopicPartition,
        max_records: int,
        acks: list[protocol.WireAck],
        max_wait_ms: int = 0,
    ) -> tuple[protocol.ShareFetchResponse, bool]:
        """Send one ShareFetch (:meth:`send`). If the leader refused the member's assignment
        ticket (``UNKNOWN_MEMBER_ID``: expired or removed; ``FENCED_MEMBER_EPOCH``: an epoch
        older than one it saw, e.g. a request sent just before a heartbeat answer brought a new
        epoch), heartbeat now and, if that brought another ticket, send it once more: with the
        acknowledgements if the leader refused them too (nothing was applied), else without
        (they were applied; only the acquisition was refused)."""
        membership = self.membership
        sent = membership.ticket
        response, direct = await self.send(tp, max_records, acks, max_wait_ms)
        if response.error not in _TICKET_REFUSALS:
            return response, direct
        if membership.ticket == sent:  # no newer ticket arrived meanwhile: ask for one
            try:
                await membership.refresh()
            except Exception as exc:  # the coordinator is away: the refusal stands
                self._log.warning("ticket_refresh_failed", error=repr(exc), refused=response.error)
                return response, direct
        if not membership.ticket or membership.ticket == sent:
            return response, direct
        resend = acks if response.ack_error != ErrorCode.NONE.value else []
        if not resend and not max_records:
            return response, direct
        retried, direct = await self.send(tp, max_records, resend, max_wait_ms)
        if acks and not resend:  # the first answer holds their result
            retried.ack_error, retried.ack_error_message = (
                response.ack_error,
                response.ack_error_message,
            )
            retried.ack_stale = response.ack_stale
        return retried, direct

    async def send(
        self,
        tp: TopicPartition,
        max_records: int,
        acks: list[protocol.WireAck],
        max_wait_ms: int = 0,
    ) -> tuple[protocol.ShareFetchResponse, bool]:
        """Send one ShareFetch: straight to the leader's endpoint when the last heartbeat named
        one, else (or when that fails or the leader refuses as ``NOT_LEADER_OR_FOLLOWER``)
        through the request topic. Returns the answer and whether it came over the direct
        path."""
        requester, settings = self.requester, self.ctx.settings
        rid = requester.next_id()
        request = protocol.ShareFetchRequest(
            group=self.group,
            topic=tp.topic,
            partition=tp.partition,
            member_id=self.member_id,
            request_id=rid,
            reply_partition=requester.reply_partition,
            max_records=max_records,
            acks=acks,
            lock_duration_ms=self.lock_duration_ms if max_records else None,
            deadline_ms=self.ctx.clock.now_ms() + settings.request_timeout_ms,
            max_wait_ms=max_wait_ms if max_records else 0,
            ticket=self.membership.ticket,
            ack_errors=self.acks.errors_for(tp, acks) if acks else [],
        )
        if acks:  # RELEASE options (docs/concepts.md "Delayed redelivery")
            request.ack_delay_ms, request.ack_undelivered = self.acks.options(tp, acks)
        address = self.membership.leaders.get(tp)
        if address is not None:
            timeout_s = (settings.request_timeout_ms + request.max_wait_ms) / 1000
            polls = self.long_polls.setdefault(tp, {})
            if request.max_wait_ms:
                polls[rid] = address
            direct: protocol.ShareFetchResponse | None = None
            try:
                direct = await self.direct.call(address, request, timeout_s)
            except DirectPathError as exc:
                self._reroute(tp, address, str(exc))
            finally:
                polls.pop(rid, None)
            if direct is not None:
                if direct.error != ErrorCode.NOT_LEADER_OR_FOLLOWER.value:
                    return direct, True
                self._reroute(tp, address, direct.error_message)
            request.max_wait_ms = 0  # the request topic's leaders answer at once
            request.ticket = self.membership.ticket  # a heartbeat may have brought a newer one
            request.deadline_ms = self.ctx.clock.now_ms() + settings.request_timeout_ms
        reply = await requester.call(
            internal.request_topic(self.ctx.app_id, tp.topic),
            tp.partition,
            rid,
            protocol.encode(request),
        )
        if not isinstance(reply, protocol.ShareFetchResponse):
            raise ShareGroupError(
                ErrorCode.INVALID_REQUEST,
                f"the leader of {tp.topic}[{tp.partition}] answered a ShareFetch with "
                f"{type(reply).__name__}",
            )
        return reply, False

    def acknowledge_message(
        self, tp: TopicPartition, acks: list[protocol.WireAck], topic: str, key: bytes
    ) -> tuple[bytes, bytes]:
        """The key and value of a standalone ShareAcknowledge of ``tp`` carrying ``acks`` (a
        ShareFetch acquiring nothing), exactly as :meth:`send` would produce it to the request
        topic (same member, request id sequence, ticket, envelope and ``key``), but sealed
        for ``topic[tp.partition]``: an ``exactly_once`` agent writes it to the ack topic
        inside its transaction, and the leaders apply it from there."""
        requester = self.requester
        request = protocol.ShareFetchRequest(
            group=self.group,
            topic=tp.topic,
            partition=tp.partition,
            member_id=self.member_id,
            request_id=requester.next_id(),
            reply_partition=requester.reply_partition,
            max_records=0,
            acks=acks,
            lock_duration_ms=None,
            deadline_ms=self.ctx.clock.now_ms() + self.ctx.settings.request_timeout_ms,
            max_wait_ms=0,
            ticket=self.membership.ticket,
            ack_errors=self.acks.errors_for(tp, acks),
        )
        if acks:  # RELEASE options (docs/concepts.md "Delayed redelivery")
            request.ack_delay_ms, request.ack_undelivered = self.acks.options(tp, acks)
        sealed = requester.auth.seal(protocol.encode(request), topic_dest(topic, tp.partition))
        return key, sealed

    async def end_long_polls(self, tp: TopicPartition) -> None:
        """Have the leader answer this member's parked ShareFetches of ``tp`` now, with nothing
        acquired (call it when ``tp`` was reassigned: a parked request would otherwise acquire
        records for a member that no longer fetches them)."""
        for rid, address in list(self.long_polls.get(tp, {}).items()):
            cancel = protocol.ShareFetchCancel(
                member_id=self.member_id, request_id=rid, topic=tp.topic, partition=tp.partition
            )
            await self.direct.cancel(address, cancel)

    def _reroute(self, tp: TopicPartition, address: str, reason: str) -> None:
        """Stop using ``address`` for ``tp`` until a heartbeat names a leader again."""
        if self.membership.leaders.get(tp) == address:
            del self.membership.leaders[tp]
            self._log.info(
                "direct_path_rerouted",
                topic=tp.topic,
                partition=tp.partition,
                address=address,
                reason=reason,
                note="using the request topic until the next heartbeat names the leader",
            )
