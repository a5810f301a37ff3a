"""The coordinator's side of releasing and skipping a parked key (key-ordered share groups,
``share.ordering=key``; docs/concepts.md "Key-ordered sharing").

A :class:`~queueflow.protocol.messages.ParkedKeyRequest` is checked here (the group exists and
has share-partitions of the topic, the partition exists, the action and key hash are valid)
and forwarded to the leaders of the named share-partitions as a
:class:`~queueflow.protocol.messages.ResetSharePartition` with ``key_action`` set, through the
same pending-request lifecycle as a reset (:mod:`~.admin_state`): the admin is answered once
every leader has, by :func:`~.admin.handle_reset_result`. Unlike a reset the group need not be
empty. Pure: returns a :class:`~.results.CoordinatorResult`.
"""

from __future__ import annotations

from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.protocol import messages as protocol
from queueflow.server.coordinator.admin import ADMIN_DEADLINE_MS, _expired, _refused
from queueflow.server.coordinator.admin_state import PendingAdmin
from queueflow.server.coordinator.results import CoordinatorResult, LogEvent, ToLeader
from queueflow.server.coordinator.state import CoordinatorState

__all__ = ["ACTIONS", "handle_parked_key"]

#: What an operator can do with a parked key.
ACTIONS = ("release", "skip")


def _targets(state: CoordinatorState, message: protocol.ParkedKeyRequest, now_ms: int) -> list[int]:
    """The partitions of ``message.topic`` the request reaches.

    Raises:
        ShareGroupError: ``INVALID_REQUEST`` (an unknown action, a bad key hash, another admin
            request on the group pending), ``GROUP_ID_NOT_FOUND``,
            ``UNKNOWN_TOPIC_OR_PARTITION``.
    """
    if message.action not in ACTIONS:
        raise ShareGroupError(
            ErrorCode.INVALID_REQUEST,
            f"unknown parked-key action {message.action!r}; use release or skip",
        )
    try:
        int(message.key_hash, 16)
    except ValueError:
        raise ShareGroupError(
            ErrorCode.INVALID_REQUEST, f"key hash {message.key_hash!r} is not hexadecimal"
        ) from None
    if message.group in state.pending:
        raise ShareGroupError(
            ErrorCode.INVALID_REQUEST,
            f"another admin request on share group {message.group!r} is in progress; retry",
        )
    group = state.existing_group(message.group, now_ms)
    count = group.partitions.get(message.topic)
    if count is None:
        known = ", ".join(sorted(group.partitions)) or "none"
        raise ShareGroupError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"share group {message.group!r} has no share-partitions of topic "
            f"{message.topic!r} (its topics: {known})",
        )
    if message.partition == -1:
        return list(range(count))
    if not 0 <= message.partition < count:
        raise ShareGroupError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"topic {message.topic!r} has no partition {message.partition} "
            f"(partitions 0..{count - 1})",
        )
    return [message.partition]


def handle_parked_key(
    state: CoordinatorState, message: protocol.ParkedKeyRequest, now_ms: int
) -> CoordinatorResult:
    """Check a release or skip of a parked key and forward it to the share-partitions'
    leaders (the request is pending until they answer or its deadline passes); a refusal is
    answered at once, changing nothing."""
    late = _expired(message, now_ms)
    if late is not None:
        return CoordinatorResult(events=(late,))
    try:
        partitions = _targets(state, message, now_ms)
    except ShareGroupError as exc:
        return _refused(message, exc)
    deadline = message.deadline_ms or now_ms + ADMIN_DEADLINE_MS
    operation = f"{message.action} of key hash:{message.key_hash}"
    waiting = {(message.topic, p) for p in partitions}
    state.pending[message.group] = PendingAdmin(message, operation, waiting, deadline)
    epoch = state.epoch(message.group)
    event = LogEvent.info(
        "share_group_admin_request",
        group=message.group,
        operation=operation,
        admin_id=message.admin_id,
        share_partitions=len(partitions),
    )
    return CoordinatorResult(
        events=(event,),
        to_leaders=tuple(
            ToLeader(
                protocol.ResetSharePartition(
                    group=message.group,
                    topic=message.topic,
                    partition=p,
                    admin_id=message.admin_id,
                    request_id=message.request_id,
                    deadline_ms=deadline,
                    coordinator_epoch=epoch,
                    key_action=message.action,
                    key_hash=message.key_hash,
                )
            )
            for p in partitions
        ),
    )
