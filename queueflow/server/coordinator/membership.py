"""Membership and assignment: the pure handlers of heartbeats and clock ticks.

KIP-932 "Share group membership" and "ShareGroupHeartbeat API": a member joins (epoch 0),
heartbeats, and leaves (epoch -1); a member silent for longer than the session timeout is
removed at a tick; every change bumps the group epoch and the group's assignor recomputes the
assignment (:class:`~queueflow.engine.group.ShareGroup`). The leaders of a departed member's
share-partitions are told to release its records (ReleaseMember). Every
``queueflow.assignor.refresh.interval.ms`` a tick also recomputes each group's assignment with
the lag and racks known then.

Each handler changes :class:`~queueflow.server.coordinator.state.CoordinatorState` and returns a
:class:`~queueflow.server.coordinator.results.CoordinatorResult`; none does I/O. A heartbeat
needs the partition counts (and maybe racks) of its topics, which the dispatcher fetches between
:func:`check_heartbeat` and :func:`handle_heartbeat`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from queueflow.engine.group import HeartbeatResult, ShareGroup
from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.protocol import messages as protocol
from queueflow.protocol.auth import issue_ticket
from queueflow.protocol.sealed_replies import PUBLIC_KEY_BYTES
from queueflow.server import group_configs
from queueflow.server.coordinator.results import (
    CoordinatorResult,
    GroupRecord,
    LogEvent,
    Reply,
    ToLeader,
)
from queueflow.server.coordinator.state import CoordinatorState
from queueflow.structs import TopicPartition

__all__ = [
    "check_heartbeat",
    "handle_heartbeat",
    "handle_member_ticket",
    "handle_tick",
    "rack_topics",
    "releases",
    "store_heartbeats",
    "touch_after_silence",
]

#: ``(member id, its share-partitions)`` of members whose records the leaders must release.
Released = list[tuple[str, list[TopicPartition]]]


def touch_after_silence(state: CoordinatorState, now_ms: int) -> None:
    """Note that a message is served at ``now_ms`` (wall). Members heartbeat and the ticker
    ticks at their intervals; a longer silence means this coordinator was not running (broker
    outage, pause, rebalance): members could not heartbeat either, so that time doesn't count
    against their sessions, and every member's session is refreshed."""
    gap = now_ms - state.last_event_ms
    state.last_event_ms = now_ms
    settings = state.ctx.settings
    expected_gap_ms = max(settings.heartbeat_interval_ms, settings.lock_check_interval_ms)
    if now_ms and gap > 2 * expected_gap_ms:
        for group in state.groups.values():
            group.touch_all(now_ms)


def releases(
    state: CoordinatorState, group: ShareGroup, released: Released, reason: str
) -> tuple[ToLeader, ...]:
    """ReleaseMember messages to the leaders of every partition of the group's topics (a member
    may hold records of partitions it was assigned earlier): release the members' records, and
    refuse their tickets issued up to now (``member_epoch``: the group epoch, which every later
    ticket of a rejoining member exceeds)."""
    epoch = state.epoch(group.group_id)
    return tuple(
        ToLeader(
            protocol.ReleaseMember(
                group.group_id,
                name,
                partition,
                member_id,
                reason,
                member_epoch=group.group_epoch,
                coordinator_epoch=epoch,
            )
        )
        for member_id, _assignment in released
        for name in sorted(group.partitions)
        for partition in range(group.partitions[name])
    )


def expire_members(
    state: CoordinatorState, group: ShareGroup, now_ms: int, log_expiry: bool = True
) -> CoordinatorResult:
    """Remove ``group``'s members whose session lapsed (logged ``member_session_expired`` with
    ``log_expiry``: at ticks, not before an admin request), store the group and release their
    records."""
    group.lag = state.directory.fresh_lag(group.group_id, now_ms)
    released = group.expire(now_ms) if group.members else []
    if not released:
        return CoordinatorResult()
    events = [
        LogEvent.warning(
            "member_session_expired",
            group=group.group_id,
            member_id=member_id,
            session_timeout_ms=group.session_timeout_ms,
        )
        for member_id, _ in released
        if log_expiry
    ]
    record, logged = state.persist(group)
    return CoordinatorResult(
        events=(*events, *logged),
        records=(record,),
        to_leaders=releases(state, group, released, "session timeout"),
    )


