"""Why a Kafka cluster could not be reached, in one line: the bootstrap servers, what failed
there (refused, unresolvable host, TLS handshake, SASL authentication, no Kafka answer) and
what to do.

aiokafka raises ``KafkaConnectionError("Unable to bootstrap from [...]")`` and only *logs* the
cause per server (``Unable connect to "host:port": <error>``); :func:`capture_connect_errors`
collects those log records so that :func:`connection_failure` can name the cause. The
``queueflow`` CLI (one wrapper at its entry), :func:`queueflow.kafka.startup.wait_for_broker`
(workers, ``ShareConsumer``) and the Spark source use them (docs/operations.md "Outages at
start").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass

from aiokafka import errors as kafka_errors

__all__ = [
    "CONNECTION_ERRORS",
    "ConnectAttempt",
    "capture_connect_errors",
    "connection_failure",
    "is_connection_error",
]

#: Exceptions that mean "the cluster could not be reached or would not let us in" (as opposed
#: to an answer the cluster gave).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    kafka_errors.KafkaConnectionError,
    kafka_errors.NoBrokersAvailable,
    kafka_errors.AuthenticationFailedError,
    kafka_errors.AuthenticationMethodNotSupported,
    kafka_errors.UnsupportedSaslMechanismError,
    kafka_errors.IllegalSaslStateError,
    kafka_errors.SaslAuthenticationFailed,
    ssl.SSLError,
    socket.gaierror,
    ConnectionError,
)

_SASL = (
    kafka_errors.AuthenticationFailedError,
    kafka_errors.AuthenticationMethodNotSupported,
    kafka_errors.UnsupportedSaslMechanismError,
    kafka_errors.IllegalSaslStateError,
    kafka_errors.SaslAuthenticationFailed,
)

#: The aiokafka log messages that carry a server's connection failure (host, port, error).
_LOGGED = ('Unable connect to "%s:%s": %s', 'Unable to request metadata from "%s:%s": %s')


@dataclass(frozen=True, slots=True)
class ConnectAttempt:
    """One bootstrap server aiokafka tried, and why it failed."""

    host: str
    port: int
    error: BaseException | str

    @property
    def server(self) -> str:
        """``host:port``."""
        return f"{self.host}:{self.port}"


def is_connection_error(exc: BaseException) -> bool:
    """True if ``exc`` (or what it was raised from) is one of :data:`CONNECTION_ERRORS`."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, CONNECTION_ERRORS):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _Collector(logging.Filter):
    def __init__(self, quiet: bool) -> None:
        super().__init__()
        self.quiet = quiet
        self.attempts: list[ConnectAttempt] = []

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if record.msg in _LOGGED and isinstance(args, tuple) and len(args) == 3:
            host, port, error = args
            self.attempts.append(ConnectAttempt(str(host), int(str(port)), error))  # type: ignore[arg-type]
            return not self.quiet
        return True


@contextlib.contextmanager
def capture_connect_errors(quiet: bool = False) -> Iterator[list[ConnectAttempt]]:
    """Collect the connection failures aiokafka logs while the block runs (the list yielded
    fills as they happen).

    Args:
        quiet: also keep those records from being written (the CLI prints one line instead).
    """
    collector = _Collector(quiet)
    # a logger's filters see only the records logged at it: aiokafka.client logs at "aiokafka"
    loggers = [logging.getLogger(name) for name in ("aiokafka", "aiokafka.client")]
    for logger in loggers:
        logger.addFilter(collector)
    try:
        yield collector.attempts
    finally:
        for logger in loggers:
            logger.removeFilter(collector)


def _kind(error: BaseException | str, tls: bool = False) -> tuple[str, str]:
    """(what happened, what to do) for one server's error; ``tls``: TLS was spoken (SSL or
    SASL_SSL), so a connection the server reset or closed is a failed handshake."""
    text = str(error).strip() or type(error).__name__
    closed = isinstance(error, (ConnectionResetError, EOFError)) or "closed" in text
    if tls and closed and not isinstance(error, ssl.SSLError):
        return (
            f"the TLS handshake failed: the server closed the connection ({text})",
            "check that this listener speaks TLS (else use security protocol PLAINTEXT or "
            "SASL_PLAINTEXT)",
        )
    if isinstance(error, socket.gaierror):
        return (
            f"the host name does not resolve ({text})",
            "correct the host name (or check DNS from this machine)",
        )
    if isinstance(error, ssl.SSLError):
        return (
            f"the TLS handshake failed ({text})",
            "check the security protocol (SSL / SASL_SSL) and the CA the server's certificate "
            "is checked with",
        )
    if isinstance(error, _SASL):
        return (
            f"SASL authentication failed ({text})",
            "check the SASL mechanism, user name and password",
        )
    if isinstance(error, ConnectionRefusedError) or "Connect call failed" in text:
        return (
            "the connection was refused (no broker listens there)",
            "start the broker (e.g. `queueflow broker start`) or fix the host:port",
        )
    if isinstance(error, (asyncio.TimeoutError, kafka_errors.KafkaTimeoutError)):
        return (
            f"no answer in time ({type(error).__name__})",
            "check that host:port is a Kafka broker's client listener reachable from here "
            "(a firewall, or a TLS listener spoken to in plain text)",
        )
    return (
        f"no Kafka answer ({text})",
        "check that host:port is a Kafka broker's client listener (not its controller port "
        "or another service), and its security protocol",
    )


def connection_failure(
    bootstrap: str,
    attempts: list[ConnectAttempt],
    exc: BaseException | None,
    tried: str,
    origin: str = "",
    security_protocol: str = "PLAINTEXT",
) -> str:
    """The one-line explanation of a connection failure.

    Args:
        bootstrap: the bootstrap servers given (``host:port[,host:port]``), named when aiokafka
            logged no attempt.
        attempts: what :func:`capture_connect_errors` collected.
        exc: the exception raised (its text is the cause when nothing was logged).
        tried: what was being done, e.g. ``queueflow share-groups --list``.
        origin: where the bootstrap servers were configured, appended to the advice.
        security_protocol: the protocol spoken (``SSL``/``SASL_SSL``: a reset is a failed TLS
            handshake).

    Returns:
        ``could not connect to Kafka at <servers> (<tried>): <server>: <cause>; ...; <what to
        do>`` without newlines.
    """
    by_server: dict[str, ConnectAttempt] = {}
    for attempt in attempts:
        by_server[attempt.server] = attempt  # the last failure of each server
    tls = security_protocol.upper() in ("SSL", "SASL_SSL")
    if by_server:
        causes = [(a.server, *_kind(a.error, tls)) for a in by_server.values()]
    else:
        causes = [(bootstrap, *_kind(_cause(exc), tls))]
    servers = ",".join(by_server) or bootstrap
    happened = "; ".join(f"{server}: {what}" for server, what, _ in causes)
    todo = "; ".join(dict.fromkeys(do for _, _, do in causes))
    line = f"could not connect to Kafka at {servers} ({tried}): {happened}. To fix: {todo}"
    if origin:
        line += f" ({origin})"
    return " ".join(line.split())


def _cause(exc: BaseException | None) -> BaseException | str:
    """The connection error ``exc`` is or was raised from (bounded), else ``exc``."""
    if exc is None:
        return "no answer"
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None or isinstance(seen, CONNECTION_ERRORS):
            break
        seen = seen.__cause__ or seen.__context__
    return seen if seen is not None else exc
