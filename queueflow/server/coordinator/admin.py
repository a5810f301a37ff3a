"""Admin requests: the pure handlers of ``alterShareGroupOffsets``, ``deleteShareGroupOffsets``,
``deleteShareGroups`` and the group configs (:mod:`queueflow.admin`).

The coordinator owns membership and the share-partition leaders own share-partition state, so
an offsets or delete request is checked here (the group exists, has no members, names
share-partitions of its topics) and forwarded to the leaders as ResetSharePartition
(:func:`forward_admin`); the leaders apply it and answer (:func:`handle_reset_result`), and the
admin is answered once every leader has, or the request's deadline passed
(:func:`expire_pending`). Group configs are the coordinator's own: described or altered here at
once (:func:`handle_group_configs`). Refusals change nothing.

The lifecycle of a forwarded request is :class:`~.admin_state.AdminState`. Every handler
returns a :class:`~.results.CoordinatorResult` and does no I/O; an ``alterShareGroupOffsets``
needs the topics' partition counts, which the dispatcher fetches between :func:`begin_admin`
and :func:`forward_admin`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from queueflow.engine.group import ShareGroup, describe_holders
from queueflow.engine.group_config import validate_group_configs
from queueflow.errors import ConfigurationError, ErrorCode, ShareGroupError
from queueflow.protocol import messages as protocol
from queueflow.server import group_configs
from queueflow.server.coordinator.admin_state import (
    AdminRequest,
    AdminState,
    PendingAdmin,
    ResetRequest,
)
from queueflow.server.coordinator.membership import expire_members
from queueflow.server.coordinator.results import (
    NOTHING,
    CoordinatorResult,
    DeleteGroup,
    GroupRecord,
    LogEvent,
    Reply,
    ToLeader,
)
from queueflow.server.coordinator.state import CoordinatorState

__all__ = [
    "ADMIN_DEADLINE_MS",
    "begin_admin",
    "count_topics",
    "expire_pending",
    "forward_admin",
    "handle_group_configs",
    "handle_reset_result",
]

#: How long (ms) an admin request without a deadline holds joins back at most.
ADMIN_DEADLINE_MS = 30_000

#: ``(topic, partition) -> start offset`` (``None``: delete the state) of a forwarded request.
Targets = dict[tuple[str, int], int | None]


def _expired(message: AdminRequest, now_ms: int) -> LogEvent | None:
    """``share_group_admin_expired`` if an admin request was read after its deadline (it is
    dropped unanswered): read again after a restart or rebalance (Faust resumes from its
    committed offset), or read late. Its admin has given up, and applying it now could discard
    what members did since."""
    if message.deadline_ms and now_ms > message.deadline_ms:
        return LogEvent.warning(
            "share_group_admin_expired",
            group=message.group,
            kind=message.kind,
            admin_id=message.admin_id,
            late_ms=now_ms - message.deadline_ms,
        )
    return None


def _answer(request: AdminRequest | ResetRequest, response: protocol.AdminResponse) -> Reply:
    return Reply(request.admin_id, request.reply_partition, response)


def _refused(message: AdminRequest, exc: ShareGroupError) -> CoordinatorResult:
    """The admin's answer carrying ``exc``, and the refusal logged (nothing was changed)."""
    response = protocol.AdminResponse(message.admin_id, message.request_id)
    response.error, response.error_message = exc.code.value, exc.message
    event = LogEvent.warning(
        "share_group_admin_refused",
        group=message.group,
        kind=message.kind,
        admin_id=message.admin_id,
        error=str(exc),
    )
    return CoordinatorResult(events=(event,), replies=(_answer(message, response),))


def _check_topics(group: ShareGroup, names: Iterable[str]) -> None:
    unknown = sorted({t for t in names if t not in group.partitions})
    if unknown:
        known = ", ".join(sorted(group.partitions)) or "none"
        raise ShareGroupError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"share group {group.group_id!r} has no share-partitions of topic(s) "
            f"{', '.join(unknown)} (its topics: {known})",
        )


