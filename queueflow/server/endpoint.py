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
* It announces itself: whenever the partitions it is live on or their leader epoch change,
  within :data:`ANNOUNCE_INTERVAL_S` of a change of their lag, and every
  :data:`ANNOUNCE_KEEPALIVE_S` otherwise, it sends a
  :class:`~queueflow.protocol.messages.LeaderAnnouncement` per led topic to the coordinator,
  which hands the addresses to members in heartbeat answers.
* With ``queueflow.auth.mode=hmac`` requests are member envelopes encrypted to the workers' key
  and bound to this endpoint's address (:mod:`queueflow.protocol.envelope`), and answers are
  sealed by the workers to the member's key (:mod:`queueflow.protocol.sealed_replies`), as on
  the reply topic: neither is readable on the wire.
* With TLS (``queueflow.leader.listener.security.protocol``, ``queueflow.leader.listener.ssl.*``;
  :mod:`queueflow.kafka.tls`; docs/operations.md, "TLS on the direct path") the whole stream
  is encrypted, and with ``ssl.client.auth=required`` only members with a certificate of a
  trusted CA connect.

Requests that came through the request topics are still served (by the stream path), so members
that don't know the address, or lost their connection, are never stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Mapping

import msgspec
import structlog

from queueflow.errors import ShareGroupError
from queueflow.kafka.tls import tls_mismatch_hint
from queueflow.logging import SkipLogLimiter
from queueflow.protocol import framing, topics
from queueflow.protocol import messages as protocol
from queueflow.protocol.envelope import direct_dest, direct_reply_dest, topic_dest
from queueflow.protocol.roles import refusal_labels
from queueflow.server.connections import (
    MAX_IN_FLIGHT_REQUESTS,
    ConnectionGate,
    DirectLimits,
    connection_cap,
    peer_host,
)
from queueflow.server.context import ServerContext
from queueflow.server.leader import ShareLeader
from queueflow.server.leader.lease import LEASE_LAPSED
from queueflow.server.record_cache import LeaderRecords
from queueflow.server.transport import control_auth, monotonic_ms, not_leader
from queueflow.settings import listener_address
from queueflow.structs import TopicPartition

__all__ = ["ANNOUNCE_INTERVAL_S", "ANNOUNCE_KEEPALIVE_S", "LeaderEndpoint", "advertised_host"]

log = structlog.get_logger("queueflow.server.endpoint")

#: How soon (s) a leader announces a changed lag (the ``lag`` assignor's input), at the most.
ANNOUNCE_INTERVAL_S = 2.0
#: How often (s) a leader repeats an announcement nothing changed in. The coordinator keeps
#: them in memory (for :data:`~queueflow.server.coordinator.LEADER_ADDRESS_TTL_MS`); a
#: coordinator partition moves only in a rebalance, which changes every leader's epoch, so
#: its new owner hears from every leader at once.
ANNOUNCE_KEEPALIVE_S = 10.0

#: A topic's last announcement: (leader epoch, live partitions, lag report, monotonic s).
_Announced = tuple[int, tuple[int, ...], list[tuple[str, int, int]], float]


def _announce_due(
    last: _Announced | None,
    epoch: int,
    live: tuple[int, ...],
    lag: list[tuple[str, int, int]],
    now: float,
) -> bool:
    """Whether a topic's announcement is due (see :meth:`LeaderEndpoint.announce`)."""
    if last is None or (last[0], last[1]) != (epoch, live):
        return True
    age = now - last[3]
    return age >= ANNOUNCE_KEEPALIVE_S or (lag != last[2] and age >= ANNOUNCE_INTERVAL_S)