def expire_provisional(
    state: CoordinatorState, group: ShareGroup, now_ms: int
) -> CoordinatorResult:
    """Remove ``group``'s provisional members that sent no heartbeat with their member epoch
    within ``share.member.join.grace.ms`` of joining (``ShareGroup.expire_provisional``; logged
    ``provisional_member_expired``), store the group and release their records."""
    if not any(m.provisional for m in group.members.values()):
        return CoordinatorResult()
    group.lag = state.directory.fresh_lag(group.group_id, now_ms)
    released = group.expire_provisional(now_ms)
    if not released:
        return CoordinatorResult()
    events = [
        _provisional_expired(
            group,
            member_id,
            "no heartbeat with its member epoch after joining",
            f"share.member.join.grace.ms={group.join_grace_ms}",
        )
        for member_id, _ in released
    ]
    record, logged = state.persist(group)
    return CoordinatorResult(
        events=(*events, *logged),
        records=(record,),
        to_leaders=releases(state, group, released, "provisional member expired"),
    )


def evicted_events(group: ShareGroup, evicted: tuple[str, ...]) -> tuple[LogEvent, ...]:
    """``provisional_member_expired`` for each provisional member a join removed to make room
    (``group.share.max.size``)."""
    return tuple(
        _provisional_expired(
            group,
            member_id,
            "the group was full and a member joined",
            f"group.share.max.size={group.max_size}",
        )
        for member_id in evicted
    )


def _provisional_expired(group: ShareGroup, member_id: str, reason: str, setting: str) -> LogEvent:
    """``provisional_member_expired``: a provisional member removed, why, and the setting."""
    return LogEvent.warning(
        "provisional_member_expired",
        group=group.group_id,
        member_id=member_id,
        reason=reason,
        setting=setting,
    )


def refresh(state: CoordinatorState, group: ShareGroup, now_ms: int) -> CoordinatorResult:
    """Every ``queueflow.assignor.refresh.interval.ms``, recompute a group's assignment with
    the lag and racks known now, and rebalance if it changed (``ShareGroup.refresh``)."""
    interval = state.ctx.settings.assignor_refresh_interval_ms
    last = state.refreshed_at.setdefault(group.group_id, now_ms)
    if interval <= 0 or now_ms - last < interval:
        return CoordinatorResult()
    state.refreshed_at[group.group_id] = now_ms
    if not group.refresh():
        return CoordinatorResult()
    record, events = state.persist(group, reason=f"{group.assignor} assignment inputs changed")
    return CoordinatorResult(events=tuple(events), records=(record,))


def store_heartbeats(state: CoordinatorState, group: ShareGroup) -> CoordinatorResult:
    """Store ``group`` again (its members' last heartbeats) once they are a third of a session
    newer than the stored ones (``ShareGroup.heartbeats_due``): at most three writes per
    session timeout per group, so that when no coordinator runs (its workers stopped before
    the members, whose leaves were then lost) the admin still sees when each member was last
    heard of and which sessions lapsed (docs/operations.md "Share groups that stay non-empty")."""
    if not group.members or not group.heartbeats_due():
        return CoordinatorResult()
    record, events = state.persist(group)
    return CoordinatorResult(events=tuple(events), records=(record,))


def handle_tick(state: CoordinatorState, now_ms: int) -> CoordinatorResult:
    """A clock tick (:class:`~queueflow.protocol.messages.Tick`): expire lapsed sessions,
    refresh assignments and store heartbeats when due, group by group."""
    result = CoordinatorResult()
    for group in list(state.groups.values()):
        result += expire_members(state, group, now_ms)
        result += expire_provisional(state, group, now_ms)
        result += refresh(state, group, now_ms)
        result += store_heartbeats(state, group)
    return result


def _response(
    state: CoordinatorState, message: protocol.HeartbeatRequest
) -> protocol.HeartbeatResponse:
    return protocol.HeartbeatResponse(
        member_id=message.member_id,
        request_id=message.request_id,
        heartbeat_interval_ms=state.ctx.settings.heartbeat_interval_ms,
        coordinator_epoch=state.epoch(message.group),
    )


def _reply(message: protocol.HeartbeatRequest, response: protocol.HeartbeatResponse) -> Reply:
    return Reply(message.member_id, message.reply_partition, response, message.reply_key)