def _empty_group(
    state: CoordinatorState, group_id: str, now_ms: int
) -> tuple[CoordinatorResult, ShareGroup]:
    """The group a forwarded request names, which must exist and be empty (members whose
    session lapsed are expired first, as a tick would; that result comes with it).

    Raises:
        ShareGroupError: ``INVALID_REQUEST`` (another request on the group is pending),
            ``GROUP_ID_NOT_FOUND``, ``CORRUPT_STATE``. ``NON_EMPTY_GROUP`` is raised as
            :class:`_NonEmpty`, which carries the expiry's result.
    """
    if group_id in state.pending:
        raise ShareGroupError(
            ErrorCode.INVALID_REQUEST,
            f"another admin request on share group {group_id!r} is in progress; retry",
        )
    group = state.existing_group(group_id, now_ms)
    expired = expire_members(state, group, now_ms, log_expiry=False)
    if group.members:
        holders = describe_holders(
            [(m.member_id, m.client_id, m.last_heartbeat_ms) for m in group.members.values()],
            now_ms,
        )
        raise _NonEmpty(
            expired,
            ShareGroupError(
                ErrorCode.NON_EMPTY_GROUP,
                f"share group {group_id!r} is not empty: it has {len(group.members)} "
                f"member(s): {holders}; stop its consumers first, or wait: a member is expired "
                f"{group.session_timeout_ms} ms (share.session.timeout.ms) after its last "
                "heartbeat",
            ),
        )
    return expired, group


class _NonEmpty(Exception):
    """A group with members after its expiry (whose result must still be performed)."""

    def __init__(self, expired: CoordinatorResult, error: ShareGroupError) -> None:
        super().__init__(error.message)
        self.expired = expired
        self.error = error


def begin_admin(
    state: CoordinatorState, message: ResetRequest, now_ms: int
) -> tuple[CoordinatorResult, ShareGroup | None]:
    """Check an offsets or delete request up to the point where partition counts are needed.

    Returns:
        The result so far (members expired on the way; or the refusal, or nothing for a request
        read after its deadline) and the group to go on with (:func:`forward_admin`), or
        ``None`` when the request is done.
    """
    late = _expired(message, now_ms)
    if late is not None:
        return CoordinatorResult(events=(late,)), None
    try:
        expired, group = _empty_group(state, message.group, now_ms)
    except _NonEmpty as exc:
        return exc.expired + _refused(message, exc.error), None
    except ShareGroupError as exc:
        return _refused(message, exc), None
    if isinstance(message, protocol.AlterShareGroupOffsetsRequest):
        try:
            _check_topics(group, (t for t, _, _ in message.offsets))
        except ShareGroupError as exc:
            return expired + _refused(message, exc), None
    return expired, group


def count_topics(message: ResetRequest) -> list[str]:
    """The topics whose partition counts :func:`forward_admin` needs (sorted)."""
    if isinstance(message, protocol.AlterShareGroupOffsetsRequest):
        return sorted({t for t, _, _ in message.offsets})
    return []


def _alter_targets(
    group: ShareGroup, offsets: list[tuple[str, int, int]], counts: Mapping[str, int]
) -> Targets:
    targets: Targets = {}
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


def _targets(
    message: ResetRequest, group: ShareGroup, counts: Mapping[str, int]
) -> tuple[str, Targets]:
    """The operation's name and the share-partitions it resets."""
    match message:
        case protocol.AlterShareGroupOffsetsRequest():
            return "alter offsets", _alter_targets(group, message.offsets, counts)
        case protocol.DeleteShareGroupOffsetsRequest():
            _check_topics(group, message.topics)
            names = sorted(set(message.topics))
            return "delete offsets", {
                (t, p): None for t in names for p in range(group.partitions[t])
            }
        case protocol.DeleteShareGroupRequest():
            return "delete group", {
                (t, p): None for t in sorted(group.partitions) for p in range(group.partitions[t])
            }
        case _:  # a parked-key request is forwarded by .parked_keys
            raise ShareGroupError(ErrorCode.INVALID_REQUEST, f"not a reset: {message.kind}")


