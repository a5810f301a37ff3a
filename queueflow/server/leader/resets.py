"""Admin resets and deletes of one share-partition's state, as pure handlers.

The coordinator forwards an admin ``alterShareGroupOffsets`` / ``deleteShareGroupOffsets``
(KIP-932 "Managing the SPSO and SPEO", DeleteShareGroupState) to the share-partition's leader as
a :class:`~queueflow.protocol.messages.ResetSharePartition` once it found the group empty; the
leader applies it in request-log order and answers the coordinator with a
:class:`~queueflow.protocol.messages.ResetSharePartitionResult`.
"""

from __future__ import annotations

from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.protocol import messages as protocol
from queueflow.server.durable import DurableSharePartition
from queueflow.server.leader.results import LeaderResult, LogEvent, NewState

__all__ = ["check_reset", "refused_reset", "reset"]


def _answer(
    message: protocol.ResetSharePartition, partition: int
) -> protocol.ResetSharePartitionResult:
    return protocol.ResetSharePartitionResult(
        group=message.group,
        topic=message.topic,
        partition=partition,
        admin_id=message.admin_id,
        request_id=message.request_id,
    )


def check_reset(
    message: protocol.ResetSharePartition,
    *,
    topic: str,
    request_topic: str,
    partition: int,
    now_ms: int,
) -> ShareGroupError | None:
    """Why the reset read from ``request_topic[partition]`` is refused before its
    share-partition is even loaded: ``UNKNOWN_TOPIC_OR_PARTITION`` for a share-partition not
    served there, ``REQUEST_TIMED_OUT`` after the request's deadline (the coordinator no longer
    holds joins back). ``None``: go on."""
    if message.topic != topic or message.partition != partition:
        return ShareGroupError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"share-partition {message.topic}[{message.partition}] is not served on "
            f"{request_topic}[{partition}]",
        )
    if message.deadline_ms and now_ms > message.deadline_ms:
        return ShareGroupError(
            ErrorCode.REQUEST_TIMED_OUT,
            f"the admin request's deadline passed {now_ms - message.deadline_ms} ms "
            "before this leader read it; nothing was changed",
        )
    return None


def reset(
    message: protocol.ResetSharePartition,
    durable: DurableSharePartition | None,
    *,
    partition: int,
    offset: int,
) -> LeaderResult:
    """Reset (``start_offset`` set) or delete (``None``) the share-partition ``durable``
    (``None``: it has no state) on behalf of the reset read at request ``offset``. A reset
    discards every in-flight record and delivery count.

    Raises:
        ShareGroupError: ``NON_EMPTY_GROUP`` when a record is Acquired (a member fetched since
            the coordinator's check); nothing changed.
    """
    if durable is not None and durable.engine.acquired_count:
        raise ShareGroupError(
            ErrorCode.NON_EMPTY_GROUP,
            f"share group {message.group!r} is not empty: {durable.engine.acquired_count} "
            f"records of {message.topic}[{partition}] are Acquired by members",
        )
    answer = _answer(message, partition)
    if message.start_offset is None:
        effects = LeaderResult() if durable is None else LeaderResult(deletes=(durable,))
    elif durable is None:
        effects = LeaderResult(creates=(NewState(message.group, partition, message.start_offset),))
        answer.start_offset = message.start_offset
    else:
        durable.engine.reset_start_offset(message.start_offset)
        effects = LeaderResult(writes=(durable,))
        answer.start_offset = durable.engine.start_offset
    changed = bool(effects.deletes or effects.creates or effects.writes)
    log = LogEvent(
        "info",
        "share_partition_deleted" if message.start_offset is None else "share_partition_reset",
        {
            "group": message.group,
            "partition": partition,
            "start_offset": message.start_offset,
            "admin_id": message.admin_id,
        },
    )
    return effects + LeaderResult(
        position=offset if changed else None,
        flush=changed,
        changed=changed,
        logs=(log,),
        coordinator_replies=(answer,),
    )


def refused_reset(
    message: protocol.ResetSharePartition, partition: int, error: ShareGroupError
) -> LeaderResult:
    """The coordinator's answer to a refused reset (``error``), logged; nothing changed."""
    answer = _answer(message, partition)
    answer.error, answer.error_message = error.code.value, error.message
    return LeaderResult(
        logs=(
            LogEvent(
                "warning",
                "share_partition_reset_refused",
                {"group": message.group, "partition": partition, "error": str(error)},
            ),
        ),
        coordinator_replies=(answer,),
    )