def check_heartbeat(
    state: CoordinatorState, message: protocol.HeartbeatRequest, now_ms: int
) -> CoordinatorResult | ShareGroup:
    """What can be decided about a heartbeat before its topics' metadata is known.

    Returns:
        The group to go on with (:func:`handle_heartbeat`), or the result answering the
        heartbeat now: ``UNSUPPORTED_VERSION``, ``INVALID_REQUEST`` (a reply key of the wrong
        size; answered unsealed), the group's ``CORRUPT_STATE``, or the retriable
        ``REQUEST_TIMED_OUT`` for a join while an admin request on the group is pending (see
        the package docstring, "the join race").
    """
    response = _response(state, message)
    if message.protocol_version not in protocol.SUPPORTED_PROTOCOL_VERSIONS:
        supported = protocol.SUPPORTED_PROTOCOL_VERSIONS
        response.error = ErrorCode.UNSUPPORTED_VERSION.value
        response.error_message = (
            f"member protocol version {message.protocol_version} is not supported by this "
            f"coordinator (versions {supported.start}..{supported.stop - 1}); run the same "
            "queueflow version on the leaders and members, or upgrade the leaders first"
        )
        event = LogEvent.warning(
            "unsupported_protocol_version",
            group=message.group,
            member_id=message.member_id,
            protocol_version=message.protocol_version,
        )
        return CoordinatorResult(events=(event,), replies=(_reply(message, response),))
    if len(message.reply_key) not in (0, PUBLIC_KEY_BYTES):
        response.error = ErrorCode.INVALID_REQUEST.value
        response.error_message = (
            f"reply_key must be a {PUBLIC_KEY_BYTES}-byte X25519 public key, got "
            f"{len(message.reply_key)} bytes"
        )
        # Unsealed: there is no key to seal it to.
        unsealed = Reply(message.member_id, message.reply_partition, response)
        return CoordinatorResult(replies=(unsealed,))
    try:
        group = state.group(message.group, now_ms)
    except ShareGroupError as exc:  # corrupt group metadata: answer, don't go silent
        response.error, response.error_message = exc.code.value, exc.message
        event = LogEvent.error("share_group_refused", group=message.group, error=str(exc))
        return CoordinatorResult(events=(event,), replies=(_reply(message, response),))
    pending = state.pending.get(group.group_id)
    if pending is not None and message.member_id not in group.members:
        response.heartbeat_interval_ms = group_configs.effective(
            state.ctx, group
        ).heartbeat_interval_ms
        response.error = ErrorCode.REQUEST_TIMED_OUT.value  # retriable: the member retries
        response.error_message = (
            f"share group {group.group_id!r} is being changed by an admin request "
            f"({pending.operation}); retry the join"
        )
        return CoordinatorResult(replies=(_reply(message, response),))
    return group


def _ticket(
    state: CoordinatorState,
    message: protocol.HeartbeatRequest,
    group: ShareGroup,
    result: HeartbeatResult,
    now_ms: int,
) -> bytes:
    """The assignment ticket of a member that joined or heartbeated (see
    :mod:`queueflow.server.tickets`): its epoch, share-partitions and the group's configs,
    valid for one session timeout."""
    return _group_ticket(
        state,
        group,
        message.member_id,
        result.member_epoch,
        result.assignment,
        group.session_timeout_ms,
        now_ms,
        message.reply_key,
        message.principal,
    )


def _group_ticket(
    state: CoordinatorState,
    group: ShareGroup,
    member_id: str,
    member_epoch: int,
    assignment: Iterable[tuple[str, int]],
    ttl_ms: int,
    now_ms: int,
    reply_key: bytes,
    principal: str = "",
) -> bytes:
    """A ticket for ``member_id`` at ``member_epoch`` holding ``assignment``, valid ``ttl_ms``
    from ``now_ms``, with the group's configs and this coordinator's epoch."""
    return issue_ticket(
        state.ticket_key,
        group=group.group_id,
        member_id=member_id,
        member_epoch=member_epoch,
        partitions=((t, p) for t, p in assignment),
        ttl_ms=ttl_ms,
        now_ms=now_ms,
        coordinator_epoch=state.epoch(group.group_id),
        reply_key=reply_key,
        config_version=group.config_version,
        configs=group_configs.ticket_configs(state.ctx, group),
        added_partitions=sorted(group.added_partitions.items()),
        principal=principal,
    )


def rack_topics(group: ShareGroup, message: protocol.HeartbeatRequest) -> list[str] | None:
    """The topics whose partitions' racks (the ``rack`` assignor's input) the heartbeat needs
    looked up, or ``None`` when no member has a rack."""
    has_rack = bool(message.rack_id) or any(m.rack_id for m in group.members.values())
    if not has_rack:
        return None
    return sorted(group.subscribed_topics() | set(message.subscribed_topics))