def forward_admin(
    state: CoordinatorState,
    message: ResetRequest,
    group: ShareGroup,
    counts: Mapping[str, int] | ShareGroupError,
    now_ms: int,
) -> CoordinatorResult:
    """Forward a request :func:`begin_admin` admitted to the share-partitions' leaders.

    Args:
        state: the coordinator state.
        message: the request.
        group: the group :func:`begin_admin` returned.
        counts: partition counts of :func:`count_topics`, or the error looking them up.
        now_ms: wall ms.

    Returns:
        ResetSharePartition messages (the request becomes pending: joins of the group are
        refused until it is answered or expires), or the refusal, or the answer at once when
        the group has no share-partitions.
    """
    try:
        if isinstance(counts, ShareGroupError):
            raise counts
        operation, targets = _targets(message, group, counts)
    except ShareGroupError as exc:
        return _refused(message, exc)
    deadline = message.deadline_ms or now_ms + ADMIN_DEADLINE_MS
    pending = PendingAdmin(message, operation, set(targets), deadline)
    event = LogEvent.info(
        "share_group_admin_request",
        group=group.group_id,
        operation=operation,
        admin_id=message.admin_id,
        share_partitions=len(targets),
    )
    started = CoordinatorResult(events=(event,))
    if not targets:
        pending.move(AdminState.ANSWERED)
        return started + _finish(state, pending, now_ms)
    state.pending[group.group_id] = pending
    epoch = state.epoch(group.group_id)
    resets = tuple(
        ToLeader(
            protocol.ResetSharePartition(
                group=group.group_id,
                topic=topic,
                partition=partition,
                admin_id=message.admin_id,
                request_id=message.request_id,
                start_offset=start,
                deadline_ms=deadline,
                coordinator_epoch=epoch,
            )
        )
        for (topic, partition), start in sorted(targets.items())
    )
    return started + CoordinatorResult(to_leaders=resets)


def handle_reset_result(
    state: CoordinatorState, message: protocol.ResetSharePartitionResult, now_ms: int
) -> CoordinatorResult:
    """A leader's answer to a ResetSharePartition; the admin is answered once every leader of
    the request has. Late (the request timed out) or repeated answers are ignored."""
    pending = state.pending.get(message.group)
    if pending is None or not pending.answered(message):
        return NOTHING
    if pending.state is not AdminState.ANSWERED:
        return NOTHING
    del state.pending[message.group]
    return _finish(state, pending, now_ms)


def _finish(state: CoordinatorState, pending: PendingAdmin, now_ms: int) -> CoordinatorResult:
    """Answer the admin; a successful group deletion also deletes the group's metadata, and a
    successful offsets deletion forgets the topics."""
    request = pending.request
    response = protocol.AdminResponse(request.admin_id, request.request_id)
    failed = []
    for (topic, partition), result in sorted(pending.results.items()):
        response.results.append(
            (topic, partition, result.error, result.error_message, result.start_offset)
        )
        if result.error != ErrorCode.NONE.value:
            failed.append(result)
    events: list[LogEvent] = []
    records: list[GroupRecord] = []
    if failed:
        response.error = failed[0].error
        response.error_message = (
            f"{len(failed)} of {len(pending.results)} share-partitions refused the "
            f"{pending.operation}: "
            + "; ".join(f"{r.topic}[{r.partition}]: {r.error_message}" for r in failed)
        )
    elif isinstance(request, protocol.DeleteShareGroupRequest):
        state.groups.pop(request.group, None)
        state.directory.lag.pop(request.group, None)
        records.append(DeleteGroup(request.group))
    elif isinstance(request, protocol.DeleteShareGroupOffsetsRequest):
        group = state.group(request.group, now_ms)
        for topic in request.topics:
            group.partitions.pop(topic, None)
            group.added_partitions.pop(topic, None)
        record, events = state.persist(group)
        records.append(record)
    events.append(
        LogEvent.info(
            "share_group_admin_done",
            group=request.group,
            operation=pending.operation,
            admin_id=request.admin_id,
            error=response.error,
        )
    )
    return CoordinatorResult(
        events=tuple(events), records=tuple(records), replies=(_answer(request, response),)
    )


