"""TLS on the direct member↔leader path (``queueflow.leader.listener.ssl.*``, docs/operations.md):
the settings, the contexts built from them and from the Kafka connection's, and the endpoint over
real TCP + TLS on the in-process cluster (no Kafka): fetches over TLS, mutual TLS refusing a
member without a trusted certificate, and a clear error when one side is plaintext."""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from inprocess_helpers import direct_cluster, events, fetch, run
from structlog.testing import capture_logs

from queueflow.devtools.broker.secure import CertificateAuthority
from queueflow.errors import ConfigurationError, ErrorCode
from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.tls import (
    direct_path_tls,
    kafka_ssl_context,
    leader_ssl_context,
    member_ssl_context,
)
from queueflow.member.direct import DirectClient, DirectPathError
from queueflow.settings import ShareGroupSettings
from queueflow.testing.inprocess import InProcessCluster

LISTENER = "127.0.0.1:0"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CertificateAuthority]:
    """A CA with a leader certificate and a member certificate (for 127.0.0.1, localhost), and a
    second CA (``other``) whose certificates the first does not trust."""
    authority = CertificateAuthority(tmp_path_factory.mktemp("direct-tls"))
    authority.issue("leader")
    authority.issue("member")
    yield authority


def keystore(ca: CertificateAuthority, name: str) -> str:
    return str(ca.directory / f"{name}.keystore.pem")


def kafka_ssl(ca: CertificateAuthority, client_cert: str | None = None) -> KafkaClientConfig:
    """A Kafka connection over SSL trusting ``ca`` (with a client certificate for mTLS)."""
    context = ssl.create_default_context(cafile=str(ca.ca_path))
    if client_cert is not None:
        context.load_cert_chain(keystore(ca, client_cert))
    return KafkaClientConfig(
        "127.0.0.1:9093", extra={"security_protocol": "SSL", "ssl_context": context}
    )


def settings(**values: Any) -> ShareGroupSettings:
    return ShareGroupSettings.load({"queueflow.leader.listener": LISTENER, **values})


# -- settings and contexts -------------------------------------------------------------------


def test_tls_is_on_by_default_exactly_when_the_kafka_connection_uses_ssl(
    ca: CertificateAuthority,
) -> None:
    plain = KafkaClientConfig("127.0.0.1:9092")
    sasl_plain = KafkaClientConfig("h:1", extra={"security_protocol": "SASL_PLAINTEXT"})
    assert settings().leader_listener_security_protocol == "auto"
    assert not direct_path_tls(settings(), plain)
    assert not direct_path_tls(settings(), sasl_plain)
    assert direct_path_tls(settings(), kafka_ssl(ca))
    forced = settings(**{"queueflow.leader.listener.security.protocol": "SSL"})
    assert direct_path_tls(forced, plain)
    off = settings(**{"queueflow.leader.listener.security.protocol": "PLAINTEXT"})
    assert not direct_path_tls(off, kafka_ssl(ca))
    assert kafka_ssl_context(plain) is None
    assert leader_ssl_context(settings(), plain) is None
    assert member_ssl_context(settings(), plain) is None


def test_the_settings_are_validated_and_the_key_password_is_masked() -> None:
    with pytest.raises(ConfigurationError, match=r"use 'https'.*or ''"):
        settings(**{"queueflow.leader.listener.ssl.endpoint.identification.algorithm": "http"})
    with pytest.raises(
        ConfigurationError, match=re.escape("choose one of none | requested | required")
    ):
        settings(**{"queueflow.leader.listener.ssl.client.auth": "yes"})
    with pytest.raises(ConfigurationError, match="choose one of PEM"):
        settings(**{"queueflow.leader.listener.ssl.keystore.type": "JKS"})
    secret = settings(**{"queueflow.leader.listener.ssl.key.password": "s3cret-pw"})
    assert "s3cret-pw" not in repr(secret)
    assert secret.as_kip_names()["queueflow.leader.listener.ssl.key.password"] == "***"
    no_check = settings(**{"queueflow.leader.listener.ssl.endpoint.identification.algorithm": ""})
    assert no_check.leader_listener_ssl_endpoint_identification_algorithm == ""


