"""The leader worker's direct endpoint: ShareFetch over a plain TCP stream, not through Kafka.

Members send ShareFetch requests straight to the worker that leads the share-partition and get
the answer on the same connection, in one network round trip instead of two Kafka hops and
Faust's consumer thread (docs/architecture.md, "The direct path"). Frames are
:mod:`queueflow.protocol.framing`; messages are :mod:`queueflow.protocol.messages`.

* :class:`LeaderEndpoint` serves the connections: each request is answered by
  :meth:`ShareLeader.serve <queueflow.server.leader.ShareLeader.serve>`, which refuses
  share-partitions this worker does not lead with ``NOT_LEADER_OR_FOLLOWER``.
* It serves only while an OK heartbeat proves the worker's group membership
  (:class:`~queueflow.engine.fencing.MembershipLease`); requests park no longer than that.
* It announces itself: every :data:`ANNOUNCE_INTERVAL_S`, and whenever the partitions it is live
  on change, it sends a :class:`~queueflow.protocol.messages.LeaderAnnouncement` per led topic to
  the coordinator, which hands the addresses to members in heartbeat answers.
* With ``queueflow.auth.mode=hmac`` requests are member envelopes encrypted to the workers' key
  and bound to this endpoint's address (:mod:`queueflow.protocol.envelope`), and answers are
  sealed by the workers to the member's key (:mod:`queueflow.protocol.sealed_replies`), as on
  the reply topic: neither is readable on the wire (the framing itself is not TLS).

Requests that came through the request topics are still served (by the stream path), so members
that don't know the address, or lost their connection, are never stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Mapping

import msgspec
import structlog

from queueflow.errors import ShareGroupError
from queueflow.protocol import framing, topics
from queueflow.protocol import messages as protocol
from queueflow.protocol.envelope import direct_dest, direct_reply_dest, topic_dest
from queueflow.protocol.roles import refusal_labels
from queueflow.server.context import ServerContext
from queueflow.server.leader import ShareLeader
from queueflow.server.transport import control_auth, not_leader
from queueflow.settings import listener_address

__all__ = ["ANNOUNCE_INTERVAL_S", "LeaderEndpoint", "advertised_host"]

log = structlog.get_logger("queueflow.server.endpoint")

#: How often (s) a leader repeats its announcements (the coordinator keeps them in memory, so a
#: new coordinator learns the addresses within this time).
ANNOUNCE_INTERVAL_S = 2.0


def advertised_host(configured: str, bind_host: str) -> str:
    """The host members should connect to: ``configured`` if set, else the bind host unless it
    is a wildcard, else this machine's host name if it resolves, else ``127.0.0.1``."""
    if configured:
        return configured
    if bind_host not in ("0.0.0.0", "::", ""):
        return bind_host
    name = socket.gethostname()
    try:
        socket.getaddrinfo(name, None)
    except OSError:
        return "127.0.0.1"
    return name


