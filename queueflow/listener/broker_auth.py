"""Authentication and authorization of listener clients by the app's Kafka cluster itself.

The listener keeps no user store: a client's SASL exchange (PLAIN, SCRAM) is relayed, token by
token, to one of the app's brokers over a connection of the listener's own
(:class:`BrokerSession`; KIP-152 framing on both sides), and the client is authenticated iff
the broker authenticates it. That connection, now the client's principal at the broker, then
asks the broker what the principal may do with a group and topics (KIP-430 authorized
operations: Metadata and DescribeGroups), so the broker's ACLs, super users and
``allow.everyone.if.no.acl.found`` decide, as for any other client of the cluster. The one
place here that does I/O; docs/kafka-listener.md "Security".
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.index import load_payload_module, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType

from queueflow.errors import ConfigurationError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.listener.codec import SIZE, FrameError, decode_response, encode_request
from queueflow.listener.sasl import SASL_AUTHENTICATE, SASL_HANDSHAKE

__all__ = ["BrokerAuthError", "BrokerSession", "BrokerTarget", "OperationCache"]

_METADATA = 3
_DESCRIBE_GROUPS = 15
#: Versions sent to the broker: SaslAuthenticate v1 (error messages), Metadata v12 and
#: DescribeGroups v5 (authorized operations, KIP-430); Kafka 3.x and 4.x brokers serve them.
_VERSIONS = {SASL_HANDSHAKE: 1, SASL_AUTHENTICATE: 1, _METADATA: 12, _DESCRIBE_GROUPS: 5}
#: The largest answer read from the broker (a Metadata answer for a few topics is small).
_MAX_ANSWER_BYTES = 16 * 1024 * 1024


class BrokerAuthError(ConnectionError):
    """The broker could not be reached or answered something unreadable."""


@dataclass(frozen=True, slots=True)
class BrokerTarget:
    """Where and how the listener reaches the app's brokers for its clients' SASL exchanges:
    the bootstrap ``host:port`` list and the Kafka connection's SSL context (``None``:
    SASL_PLAINTEXT)."""

    addresses: tuple[tuple[str, int], ...]
    ssl_context: ssl.SSLContext | None
    timeout_s: float = 10.0

    @classmethod
    def of(cls, kafka: KafkaClientConfig) -> BrokerTarget:
        """The target of the app's Kafka connection.

        Raises:
            ConfigurationError: the connection does not use SASL (no broker to relay to).
        """
        protocol = str(kafka.extra.get("security_protocol", "PLAINTEXT")).upper()
        if not protocol.startswith("SASL"):
            raise ConfigurationError(
                f"SASL on queueflow.kafka.listener relays each client's SASL exchange to the "
                f"app's Kafka cluster, but the app reaches Kafka over {protocol}: use SASL "
                'credentials for the app (docs/operations.md "Secured clusters"), or an SSL '
                "listener with queueflow.kafka.listener.ssl.client.auth=required"
            )
        addresses = []
        for item in kafka.bootstrap.split(","):
            host, _, port = item.strip().rpartition(":")
            addresses.append((host.strip("[]"), int(port)))
        context = kafka.extra.get("ssl_context") if protocol == "SASL_SSL" else None
        if protocol == "SASL_SSL" and not isinstance(context, ssl.SSLContext):
            context = ssl.create_default_context()
        return cls(tuple(addresses), context)


@dataclass(slots=True)
class OperationCache:
    """Authorized operations seen for one principal, kept ``ttl_s`` seconds (so that a revoked
    ACL applies within that time). Keys are ``("group"|"topic", name)``."""

    monotonic: Callable[[], float]
    ttl_s: float = 30.0
    entries: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)

    def get(self, key: tuple[str, str]) -> int | None:
        """The bit field seen for ``key`` (-1: not authorized to describe it), or None."""
        hit = self.entries.get(key)
        if hit is None or self.monotonic() - hit[0] > self.ttl_s:
            return None
        return hit[1]

    def put(self, key: tuple[str, str], bits: int) -> None:
        """Remember ``bits`` for ``key`` from now."""
        self.entries[key] = (self.monotonic(), bits)


class BrokerSession:
    """One connection to a broker of the app's cluster, authenticating as one listener client.

    Args:
        reader / writer: the open connection.
        client_id: sent in the request headers (the broker's logs and quotas show it).
        timeout_s: the longest wait for an answer.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        client_id: str,
        timeout_s: float,
    ) -> None:
        self._reader, self._writer = reader, writer
        self._client_id = client_id
        self._timeout_s = timeout_s
        self._correlation = 0

    @classmethod
    async def open(cls, target: BrokerTarget, client_id: str) -> BrokerSession:
        """Connect to the first of ``target``'s brokers that answers.

        Raises:
            BrokerAuthError: none could be reached within ``target.timeout_s`` each.
        """
        errors = []
        for host, port in target.addresses:
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(
                        host,
                        port,
                        ssl=target.ssl_context,
                        server_hostname=host if target.ssl_context is not None else None,
                    ),
                    target.timeout_s,
                )
            except (OSError, asyncio.TimeoutError, ssl.SSLError) as exc:
                errors.append(f"{host}:{port}: {exc!r}")
                continue
            return cls(reader, writer, client_id, target.timeout_s)
        raise BrokerAuthError(f"no broker of the app's cluster answered ({'; '.join(errors)})")

    async def close(self) -> None:
        """Close the connection."""
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    async def _call(self, api_key: int, **fields: Any) -> Any:
        version = _VERSIONS[api_key]
        request = load_request_schema(api_key, version)(**fields)
        self._correlation += 1
        try:
            self._writer.write(encode_request(request, self._correlation, self._client_id))
            await asyncio.wait_for(self._writer.drain(), self._timeout_s)
            head = await asyncio.wait_for(self._reader.readexactly(SIZE.size), self._timeout_s)
            (size,) = SIZE.unpack(head)
            if not 4 <= size <= _MAX_ANSWER_BYTES:
                raise BrokerAuthError(f"the broker sent a {size}-byte answer")
            frame = await asyncio.wait_for(self._reader.readexactly(size), self._timeout_s)
            correlation, answer = decode_response(frame, load_response_schema(api_key, version))
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, FrameError) as exc:
            raise BrokerAuthError(f"the broker's answer to API key {api_key}: {exc!r}") from exc
        if correlation != self._correlation:
            raise BrokerAuthError(f"the broker answered correlation id {correlation}")
        return answer

    async def handshake(self, mechanism: str) -> tuple[ErrorCode, tuple[str, ...]]:
        """SaslHandshake with ``mechanism``: the broker's error and enabled mechanisms."""
        answer = await self._call(SASL_HANDSHAKE, mechanism=mechanism)
        return answer.error_code, tuple(answer.mechanisms)

    async def authenticate(self, auth_bytes: bytes) -> tuple[ErrorCode, str | None, bytes]:
        """One SaslAuthenticate round: the broker's error, message and token."""
        answer = await self._call(SASL_AUTHENTICATE, auth_bytes=auth_bytes)
        return answer.error_code, answer.error_message, bytes(answer.auth_bytes)

    async def group_operations(self, group: str) -> int:
        """The principal's authorized operations on ``group`` (KIP-430 bit field); -1 when it
        may not even describe it (GROUP_AUTHORIZATION_FAILED)."""
        answer = await self._call(
            _DESCRIBE_GROUPS, groups=(group,), include_authorized_operations=True
        )
        (described,) = answer.groups
        if described.error_code is ErrorCode.group_authorization_failed:
            return -1
        return int(described.authorized_operations)

    async def topic_operations(self, topics: Iterable[str]) -> dict[str, int]:
        """The principal's authorized operations on each of ``topics`` (-1: it may not describe
        it, TOPIC_AUTHORIZATION_FAILED, or the topic does not exist)."""
        m = load_payload_module(_METADATA, _VERSIONS[_METADATA], EntityType.request)
        answer = await self._call(
            _METADATA,
            topics=tuple(m.MetadataRequestTopic(topic_id=None, name=t) for t in topics),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=True,
        )
        return {
            str(t.name): -1
            if t.error_code is not ErrorCode.none
            else int(t.topic_authorized_operations)
            for t in answer.topics
        }
