"""The listener's SASL rules, pure: its security protocol, the SASL state of a connection
(KIP-152 framing: SaslHandshake v1, then SaslAuthenticate) and the answers to the SASL
requests. Which ACLs each request needs is :mod:`queueflow.listener.acl_rules`.

The I/O (relaying the client's SASL exchange to the app's Kafka cluster, asking it what the
principal may do) is :mod:`queueflow.listener.broker_auth`; docs/kafka-listener.md "Security".
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType

from queueflow.errors import ConfigurationError

__all__ = [
    "MECHANISMS",
    "ROUNDS",
    "SASL_AUTHENTICATE",
    "SASL_HANDSHAKE",
    "SaslExchange",
    "SaslStage",
    "SecurityProtocol",
    "authenticate_response",
    "handshake_response",
    "parse_mechanisms",
    "user_name",
]

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
_API_VERSIONS = 18

#: The SASL mechanisms the listener can relay (their exchange needs no channel binding).
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: SaslAuthenticate rounds of each mechanism (PLAIN: the credentials; SCRAM: client-first,
#: then client-final, RFC 5802 section 3); the exchange is done after that many successes.
ROUNDS = {"PLAIN": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}


class SecurityProtocol(enum.Enum):
    """The listener's security protocol, as Kafka's ``security.protocol`` /
    ``listeners`` scheme."""

    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def sasl(self) -> bool:
        """Whether clients authenticate with SASL."""
        return self.value.startswith("SASL")

    @property
    def tls(self) -> bool:
        """Whether connections use TLS."""
        return self.value.endswith("SSL")


def parse_mechanisms(text: str) -> tuple[str, ...]:
    """The mechanisms of ``queueflow.kafka.listener.sasl.enabled.mechanisms`` (comma-separated).

    Raises:
        ConfigurationError: none given, or one not in :data:`MECHANISMS`.
    """
    names = tuple(dict.fromkeys(n.strip().upper() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in MECHANISMS]
    if unknown or not names:
        raise ConfigurationError(
            f"queueflow.kafka.listener.sasl.enabled.mechanisms={text!r}: "
            + (f"{', '.join(unknown)} not served" if unknown else "no mechanism given")
            + f"; give a comma-separated list of {', '.join(MECHANISMS)}"
        )
    return names


class SaslStage(enum.Enum):
    """Where a connection is in its SASL exchange."""

    HANDSHAKE = "handshake"  # waiting for SaslHandshake (ApiVersions allowed)
    AUTHENTICATE = "authenticate"  # waiting for SaslAuthenticate
    DONE = "done"  # authenticated (or no SASL on this listener)


@dataclass(slots=True)
class SaslExchange:
    """One connection's SASL state (Kafka's ``SaslServerAuthenticator``, KIP-152 framing).

    Args:
        enabled: the mechanisms offered; empty: the listener has no SASL (the connection is
            :attr:`SaslStage.DONE` from the start).
    """

    enabled: tuple[str, ...]
    stage: SaslStage = SaslStage.DONE
    mechanism: str | None = None
    rounds: int = 0

    def __post_init__(self) -> None:
        if self.enabled:
            self.stage = SaslStage.HANDSHAKE

    def refusal(self, api_key: int) -> str | None:
        """Why a request of ``api_key`` closes the connection now (Kafka's
        ``ILLEGAL_SASL_STATE``: only ApiVersions, SaslHandshake, then SaslAuthenticate before
        authentication), or ``None`` when it may be answered."""
        if self.stage is SaslStage.DONE:
            return None
        expected = SASL_HANDSHAKE if self.stage is SaslStage.HANDSHAKE else SASL_AUTHENTICATE
        if api_key == expected or (api_key == _API_VERSIONS and self.stage is SaslStage.HANDSHAKE):
            return None
        return (
            f"ILLEGAL_SASL_STATE: unexpected request of API key {api_key} during the SASL "
            f"{self.stage.value} (authenticate first: SaslHandshake, then SaslAuthenticate)"
        )

    def handshake(self, mechanism: str) -> ErrorCode:
        """Take a SaslHandshake: ``none`` (the exchange goes on with ``mechanism``),
        ``unsupported_sasl_mechanism`` (the connection is then closed) or
        ``illegal_sasl_state`` (no SASL here, or already authenticated: re-authentication is
        not offered)."""
        if self.stage is not SaslStage.HANDSHAKE:
            return ErrorCode.illegal_sasl_state
        if mechanism not in self.enabled:
            return ErrorCode.unsupported_sasl_mechanism
        self.stage, self.mechanism = SaslStage.AUTHENTICATE, mechanism
        return ErrorCode.none

    def round_passed(self) -> bool:
        """One SaslAuthenticate round succeeded; True when that finished the mechanism's
        exchange (the connection is then authenticated)."""
        self.rounds += 1
        if self.mechanism is not None and self.rounds >= ROUNDS[self.mechanism]:
            self.stage = SaslStage.DONE
            return True
        return False


def handshake_response(error: ErrorCode, enabled: Iterable[str]) -> Any:
    """The SaslHandshake (v1) answer: ``error`` and the mechanisms enabled."""
    m = load_payload_module(SASL_HANDSHAKE, 1, EntityType.response)
    return m.SaslHandshakeResponse(error_code=error, mechanisms=tuple(enabled))


def authenticate_response(
    version: int, error: ErrorCode, message: str | None, auth_bytes: bytes
) -> Any:
    """The SaslAuthenticate answer of ``version``; no session lifetime (0: the client does not
    re-authenticate, KIP-368)."""
    m = load_payload_module(SASL_AUTHENTICATE, version, EntityType.response)
    extra: dict[str, Any] = {"session_lifetime": datetime.timedelta(0)} if version >= 1 else {}
    return m.SaslAuthenticateResponse(
        error_code=error, error_message=message, auth_bytes=auth_bytes, **extra
    )


def user_name(mechanism: str | None, first_token: bytes) -> str:
    """The user a client authenticates as, from its first SaslAuthenticate token: PLAIN's
    ``[authzid] NUL authcid NUL password`` (RFC 4616), SCRAM's client-first message
    ``n,,n=<name>,r=<nonce>`` (RFC 5802 section 5.1, ``=2C`` and ``=3D`` unescaped); ``""``
    when the token does not have that form (the broker then refuses it)."""
    text = first_token.decode("utf-8", "replace")
    if mechanism == "PLAIN":
        parts = text.split("\0")
        return parts[1] if len(parts) == 3 else ""
    for attribute in text.split(",")[2:]:
        if attribute.startswith("n="):
            return attribute[2:].replace("=2C", ",").replace("=3D", "=")
    return ""
