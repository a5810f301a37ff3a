"""What the server loops (leaders, coordinator, ticker, direct endpoint) share to talk to
members and to each other: the control-message authenticator of a loop, replies on the reply
topic (sealed to the member's key under ``queueflow.auth.mode=hmac``), the
``NOT_LEADER_OR_FOLLOWER`` answer, and the fences every owner of a partition appends
(:mod:`queueflow.engine.fencing`).
"""

from __future__ import annotations

import structlog

from queueflow.clock import Clock
from queueflow.engine.fencing import PartitionFencing
from queueflow.errors import ErrorCode
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics
from queueflow.protocol.auth import ControlAuth
from queueflow.protocol.sealed_replies import reply_route
from queueflow.server.context import ServerContext
from queueflow.settings import AuthMode

__all__ = [
    "FENCE_RESEND_MS",
    "control_auth",
    "monotonic_ms",
    "not_leader",
    "seal_reply",
    "send_due_fences",
    "send_reply",
]

log = structlog.get_logger("queueflow.server.transport")

#: Resend an own fence not read back within this many ms (see :mod:`queueflow.engine.fencing`).
FENCE_RESEND_MS = 1000


def control_auth(ctx: ServerContext, role: str) -> ControlAuth:
    """The :class:`~queueflow.protocol.auth.ControlAuth` of one server loop (``role``: leader,
    coordinator, ticker, endpoint) under ``queueflow.auth.mode``; each has its own replay cache."""
    s = ctx.settings
    return ControlAuth(s.control_auth_mode, s.auth_secret, ctx.app_id, f"{ctx.app_id}/{role}")


async def send_reply(
    ctx: ServerContext,
    member_id: str,
    reply_partition: int,
    value: bytes,
    reply_key: bytes = b"",
) -> None:
    """Answer a member on the reply topic partition it reads, keyed by its member id.

    With ``queueflow.auth.mode=hmac`` and the member's ``reply_key`` (its X25519 public key, from
    its heartbeat or its ticket), the answer is sealed so that only that member can read it and
    keyed by :func:`~queueflow.protocol.sealed_replies.reply_route` instead of the member id
    (:mod:`queueflow.protocol.sealed_replies`); an answer to an invalid key is dropped (logged).
    """
    key = member_id
    if reply_key and ctx.settings.control_auth_mode is AuthMode.HMAC:
        try:
            value = seal_reply(ctx, reply_key, value)
        except ValueError as exc:
            log.warning("reply_unsealable", member_id=member_id, error=str(exc))
            return
        key = reply_route(reply_key)
    await ctx.sender.send(topics.reply_topic(ctx.app_id), reply_partition, value, key.encode())


def seal_reply(ctx: ServerContext, reply_key: bytes, value: bytes) -> bytes:
    """``value`` sealed to the member's ``reply_key`` with ``queueflow.auth.mode=hmac``
    (:mod:`queueflow.protocol.sealed_replies`); unchanged without a key or in ``none`` mode.

    Raises:
        ValueError: ``reply_key`` is not a valid X25519 public key.
    """
    if not reply_key or ctx.settings.control_auth_mode is not AuthMode.HMAC:
        return value
    return ctx.reply_sealer.seal(reply_key, value)


def not_leader(request: protocol.ShareFetchRequest, why: str) -> protocol.ShareFetchResponse:
    """The ``NOT_LEADER_OR_FOLLOWER`` answer to ``request`` (nothing of it was applied), with
    ``why`` as the message: the member re-routes."""
    return protocol.ShareFetchResponse(
        member_id=request.member_id,
        request_id=request.request_id,
        topic=request.topic,
        partition=request.partition,
        error=ErrorCode.NOT_LEADER_OR_FOLLOWER.value,
        error_message=why,
    )


def monotonic_ms(clock: Clock) -> int:
    """``clock``'s monotonic time in ms (the stall guard's and fence resends' clock)."""
    return int(clock.monotonic() * 1000)


async def send_due_fences(
    ctx: ServerContext, fencing: PartitionFencing, auth: ControlAuth, topic: str
) -> list[tuple[int, int]]:
    """Append this worker's fence to each partition of ``topic`` that ``fencing`` says is due
    (owned, not live yet, not resent within :data:`FENCE_RESEND_MS`), once Faust has finished
    rebalancing: what the stream fetches during a rebalance would be dropped, the fence with
    it. Leaders and the coordinator fence the same way (:mod:`queueflow.engine.fencing`).

    Returns:
        ``(partition, epoch)`` of every fence sent.
    """
    if not ctx.runtime.streams_active:
        return []
    sent = []
    for p in fencing.fences_due(monotonic_ms(ctx.clock), FENCE_RESEND_MS):
        epoch = fencing.partitions[p].epoch
        fence = protocol.Fence(leader_epoch=epoch, sent_ms=ctx.clock.now_ms())
        await ctx.sender.send(topic, p, auth.seal(protocol.encode(fence)))
        sent.append((p, epoch))
    return sent
