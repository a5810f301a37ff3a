"""The share-partition leader's membership check: assignment tickets.

KIP-932 checks, on every ShareFetch and ShareAcknowledge, that the member is in its group at its
current member epoch. Here the leader does not ask the coordinator: the coordinator puts a
signed :class:`~queueflow.protocol.auth.AssignmentTicket` in every successful heartbeat answer
(group, member id, member epoch, assigned share-partitions, expiry one session timeout away),
the member attaches its latest ticket to every request, and :class:`TicketGate` checks it:

* ``UNKNOWN_MEMBER_ID`` for any request (acquiring or only acknowledging) without a ticket
  (with ``queueflow.auth.tickets=required``), with a ticket that fails its MAC, is malformed or
  longer than :data:`MAX_TICKET_BYTES`, with another member's or another group's ticket, or with
  a ticket of an epoch at or below the one at which the coordinator removed the member from the
  share-partition (its ReleaseMember);
* for a request that acquires (``max_records > 0``), also ``UNKNOWN_MEMBER_ID`` when the ticket
  expired (no heartbeat answer for a session timeout), ``FENCED_MEMBER_EPOCH`` when its epoch is
  older than one already seen from the member, or when a coordinator older than one already
  seen for the group issued it (a zombie coordinator; :class:`~queueflow.engine.fencing.
  CoordinatorEpochs`, shared with the leader's check of ReleaseMember and ResetSharePartition),
  and ``UNKNOWN_TOPIC_OR_PARTITION`` when it does not assign the share-partition.

Acknowledgements need only the first point: KIP-932 lets a member acknowledge the records it
acquired until their locks end, even after its share-partition moved to another member (a
reassignment bumps its epoch and drops the share-partition from its ticket), and the engine
refuses acknowledgements of records the member doesn't hold, so the records' locks, not the
ticket's expiry, bound how long it may acknowledge (a coordinator that was down longer than a
session timeout forgives the silence; so do acknowledgements).

Verifying a ticket (HMAC-SHA256, msgpack decode) happens once per distinct ticket: the verified
ticket is cached by its bytes, and swept once expired (a member sends the same ticket with every
request until its next heartbeat answer). Pure and synchronous: no I/O, time passed in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

from queueflow.engine.fencing import CoordinatorEpochs
from queueflow.errors import ErrorCode
from queueflow.protocol.auth import AssignmentTicket, AuthenticationError, verify_ticket

__all__ = ["MAX_TICKET_BYTES", "TicketGate", "TicketRefusal"]

#: Tickets longer than this are refused unread (an assignment of thousands of share-partitions
#: is a few tens of KiB).
MAX_TICKET_BYTES: Final = 1 << 20
#: Verified tickets cached at most; past it expired ones are dropped, then all.
_MAX_CACHED: Final = 100_000
_FIRST_SWEEP: Final = 1024
#: Members whose epochs and removals are remembered at most, per gate.
_MAX_MEMBERS: Final = 100_000


@dataclass(frozen=True, slots=True)
class TicketRefusal:
    """Why a request was refused: its ``code`` (what the member gets), a ``reason`` for the
    refusal metric and log (``missing``, ``bad_ticket``, ``expired``, ``wrong_member``,
    ``wrong_group``, ``removed``, ``fenced_epoch``, ``stale_coordinator``, ``not_assigned``) and
    a ``message`` saying
    what is wrong and what to do."""

    code: ErrorCode
    reason: str
    message: str
    #: The Kafka principal the (verified) ticket binds, for the refusal's log line ("": none).
    principal: str = ""


class TicketGate:
    """Checks the assignment tickets of one leader's requests.

    Args:
        key: the ticket key (:func:`~queueflow.protocol.auth.ticket_key`), the coordinator's.
        required: refuse requests without a ticket (``queueflow.auth.tickets=required``);
            otherwise they pass unchecked (a rolling upgrade from members without tickets).
        coordinator_forget_ms: how long (ms) the newest coordinator epoch of a group fences
            older ones without being seen again (:class:`CoordinatorEpochs`; the share-group
            session timeout).

    Not thread-safe; one per leader (all on one event loop).
    """

    def __init__(
        self, key: bytes, *, required: bool = True, coordinator_forget_ms: int = 45_000
    ) -> None:
        self._key = key
        self.required = required
        #: The newest coordinator epoch seen per group (tickets, releases, resets), in
        #: wall-clock ms.
        self.coordinator_epochs = CoordinatorEpochs(coordinator_forget_ms)
        self._verified: dict[bytes, AssignmentTicket] = {}
        self._sweep_at = _FIRST_SWEEP
        # (group, member id) -> the highest member epoch seen in a valid ticket.
        self._epochs: dict[tuple[str, str], int] = {}
        # (group, member id, partition) -> tickets of this epoch or older are refused there
        # (the member was removed: its records there were released).
        self._removed: dict[tuple[str, str, int], int] = {}

    def check(
        self,
        group: str,
        member_id: str,
        ticket: bytes,
        now_ms: int,
        *,
        topic: str,
        partition: int,
        acquiring: bool,
    ) -> TicketRefusal | None:
        """Check one request's ticket; ``None`` when it may proceed.

        Args:
            group / member_id: as the request names them.
            ticket: the request's ticket bytes (empty: none).
            now_ms: wall-clock ms (the coordinator's clock set the expiry).
            topic / partition: the share-partition the request is for.
            acquiring: the request acquires records (``max_records > 0``); if False only
                membership is checked (acknowledgements, see the module docstring).

        A valid ticket of a higher epoch than seen before raises the member's epoch.
        """
        if not ticket:
            return None if not self.required else _missing(group, member_id)
        verified = self._verified.get(ticket)
        if verified is None:
            try:
                verified = self._verify(ticket)
            except AuthenticationError as exc:
                return TicketRefusal(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    "bad_ticket",
                    f"assignment ticket of member {member_id!r} refused ({exc.reason}): it was "
                    "not issued by this app's coordinator (another app id or "
                    "queueflow.auth.secret, or altered)",
                )
            self._remember(ticket, verified, now_ms)
        refusal: TicketRefusal | None
        if acquiring and now_ms >= verified.expires_ms:
            refusal = TicketRefusal(
                ErrorCode.UNKNOWN_MEMBER_ID,
                "expired",
                f"assignment ticket of member {member_id!r} expired at {verified.expires_ms} ms "
                f"({now_ms - verified.expires_ms} ms ago): it has had no heartbeat answer for a "
                "session timeout; it must heartbeat (is the share-group coordinator running?) "
                "or rejoin",
            )
        else:
            refusal = _whose(verified, group, member_id) or self._current(
                verified, group, member_id, now_ms, topic, partition, acquiring
            )
        if refusal is not None and verified.principal:
            refusal = dataclasses.replace(refusal, principal=verified.principal)
        return refusal

    def _verify(self, ticket: bytes) -> AssignmentTicket:
        """Verify ``ticket``'s MAC and decode it (expiry is checked by the caller, and for
        acquisitions only).

        Raises:
            AuthenticationError: too long, malformed, or not issued with this gate's key.
        """
        if len(ticket) > MAX_TICKET_BYTES:
            raise AuthenticationError("malformed", f"ticket of {len(ticket)} bytes")
        return verify_ticket(self._key, ticket, now_ms=-(2**63))

    def _current(
        self,
        verified: AssignmentTicket,
        group: str,
        member_id: str,
        now_ms: int,
        topic: str,
        partition: int,
        acquiring: bool,
    ) -> TicketRefusal | None:
        """The checks of a verified ticket of the request's member against what the gate has
        seen: the coordinator epoch, the member's removal and epoch, and (acquiring) the
        assignment. Raises the member's epoch when the ticket's is higher."""
        if (
            not self.coordinator_epochs.admit(group, verified.coordinator_epoch, now_ms)
            and acquiring
        ):
            return TicketRefusal(
                ErrorCode.FENCED_MEMBER_EPOCH,
                "stale_coordinator",
                f"member {member_id!r} sent a ticket of coordinator epoch "
                f"{verified.coordinator_epoch}, but share group {group!r} has a newer "
                f"coordinator (epoch {self.coordinator_epochs.newest(group)}): acquire with the "
                "ticket of the latest heartbeat answer",
            )
        key = (group, member_id)
        removed = self._removed.get((group, member_id, partition))
        if removed is not None and verified.member_epoch <= removed:
            return TicketRefusal(
                ErrorCode.UNKNOWN_MEMBER_ID,
                "removed",
                f"member {member_id!r} left or was removed from share group {group!r} (its "
                f"ticket is of member epoch {verified.member_epoch}, removed at group epoch "
                f"{removed}); it must rejoin with member epoch 0",
            )
        seen = self._epochs.get(key, -1)
        if verified.member_epoch > seen:
            if len(self._epochs) >= _MAX_MEMBERS and key not in self._epochs:
                self._epochs.clear()  # forgetting only makes the fence laxer, never stuck
            self._epochs[key] = verified.member_epoch
        elif acquiring and verified.member_epoch < seen:
            return TicketRefusal(
                ErrorCode.FENCED_MEMBER_EPOCH,
                "fenced_epoch",
                f"member {member_id!r} sent a ticket of member epoch {verified.member_epoch}, "
                f"but epoch {seen} was seen since: acquire with the ticket of the latest "
                "heartbeat answer",
            )
        if acquiring and not verified.covers(topic, partition):
            return TicketRefusal(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                "not_assigned",
                f"share-partition {topic}[{partition}] is not assigned to member {member_id!r} "
                f"at member epoch {verified.member_epoch}: acquire only from the share-partitions "
                "of the latest heartbeat answer (acknowledging records already held is allowed)",
            )
        return None

    def remove(self, group: str, member_id: str, partition: int, epoch: int) -> None:
        """The member left or timed out (a ReleaseMember of ``partition``; the coordinator sends
        one per partition): refuse its tickets of ``epoch`` or older for that share-partition.
        ``epoch`` < 0 (unknown) fences nothing."""
        if epoch < 0:
            return
        key = (group, member_id, partition)
        if len(self._removed) >= _MAX_MEMBERS and key not in self._removed:
            self._removed.clear()
        self._removed[key] = max(epoch, self._removed.get(key, -1))

    def _remember(self, raw: bytes, ticket: AssignmentTicket, now_ms: int) -> None:
        # Each heartbeat answer brings a new ticket (its expiry moves on), so expired ones are
        # swept whenever the cache has doubled since the last sweep: amortised O(1).
        cache = self._verified
        if len(cache) >= self._sweep_at:
            for stale in [k for k, t in cache.items() if now_ms >= t.expires_ms]:
                del cache[stale]
            if len(cache) >= _MAX_CACHED:
                cache.clear()
            self._sweep_at = max(_FIRST_SWEEP, 2 * len(cache))
        cache[raw] = ticket

    def reply_key(self, ticket: bytes) -> bytes:
        """The reply key bound into ``ticket`` (empty: none, or the ticket is not valid), for
        sealing the answer to its request (:mod:`queueflow.protocol.sealed_replies`)."""
        if not ticket:
            return b""
        verified = self._verified.get(ticket)
        if verified is None:
            try:
                verified = self._verify(ticket)
            except AuthenticationError:
                return b""
        return verified.reply_key

    def bound_key(self, ticket: bytes) -> bytes | None:
        """The member key ``ticket`` binds its member id to (``b""``: none), or ``None`` when
        the ticket is not valid (its request is refused by :meth:`check`, answered): what
        :meth:`~queueflow.protocol.roles.ControlAuth.check_sender` compares with the key a
        ShareFetch was sent with."""
        verified = self._verified.get(ticket)
        if verified is None:
            try:
                verified = self._verify(ticket)
            except AuthenticationError:
                return None
        return verified.reply_key

    def verified(self, ticket: bytes) -> AssignmentTicket | None:
        """The ticket ``ticket`` once :meth:`check` verified it (``None``: not verified, or
        swept since): what the leader reads the group's configs from."""
        return self._verified.get(ticket) if ticket else None

    @property
    def cached(self) -> int:
        """How many verified tickets are cached (for tests)."""
        return len(self._verified)


def _missing(group: str, member_id: str) -> TicketRefusal:
    return TicketRefusal(
        ErrorCode.UNKNOWN_MEMBER_ID,
        "missing",
        f"member {member_id!r} sent no assignment ticket for share group {group!r}: "
        "only a member that joined the group (ShareGroupHeartbeat) and attaches the "
        "ticket of its latest heartbeat answer is served; members of queueflow releases "
        "without tickets must be upgraded (or set queueflow.auth.tickets=optional on the "
        "workers for the rolling upgrade)",
    )


def _whose(verified: AssignmentTicket, group: str, member_id: str) -> TicketRefusal | None:
    """Refuse another member's or another group's ticket."""
    if verified.member_id != member_id:
        return TicketRefusal(
            ErrorCode.UNKNOWN_MEMBER_ID,
            "wrong_member",
            f"the request names member {member_id!r} but carries the ticket of member "
            f"{verified.member_id!r}",
        )
    if verified.group != group:
        return TicketRefusal(
            ErrorCode.UNKNOWN_MEMBER_ID,
            "wrong_group",
            f"the request is for share group {group!r} but carries a ticket of share group "
            f"{verified.group!r}",
        )
    return None
