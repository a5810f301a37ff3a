"""The member's side of the direct path: ShareFetch straight to the leader's endpoint.

One TCP connection per leader address (:mod:`queueflow.server.endpoint`), shared by all the
share-partitions that leader serves; requests are pipelined and answers matched by request id.
A connection that fails is dropped and its waiting requests fail with
:class:`DirectPathError`, after which the session re-routes (through the request topics) until
the next heartbeat names a leader again.

The leader bounds what a connection may cost (docs/operations.md, "The direct port's limits"):
it closes connections idle for ``queueflow.direct.connections.max.idle.ms``, and reads at most
``queueflow.direct.unauthenticated.max.frame.bytes`` until a connection delivered one verified
frame. So a request whose connection the leader closed before it was read is sent once more on
a new connection (transparently), and each connection opens with a small frame whatever the
first request's size (a ShareFetch may carry thousands of acknowledgements after a reconnect): a
:class:`~queueflow.protocol.messages.ShareFetchCancel` for no request (about 270 bytes signed),
which the leader verifies and otherwise ignores.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import structlog

from queueflow.errors import ShareGroupError
from queueflow.kafka.tls import tls_mismatch_hint
from queueflow.protocol import framing
from queueflow.protocol import messages as protocol
from queueflow.protocol.envelope import direct_dest, direct_reply_dest
from queueflow.protocol.roles import ControlAuth
from queueflow.settings import listener_address

__all__ = ["CONNECT_TIMEOUT_S", "DirectClient", "DirectPathError"]

log = structlog.get_logger("queueflow.member.direct")

#: How long (s) a member waits to connect to a leader's endpoint before using the request topic.
CONNECT_TIMEOUT_S = 2.0

#: The request id of the small verified frame that opens each connection: never a real
#: request's (those count up from 1), so the leader finds nothing parked to cancel.
_HELLO_REQUEST_ID = -1


_TRUSTSTORE = "queueflow.leader.listener.ssl.truststore.location"
_IDENTIFICATION = "queueflow.leader.listener.ssl.endpoint.identification.algorithm"
_PLAINTEXT_HINT = tls_mismatch_hint(False)
#: The reason of a connection this member closed itself.
_CLOSED = "closed"
_CLIENT_CERT_HINT = (
    " (if the leader requires a client certificate, queueflow.leader.listener.ssl.client.auth="
    "required: this member needs one signed by a CA the leader trusts, in "
    "queueflow.leader.listener.ssl.keystore.location or its Kafka SSL context)"
)


def _log_tls_mismatch(address: str, error: str) -> None:
    log.warning("direct_tls_failed", address=address, error=error)


class DirectPathError(Exception):
    """A request over the direct path got no answer (connection refused, reset or timed out).

    The leader may or may not have applied it; the caller re-sends through the request topic
    (acknowledgements are atomic, so a repeat is refused harmlessly as stale).
    """


class _ConnectionLost(DirectPathError):
    """The connection ended (closed or reset by the leader) before the request's answer."""


