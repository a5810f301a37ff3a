"""How a member reaches the leaders and the coordinator: requests out, replies back.

* :class:`MemberTransport` is the seam: send a request record to an internal topic partition,
  hand every reply addressed to this member to a callback. :class:`KafkaMemberTransport` does it
  over Kafka (the request topics and the reply topic); an in-process one
  (:mod:`queueflow.testing.inprocess`) does it in memory for unit tests.
* :class:`Requester` correlates requests and replies by request id and turns a missing answer
  into ``REQUEST_TIMED_OUT`` (KIP-932 RPCs are request/response; queueflow carries them as
  records, so the correlation is ours).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

import structlog
from aiokafka.errors import UnknownTopicOrPartitionError

from queueflow.errors import ErrorCode, ShareGroupError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.reply_channel import KafkaReplyChannel, ReplyHandler
from queueflow.logging import JunkDrops, get_logger
from queueflow.metrics import Metrics
from queueflow.protocol import messages as protocol
from queueflow.protocol import topics as internal
from queueflow.protocol.envelope import reply_dest, topic_dest
from queueflow.protocol.prefilter import reply_prefilter
from queueflow.protocol.roles import ControlAuth, check_values, refusal_labels
from queueflow.protocol.sealed_replies import reply_route

__all__ = ["KafkaMemberTransport", "MemberTransport", "ReplyHandler", "Requester"]

log = structlog.get_logger("queueflow.member.transport")

#: How long (ms) the broker may hold a member's fetch of the reply topic when it is empty.
REPLY_FETCH_WAIT_MS = 5000


class MemberTransport(Protocol):
    """Carries one member's requests and replies.

    Attributes:
        reply_partition: the reply-topic partition this member reads; leaders answer there.
    """

    reply_partition: int

    async def start(self, on_reply: ReplyHandler) -> None:
        """Connect; from now on call ``on_reply(bytes)`` for each reply keyed by this member."""
        ...

    async def send(self, topic: str, partition: int, payload: bytes) -> None:
        """Append one request record to ``topic[partition]``, keyed by the transport's key (the
        member id, or under ``hmac`` the pseudonym of its key)."""
        ...

    async def close(self) -> None:
        """Disconnect (idempotent)."""
        ...


class KafkaMemberTransport(KafkaReplyChannel):
    """Requests as records on the request topics (acks=1, not awaited: a lost one is a missing
    answer, which :class:`Requester` times out), replies read from one reply-topic partition.

    Args:
        kafka: the cluster.
        app_id: the app id (names the reply topic).
        member_id: the key of this member's requests and replies.
        client_id: the Kafka client id.
        reply_route: another key of its replies (those sealed to its reply key).
    """

    def __init__(
        self,
        kafka: KafkaClientConfig,
        app_id: str,
        member_id: str,
        client_id: str,
        *,
        reply_route: str | None = None,
    ) -> None:
        # Replies arrive within a long poll anyway; a long wait only makes an idle member's
        # reply fetches rare.
        super().__init__(
            kafka,
            internal.reply_topic(app_id),
            member_id,
            client_id,
            what="member",
            acks=1,
            reply_fetch_wait_ms=REPLY_FETCH_WAIT_MS,
            also_key=reply_route,
        )
        self.app_id = app_id
        self.member_id = member_id


class Requester:
    """Request/reply correlation for one member.

    Args:
        transport: carries the requests and replies.
        app_id: the app id, for error messages.
        timeout_ms: how long to wait for an answer (``queueflow.request.timeout.ms``).
        auth: the member's :class:`~queueflow.protocol.roles.ControlAuth` (``role="member"``):
            seals requests in member envelopes and opens the replies sealed to its reply key
            (whose public key goes into the heartbeats); ``None``: ``queueflow.auth.mode=none``.
        metrics: where dropped junk replies are counted
            (``queueflow_control_messages_dropped_total{receiver="member"}``); None: not counted.
    """

    def __init__(
        self,
        transport: MemberTransport,
        app_id: str,
        timeout_ms: int,
        auth: ControlAuth | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.transport = transport
        self.auth = auth or ControlAuth(None, role="member")
        self.reply_key = self.auth.reply_key
        self._route = "" if self.reply_key is None else reply_route(self.reply_key.public)
        self.app_id = app_id
        self.timeout_ms = timeout_ms
        self._next = 0
        self._pending: dict[int, asyncio.Future[protocol.Message]] = {}
        self._accept: dict[int, Callable[[protocol.Message], bool]] = {}
        self._log = get_logger("queueflow.member.transport", app_id=app_id)
        # Whatever others write to the reply topic under this member's key costs a look at its
        # first bytes (then the crypto), a counter and a rate-limited log line: never a stall.
        self.prefilter = reply_prefilter(self.auth.enabled)
        self.junk = JunkDrops(
            self._log,
            "undecodable_reply",
            lambda: time.monotonic_ns() // 1_000_000,
            None if metrics is None else metrics.control_messages_dropped,
            "member",
        )

    @property
    def reply_partition(self) -> int:
        """The reply-topic partition the transport reads."""
        return self.transport.reply_partition

    async def start(self) -> None:
        """Start the transport, with replies going to :meth:`on_reply`."""
        await self.transport.start(self.on_reply)

    def start_ids_at(self, first: int) -> None:
        """Number the next requests from ``first`` on (one member acting in two processes
        keeps their ids apart: replies are matched by id)."""
        self._next = first - 1

    def next_id(self) -> int:
        """A new request id (unique per member)."""
        self._next += 1
        return self._next

    def on_reply(self, data: bytes) -> None:
        """Resolve the pending request a reply answers; junk and undecodable replies are
        dropped, counted and logged rate-limited (``undecodable_reply``)."""
        reason = self.prefilter.reject(data)
        if reason is not None:
            self.junk.drop(reason)
            return
        try:
            dest = reply_dest(internal.reply_topic(self.app_id), self.reply_partition, self._route)
            reply = protocol.decode(self.auth.open(data, dest))
            check_values(reply)
        except ShareGroupError as exc:
            self.junk.drop(refusal_labels(exc)[0], error=str(exc))
            return
        request_id = getattr(reply, "request_id", -1)
        fut = self._pending.get(request_id)
        if fut is not None and not fut.done():
            accept = self._accept.get(request_id)
            if accept is None or accept(reply):
                fut.set_result(reply)

    async def call(
        self,
        topic: str,
        partition: int,
        request_id: int,
        payload: bytes,
        accept: Callable[[protocol.Message], bool] | None = None,
        sealer: ControlAuth | None = None,
    ) -> protocol.Message:
        """Send a request and wait for its answer (the first one ``accept``, if given, returns
        True for: others are dropped, e.g. a superseded coordinator's). ``sealer`` seals the
        request instead of the member's own auth (a worker acting for a member asks the
        coordinator in a worker envelope; the answer is still sealed to this member's key).

        Raises:
            ShareGroupError: ``REQUEST_TIMED_OUT`` when no answer comes within ``timeout_ms``;
                ``NOT_LEADER_OR_FOLLOWER`` (retriable) for a request partition that does not
                exist yet (a partition added at runtime).
            aiokafka.errors.KafkaError: the request could not be sent.
        """
        fut: asyncio.Future[protocol.Message] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = fut
        if accept is not None:
            self._accept[request_id] = accept
        try:
            try:
                sealed = (sealer or self.auth).seal(payload, topic_dest(topic, partition))
                await self.transport.send(topic, partition, sealed)
            except UnknownTopicOrPartitionError:
                raise ShareGroupError(
                    ErrorCode.NOT_LEADER_OR_FOLLOWER,
                    f"{topic} has no partition {partition} yet: it was added to the source "
                    "topic at runtime and the leader workers have not grown the request topic; "
                    "retried",
                ) from None
            return await asyncio.wait_for(fut, self.timeout_ms / 1000)
        except asyncio.TimeoutError:
            raise ShareGroupError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"no answer from {topic}[{partition}] within {self.timeout_ms} ms; "
                f"is a queueflow leader worker for app {self.app_id!r} running?"
                + self._credential_hint(),
            ) from None
        finally:
            self._pending.pop(request_id, None)
            self._accept.pop(request_id, None)

    def _credential_hint(self) -> str:
        if not self.auth.enabled:
            return ""
        return (
            " Workers also drop requests signed with another key: check that this member's "
            "queueflow.auth.member.credential (or secret) is this app's (its member key id is "
            f"{self.auth.key_id}; workers log refused ones as reason wrong_key with the key id)"
        )

    async def close(self) -> None:
        """Close the transport and cancel the requests still waiting."""
        await self.transport.close()
        for fut in self._pending.values():
            if not fut.done():
                fut.cancel()