#: The high-water mark (bytes) of a connection's send buffer: above it an answer waits (up to
#: ``queueflow.direct.write.timeout.ms``) for the peer to read, so a peer that never reads its
#: answers holds at most this much (plus one answer) of the worker's memory.
WRITE_BUFFER_BYTES = 256 * 1024


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
        #: ``host:port`` of this worker's Kafka-protocol listener (``queueflow.kafka.listener``),
        #: announced with the direct endpoint so that listeners name it in Metadata ("": none).
        self.kafka_listener = ""
        #: The coordinator partitions this worker serves, live, with their coordinator epoch
        #: (set by the app): announced so that listeners name this worker in FindCoordinator.
        self.coordinator_partitions: Callable[[], list[tuple[int, int]]] = list
        self._coordinators_announced: list[tuple[int, int]] = []
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        #: What was last announced per topic: (epoch, live partitions, lag, monotonic s).
        self._announced: dict[str, _Announced] = {}
        self.auth = control_auth(ctx, "endpoint")
        #: The member key of each request being served: (member, request id, topic, partition).
        self._serving: dict[tuple[str, int, str, int], bytes] = {}
        settings = ctx.settings
        self._limits = DirectLimits.from_settings(settings)
        #: The records answers carry (``None``: members read them; ``record_cache``).
        self.records = (
            LeaderRecords(ctx.batch_source, settings.leader_record_cache_bytes)
            if ctx.batch_source is not None and settings.leader_record_cache_bytes > 0
            else None
        )
        self._gate = ConnectionGate(
            connection_cap(settings.direct_max_connections),
            settings.direct_max_connections_per_ip,
        )
        # A flood of connections or junk frames logs a few lines, not one per connection.
        self._refused_log = SkipLogLimiter(lambda: monotonic_ms(ctx.clock))
        self._dropped_log = SkipLogLimiter(lambda: monotonic_ms(ctx.clock))

    async def start(self) -> None:
        """Listen on ``queueflow.leader.listener`` and set :attr:`address` (``host:port``).

        Raises:
            OSError: the address can't be bound (in use, not local); the message names it.
        """
        listener = self.ctx.settings.leader_listener
        host, port = listener_address(listener)
        tls = self.ctx.direct_ssl
        try:
            self._server = await asyncio.start_server(
                self._serve_connection,
                host,
                port,
                ssl=tls,
                # a peer that never completes the handshake is an unauthenticated idle one
                ssl_handshake_timeout=None if tls is None else self._limits.idle_timeout_s(False),
            )
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"queueflow.leader.listener={listener}: cannot listen there ({exc.strerror}); "
                "choose a free local address, or port 0 for any free port",
            ) from exc
        bound = self._server.sockets[0].getsockname()
        public = advertised_host(self.ctx.settings.leader_advertised_host, host)
        self.address = f"[{public}]:{bound[1]}" if ":" in public else f"{public}:{bound[1]}"
        log.info(
            "leader_endpoint_listening",
            address=self.address,
            listener=listener,
            tls=tls is not None,
            max_connections=self._gate.max_connections,
            max_connections_per_ip=self._gate.max_per_ip,
        )

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

    def advertise_kafka_listener(self, address: str) -> None:
        """Announce ``address`` (``host:port``) as this worker's Kafka-protocol listener from
        the next :meth:`announce` on (at once: every topic is announced again)."""
        self.kafka_listener = address
        self._announced.clear()

    async def announce(self) -> None:
        """Tell the coordinator which partitions this worker is live on, per led topic, and
        their lag: at once when the partitions or the leader epoch changed, within
        :data:`ANNOUNCE_INTERVAL_S` when only the lag changed, and every
        :data:`ANNOUNCE_KEEPALIVE_S` otherwise (call it often; it is cheap)."""
        lease_ms = self.ctx.runtime.lease_remaining_ms()
        if not self.address or not self.ctx.runtime.streams_active:
            return
        if lease_ms is not None and lease_ms <= 0:
            return  # it would refuse every request (see _answer)
        now = self.ctx.clock.monotonic()
        coordinators = sorted(self.coordinator_partitions())
        if coordinators != self._coordinators_announced:  # every topic's announcement is due
            self._announced.clear()
            self._coordinators_announced = coordinators
        for topic, leader in list(self.leaders.items()):
            live = tuple(sorted(p for p in leader.fencing.partitions if leader.fencing.is_live(p)))
            if not live:
                continue
            epoch = max(leader.fencing.partitions[p].epoch for p in live)
            lag = leader.lag_report(live)
            if not _announce_due(self._announced.get(topic), epoch, live, lag, now):
                continue
            message = protocol.LeaderAnnouncement(
                topic=topic,
                partitions=list(live),
                leader_epoch=epoch,
                address=self.address,
                sent_ms=self.ctx.clock.now_ms(),
                lag=lag,
                kafka_listener=self.kafka_listener,
                coordinator_partitions=coordinators,
            )
            payload = protocol.encode(message)
            coordinator = topics.coordinator_topic(self.ctx.app_id)
            for partition in range(self.ctx.coordinator_partitions):  # every group's coordinator
                sealed = self.auth.seal(payload, topic_dest(coordinator, partition))
                await self.ctx.sender.send(coordinator, partition, sealed)
            self._announced[topic] = (epoch, live, lag, now)

    def _may_cancel(self, cancel: protocol.ShareFetchCancel, member_key: bytes) -> bool:
        """A cancel ends a parked request only if it came with the request's member key."""
        slot = (cancel.member_id, cancel.request_id, cancel.topic, cancel.partition)
        key = self._serving.get(slot)
        if key is not None and key != member_key:
            if (suppressed := self._dropped_log.admit()) is not None:
                log.error(
                    "undecodable_direct_request",
                    reason="wrong_member",
                    error=f"a cancel of member {cancel.member_id!r}'s request from another key",
                    verified=True,
                    suppressed=suppressed,
                )
            return False
        return True

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        host = peer_host(writer.get_extra_info("peername"))
        refused = self._gate.admit(host)
        if refused is not None:  # closed at once: no buffer, no task, fd released
            writer.transport.abort()
            self.ctx.metrics.direct_connections_refused.labels(refused).inc()
            if (suppressed := self._refused_log.admit()) is not None:
                log.warning(
                    "direct_connection_refused",
                    peer=host,
                    reason=refused,
                    held=self._gate.open,
                    held_from_peer=self._gate.held(host),
                    suppressed=suppressed,
                )
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self.ctx.metrics.direct_connections.set(self._gate.open)
        writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
        write_lock = asyncio.Lock()
        requests: set[asyncio.Task[None]] = set()
        reason: str | None = "closing"
        try:
            reason = await self._read_requests(reader, writer, write_lock, requests)
            if reason is not None:
                self.ctx.metrics.direct_connections_dropped.labels(reason).inc()
        finally:
            for request_task in requests:
                request_task.cancel()
            try:
                if reason is None:  # the peer left: flush what it is owed, within a bound
                    writer.close()
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(writer.wait_closed(), self._limits.write_timeout_s)
            finally:
                writer.transport.abort()  # closed by a limit (or not flushed in time): at once
                self._connections.discard(task)
                self._gate.release(host)
                self.ctx.metrics.direct_connections.set(self._gate.open)

    async def _read_requests(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        write_lock: asyncio.Lock,
        requests: set[asyncio.Task[None]],
    ) -> str | None:
        """Read frames until the peer leaves (``None``) or a limit closes the connection (the
        reason, as the ``queueflow_direct_connections_dropped_total`` label). Until one frame
        was verified the pre-authentication limits apply (:class:`DirectLimits`)."""
        limits = self._limits
        verified = False
        while True:
            if len(requests) >= MAX_IN_FLIGHT_REQUESTS:  # backpressure: read no more for now
                await asyncio.wait(requests, return_when=asyncio.FIRST_COMPLETED)
                continue
            try:
                frame = await framing.read_frame(
                    reader,
                    limits.frame_bytes(verified),
                    idle_timeout_s=limits.idle_timeout_s(verified),
                    read_timeout_s=limits.frame_read_timeout_s,
                )
            except framing.FrameIdleTimeout as exc:
                if verified and requests:
                    continue  # a parked long poll: the peer is waiting, not idle
                reason = "idle" if verified else "unauthenticated_idle"
                return self._dropped(writer, reason, verified, str(exc))
            except framing.FrameTooLargeError as exc:
                if exc.tls:  # a member using TLS on this plaintext endpoint
                    error = f"{exc.message}: {tls_mismatch_hint(False)}"
                    return self._dropped(writer, "tls_mismatch", verified, error)
                return self._dropped(writer, "frame_too_large", verified, str(exc))
            except framing.FrameReadTimeout as exc:
                return self._dropped(writer, "read_timeout", verified, str(exc))
            except (ShareGroupError, asyncio.IncompleteReadError, ConnectionError) as exc:
                self._dropped(writer, "broken", verified, str(exc))
                return None  # the peer's doing, not a limit: not counted
            if frame is None:
                return None
            opened = self._open_request(frame, verified)
            if opened is None:
                return "undecodable"
            request, member_key = opened
            # The frame opened (signature verified) and decoded as a request: the full limits
            # apply from now on (auth mode none: a well-formed request is all there is to check).
            verified = True
            answer = self._answer(request, member_key, writer, write_lock)
            request_task = asyncio.ensure_future(answer)
            requests.add(request_task)
            request_task.add_done_callback(requests.discard)

    def _dropped(
        self, writer: asyncio.StreamWriter, reason: str, verified: bool, error: str
    ) -> str:
        """Log (rate-limited) why a connection is closed; returns ``reason``."""
        if (suppressed := self._dropped_log.admit()) is not None:
            log.warning(
                "direct_connection_dropped",
                peer=self._peer(writer),
                reason=reason,
                verified=verified,
                error=error,
                suppressed=suppressed,
            )
        return reason

    @staticmethod
    def _peer(writer: asyncio.StreamWriter) -> str:
        return str(writer.get_extra_info("peername"))

    def _open_request(
        self, frame: bytes, verified: bool
    ) -> tuple[protocol.ShareFetchRequest | protocol.ShareFetchCancel, bytes] | None:
        """The request in ``frame`` and the member key it came with, or ``None`` (logged,
        rate-limited) if it is not signed right (``hmac``), not bound to the member it names,
        or not a message."""
        try:
            request = protocol.decode_binary(self.auth.open(frame, direct_dest(self.address)))
            # open and check are synchronous: ``last`` is still this frame's
            opened, leader = self.auth.last, self.leaders.get(getattr(request, "topic", ""))
            self.auth.check_sender(request, None if leader is None else leader.tickets.bound_key)
        except ShareGroupError as exc:
            self.ctx.auth_health.refused(frame, getattr(exc, "reason", ""))
            if (suppressed := self._dropped_log.admit()) is not None:
                log.error(
                    "undecodable_direct_request",
                    reason=refusal_labels(exc)[0],
                    error=str(exc),
                    verified=verified,
                    suppressed=suppressed,
                )
            return None  # no request id to answer with: the member times out and re-routes
        self.ctx.auth_health.verified(self.auth.last_sender)
        if not isinstance(request, protocol.ShareFetchRequest | protocol.ShareFetchCancel):
            if (suppressed := self._dropped_log.admit()) is not None:
                log.error(
                    "unexpected_direct_message",
                    kind=type(request).__name__,
                    suppressed=suppressed,
                )
            return None
        return request, b"" if opened is None else opened.member_pub

    async def _answer(
        self,
        request: protocol.ShareFetchRequest | protocol.ShareFetchCancel,
        member_key: bytes,
        writer: asyncio.StreamWriter,
        write_lock: asyncio.Lock,
    ) -> None:
        """Answer ``request`` on its connection; ``member_key``: the key it came with (its
        answer is sealed to it; ``b""``: mode ``none`` or a worker's)."""
        leader = self.leaders.get(request.topic)
        if isinstance(request, protocol.ShareFetchCancel):
            if leader is not None and self._may_cancel(request, member_key):
                leader.end_long_poll(request)
            return  # no answer of its own: the parked request's answer is it
        lease_ms = self.ctx.runtime.lease_remaining_ms()
        if leader is None:
            response = not_leader(
                request, f"this worker leads no share-partition of topic {request.topic!r}"
            )
        elif lease_ms is not None and lease_ms <= 0:
            # Its membership may have lapsed and its partitions moved: only the request log,
            # split by the successor's fence, can still say who leads (engine.fencing).
            leader.long_polls.lease.refused("acquire")
            response = not_leader(request, LEASE_LAPSED)
        else:
            if lease_ms is not None and request.max_wait_ms > lease_ms:
                request = msgspec.structs.replace(request, max_wait_ms=lease_ms)
            slot = (request.member_id, request.request_id, request.topic, request.partition)
            self._serving[slot] = member_key
            try:
                response = await leader.serve(request)
            finally:
                self._serving.pop(slot, None)
            if self.records is not None and response.acquired:
                self.records.follow(leader)  # its batches go when it stops leading them
                response.records, response.records_end = await self.records.carry(
                    TopicPartition(request.topic, request.partition),
                    response.acquired,
                    read_committed=response.read_committed,
                )
            lease = leader.long_polls.lease
            if not lease.holds():  # lapsed while it waited: the successor may serve now
                lease.refused("answer")
                response = not_leader(request, LEASE_LAPSED)
        body = protocol.encode_binary(response)
        dest = direct_reply_dest(self.address)
        # hmac: sealed by the workers to the key the request came with (= its ticket's)
        frame = self.auth.seal_reply(member_key, body, dest) if member_key else body
        if self.auth.enabled and not member_key:
            frame = self.auth.seal(body, dest)  # a worker's request: a worker envelope
        async with write_lock:
            if writer.is_closing():
                return
            framing.write_frame(writer, frame)
            try:
                await asyncio.wait_for(writer.drain(), self._limits.write_timeout_s)
            except (
                asyncio.TimeoutError
            ):  # the peer reads nothing: don't hold its answers any longer
                self.ctx.metrics.direct_connections_dropped.labels("write_timeout").inc()
                self._dropped(writer, "write_timeout", True, "the peer does not read its answers")
                writer.transport.abort()
            except ConnectionError:
                pass
