"""The leader's pure request handlers (KIP-932 "ShareFetch API", "Share group membership").

Each handler changes only in-memory state (a share-partition's engine, the fencing state) and
returns what must happen as a :class:`~queueflow.server.leader.results.LeaderResult` or
:class:`~queueflow.server.leader.results.FetchResult`: no awaits, no table writes, no sends,
no logging. The inputs that need the broker or the state table (the share-partition, the log
end) are gathered by :class:`~queueflow.server.leader.manager.ShareLeader` first, and it performs
the result (:meth:`~queueflow.server.leader.manager.ShareLeader._apply`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from queueflow.engine.partition import AcknowledgementBatch, MemberFence
from queueflow.errors import CorruptStateError, ErrorCode, ShareGroupError
from queueflow.protocol import messages as protocol
from queueflow.server.durable import DurableSharePartition
from queueflow.server.leader.ack_batches import ack_batches
from queueflow.server.leader.dead_letter_notes import DeadLetterNotes
from queueflow.server.leader.results import (
    NOTHING,
    FetchResult,
    LeaderResult,
    LogEvent,
    MemberReply,
    MetricIncrement,
)
from queueflow.server.tickets import TicketRefusal

__all__ = [
    "acquire",
    "answer_from_log",
    "archived_effects",
    "expire",
    "fence_effects",
    "new_response",
    "refusal_effects",
    "refused_fetch",
    "release_member",
    "share_fetch",
    "tick",
    "unloadable_fetch",
]


def new_response(
    request: protocol.ShareFetchRequest, topic: str, partition: int
) -> protocol.ShareFetchResponse:
    """An empty answer to ``request`` (nothing acquired, no error yet)."""
    return protocol.ShareFetchResponse(
        member_id=request.member_id,
        request_id=request.request_id,
        topic=topic,
        partition=partition,
    )


def refusal_effects(
    refusal: TicketRefusal, request: protocol.ShareFetchRequest, topic: str, partition: int
) -> LeaderResult:
    """A ticket refusal counted (``queueflow_ticket_refusals``) and logged rate-limited
    (``share_fetch_refused``)."""
    return LeaderResult(
        metrics=(MetricIncrement("ticket_refusals", (topic, refusal.reason)),),
        logs=(
            LogEvent(
                "warning",
                "share_fetch_refused",
                {
                    "group": request.group,
                    "partition": partition,
                    "member_id": request.member_id,
                    "principal": refusal.principal,
                    "code": refusal.code.value,
                    "reason": refusal.reason,
                    "detail": refusal.message,
                    "acknowledgements": len(request.acks),
                },
                limiter="refusals",
            ),
        ),
    )


def refused_fetch(
    request: protocol.ShareFetchRequest, topic: str, partition: int, refusal: TicketRefusal
) -> FetchResult:
    """The answer to a request whose ticket does not prove a current member: the refusal's
    code for the fetch and for its acknowledgements; nothing loaded or changed."""
    response = new_response(request, topic, partition)
    response.error, response.error_message = refusal.code.value, refusal.message
    if request.acks:
        response.ack_error, response.ack_error_message = response.error, response.error_message
    return FetchResult(response, None, refusal_effects(refusal, request, topic, partition))


def unloadable_fetch(
    request: protocol.ShareFetchRequest, topic: str, partition: int, error: CorruptStateError
) -> FetchResult:
    """The answer to a request for a share-partition whose state is corrupt."""
    response = new_response(request, topic, partition)
    response.error, response.error_message = error.code.value, error.message
    return FetchResult(response, None)


def expire(durable: DurableSharePartition, now_ms: int) -> tuple[int, LeaderResult]:
    """Expire the share-partition's elapsed acquisition locks (KIP-932 "acquisition lock");
    return how many records and the count for ``queueflow_share_partition_lock_expiries``."""
    expired = durable.engine.expire_locks(now_ms)
    if not expired:
        return 0, NOTHING
    labels = (durable.group, durable.topic, str(durable.partition))
    result = LeaderResult(metrics=(MetricIncrement("lock_expiries", labels, expired),))
    for fence in durable.engine.take_fences():  # locks held to the renewal cap in bulk
        result = result + fence_effects(durable, fence)
    return expired, result


def share_fetch(
    durable: DurableSharePartition,
    request: protocol.ShareFetchRequest,
    now_ms: int,
    *,
    acquire_from: tuple[int | None, TicketRefusal | None] | None,
    expire_ms: int | None = None,
    notes: DeadLetterNotes | None = None,
) -> FetchResult:
    """Apply a request's acknowledgements atomically, then acquire (KIP-932 "ShareFetch API":
    expire elapsed locks first).

    Args:
        durable: the request's share-partition (loaded).
        request: the request, its ticket admitted for acknowledging.
        now_ms: wall-clock ms.
        acquire_from: ``None`` to acquire nothing; else ``(log_end, refusal)``: the high
            watermark to acquire below and the ticket's refusal for acquiring (or ``None``).
        expire_ms: the time to expire locks as of (default ``now_ms``; an exactly-once
            leader's ``min(now, ack_safe_ms)``: :mod:`~queueflow.server.leader.ack_clock`).
        notes: where the REJECTs and failed RELEASEs of a group with a dead-letter topic are
            noted for its headers (:mod:`~queueflow.server.leader.dead_letter_notes`).

    Returns:
        The answer and the share-partition (the caller writes its changes).
    """
    response = new_response(request, durable.topic, durable.partition)
    _expired, effects = expire(durable, now_ms if expire_ms is None else expire_ms)
    engine = durable.engine
    if request.acks:
        batches: list[AcknowledgementBatch] = []
        try:
            batches = ack_batches(request.acks, request.ack_delay_ms, request.ack_undelivered)
            fence = engine.acknowledge(request.member_id, batches, now_ms, request.lock_duration_ms)
            if fence is not None:
                effects = effects + fence_effects(durable, fence)
            if notes is not None and engine.config.dead_letter:
                notes.remember(durable.group, durable.partition, request, engine)
        except (ShareGroupError, ValueError) as exc:
            code = exc.code if isinstance(exc, ShareGroupError) else ErrorCode.INVALID_REQUEST
            response.ack_error, response.ack_error_message = code.value, str(exc)
            # A RENEW past share.record.lock.max.renewal.ms is stale too (needs the types).
            response.ack_stale = engine.stale_acknowledgements(
                request.member_id,
                batches
                or [AcknowledgementBatch(first, last, ()) for first, last, _ in request.acks],
            )
    if acquire_from is not None:
        log_end, refusal = acquire_from
        effects = effects + acquire(durable, request, response, now_ms, log_end, refusal)
    return FetchResult(response, durable, effects + archived_effects(durable))


def archived_effects(durable: DurableSharePartition) -> LeaderResult:
    """The records the share-partition Archived since the last call, each logged once as
    ``records_archived`` (docs/operations.md): one line per reason and delivery count, with
    the offset ranges merged. ``warning`` for records archived at the delivery count limit,
    ``info`` for REJECTed ones."""
    archived = durable.engine.take_archived()
    if not archived:
        return NOTHING
    groups: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for a in archived:
        groups.setdefault((a.reason, a.delivery_count), []).append((a.first, a.last))
    logs = []
    for (reason, count), ranges in groups.items():
        fields = {
            "group": durable.group,
            "partition": durable.partition,
            "offsets": ",".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in ranges),
            "records": sum(hi - lo + 1 for lo, hi in ranges),
            "reason": reason,
            "delivery_count": count,
        }
        level: Literal["info", "warning"] = "info" if reason == "rejected" else "warning"
        logs.append(LogEvent(level, "records_archived", fields))
    return LeaderResult(logs=tuple(logs))


def fence_effects(durable: DurableSharePartition, fence: MemberFence) -> LeaderResult:
    """A member fenced from a share-partition for RELEASing records without handling them:
    logged ``member_fenced_release_abuse`` (naming the member, its counts and the settings)
    and counted in ``queueflow_member_fences``; the share-partition's changes are written by
    the caller."""
    config = durable.engine.config
    return LeaderResult(
        metrics=(MetricIncrement("member_fences", (durable.group, durable.topic, "release")),),
        logs=(
            LogEvent(
                "warning",
                "member_fenced_release_abuse",
                {
                    "group": durable.group,
                    "topic": durable.topic,
                    "partition": durable.partition,
                    "member_id": fence.member_id,
                    "released": fence.released,
                    "handled": fence.handled,
                    "counts_restored": fence.restored,
                    "records_returned": fence.returned,
                    "fenced_until_ms": fence.until_ms,
                    "setting": (
                        f"share.member.release.abuse.records={config.release_abuse_records}, "
                        "share.member.release.abuse.ratio.percent="
                        f"{config.release_abuse_ratio_percent}, "
                        "share.member.release.abuse.window.ms="
                        f"{config.release_abuse_window_ms}"
                    ),
                },
            ),
        ),
    )


def acquire(
    durable: DurableSharePartition,
    request: protocol.ShareFetchRequest,
    response: protocol.ShareFetchResponse,
    now_ms: int,
    log_end: int | None,
    refusal: TicketRefusal | None,
) -> LeaderResult:
    """Acquire up to the request's ``max_records`` below ``log_end`` into ``response``, unless
    its ticket was refused for acquiring (``refusal``: then ``response.error`` is set). Counts
    acquisitions and deliveries."""
    if refusal is not None:
        response.error, response.error_message = refusal.code.value, refusal.message
        return refusal_effects(refusal, request, durable.topic, durable.partition)
    assert log_end is not None
    try:
        acquired = durable.engine.acquire(
            request.member_id, request.max_records, log_end, now_ms, request.lock_duration_ms
        )
    except ShareGroupError as exc:
        response.error, response.error_message = exc.code.value, exc.message
        acquired = []
    response.acquired = [(a.first_offset, a.last_offset, a.delivery_count) for a in acquired]
    labels = (request.group, durable.topic, str(durable.partition))
    metrics: list[MetricIncrement] = []
    for a in acquired:
        n = a.last_offset - a.first_offset + 1
        metrics.append(MetricIncrement("acquisitions", labels, n))
        metrics.append(MetricIncrement("deliveries", (*labels, str(a.delivery_count)), n))
    response.lock_timeout_ms = (
        request.lock_duration_ms or durable.engine.config.record_lock_duration_ms
    )
    return LeaderResult(metrics=tuple(metrics))


def answer_from_log(
    fetched: FetchResult,
    request: protocol.ShareFetchRequest,
    offset: int,
    now_ms: int,
    *,
    replayed: bool,
) -> LeaderResult:
    """What a ShareFetch read from the request log at ``offset`` makes happen: its
    share-partition's changes written, the request's position persisted (and, with durability
    ``acked``, flushed before the answer) when it acknowledged or acquired, the answer sent
    (a ``replayed`` request only if its member still waits), and parked long polls woken
    when acknowledgements may have released records."""
    result = replace(fetched.effects, changed=bool(request.acks))
    if fetched.durable is not None:
        moved = bool(request.acks or fetched.response.acquired)
        result = result + LeaderResult(
            writes=(fetched.durable,), position=offset if moved else None, flush=moved
        )
    if not replayed or now_ms < request.deadline_ms:
        result = result + LeaderResult(replies=(MemberReply(request, fetched.response),))
    return result


def tick(live: list[DurableSharePartition], now_ms: int) -> LeaderResult:
    """A clock tick of a request partition: expire the elapsed locks of its ``live``
    share-partitions, and write those that changed."""
    result = NOTHING
    for durable in live:
        expired, effects = expire(durable, now_ms)
        if expired:
            result = result + effects + LeaderResult(writes=(durable,), changed=True)
            result = result + archived_effects(durable)
    return result


def release_member(
    message: protocol.ReleaseMember,
    holder: DurableSharePartition | None,
    now_ms: int,
    offset: int,
) -> LeaderResult:
    """Release every record the departed member holds in ``holder`` (KIP-932 "Share group
    membership"; ``None``: the share-partition has no state, nothing to release). On an
    exactly-once app the engine ends the member's locks at ``now_ms`` instead (they elapse as
    of the lock clock: :mod:`~queueflow.server.leader.ack_clock`)."""
    released = 0 if holder is None else holder.engine.release_member(message.member_id, now_ms)
    if not released or holder is None:
        return NOTHING
    return archived_effects(holder) + LeaderResult(
        writes=(holder,),
        position=offset,
        changed=True,
        logs=(
            LogEvent(
                "info",
                "member_records_released",
                {
                    "group": message.group,
                    "partition": holder.partition,
                    "member_id": message.member_id,
                    "records": released,
                    "reason": message.reason,
                },
            ),
        ),
    )
