"""Security of the Kafka-protocol listener (docs/kafka-listener.md "Security"): the SASL state
machine (pure), the start-up checks, and, on a real socket against a stand-in broker that
speaks SaslHandshake/SaslAuthenticate/DescribeGroups/Metadata, the relay: a wrong password is
SASL_AUTHENTICATION_FAILED and closes the connection, a request before authentication closes it
unanswered, a principal without READ on the group gets GROUP_AUTHORIZATION_FAILED."""

from __future__ import annotations

import asyncio
import datetime
import ssl
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.index import load_payload_module, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from listener_stubs import unit_limits

from queueflow.errors import ConfigurationError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.listener import KafkaListener, sasl
from queueflow.listener.acl_rules import AclOperation, allows
from queueflow.listener.auth import ListenerSecurity, listener_protocol, listener_security
from queueflow.listener.broker_auth import BrokerTarget
from queueflow.listener.codec import (
    SIZE,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from queueflow.listener.sasl import (
    SaslExchange,
    SaslStage,
    SecurityProtocol,
    parse_mechanisms,
    user_name,
)
from queueflow.settings import ShareGroupSettings

API_VERSIONS, METADATA, HEARTBEAT = 18, 3, 76
SERVED_KEYS = st.integers(0, 100)


# -- the state machine ------------------------------------------------------------------------
def test_without_sasl_everything_is_answered_and_a_handshake_is_an_illegal_state() -> None:
    exchange = SaslExchange(())
    assert exchange.stage is SaslStage.DONE
    assert all(exchange.refusal(key) is None for key in range(100))
    assert exchange.handshake("PLAIN") is ErrorCode.illegal_sasl_state


@given(st.lists(SERVED_KEYS, min_size=1, max_size=6))
def test_before_authentication_only_api_versions_and_the_handshake_pass(keys: list[int]) -> None:
    exchange = SaslExchange(("PLAIN",))
    for key in keys:
        reason = exchange.refusal(key)
        if key in (API_VERSIONS, sasl.SASL_HANDSHAKE):
            assert reason is None
        else:
            assert reason is not None and reason.startswith("ILLEGAL_SASL_STATE")
            assert f"API key {key}" in reason


@pytest.mark.parametrize(("mechanism", "rounds"), [("PLAIN", 1), ("SCRAM-SHA-512", 2)])
def test_each_mechanism_is_done_after_its_rounds(mechanism: str, rounds: int) -> None:
    exchange = SaslExchange(sasl.MECHANISMS)
    assert exchange.handshake("GSSAPI") is ErrorCode.unsupported_sasl_mechanism
    assert exchange.handshake(mechanism) is ErrorCode.none
    assert exchange.refusal(API_VERSIONS) is not None  # only SaslAuthenticate now
    assert exchange.refusal(sasl.SASL_AUTHENTICATE) is None
    done = [exchange.round_passed() for _ in range(rounds)]
    assert done == [False] * (rounds - 1) + [True]
    assert exchange.stage is SaslStage.DONE and exchange.refusal(HEARTBEAT) is None
    assert exchange.handshake(mechanism) is ErrorCode.illegal_sasl_state  # no re-authentication


@given(st.text(min_size=1, max_size=20).filter(lambda n: "\0" not in n))
def test_user_names_come_from_the_first_token(name: str) -> None:
    assert user_name("PLAIN", f"\0{name}\0secret".encode()) == name
    escaped = name.replace("=", "=3D").replace(",", "=2C")
    assert user_name("SCRAM-SHA-256", f"n,,n={escaped},r=abc".encode()) == name


def test_malformed_first_tokens_name_nobody() -> None:
    assert user_name("PLAIN", b"no separators") == ""
    assert user_name("SCRAM-SHA-512", b"n,,r=abc") == ""


@given(st.integers(-(2**31), 2**31 - 1))
def test_an_operation_is_granted_by_its_bit_or_all_and_describe_by_read(bits: int) -> None:
    assert allows(bits, AclOperation.READ) is (bits >= 0 and bool(bits & (1 << 3 | 1 << 2)))
    implying = 1 << 8 | 1 << 2 | 1 << 3 | 1 << 4 | 1 << 6
    assert allows(bits, AclOperation.DESCRIBE) is (bits >= 0 and bool(bits & implying))


def test_mechanisms_are_checked() -> None:
    assert parse_mechanisms(" plain, SCRAM-SHA-512,PLAIN") == ("PLAIN", "SCRAM-SHA-512")
    with pytest.raises(ConfigurationError, match="GSSAPI not served"):
        parse_mechanisms("PLAIN,GSSAPI")
    with pytest.raises(ConfigurationError, match="no mechanism"):
        parse_mechanisms(" , ")


# -- start-up checks --------------------------------------------------------------------------
SECURED = KafkaClientConfig(
    "broker:9093",
    extra={"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"},
)


def test_the_scheme_is_the_security_protocol() -> None:
    assert listener_protocol("127.0.0.1:9192") is SecurityProtocol.PLAINTEXT
    assert listener_protocol("sasl_ssl://h:1") is SecurityProtocol.SASL_SSL
    with pytest.raises(ConfigurationError, match="not a security protocol"):
        listener_protocol("TLS://h:1")


def test_a_plaintext_listener_of_a_secured_app_is_refused_saying_what_to_set() -> None:
    settings = ShareGroupSettings(kafka_listener="PLAINTEXT://127.0.0.1:9192")
    with pytest.raises(ConfigurationError) as err:
        listener_security(settings, SECURED)
    assert "SASL_SSL://host:port" in str(err.value)
    assert "queueflow.kafka.listener.ssl.client.auth=required" in str(err.value)
    # on a plaintext cluster it is what it was
    plain = KafkaClientConfig("broker:9092")
    assert listener_security(settings, plain).protocol is SecurityProtocol.PLAINTEXT


def test_sasl_needs_an_app_that_authenticates_with_sasl() -> None:
    settings = ShareGroupSettings(kafka_listener="SASL_PLAINTEXT://127.0.0.1:9192")
    with pytest.raises(ConfigurationError, match="relays each client's SASL exchange"):
        listener_security(settings, KafkaClientConfig("broker:9092"))
    security = listener_security(settings, SECURED)
    assert security.mechanisms == sasl.MECHANISMS
    assert security.target == BrokerTarget((("broker", 9093),), None)


def test_tls_needs_a_key_store() -> None:
    settings = ShareGroupSettings(kafka_listener="SASL_SSL://127.0.0.1:9192")
    with pytest.raises(ConfigurationError, match=r"queueflow\.kafka\.listener\.ssl\.keystore"):
        listener_security(settings, SECURED)


# -- the relay, on real sockets ---------------------------------------------------------------
class StandInBroker:
    """Answers SaslHandshake (PLAIN), SaslAuthenticate (user ``alice``, password ``right``),
    DescribeGroups (READ on group ``open`` only) and Metadata (READ on every topic)."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = SIZE.unpack(await reader.readexactly(4))
                request = decode_request(await reader.readexactly(size))
                writer.write(encode_response(request.correlation_id, self._answer(request)))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _answer(self, request: Any) -> Any:
        key, body = request.api_key, request.body
        m = load_payload_module(key, request.api_version, EntityType.response)
        zero = datetime.timedelta(0)
        if key == sasl.SASL_HANDSHAKE:
            return m.SaslHandshakeResponse(error_code=ErrorCode.none, mechanisms=("PLAIN",))
        if key == sasl.SASL_AUTHENTICATE:
            ok = bytes(body.auth_bytes) == b"\0alice\0right"
            return m.SaslAuthenticateResponse(
                error_code=ErrorCode.none if ok else ErrorCode.sasl_authentication_failed,
                error_message=None if ok else "Authentication failed: Invalid username or password",
                auth_bytes=b"",
                session_lifetime=zero,
            )
        if key == 15:  # DescribeGroups
            group = body.groups[0]
            return m.DescribeGroupsResponse(
                throttle_time=zero,
                groups=(
                    m.DescribedGroup(
                        error_code=ErrorCode.none
                        if group == "open"
                        else ErrorCode.group_authorization_failed,
                        group_id=group,
                        group_state="Dead",
                        protocol_type="",
                        protocol_data="",
                        members=(),
                        authorized_operations=1 << 3 | 1 << 8 if group == "open" else -(2**31),
                    ),
                ),
            )
        return m.MetadataResponse(
            throttle_time=zero,
            brokers=(),
            topics=tuple(
                m.MetadataResponseTopic(
                    error_code=ErrorCode.none,
                    name=t.name,
                    topic_id=None,
                    partitions=(),
                    topic_authorized_operations=1 << 3,
                )
                for t in body.topics
            ),
        )


class NoSession:
    """A member session that is never used: the requests tested are refused before a join."""

    def __init__(self, *args: Any) -> None:
        raise AssertionError("no member may join")


@pytest.fixture
def secured_listener() -> Iterator[tuple[KafkaListener, asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    broker = StandInBroker()
    broker_port = loop.run_until_complete(broker.start())

    async def served() -> dict[str, int]:
        return {"jobs": 1}

    kl = KafkaListener(
        "SASL_PLAINTEXT://127.0.0.1:0",
        "127.0.0.1",
        "app",
        served,
        NoSession,  # type: ignore[arg-type]
        object(),  # type: ignore[arg-type]
        heartbeat_interval_ms=500,
        session_timeout_ms=60_000,
        limits=unit_limits(1024),
        max_connections=4,
        monotonic=loop.time,
        security=ListenerSecurity(
            SecurityProtocol.SASL_PLAINTEXT,
            ("PLAIN",),
            None,
            BrokerTarget((("127.0.0.1", broker_port),), None, timeout_s=5.0),
        ),
    )
    loop.run_until_complete(kl.start())
    yield kl, loop
    loop.run_until_complete(kl.close())
    loop.run_until_complete(broker.close())
    loop.close()


def frame(api_key: int, version: int, correlation_id: int = 1, **fields: Any) -> bytes:
    return encode_request(load_request_schema(api_key, version)(**fields), correlation_id, "t")


async def exchange(port: int, *frames: bytes) -> list[Any]:
    """Send ``frames`` one by one on one connection; the decoded answers until it is closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answers: list[Any] = []
    try:
        for data in frames:
            key, version = struct.unpack_from(">hh", data, 4)
            try:
                writer.write(data)
                await writer.drain()
                (size,) = SIZE.unpack(await asyncio.wait_for(reader.readexactly(4), 5))
            except (asyncio.IncompleteReadError, ConnectionError):
                break  # closed by the listener
            body = await reader.readexactly(size)
            answers.append(decode_response(body, load_response_schema(key, version))[1])
        return answers
    finally:
        writer.close()


HANDSHAKE = frame(sasl.SASL_HANDSHAKE, 1, mechanism="PLAIN")


def authenticate(password: str) -> bytes:
    return frame(sasl.SASL_AUTHENTICATE, 2, 2, auth_bytes=f"\0alice\0{password}".encode())


def heartbeat(group: str) -> bytes:
    return frame(
        HEARTBEAT,
        1,
        3,
        group_id=group,
        member_id="m1",
        member_epoch=0,
        rack_id=None,
        subscribed_topic_names=("jobs",),
    )


def test_a_wrong_password_is_refused_and_the_connection_closed(secured_listener: Any) -> None:
    kl, loop = secured_listener
    answers = loop.run_until_complete(
        exchange(kl.port, HANDSHAKE, authenticate("wrong"), heartbeat("open"))
    )
    assert [a.error_code for a in answers] == [
        ErrorCode.none,
        ErrorCode.sasl_authentication_failed,
    ]  # the heartbeat went unanswered: closed
    assert answers[1].error_message == "Authentication failed: Invalid username or password"


def test_a_request_before_authentication_closes_the_connection(secured_listener: Any) -> None:
    kl, loop = secured_listener
    metadata = frame(
        METADATA,
        12,
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    assert loop.run_until_complete(exchange(kl.port, metadata, HANDSHAKE)) == []
    # after the handshake, only SaslAuthenticate
    answers = loop.run_until_complete(exchange(kl.port, HANDSHAKE, heartbeat("open")))
    assert [a.error_code for a in answers] == [ErrorCode.none]


def test_an_unsupported_mechanism_lists_the_enabled_ones(secured_listener: Any) -> None:
    kl, loop = secured_listener
    scram = frame(sasl.SASL_HANDSHAKE, 1, mechanism="SCRAM-SHA-256")
    (answer,) = loop.run_until_complete(exchange(kl.port, scram, HANDSHAKE))
    assert answer.error_code is ErrorCode.unsupported_sasl_mechanism
    assert answer.mechanisms == ("PLAIN",)


def test_a_principal_without_read_on_the_group_is_refused(secured_listener: Any) -> None:
    kl, loop = secured_listener
    answers = loop.run_until_complete(
        exchange(kl.port, HANDSHAKE, authenticate("right"), heartbeat("closed"))
    )
    assert [a.error_code for a in answers] == [
        ErrorCode.none,
        ErrorCode.none,
        ErrorCode.group_authorization_failed,
    ]
    assert answers[2].error_message == (
        "User:alice is not authorized to READ group closed (grant it an ALLOW ACL)"
    )


def test_a_plaintext_listener_answers_sasl_requests_with_an_illegal_state() -> None:
    async def served() -> dict[str, int]:
        return {}

    loop = asyncio.new_event_loop()
    kl = KafkaListener(
        "PLAINTEXT://127.0.0.1:0",
        "127.0.0.1",
        "app",
        served,
        NoSession,  # type: ignore[arg-type]
        object(),  # type: ignore[arg-type]
        heartbeat_interval_ms=500,
        session_timeout_ms=60_000,
        limits=unit_limits(),
        max_connections=4,
        monotonic=loop.time,
    )
    loop.run_until_complete(kl.start())
    try:
        (answer,) = loop.run_until_complete(exchange(kl.port, HANDSHAKE, HANDSHAKE))
        assert answer.error_code is ErrorCode.illegal_sasl_state
    finally:
        loop.run_until_complete(kl.close())
        loop.close()


def test_admin_requests_need_their_group_operations(secured_listener: Any) -> None:
    kl, loop = secured_listener
    describe = frame(77, 1, 3, group_ids=("closed",), include_authorized_operations=False)
    delete = frame(42, 2, 4, groups_names=("open",))  # READ and DESCRIBE only, no DELETE
    answers = loop.run_until_complete(
        exchange(kl.port, HANDSHAKE, authenticate("right"), describe, delete)
    )
    (described,) = answers[2].groups
    assert described.error_code is ErrorCode.group_authorization_failed
    assert described.error_message == (
        "User:alice is not authorized to DESCRIBE group closed (grant it an ALLOW ACL)"
    )
    assert [(r.group_id, r.error_code) for r in answers[3].results] == [
        ("open", ErrorCode.group_authorization_failed)
    ]


def test_frames_before_authentication_are_bounded_tighter(secured_listener: Any) -> None:
    kl, loop = secured_listener
    token = b"\0alice\0" + b"x" * 2000  # over the 1,024 bytes allowed before authentication
    big = frame(sasl.SASL_AUTHENTICATE, 2, 2, auth_bytes=token)
    answers = loop.run_until_complete(exchange(kl.port, HANDSHAKE, big))
    assert [a.error_code for a in answers] == [ErrorCode.none]  # then closed


def test_mutual_tls_names_the_client_by_its_certificate(tmp_path: Any) -> None:
    from queueflow.devtools.broker.secure import CertificateAuthority
    from queueflow.listener.auth import cert_principal

    ca = CertificateAuthority(tmp_path)
    ca.issue("listener")
    cert, key = ca.issue("carol")
    settings = ShareGroupSettings(
        kafka_listener="SSL://127.0.0.1:0",
        kafka_listener_ssl_keystore_location=str(tmp_path / "listener.keystore.pem"),
        kafka_listener_ssl_truststore_location=str(ca.ca_path),
        kafka_listener_ssl_client_auth="required",  # type: ignore[arg-type]
    )
    secured_ssl = KafkaClientConfig("broker:9093", extra={"security_protocol": "SSL"})
    security = listener_security(settings, secured_ssl)
    assert security.protocol is SecurityProtocol.SSL and security.target is None
    assert security.ssl_context is not None

    async def principal() -> str:
        seen: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.set_result(cert_principal(writer.get_extra_info("ssl_object")))
            writer.close()

        server = await asyncio.start_server(accept, "127.0.0.1", 0, ssl=security.ssl_context)
        port = server.sockets[0].getsockname()[1]
        client = ssl.create_default_context(cafile=str(ca.ca_path))
        client.load_cert_chain(cert, key)
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
        try:
            return await asyncio.wait_for(seen, 10)
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    assert asyncio.run(principal()) == "User:CN=carol"
    # without client authentication, SSL alone is refused on a secured cluster
    with pytest.raises(ConfigurationError, match="without authentication"):
        listener_security(
            ShareGroupSettings(
                kafka_listener="SSL://127.0.0.1:0",
                kafka_listener_ssl_keystore_location=str(tmp_path / "listener.keystore.pem"),
            ),
            secured_ssl,
        )
