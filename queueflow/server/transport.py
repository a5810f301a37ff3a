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
from queueflow.protocol.envelope import reply_dest, topic_dest
from queueflow.protocol.roles import ControlAuth
from queueflow.protocol.sealed_replies import reply_route
from queueflow.server.context import ServerContext

__all__ = [
    "FENCE_RESEND_MS",
    "control_auth",
    "monotonic_ms",
    "not_leader",
    "send_due_fences",
    "send_reply",
]

log = structlog.get_logger("queueflow.server.transport")

#: Resend an own fence not read back within this many ms (see :mod:`queueflow.engine.fencing`).
FENCE_RESEND_MS = 1000


def control_auth(ctx: ServerContext, role: str) -> ControlAuth:
    """The :class:`~queueflow.protocol.roles.ControlAuth` of one server loop (``role``: leader,
    coordinator, ticker, endpoint) under ``queueflow.auth.mode``, signing as a worker; each has
    its own replay guard.

    Raises:
        ConfigurationError: hmac without the worker secret, or a weak one.
    """
    return ControlAuth.from_settings(ctx.settings, ctx.app_id, f"{ctx.app_id}/{role}")


async def send_reply(
    ctx: ServerContext,
    auth: ControlAuth,
    recipient: str,
    reply_partition: int,
    body: bytes,
    reply_key: bytes = b"",
    *,
    member: bool = True,
) -> None:
    """Answer a member (or an admin) on the reply topic partition it reads.

    With ``queueflow.auth.mode=hmac`` and the member's ``reply_key`` (its X25519 public key,
    from its heartbeat or its ticket), ``body`` is sealed by the workers so that only that
    member can read it, keyed by :func:`~queueflow.protocol.sealed_replies.reply_route` (the
    member id is not in the clear; :mod:`queueflow.protocol.sealed_replies`). Without a key, an
    admin's answer goes in a worker envelope keyed by its id; a member's is dropped (it could
    not open it), as is one to an invalid key (logged).

    Args:
        recipient: the member id or admin id.
        body: the encoded message.
        member: the recipient is a member (not an admin).
    """
    topic = topics.reply_topic(ctx.app_id)
    if auth.enabled and reply_key:
        route = reply_route(reply_key)
        try:
            value = auth.seal_reply(reply_key, body, reply_dest(topic, reply_partition, route))
        except ValueError as exc:
            log.warning("reply_unsealable", member_id=recipient, error=str(exc))
            return
        key = route
    elif auth.enabled and member:
        log.warning("reply_unsealable", member_id=recipient, error="no valid reply key")
        return
    else:
        key = recipient
        value = auth.seal(body, reply_dest(topic, reply_partition, key))
    await ctx.sender.send(topic, reply_partition, value, key.encode())


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
        await ctx.sender.send(topic, p, auth.seal(protocol.encode(fence), topic_dest(topic, p)))
        sent.append((p, epoch))
    return sent