class LeaderEndpoint:
    """Serves ShareFetch requests of the leaders on this worker over TCP.

    Args:
        ctx: the server context (settings: ``queueflow.leader.listener`` and
            ``queueflow.leader.advertised.host``).
        leaders: the worker's leaders by source topic (a live view: topics added later are
            served too).
    """

    def __init__(self, ctx: ServerContext, leaders: Mapping[str, ShareLeader]) -> None:
        self.ctx = ctx
        self.leaders = leaders
        self.address = ""
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._announced: dict[str, tuple[int, tuple[int, ...]]] = {}
        self._announced_at = 0.0
        self.auth = control_auth(ctx, "endpoint")
        #: The member key of each request being served: (member, request id, topic, partition).
        self._serving: dict[tuple[str, int, str, int], bytes] = {}

    async def start(self) -> None:
        """Listen on ``queueflow.leader.listener`` and set :attr:`address` (``host:port``).

        Raises:
            OSError: the address can't be bound (in use, not local); the message names it.
        """
        listener = self.ctx.settings.leader_listener
        host, port = listener_address(listener)
        try:
            self._server = await asyncio.start_server(self._serve_connection, host, port)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"queueflow.leader.listener={listener}: cannot listen there ({exc.strerror}); "
                "choose a free local address, or port 0 for any free port",
            ) from exc
        bound = self._server.sockets[0].getsockname()
        public = advertised_host(self.ctx.settings.leader_advertised_host, host)
        self.address = f"[{public}]:{bound[1]}" if ":" in public else f"{public}:{bound[1]}"
        log.info("leader_endpoint_listening", address=self.address, listener=listener)

    async def close(self) -> None:
        """Stop listening and drop every connection."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def announce(self) -> None:
        """Tell the coordinator which partitions this worker is live on, per led topic, when
        they changed or every :data:`ANNOUNCE_INTERVAL_S` (call it often; it is cheap)."""
        lease_ms = self.ctx.runtime.lease_remaining_ms()
        if not self.address or not self.ctx.runtime.streams_active:
            return
        if lease_ms is not None and lease_ms <= 0:
            return  # it would refuse every request (see _answer)
        now = self.ctx.clock.monotonic()
        due = now - self._announced_at >= ANNOUNCE_INTERVAL_S
        for topic, leader in list(self.leaders.items()):
            live = tuple(sorted(p for p in leader.fencing.partitions if leader.fencing.is_live(p)))
            if not live:
                continue
            epoch = max(leader.fencing.partitions[p].epoch for p in live)
            if not due and self._announced.get(topic) == (epoch, live):
                continue
            message = protocol.LeaderAnnouncement(
                topic=topic,
                partitions=list(live),
                leader_epoch=epoch,
                address=self.address,
                sent_ms=self.ctx.clock.now_ms(),
                lag=leader.lag_report(live),
            )
            payload = protocol.encode(message)
            coordinator = topics.coordinator_topic(self.ctx.app_id)
            for partition in range(topics.COORDINATOR_PARTITIONS):  # every group's coordinator
                sealed = self.auth.seal(payload, topic_dest(coordinator, partition))
                await self.ctx.sender.send(coordinator, partition, sealed)
            self._announced[topic] = (epoch, live)
        if due:
            self._announced_at = now

    def _may_cancel(self, cancel: protocol.ShareFetchCancel, member_key: bytes) -> bool:
        """A cancel ends a parked request only if it came with the request's member key."""
        slot = (cancel.member_id, cancel.request_id, cancel.topic, cancel.partition)
        key = self._serving.get(slot)
        if key is not None and key != member_key:
            log.error(
                "undecodable_direct_request",
                reason="wrong_member",
                error=f"a cancel of member {cancel.member_id!r}'s request from another key",
            )
            return False
        return True

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        write_lock = asyncio.Lock()
        requests: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    frame = await framing.read_frame(reader)
                except (ShareGroupError, asyncio.IncompleteReadError, ConnectionError) as exc:
                    log.warning("direct_connection_dropped", peer=str(peer), error=str(exc))
                    return
                if frame is None:
                    return
                request_task = asyncio.ensure_future(self._answer(frame, writer, write_lock))
                requests.add(request_task)
                request_task.add_done_callback(requests.discard)
        finally:
            for request_task in requests:
                request_task.cancel()
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            self._connections.discard(task)

    async def _answer(
        self, frame: bytes, writer: asyncio.StreamWriter, write_lock: asyncio.Lock
    ) -> None:
        try:
            request = protocol.decode_binary(self.auth.open(frame, direct_dest(self.address)))
            # open and check are synchronous: ``last`` is still this frame's
            opened, leader = self.auth.last, self.leaders.get(getattr(request, "topic", ""))
            self.auth.check_sender(request, None if leader is None else leader.tickets.bound_key)
        except ShareGroupError as exc:
            log.error("undecodable_direct_request", reason=refusal_labels(exc)[0], error=str(exc))
            writer.close()  # no request id to answer with: the member times out and re-routes
            return
        member_key = b"" if opened is None else opened.member_pub
        if isinstance(request, protocol.ShareFetchCancel):
            if leader is not None and self._may_cancel(request, member_key):
                leader.end_long_poll(request)
            return  # no answer of its own: the parked request's answer is it
        if not isinstance(request, protocol.ShareFetchRequest):
            log.error("unexpected_direct_message", kind=type(request).__name__)
            writer.close()
            return
        leader = self.leaders.get(request.topic)
        lease_ms = self.ctx.runtime.lease_remaining_ms()
        if leader is None:
            response = not_leader(
                request, f"this worker leads no share-partition of topic {request.topic!r}"
            )
        elif lease_ms is not None and lease_ms <= 0:
            # Its membership may have lapsed and its partitions moved: only the request log,
            # split by the successor's fence, can still say who leads (engine.fencing).
            response = not_leader(
                request, "no recent OK heartbeat proves this worker's group membership"
            )
        else:
            if lease_ms is not None and request.max_wait_ms > lease_ms:
                request = msgspec.structs.replace(request, max_wait_ms=lease_ms)
            slot = (request.member_id, request.request_id, request.topic, request.partition)
            self._serving[slot] = member_key
            try:
                response = await leader.serve(request)
            finally:
                self._serving.pop(slot, None)
        body = protocol.encode_binary(response)
        dest = direct_reply_dest(self.address)
        # hmac: sealed by the workers to the key the request came with (= its ticket's)
        frame = self.auth.seal_reply(member_key, body, dest) if member_key else body
        if self.auth.enabled and not member_key:
            frame = self.auth.seal(body, dest)  # a worker's request: a worker envelope
        async with write_lock:
            framing.write_frame(writer, frame)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