def handle_heartbeat(
    state: CoordinatorState,
    message: protocol.HeartbeatRequest,
    group: ShareGroup,
    counts: Mapping[str, int] | ShareGroupError,
    racks: Mapping[TopicPartition, str] | None,
    now_ms: int,
) -> CoordinatorResult:
    """A ShareGroupHeartbeat (join, heartbeat or leave) of a member of ``group``, once
    :func:`check_heartbeat` admitted it.

    Args:
        state: the coordinator state.
        message: the heartbeat.
        group: the group :func:`check_heartbeat` returned.
        counts: the partition counts of the subscribed topics, or the error looking them up.
        racks: the racks of the partitions' leader brokers (``None``: unknown or not needed).
        now_ms: wall ms.

    Returns:
        The answer (member epoch, assignment, leader addresses, and the assignment ticket the
        member shows its leaders), the group record when its epoch or membership changed, and
        ReleaseMember messages for a member that left.
    """
    response = _response(state, message)
    response.heartbeat_interval_ms = group_configs.effective(state.ctx, group).heartbeat_interval_ms
    epoch_before, members_before = group.group_epoch, len(group.members)
    to_leaders: tuple[ToLeader, ...] = ()
    events: list[LogEvent] = []
    try:
        if isinstance(counts, ShareGroupError):
            raise counts
        group.lag = state.directory.fresh_lag(group.group_id, now_ms)
        if racks is not None:
            group.partition_racks = racks
        result = group.heartbeat(
            message.member_id,
            message.member_epoch,
            message.subscribed_topics,
            now_ms,
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
        response.leaders = state.directory.addresses_of(result.assignment, now_ms)
        if result.member_epoch > 0:  # not a leave: the member's proof for the leaders
            response.ticket = _ticket(state, message, group, result, now_ms)
        if result.released:
            to_leaders = releases(state, group, result.released, "member left")
        events.extend(evicted_events(group, result.evicted))
    except ShareGroupError as exc:
        response.error, response.error_message = exc.code.value, exc.message
    records: tuple[GroupRecord, ...] = ()
    if group.group_epoch != epoch_before or len(group.members) != members_before or events:
        record, persisted = state.persist(group, reason="membership")
        records = (record,)
        events.extend(persisted)
    return CoordinatorResult(
        events=tuple(events),
        records=records,
        to_leaders=to_leaders,
        replies=(_reply(message, response),),
    )


def handle_member_ticket(
    state: CoordinatorState, message: protocol.MemberTicketRequest, now_ms: int
) -> CoordinatorResult:
    """A worker asks for the current ticket of a live member
    (:class:`~queueflow.protocol.messages.MemberTicketRequest`): answered as a heartbeat of the
    member would be (epoch, assignment, leader addresses, ticket), but nothing in the group
    changes, and the ticket binds the requester's ``reply_key``. It expires when the member's
    session would lapse without another heartbeat (its last heartbeat plus the session
    timeout), so it vouches for no longer than the coordinator knows the member is there; a
    leave or a timeout also fences it at the leaders (ReleaseMember). ``UNKNOWN_MEMBER_ID``
    when the group does not have the member, or its session lapsed.
    """
    response = protocol.HeartbeatResponse(
        member_id=message.member_id,
        request_id=message.request_id,
        heartbeat_interval_ms=state.ctx.settings.heartbeat_interval_ms,
        coordinator_epoch=state.epoch(message.group),
    )
    reply = Reply(message.member_id, message.reply_partition, response, message.reply_key)
    if len(message.reply_key) not in (0, PUBLIC_KEY_BYTES):
        response.error = ErrorCode.INVALID_REQUEST.value
        response.error_message = f"reply_key must be a {PUBLIC_KEY_BYTES}-byte X25519 public key"
        unsealed = Reply(message.member_id, message.reply_partition, response)
        return CoordinatorResult(replies=(unsealed,))
    try:
        group: ShareGroup | None = state.existing_group(message.group, now_ms)
    except ShareGroupError:  # never stored, or corrupt (a heartbeat answers the latter)
        group = None
    member = None if group is None else group.members.get(message.member_id)
    ttl_ms = (
        -1
        if group is None or member is None
        else member.last_heartbeat_ms + group.session_timeout_ms - now_ms
    )
    if group is None or member is None or ttl_ms <= 0 or member.member_epoch <= 0:
        response.error = ErrorCode.UNKNOWN_MEMBER_ID.value
        response.error_message = (
            f"member {message.member_id!r} is not in share group {message.group!r} (it left, "
            "its session timed out, or it never joined)"
        )
        return CoordinatorResult(replies=(reply,))
    response.heartbeat_interval_ms = group_configs.effective(state.ctx, group).heartbeat_interval_ms
    response.member_epoch = member.member_epoch
    response.assignment = {}
    for t, p in member.assignment:
        response.assignment.setdefault(t, []).append(p)
    response.leaders = state.directory.addresses_of(member.assignment, now_ms)
    response.ticket = _group_ticket(
        state,
        group,
        member.member_id,
        member.member_epoch,
        member.assignment,
        ttl_ms,
        now_ms,
        message.reply_key,
    )
    return CoordinatorResult(replies=(reply,))
