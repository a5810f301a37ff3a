"""The listener's asyncio TCP server: reads size-prefixed Kafka request frames (bounded),
answers each connection's requests in order (as Kafka's brokers do), and dispatches them to
the pure answer builders and to the member gateway. The one place here that does I/O."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from queueflow.errors import ConfigurationError
from queueflow.listener import acl_rules, apis, sasl
from queueflow.listener.admin import AdminGateway, GroupAdmin
from queueflow.listener.auth import (
    ConnectionGuard,
    ListenerSecurity,
    cert_principal,
    listener_protocol,
)
from queueflow.listener.codec import SIZE, FrameError, decode_request, encode_response, peek_header
from queueflow.listener.fetch import CONNECTION, ShareFetcher
from queueflow.listener.leadership import Cluster, Node, node_at, node_id_of
from queueflow.listener.members import MemberRegistry, SessionFactory
from queueflow.listener.metadata import (
    TopicIds,
    find_coordinator_response,
    metadata_response,
)
from queueflow.listener.refused import refused_fetch, refused_produce
from queueflow.listener.sasl import SaslStage
from queueflow.server.connections import DirectLimits
from queueflow.structs import TopicPartition

__all__ = ["KafkaListener", "Leaders", "parse_listener"]

log = structlog.get_logger("queueflow.listener")

#: Who leads what, now: ``(local, remote)``, the share-partitions this worker is live on with
#: its leader epoch, and the other leaders' ``tp -> (leader epoch, listener host:port)``
#: (:meth:`~queueflow.listener.leadership.Cluster.build`).
Leaders = Callable[
    [], tuple[Mapping[TopicPartition, int], Mapping[TopicPartition, tuple[int, str]]]
]
#: How often members whose heartbeats stopped are looked for, in seconds.
REAP_INTERVAL_S = 1.0
#: The longest a ShareFetch is held (ms), whatever MaxWaitMs it asks for.
MAX_WAIT_CAP_MS = 5000


def _forwarding(factory: SessionFactory) -> SessionFactory:
    """``factory`` whose sessions keep the record batches leaders carry (forwarded to the
    client as they are, docs/kafka-listener.md) and parse them as lazy views: the listener
    reads only their offsets and delivery counts, so their records are never decoded."""

    def build(*args: Any, **kwargs: Any) -> Any:
        session = factory(*args, **kwargs)
        session.forward_batches = True
        session.lazy_records = True
        return session

    return build


def parse_listener(value: str) -> tuple[str, int]:
    """``(host, port)`` of a ``queueflow.kafka.listener`` value: ``PLAINTEXT://host:port`` or
    ``host:port``.

    ``SSL://``, ``SASL_PLAINTEXT://`` or ``SASL_SSL://host:port`` (the scheme is the security
    protocol, :func:`~queueflow.listener.auth.listener_protocol`).

    Raises:
        ConfigurationError: an unknown security protocol, or no valid port.
    """
    text = value.strip()
    listener_protocol(text)
    _, sep, rest = text.partition("://")
    if not sep:
        rest = text
    host, colon, port = rest.rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigurationError(
            f"queueflow.kafka.listener={value!r}: expected PLAINTEXT://host:port, e.g. "
            "PLAINTEXT://127.0.0.1:9192"
        )
    return host.strip("[]") or "0.0.0.0", int(port)


class KafkaListener:
    """A Kafka-protocol listener serving this app's share groups to KIP-932 clients.

    Args:
        listen: the ``queueflow.kafka.listener`` value.
        advertised_host: the host clients are told to connect to (when ``listen``'s host is a
            wildcard).
        app_id: the app's id (the cluster id in Metadata answers; the topic-id namespace).
        served: returns topic -> partition count of the topics the app serves.
        factory: builds a member's queueflow session.
        admin: the app's share-group admin (:class:`~queueflow.admin.ShareGroupAdmin`), which
            answers the admin APIs (``kafka-share-groups.sh``).
        heartbeat_interval_ms / session_timeout_ms: given to clients / after which a silent
            member is closed.
        limits: the direct endpoint's per-connection bounds (``queueflow.direct.*``,
            :meth:`DirectLimits.from_settings`): its ``max_frame_bytes`` (a larger frame closes
            the connection), ``idle_s`` (no request for this long), ``frame_read_timeout_s``
            and ``write_timeout_s`` (a slow client) apply here.
        max_connections: connections held at once; more are closed at once.
        monotonic: the clock, in seconds.
        security: what clients must present (TLS, SASL; :func:`~queueflow.listener.auth.
            listener_security`); ``None``: PLAINTEXT.
        leaders: who leads each share-partition (Metadata names its node, ShareFetch sends
            clients there; :mod:`queueflow.listener.leadership`); ``None``: the gateway, this
            listener named as the leader of everything.
        delegate: builds the session acting for a member that heartbeats to another listener
            (:mod:`queueflow.listener.delegated`); ``None``: such members are unknown here.
        coordinators: ``group -> host:port`` of the listener of the worker serving the group's
            coordinator partition (None: unknown, or it runs none), named in FindCoordinator
            (with ``leaders``); otherwise this listener is named.

    Raises:
        ConfigurationError: an invalid ``listen``.
    """

    def __init__(
        self,
        listen: str,
        advertised_host: str,
        app_id: str,
        served: Callable[[], Awaitable[Mapping[str, int]]],
        factory: SessionFactory,
        admin: GroupAdmin,
        *,
        heartbeat_interval_ms: int,
        session_timeout_ms: int,
        limits: DirectLimits,
        max_connections: int,
        monotonic: Callable[[], float],
        security: ListenerSecurity | None = None,
        leaders: Leaders | None = None,
        delegate: SessionFactory | None = None,
        coordinators: Callable[[str], str | None] | None = None,
    ) -> None:
        self._host, self._port = parse_listener(listen)
        self._security = security or ListenerSecurity()
        self._monotonic = monotonic
        self._advertised = (
            self._host if self._host not in ("0.0.0.0", "::", "") else advertised_host
        )
        self.app_id = app_id
        self._served = served
        self._served_now: Mapping[str, int] = {}
        self.topic_ids = TopicIds(app_id)
        self.node = self._node()
        self._leaders = leaders
        self._coordinators = coordinators
        self.members = MemberRegistry(
            _forwarding(factory),
            lambda: self._served_now,
            self.topic_ids,
            heartbeat_interval_ms,
            session_timeout_ms,
            monotonic,
            delegate=delegate,
        )
        self._fetcher = ShareFetcher(self.members, self.topic_ids, self.cluster, MAX_WAIT_CAP_MS)
        self._admin = AdminGateway(admin, self.topic_ids, lambda: self._served_now)
        self._limits = limits
        self._max_connections = max_connections
        self._read_s = limits.frame_read_timeout_s
        self._write_s = limits.write_timeout_s
        self._connections: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._closing = False  # closing every member anyway: no release per connection

    @property
    def port(self) -> int:
        """The port listened on (the bound one when 0 was asked for)."""
        return self._port

    @property
    def advertised_address(self) -> str:
        """``host:port`` clients are told to connect to (the bound port once started)."""
        return f"{self._advertised}:{self._port}"

    def _node(self) -> Node:
        return Node(node_id_of(self.advertised_address), self._advertised, self._port)

    def _coordinator_of(self, group: str) -> Node:
        """The node FindCoordinator names for ``group``: the listener of the worker serving its
        coordinator partition when known (not with the gateway), else this listener."""
        if self._leaders is None or self._coordinators is None:
            return self.node
        address = self._coordinators(group)
        if address is None or address == self.node.address:
            return self.node
        return node_at(address) or self.node

    def cluster(self) -> Cluster:
        """The listener nodes and who leads what, now (gateway: this listener leads all)."""
        if self._leaders is None:
            return Cluster(self.node, gateway=True)
        local, remote = self._leaders()
        return Cluster.build(self.node, local, remote)

    async def start(self) -> None:
        """Listen, and start closing members whose heartbeats stopped."""
        self._served_now = await self._served()
        for topic in self._served_now:
            self.topic_ids.id_of(topic)
        self._server = await asyncio.start_server(
            self._accept, self._host, self._port, ssl=self._security.ssl_context
        )
        sockets = self._server.sockets
        if sockets and self._port == 0:
            self._port = int(sockets[0].getsockname()[1])
            self.node = self._node()
        self._reaper = asyncio.ensure_future(self._reap())
        log.info(
            "kafka_listener_started",
            host=self._host,
            port=self._port,
            advertised=self.advertised_address,
            node_id=self.node.node_id,
            leaders="gateway" if self._leaders is None else "partition",
            protocol=self._security.protocol.value,
            topics=sorted(self._served_now),
        )

    async def close(self) -> None:
        """Stop listening, close the connections and every member (each leaves its group)."""
        self._closing = True
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        await self.members.close_all()

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            try:
                await self.members.reap()
            except Exception as exc:  # one failed close never stops the reaper
                log.warning("kafka_member_close_failed", error=repr(exc))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if len(self._connections) >= self._max_connections:
            log.warning(
                "kafka_connection_refused",
                peer=str(peer),
                reason="too many connections",
                limit=self._max_connections,
            )
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        connection = object()  # what the share sessions opened here belong to
        CONNECTION.set(connection)  # this task's context: its requests see it
        guard = ConnectionGuard(
            self._security,
            str(peer),
            cert_principal(writer.get_extra_info("ssl_object")),
            self._monotonic,
        )
        try:
            await self._serve(reader, writer, guard, str(peer))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        except FrameError as exc:
            log.warning("kafka_frame_rejected", peer=str(peer), reason=str(exc))
        except Exception as exc:  # a bug answering one request closes that connection only
            log.exception("kafka_request_failed", peer=str(peer), error=repr(exc))
        finally:
            self._connections.discard(task)
            writer.close()
            try:
                if not self._closing:
                    await self._fetcher.connection_closed(connection)
            except Exception as exc:  # the records' locks still end: logged, not raised
                log.warning("kafka_share_session_release_failed", peer=str(peer), error=repr(exc))
            await guard.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        guard: ConnectionGuard,
        peer: str,
    ) -> None:
        while True:
            # before SASL authentication, the direct port's tighter bounds (Kafka:
            # sasl.server.max.receive.size)
            done = guard.exchange.stage is SaslStage.DONE
            idle_s, limit = self._limits.idle_timeout_s(done), self._limits.frame_bytes(done)
            try:
                head = await asyncio.wait_for(reader.readexactly(SIZE.size), idle_s)
            except asyncio.TimeoutError:
                return  # idle (Kafka: connections.max.idle.ms)
            (size,) = SIZE.unpack(head)
            if size < 8 or size > limit:
                setting = "max.frame.bytes" if done else "unauthenticated.max.frame.bytes"
                raise FrameError(
                    f"a {size}-byte frame (the limit is {limit} bytes: queueflow.direct.{setting})"
                )
            try:
                frame = await asyncio.wait_for(reader.readexactly(size), self._read_s)
            except asyncio.TimeoutError:
                raise FrameError(
                    f"a {size}-byte frame did not arrive within {self._read_s} s "
                    "(queueflow.direct.frame.read.timeout.ms)"
                ) from None
            answer, close = await self._guarded(frame, guard)
            if answer is None:
                return  # closed before any answer (ILLEGAL_SASL_STATE)
            writer.write(answer)
            try:
                await asyncio.wait_for(writer.drain(), self._write_s)
            except asyncio.TimeoutError:
                raise FrameError(
                    f"the client took no answer within {self._write_s} s "
                    "(queueflow.direct.write.timeout.ms)"
                ) from None
            if close:
                return

    async def _guarded(self, frame: bytes, guard: ConnectionGuard) -> tuple[bytes | None, bool]:
        """``(answer, close)`` for one frame: the SASL requests answered by ``guard``, a request
        before authentication closes the connection unanswered (as Kafka's brokers do), a
        share-group request of a principal without READ gets its authorization error."""
        key, version, correlation_id = peek_header(frame)
        refusal = guard.exchange.refusal(key)
        if refusal is not None:
            log.warning("kafka_client_auth_failed", peer=guard.peer, reason=refusal)
            return None, True
        if key in (sasl.SASL_HANDSHAKE, sasl.SASL_AUTHENTICATE) and apis.serves(key, version):
            body = decode_request(frame).body
            if key == sasl.SASL_HANDSHAKE:
                response, close = await guard.handshake(body)
            else:
                response, close = await guard.authenticate(version, body)
            return encode_response(correlation_id, response), close
        if guard.checks_acls and key in acl_rules.AUTHORIZE and apis.serves(key, version):
            refused = await guard.authorize(key, version, decode_request(frame).body)
            if refused is not None:
                return encode_response(correlation_id, refused), False
        return await self._answer(frame), False

    async def _answer(self, frame: bytes) -> bytes:
        key, version, correlation_id = peek_header(frame)
        if key == apis.API_VERSIONS and not apis.serves(key, version):
            return encode_response(correlation_id, apis.api_versions_response(version))
        if not apis.serves(key, version):
            raise FrameError(
                f"API key {key} version {version} is not served (ApiVersions lists what is)"
            )
        request = decode_request(frame)
        body = request.body
        if key == apis.API_VERSIONS:
            response: Any = apis.api_versions_response(version)
        elif key == apis.METADATA:
            self._served_now = await self._served()
            response = metadata_response(
                version, body, self._served_now, self.cluster(), self.topic_ids, self.app_id
            )
        elif key == apis.FIND_COORDINATOR:
            response = find_coordinator_response(version, body, self._coordinator_of)
        elif key == apis.SHARE_GROUP_HEARTBEAT:
            response = await self.members.heartbeat(body, request.client_id)
        else:
            response = await self._handlers()[key](version, body)
        return encode_response(correlation_id, response)

    def _handlers(self) -> Mapping[int, Callable[[int, Any], Awaitable[Any]]]:
        return {
            apis.SHARE_FETCH: self._fetcher.share_fetch,
            apis.SHARE_ACKNOWLEDGE: self._fetcher.share_acknowledge,
            apis.SHARE_GROUP_DESCRIBE: self._admin.describe,
            apis.LIST_GROUPS: self._admin.list_groups,
            apis.DESCRIBE_SHARE_GROUP_OFFSETS: self._admin.describe_offsets,
            apis.ALTER_SHARE_GROUP_OFFSETS: self._admin.alter_offsets,
            apis.DELETE_SHARE_GROUP_OFFSETS: self._admin.delete_offsets,
            apis.LIST_OFFSETS: self._admin.list_offsets,
            apis.DELETE_GROUPS: self._admin.delete_groups,
            apis.PRODUCE: self._refuse_produce,
            apis.FETCH: self._refuse_fetch,
        }

    async def _refuse_produce(self, version: int, request: Any) -> Any:
        log.info("kafka_request_refused", api="Produce")
        return refused_produce(version, request)

    async def _refuse_fetch(self, version: int, request: Any) -> Any:
        log.info("kafka_request_refused", api="Fetch")
        return refused_fetch(version, request)