def expire_pending(state: CoordinatorState, now_ms: int) -> CoordinatorResult:
    """Give up on admin requests past their deadline: joins are allowed again (the leaders
    refuse a reset they read later), and the admin is told which share-partitions' leaders
    did not answer (``REQUEST_TIMED_OUT``) and what the others did."""
    result = NOTHING
    for group_id, pending in list(state.pending.items()):
        if now_ms <= pending.deadline_ms:
            continue
        del state.pending[group_id]
        pending.expire()
        unanswered = sorted(f"{t}[{p}]" for t, p in pending.waiting)
        event = LogEvent.warning(
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
        result += CoordinatorResult(events=(event,), replies=(_answer(request, response),))
    return result


def _applied(pending: PendingAdmin) -> str:
    done = sorted(
        f"{t}[{p}]" for (t, p), r in pending.results.items() if r.error == ErrorCode.NONE.value
    )
    return f"Applied to: {', '.join(done)}." if done else "Nothing was applied."


def handle_group_configs(
    state: CoordinatorState,
    message: protocol.DescribeGroupConfigsRequest | protocol.AlterGroupConfigsRequest,
    now_ms: int,
) -> CoordinatorResult:
    """Describe or alter a group's configs (docs/operations.md, "Group configs"): an alter is
    validated against the broker-level bounds as a whole (``INVALID_CONFIG``: nothing
    changes), stored with the group under a new config version, and answered with every
    config after it. The session timeout applies at once, the heartbeat interval at the
    members' next heartbeat, the leaders' configs with the tickets of their next heartbeat.

    As ``kafka-configs.sh --entity-type groups`` allows, the group need not exist yet: its
    configs are stored for it (a group no member has joined is not listed) and apply from its
    first join, e.g. ``share.auto.offset.reset=earliest``; a describe answers the defaults."""
    late = _expired(message, now_ms)
    if late is not None:
        return CoordinatorResult(events=(late,))
    response = protocol.AdminResponse(message.admin_id, message.request_id)
    result = NOTHING
    try:
        group = _config_target(state, message.group, now_ms)
        if isinstance(message, protocol.AlterGroupConfigsRequest):
            result = _alter_configs(state, message, group, now_ms)
            group = state.groups.get(group.group_id, group)
        response.configs = [
            (e.name, e.value, e.source, e.synonym) for e in group_configs.describe(state.ctx, group)
        ]
    except ShareGroupError as exc:
        return result + _refused(message, exc)
    return result + CoordinatorResult(replies=(_answer(message, response),))


def _config_target(state: CoordinatorState, group_id: str, now_ms: int) -> ShareGroup:
    """The group whose configs are described or altered; a group not stored yet is a new,
    empty one, not kept unless an alter changes its configs (Kafka keeps a group's configs
    apart from the group: they can be set before the first member joins).

    Raises:
        ShareGroupError: ``CORRUPT_STATE``.
    """
    try:
        return state.existing_group(group_id, now_ms)
    except ShareGroupError as exc:
        if exc.code is not ErrorCode.GROUP_ID_NOT_FOUND:
            raise
    settings = state.ctx.settings
    return ShareGroup(group_id, settings.session_timeout_ms, settings.max_size)


def _alter_configs(
    state: CoordinatorState,
    message: protocol.AlterGroupConfigsRequest,
    group: ShareGroup,
    now_ms: int,
) -> CoordinatorResult:
    try:
        dynamic = validate_group_configs(
            message.set_configs,
            state.ctx.settings,
            base=group.configs,
            delete=message.delete_configs,
            defaults=state.ctx.group_configs.get(group.group_id, {}),
        )
    except ConfigurationError as exc:
        raise ShareGroupError(ErrorCode.INVALID_CONFIG, str(exc)) from None
    events: list[LogEvent] = []
    records: tuple[GroupRecord, ...] = ()
    if dynamic != group.configs:
        group = state.group(group.group_id, now_ms)  # kept from now on if it was new
        group.configs = dynamic
        group.config_version += 1
        group.session_timeout_ms = group_configs.effective(state.ctx, group).session_timeout_ms
        record, events = state.persist(group)
        records = (record,)
    events.append(
        LogEvent.info(
            "share_group_configs_altered",
            group=group.group_id,
            admin_id=message.admin_id,
            set=message.set_configs,
            deleted=message.delete_configs,
            config_version=group.config_version,
        )
    )
    return CoordinatorResult(events=tuple(events), records=records)
