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
* With ``queueflow.auth.mode=hmac`` frames are signed both ways and answers are sealed to the
  member's reply key from its ticket (:mod:`queueflow.protocol.sealed_replies`), as on the
  reply topic; requests travel signed but in plaintext (no TLS).

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
from queueflow.server.context import ServerContext
from queueflow.server.leader import ShareLeader
from queueflow.server.transport import control_auth, not_leader, seal_reply
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
            for partition in range(topics.COORDINATOR_PARTITIONS):  # every group's coordinator
                await self.ctx.sender.send(
                    topics.coordinator_topic(self.ctx.app_id), partition, self.auth.seal(payload)
                )
            self._announced[topic] = (epoch, live)
        if due:
            self._announced_at = now

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
            request = protocol.decode_binary(self.auth.open(frame))
            self.auth.check_sender(request)
        except ShareGroupError as exc:
            self.ctx.auth_health.refused(frame, getattr(exc, "reason", ""))
            log.error("undecodable_direct_request", error=str(exc))
            writer.close()  # no request id to answer with: the member times out and re-routes
            return
        self.ctx.auth_health.verified(self.auth.last_sender)
        if isinstance(request, protocol.ShareFetchCancel):
            leader = self.leaders.get(request.topic)
            if leader is not None:
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
            response = await leader.serve(request)
        frame = self.auth.seal(protocol.encode_binary(response))
        if leader is not None:  # hmac: sealed to the member's reply key, as on the reply topic
            try:
                frame = seal_reply(self.ctx, leader.tickets.reply_key(request.ticket), frame)
            except ValueError as exc:
                log.warning("reply_unsealable", member_id=request.member_id, error=str(exc))
                return
        async with write_lock:
            framing.write_frame(writer, frame)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