class _Connection:
    def __init__(self, address: str, auth: ControlAuth, tls: ssl.SSLContext | None) -> None:
        self.address = address
        self.tls = tls
        self.auth = auth.receiver()  # a replay guard of its own
        self.pending: dict[int, asyncio.Future[protocol.ShareFetchResponse]] = {}
        self.writer: asyncio.StreamWriter | None = None
        self.reader_task: asyncio.Task[None] | None = None
        self.ready: asyncio.Future[None] | None = None
        self.closed = False
        #: Why the connection failed (once closed).
        self.reason = "the connection was closed"
        #: Frames written so far (the first one must fit the leader's pre-authentication limit).
        self.frames_sent = 0
        #: Whether the leader answered a request on this connection.
        self.answered = False

    async def open(self) -> None:
        host, port = listener_address(self.address)
        hostname = None if self.tls is None else host  # the name the certificate must hold
        reader, self.writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=self.tls, server_hostname=hostname),
            CONNECT_TIMEOUT_S,
        )
        self.reader_task = asyncio.ensure_future(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        error = "the leader closed the connection"
        try:
            while (frame := await framing.read_frame(reader)) is not None:
                try:
                    dest = direct_reply_dest(self.address)
                    message = protocol.decode_binary(self.auth.open(frame, dest))
                except ShareGroupError as exc:
                    log.error("undecodable_direct_reply", address=self.address, error=str(exc))
                    continue
                if isinstance(message, protocol.ShareFetchResponse):
                    self.answered = True
                    future = self.pending.pop(message.request_id, None)
                    if future is not None and not future.done():
                        future.set_result(message)
        except framing.FrameTooLargeError as exc:
            error = f"connection to the leader failed: {exc.message}"
            if exc.tls:  # a TLS alert: the leader's endpoint uses TLS, this member does not
                error += f"; {tls_mismatch_hint(False)}"
                _log_tls_mismatch(self.address, error)
        except (OSError, asyncio.IncompleteReadError, ShareGroupError) as exc:
            error = f"connection to the leader failed: {exc!r}"
        finally:
            self.fail(error)

    def _hinted(self, reason: str) -> str:
        """``reason`` with what to check when the connection failed before any answer."""
        if self.answered or "TLS" in reason or reason == _CLOSED:
            return reason
        if self.tls is None:  # a TLS endpoint closes a plaintext connection after its first bytes
            return f"{reason} (if the leader's direct endpoint uses TLS: {_PLAINTEXT_HINT})"
        # Under TLS 1.3 a refused client certificate ends the connection after the handshake.
        return reason + _CLIENT_CERT_HINT

    def fail(self, reason: str) -> None:
        reason = self._hinted(reason)
        if not self.closed:
            self.reason = reason
        self.closed = True
        for future in self.pending.values():
            if not future.done():
                future.set_exception(_ConnectionLost(f"{self.address}: {reason}"))
        self.pending.clear()
        if self.writer is not None:
            self.writer.close()

    async def call(
        self, request: protocol.ShareFetchRequest, timeout_s: float
    ) -> protocol.ShareFetchResponse:
        assert self.writer is not None
        future: asyncio.Future[protocol.ShareFetchResponse] = (
            asyncio.get_running_loop().create_future()
        )
        self.pending[request.request_id] = future
        try:
            if self.closed:
                raise _ConnectionLost(f"{self.address}: {self.reason}")
            await self._write(request)
            return await asyncio.wait_for(future, timeout_s)
        except asyncio.TimeoutError:
            raise DirectPathError(f"{self.address}: no answer within {timeout_s:.1f} s") from None
        except OSError as exc:
            self.fail(repr(exc))
            raise _ConnectionLost(f"{self.address}: {self.reason}") from exc
        finally:
            self.pending.pop(request.request_id, None)

    async def send(self, message: protocol.ShareFetchCancel) -> None:
        """Send a message that gets no answer of its own (a ShareFetchCancel)."""
        if self.writer is None or self.closed:
            return
        try:
            await self._write(message)
        except OSError as exc:
            self.fail(repr(exc))

    async def _write(self, message: protocol.ShareFetchRequest | protocol.ShareFetchCancel) -> None:
        """Sign and send ``message``; on a new connection, after a small verified frame (see
        the module docstring).

        Raises:
            OSError: the connection failed.
        """
        assert self.writer is not None
        dest = direct_dest(self.address)
        frame = self.auth.seal(protocol.encode_binary(message), dest)
        if self.frames_sent == 0:
            hello = protocol.ShareFetchCancel(
                member_id=message.member_id,
                request_id=_HELLO_REQUEST_ID,
                topic=message.topic,
                partition=message.partition,
            )
            framing.write_frame(self.writer, self.auth.seal(protocol.encode_binary(hello), dest))
            self.frames_sent += 1
        framing.write_frame(self.writer, frame)
        self.frames_sent += 1
        await self.writer.drain()

    async def close(self) -> None:
        self.fail(_CLOSED)
        if self.reader_task is not None:
            self.reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.reader_task


class DirectClient:
    """Connections of one member to the leaders' endpoints, opened on first use.

    Args:
        auth: the member's :class:`~queueflow.protocol.roles.ControlAuth` (``role="member"``):
            seals frames for the endpoint they go to and opens the answers sealed to the
            member's key; ``None``: ``queueflow.auth.mode=none``.
        tls: the TLS client context (:func:`queueflow.kafka.tls.member_ssl_context`); ``None``:
            plaintext connections.
    """

    def __init__(self, auth: ControlAuth | None = None, tls: ssl.SSLContext | None = None) -> None:
        self.auth = auth or ControlAuth(None, role="member")
        self.tls = tls
        self._connections: dict[str, _Connection] = {}
        self._opening: dict[str, asyncio.Future[_Connection]] = {}

    async def call(
        self, address: str, request: protocol.ShareFetchRequest, timeout_s: float
    ) -> protocol.ShareFetchResponse:
        """Send ``request`` to the leader at ``address`` (``host:port``) and wait for the
        answer, up to ``timeout_s`` seconds.

        Raises:
            DirectPathError: could not connect, the connection failed, or no answer in time.
        """
        connection = await self._connection(address)
        try:
            return await connection.call(request, timeout_s)
        except _ConnectionLost:
            if not connection.answered:
                raise  # a connection that never served: the leader is gone or refuses it
        # The leader closed a connection that had served before (idle for
        # queueflow.direct.connections.max.idle.ms, or it restarted): once more on a new one.
        # A repeat is as safe as the re-send through the request topic it replaces.
        connection = await self._connection(address)
        return await connection.call(request, timeout_s)

    async def cancel(self, address: str, cancel: protocol.ShareFetchCancel) -> None:
        """Ask the leader at ``address`` to answer a parked request now (nothing if the
        connection is gone: then so is the request)."""
        connection = self._connections.get(address)
        if connection is not None and not connection.closed:
            await connection.send(cancel)

    async def _connection(self, address: str) -> _Connection:
        connection = self._connections.get(address)
        if connection is not None and not connection.closed:
            return connection
        opening = self._opening.get(address)
        if opening is None:
            opening = self._opening[address] = asyncio.ensure_future(self._open(address))
        try:
            return await asyncio.shield(opening)
        finally:
            if opening.done():
                self._opening.pop(address, None)

    async def _open(self, address: str) -> _Connection:
        connection = _Connection(address, self.auth, self.tls)
        try:
            await connection.open()
        except (OSError, TimeoutError, ValueError) as exc:
            error = f"cannot connect to the leader at {address}: {exc!r}"
            if self.tls is not None and isinstance(exc, ssl.SSLError | ConnectionError):
                # A plaintext endpoint closes a TLS handshake after its first bytes; a
                # certificate the member does not trust fails it too.
                error += (
                    "; the TLS handshake failed: the leader's certificate is not trusted "
                    f"({_TRUSTSTORE}) or does not name {address} ({_IDENTIFICATION}), or "
                    f"{tls_mismatch_hint(True)}"
                )
                _log_tls_mismatch(address, error)
            raise DirectPathError(error) from exc
        self._connections[address] = connection
        return connection

    async def close(self) -> None:
        """Close every connection (their waiting requests fail with DirectPathError)."""
        for connection in list(self._connections.values()):
            await connection.close()
        self._connections.clear()
