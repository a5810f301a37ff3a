"""Acting for a Kafka-protocol member at this worker's share-partition leaders when the member
heartbeats to another worker's listener.

A Kafka share consumer heartbeats to one node (its coordinator, FindCoordinator) but fetches
each share-partition from the node that Metadata names as its leader (KIP-932 "Share group
coordinator", "ShareFetch API"). The member is a queueflow member on the node it heartbeats to
(:class:`~queueflow.listener.members.MemberRegistry`); on a leader node the listener acts for
the same member id with a :class:`DelegatedMembership`: instead of heartbeating, it asks the
group's coordinator for the member's current assignment ticket
(:class:`~queueflow.protocol.messages.MemberTicketRequest`, sealed as a worker: only workers of
the app may ask), which the coordinator answers only while the member is in the group, binding
this listener's own member key. The answer is a heartbeat answer (epoch, assignment, leader
addresses, ticket), so the member's session fetches and acknowledges as the member's own would;
the leaders check the ticket as any other (queueflow.server.tickets). The ticket is asked for
again every heartbeat interval (it expires one session timeout after the member's last
heartbeat), and at once when a leader refuses it (``UNKNOWN_MEMBER_ID``,
``FENCED_MEMBER_EPOCH``: :class:`~queueflow.member.routing.FetchRouter`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.member.membership import Membership
from queueflow.member.transport import Requester
from queueflow.metrics import Metrics
from queueflow.protocol import messages as protocol
from queueflow.protocol.roles import ControlAuth
from queueflow.settings import ShareGroupSettings
from queueflow.structs import TopicPartition

__all__ = ["FIRST_REQUEST_ID", "DelegatedMembership"]

#: Request ids of a delegated member start at a random number at or above this, so that they
#: never meet the ids of the member's own session in another process (replies are matched by
#: id, and without ``queueflow.auth.mode=hmac`` both read replies keyed by the member id).
FIRST_REQUEST_ID = 1 << 40


class DelegatedMembership(Membership):
    """The membership of a member that heartbeats elsewhere: its ticket, assignment and leader
    addresses come from the coordinator (see the module docstring). Joining asks for the
    ticket (``UNKNOWN_MEMBER_ID`` raised when the coordinator does not have the member);
    leaving sends nothing (the member leaves where it heartbeats).

    Args:
        requester ... metrics: as :class:`~queueflow.member.membership.Membership`.
        worker_auth: seals the ticket requests as this worker (``queueflow.auth.secret``).
        requester_name: names this listener in the coordinator's log lines (``host:port``).
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
        *,
        worker_auth: ControlAuth,
        requester_name: str = "",
    ) -> None:
        super().__init__(
            requester,
            app_id,
            group,
            topics,
            settings,
            client_id,
            member_id,
            metrics,
            principal,
            sealer=worker_auth,
        )
        self.requester_name = requester_name
        #: The coordinator said the member is not in the group (its last answer).
        self.gone = False
        requester.start_ids_at(FIRST_REQUEST_ID + secrets.randbelow(FIRST_REQUEST_ID))

    async def _heartbeat(self, join: bool = False, leave: bool = False) -> None:
        if leave:  # the member leaves where it heartbeats; forget what was held for it
            self.assignment, self.leaders, self.ticket = set(), {}, b""
            self.assignment_changed.set()
            return
        rid = self.requester.next_id()
        request = protocol.MemberTicketRequest(
            group=self.group,
            member_id=self.member_id,
            reply_partition=self.requester.reply_partition,
            request_id=rid,
            reply_key=self.requester.reply_key.public if self.requester.reply_key else b"",
            requester=self.requester_name,
        )
        response = await self._ask_coordinator(request, rid, "a member ticket request")
        if response.error != ErrorCode.NONE.value:
            # The last ticket is kept: the leaders refuse it for acquisitions once the member
            # is removed or the ticket expired, and acknowledgements of records it holds count
            # until their locks end, as the member's own (queueflow.server.tickets).
            self.gone = response.error == ErrorCode.UNKNOWN_MEMBER_ID.value
            raise ShareGroupError(ErrorCode(response.error), response.error_message)
        self.gone = False
        self.member_epoch = response.member_epoch
        self.ticket = response.ticket
        if response.heartbeat_interval_ms > 0:
            self.heartbeat_interval_ms = response.heartbeat_interval_ms
        self.leaders = {TopicPartition(t, p): address for t, p, address in response.leaders}
        new = {TopicPartition(t, p) for t, parts in response.assignment.items() for p in parts}
        if new != self.assignment:
            self.assignment = new
            self.assignment_changed.set()