def test_a_leader_on_an_ssl_cluster_without_a_keystore_is_refused_with_what_to_set(
    ca: CertificateAuthority,
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        leader_ssl_context(settings(), kafka_ssl(ca))
    message = str(refused.value)
    assert "the app's Kafka connection uses SSL" in message
    assert "queueflow.leader.listener.ssl.keystore.location" in message
    assert "queueflow.leader.listener.security.protocol=PLAINTEXT" in message
    missing = settings(
        **{
            "queueflow.leader.listener.security.protocol": "SSL",
            "queueflow.leader.listener.ssl.keystore.location": "/no/such/keystore.pem",
        }
    )
    with pytest.raises(ConfigurationError, match=r"ssl\.keystore\.location: cannot load it"):
        leader_ssl_context(missing, None)


def test_a_member_reuses_the_kafka_ssl_context_unless_files_are_set(
    ca: CertificateAuthority,
) -> None:
    kafka = kafka_ssl(ca)
    assert member_ssl_context(settings(), kafka) is kafka.extra["ssl_context"]
    own = member_ssl_context(
        settings(**{"queueflow.leader.listener.ssl.keystore.location": keystore(ca, "member")}),
        kafka,
    )
    assert own is not None and own is not kafka.extra["ssl_context"]
    assert own.verify_mode == ssl.CERT_REQUIRED and own.check_hostname
    # The Kafka context's CA is trusted (no trust store set).
    assert [c["subject"] for c in own.get_ca_certs()] == [
        c["subject"] for c in kafka.extra["ssl_context"].get_ca_certs()
    ]
    unchecked = member_ssl_context(
        settings(**{"queueflow.leader.listener.ssl.endpoint.identification.algorithm": ""}),
        kafka,
    )
    assert unchecked is not None and not unchecked.check_hostname
    assert unchecked.verify_mode == ssl.CERT_REQUIRED


# -- the endpoint over TLS ---------------------------------------------------------------------


def leader_settings(ca: CertificateAuthority, client_auth: str = "none") -> ShareGroupSettings:
    return settings(
        **{
            "queueflow.leader.listener.ssl.keystore.location": keystore(ca, "leader"),
            "queueflow.leader.listener.ssl.client.auth": client_auth,
        }
    )


@asynccontextmanager
async def tls_cluster(
    ca: CertificateAuthority, client_auth: str = "none", tls: bool = True
) -> AsyncIterator[InProcessCluster]:
    """A direct cluster whose endpoint uses TLS with the leader certificate (``tls=False``:
    plaintext), trusting ``ca`` for members' certificates."""
    cluster = direct_cluster(records=3)
    if tls:
        cluster.server.direct_ssl = leader_ssl_context(
            leader_settings(ca, client_auth), kafka_ssl(ca)
        )
    async with cluster:
        assert cluster.endpoint is not None
        yield cluster


def member_context(ca: CertificateAuthority, cert: str | None = None) -> ssl.SSLContext:
    context = member_ssl_context(settings(), kafka_ssl(ca, cert))
    assert context is not None
    return context


def test_a_member_fetches_over_tls(ca: CertificateAuthority) -> None:
    async def scenario() -> None:
        async with tls_cluster(ca) as cluster:
            assert cluster.endpoint is not None
            client = DirectClient(tls=member_context(ca))
            response = await client.call(cluster.endpoint.address, fetch("m1", 1), 2.0)
            assert response.error == ErrorCode.NONE.value
            assert response.acquired == [(0, 2, 1)]
            (connection,) = client._connections.values()
            assert connection.writer is not None
            assert connection.writer.get_extra_info("ssl_object").version().startswith("TLS")
            await client.close()

    run(scenario())


def test_mutual_tls_refuses_a_member_without_a_trusted_certificate(
    ca: CertificateAuthority, tmp_path: Path
) -> None:
    stranger = CertificateAuthority(tmp_path / "stranger")
    stranger.issue("member")
    strange = ssl.create_default_context(cafile=str(ca.ca_path))  # trusts the leader...
    strange.load_cert_chain(keystore(stranger, "member"))  # ...but another CA signed its cert

    async def refused(client: DirectClient, address: str) -> None:
        with pytest.raises(DirectPathError) as failed:
            await client.call(address, fetch("m1", 1), 2.0)
        assert "queueflow.leader.listener.ssl.client.auth=required" in str(failed.value)
        await client.close()

    async def scenario() -> None:
        async with tls_cluster(ca, client_auth="required") as cluster:
            address = cluster.endpoint.address if cluster.endpoint else ""
            await refused(DirectClient(tls=member_context(ca)), address)  # no certificate
            await refused(DirectClient(tls=strange), address)
            client = DirectClient(tls=member_context(ca, "member"))
            response = await client.call(address, fetch("m1", 1), 2.0)
            assert response.error == ErrorCode.NONE.value and response.acquired
            await client.close()

    run(scenario())


def test_a_plaintext_member_of_a_tls_leader_gets_an_error_naming_the_setting(
    ca: CertificateAuthority,
) -> None:
    async def scenario() -> None:
        async with tls_cluster(ca) as cluster:
            assert cluster.endpoint is not None
            client = DirectClient()
            with pytest.raises(DirectPathError) as failed:
                await client.call(cluster.endpoint.address, fetch("m1", 1), 2.0)
            assert "queueflow.leader.listener.security.protocol" in str(failed.value)
            await client.close()
            # Nothing was acquired: a TLS member gets every record.
            client = DirectClient(tls=member_context(ca))
            response = await client.call(cluster.endpoint.address, fetch("m2", 1), 2.0)
            assert response.acquired == [(0, 2, 1)]
            await client.close()

    run(scenario())


def test_a_tls_member_of_a_plaintext_leader_gets_an_error_and_the_leader_logs_why(
    ca: CertificateAuthority,
) -> None:
    async def scenario() -> None:
        async with tls_cluster(ca, tls=False) as cluster:
            assert cluster.endpoint is not None
            client = DirectClient(tls=member_context(ca))
            with capture_logs() as logs:
                with pytest.raises(DirectPathError) as failed:
                    await client.call(cluster.endpoint.address, fetch("m1", 1), 2.0)
                await asyncio.sleep(0.05)  # the leader's side of the closed connection
            message = str(failed.value)
            assert "TLS handshake failed" in message
            assert "queueflow.leader.listener.security.protocol" in message
            (dropped,) = events(logs, "direct_connection_dropped")
            assert dropped["reason"] == "tls_mismatch"
            assert "the peer speaks TLS" in dropped["error"]
            assert events(logs, "direct_tls_failed")
            await client.close()
            plain = DirectClient()
            response = await plain.call(cluster.endpoint.address, fetch("m2", 1), 2.0)
            assert response.acquired == [(0, 2, 1)]
            await plain.close()

    run(scenario())
