"""Security of the Kafka-protocol listener: what it is configured to require
(:func:`listener_security`) and each connection's authentication and authorization
(:class:`ConnectionGuard`); docs/kafka-listener.md "Security".

A SASL client's exchange is relayed to the app's Kafka cluster
(:mod:`queueflow.listener.broker_auth`), and what its principal may do is what the cluster's
authorizer says (READ on the share group and on the topics, as Kafka requires of share
consumers and queueflow of its members' principals).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog
from kio.schema.errors import ErrorCode

from queueflow.errors import ConfigurationError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.listener import acl_rules, sasl
from queueflow.listener.acl_rules import AclOperation
from queueflow.listener.broker_auth import (
    BrokerAuthError,
    BrokerSession,
    BrokerTarget,
    OperationCache,
)
from queueflow.listener.sasl import SaslExchange, SecurityProtocol
from queueflow.settings import ShareGroupSettings, SslClientAuth

__all__ = [
    "ConnectionGuard",
    "ListenerSecurity",
    "cert_principal",
    "listener_protocol",
    "listener_security",
]

log = structlog.get_logger("queueflow.listener")


def listener_protocol(value: str) -> SecurityProtocol:
    """The security protocol of a ``queueflow.kafka.listener`` value (its scheme, as in
    Kafka's ``listeners``; none: PLAINTEXT).

    Raises:
        ConfigurationError: an unknown scheme.
    """
    scheme, sep, _ = value.strip().partition("://")
    if not sep:
        return SecurityProtocol.PLAINTEXT
    try:
        return SecurityProtocol(scheme.upper())
    except ValueError:
        raise ConfigurationError(
            f"queueflow.kafka.listener={value!r}: {scheme!r} is not a security protocol; use "
            "PLAINTEXT://, SSL://, SASL_PLAINTEXT:// or SASL_SSL://host:port"
        ) from None


@dataclass(frozen=True, slots=True)
class ListenerSecurity:
    """What the listener requires of its clients.

    Args:
        protocol: the security protocol.
        mechanisms: the SASL mechanisms offered (empty without SASL).
        ssl_context: the TLS server context (``None`` without TLS).
        target: the app's brokers the SASL exchanges are relayed to (``None`` without SASL).
    """

    protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    mechanisms: tuple[str, ...] = ()
    ssl_context: ssl.SSLContext | None = None
    target: BrokerTarget | None = None


def listener_security(settings: ShareGroupSettings, kafka: KafkaClientConfig) -> ListenerSecurity:
    """The listener's security from the ``queueflow.kafka.listener*`` settings.

    Raises:
        ConfigurationError: PLAINTEXT (or SSL without ``ssl.client.auth=required``) while the
            app's Kafka connection is secured, so that nothing is reachable without
            authentication; SASL when the app's Kafka connection has none; TLS without a key
            store; unknown mechanisms. Each message says what to set.
    """
    from queueflow.kafka.tls import kafka_listener_ssl_context

    protocol = listener_protocol(settings.kafka_listener)
    app_protocol = str(kafka.extra.get("security_protocol", "PLAINTEXT")).upper()
    mtls = settings.kafka_listener_ssl_client_auth is SslClientAuth.REQUIRED
    if app_protocol != "PLAINTEXT" and not protocol.sasl and not (protocol.tls and mtls):
        raise ConfigurationError(
            f"queueflow.kafka.listener={settings.kafka_listener!r} would let clients in "
            f"without authentication, but the app's Kafka cluster is secured ({app_protocol}): "
            "use SASL_SSL://host:port (clients authenticate with the app cluster's SASL "
            "credentials; set queueflow.kafka.listener.ssl.keystore.location), or SSL:// with "
            "queueflow.kafka.listener.ssl.client.auth=required (docs/kafka-listener.md "
            '"Security")'
        )
    mechanisms = (
        sasl.parse_mechanisms(settings.kafka_listener_sasl_enabled_mechanisms)
        if protocol.sasl
        else ()
    )
    return ListenerSecurity(
        protocol,
        mechanisms,
        kafka_listener_ssl_context(settings, kafka) if protocol.tls else None,
        BrokerTarget.of(kafka) if protocol.sasl else None,
    )


class ConnectionGuard:
    """One connection's authentication (SASL relayed to the app's cluster, or the client
    certificate) and authorization (the cluster's authorized operations for the principal).

    Args:
        security: the listener's.
        peer: the client's address (for log lines).
        principal: the principal from the client's certificate (``User:<subject DN>``), or
            ``""``; SASL replaces it with ``User:<name>``.
        monotonic: the clock, in seconds (the authorization cache).
    """

    def __init__(
        self,
        security: ListenerSecurity,
        peer: str,
        principal: str,
        monotonic: Callable[[], float],
    ) -> None:
        self._security = security
        self.peer = peer
        self.principal = principal or "User:ANONYMOUS"
        self.exchange = SaslExchange(security.mechanisms)
        self._broker: BrokerSession | None = None
        self._user = ""
        self._cache = OperationCache(monotonic)

    @property
    def checks_acls(self) -> bool:
        """Whether share-group requests are checked against the cluster's ACLs (a SASL
        client, authenticated by the cluster)."""
        return self._broker is not None

    async def close(self) -> None:
        """Close the connection to the broker, if any."""
        if self._broker is not None:
            await self._broker.close()
            self._broker = None

    async def handshake(self, body: Any) -> tuple[Any, bool]:
        """Answer a SaslHandshake: ``(answer, close)``; the broker must enable the mechanism
        too (it is asked on a new connection of this client's)."""
        error = self.exchange.handshake(body.mechanism)
        enabled = self._security.mechanisms
        if error is ErrorCode.none:
            assert self._security.target is not None
            try:
                self._broker = await BrokerSession.open(self._security.target, "queueflow-sasl")
                error, _ = await self._broker.handshake(body.mechanism)
            except BrokerAuthError as exc:
                log.warning("kafka_client_auth_failed", peer=self.peer, reason=str(exc))
                error = ErrorCode.illegal_sasl_state
        return sasl.handshake_response(error, enabled), error is not ErrorCode.none

    async def authenticate(self, version: int, body: Any) -> tuple[Any, bool]:
        """Relay one SaslAuthenticate round to the broker: ``(answer, close)``. A failure is
        the broker's (SASL_AUTHENTICATION_FAILED with its message) and closes the
        connection, as Kafka's brokers do."""
        if self._broker is None or self.exchange.stage is not sasl.SaslStage.AUTHENTICATE:
            answer = sasl.authenticate_response(
                version, ErrorCode.illegal_sasl_state, "no SASL exchange in progress", b""
            )
            return answer, True
        if self.exchange.rounds == 0:
            self._user = sasl.user_name(self.exchange.mechanism, bytes(body.auth_bytes))
        try:
            error, message, token = await self._broker.authenticate(bytes(body.auth_bytes))
        except BrokerAuthError as exc:
            error, message, token = ErrorCode.sasl_authentication_failed, str(exc), b""
        if error is not ErrorCode.none:
            log.warning(
                "kafka_client_auth_failed",
                peer=self.peer,
                mechanism=self.exchange.mechanism,
                reason=message,
            )
            return sasl.authenticate_response(version, error, message, b""), True
        if self.exchange.round_passed():
            self.principal = f"User:{self._user}"
            log.info(
                "kafka_client_authenticated",
                peer=self.peer,
                principal=self.principal,
                mechanism=self.exchange.mechanism,
            )
        return sasl.authenticate_response(version, ErrorCode.none, None, token), False

    async def authorize(self, api_key: int, version: int, body: Any) -> Any | None:
        """The refusal to answer instead of a request whose principal lacks an ACL it needs
        (:data:`~queueflow.listener.acl_rules.AUTHORIZE`: GROUP_ or
        TOPIC_AUTHORIZATION_FAILED), or ``None``: go on. Without SASL (no broker connection as
        the principal) nothing is checked here: mutual TLS decided who connects."""
        rule = acl_rules.AUTHORIZE.get(api_key)
        if rule is None or self._broker is None:
            return None
        need = rule(body)
        error, op, denied = ErrorCode.none, need.group_op, []
        try:
            denied = [g for g in need.groups if not await self._allowed("group", g, op)]
            if denied:
                error, what = ErrorCode.group_authorization_failed, "group"
            else:
                op = need.topic_op
                denied = [t for t in need.topics if not await self._allowed("topic", t, op)]
                error, what = ErrorCode.topic_authorization_failed, "topic"
        except BrokerAuthError as exc:
            error, what, denied = ErrorCode.group_authorization_failed, "group", [repr(exc)]
        if not denied:
            return None
        message = (
            f"{self.principal} is not authorized to {op.name} {what} {', '.join(denied)} "
            "(grant it an ALLOW ACL)"
        )
        log.warning(
            "kafka_client_unauthorized", peer=self.peer, principal=self.principal, reason=message
        )
        return acl_rules.unauthorized_response(api_key, version, error, message, body)

    async def _allowed(self, kind: str, name: str, op: AclOperation) -> bool:
        bits = self._cache.get((kind, name))
        if bits is None:
            assert self._broker is not None
            if kind == "group":
                bits = await self._broker.group_operations(name)
            else:
                bits = (await self._broker.topic_operations([name])).get(name, -1)
            self._cache.put((kind, name), bits)
        return acl_rules.allows(bits, op)


def cert_principal(ssl_object: ssl.SSLObject | None) -> str:
    """``User:<subject DN>`` of the client's certificate (RFC 4514, as Kafka's default SSL
    principal builder names it, e.g. ``User:CN=carol``), or ``""`` without one."""
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        return ""
    from cryptography import x509

    return f"User:{x509.load_der_x509_certificate(der).subject.rfc4514_string()}"
