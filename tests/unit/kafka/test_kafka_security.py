"""Faust's broker credentials and ShareConsumer's security arguments become the aiokafka keyword
arguments of every client queueflow creates (queueflow.kafka.security)."""

from __future__ import annotations

import ssl

import faust
import pytest

from queueflow.errors import ConfigurationError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.kafka.options import KafkaOptions
from queueflow.kafka.security import credentials_to_kwargs, security_kwargs


@pytest.fixture
def context() -> ssl.SSLContext:
    return ssl.create_default_context()


def test_no_credentials_is_plaintext() -> None:
    assert credentials_to_kwargs(None, None) == {}


def test_sasl_scram_over_tls(context: ssl.SSLContext) -> None:
    creds = faust.SASLCredentials(
        username="alice", password="pw", mechanism="SCRAM-SHA-512", ssl_context=context
    )
    assert credentials_to_kwargs(creds) == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": "pw",
        "ssl_context": context,
    }


def test_sasl_plain_without_tls() -> None:
    creds = faust.SASLCredentials(username="bob", password="pw")
    out = credentials_to_kwargs(creds)
    assert out == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "bob",
        "sasl_plain_password": "pw",
    }


def test_ssl_credentials_and_bare_context(context: ssl.SSLContext) -> None:
    expected = {"security_protocol": "SSL", "ssl_context": context}
    assert credentials_to_kwargs(faust.SSLCredentials(context)) == expected
    assert credentials_to_kwargs(context) == expected
    assert credentials_to_kwargs(None, context) == expected


def test_faust_normalises_an_ssl_context_setting(context: ssl.SSLContext) -> None:
    app = faust.App("qf-sec-test", broker="kafka://h:1", broker_credentials=context)
    out = credentials_to_kwargs(app.conf.broker_credentials, app.conf.ssl_context)
    assert out == {"security_protocol": "SSL", "ssl_context": context}


def test_gssapi(context: ssl.SSLContext) -> None:
    creds = faust.GSSAPICredentials(kerberos_service_name="kafka", ssl_context=context)
    out = credentials_to_kwargs(creds)
    assert out["security_protocol"] == "SASL_SSL"
    assert out["sasl_mechanism"] == "GSSAPI"
    assert out["sasl_kerberos_service_name"] == "kafka"
    assert "sasl_plain_username" not in out


def test_every_client_gets_the_settings(context: ssl.SSLContext) -> None:
    creds = faust.SASLCredentials(username="a", password="b", ssl_context=context)
    config = KafkaClientConfig.from_broker("kafka://h:1", extra=credentials_to_kwargs(creds))
    kwargs = config.client_kwargs("x")
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["ssl_context"] is context
    assert kwargs["bootstrap_servers"] == "h:1"


def test_missing_password_is_named() -> None:
    with pytest.raises(ConfigurationError, match="sasl_plain_password is not set"):
        credentials_to_kwargs(faust.SASLCredentials(username="alice"))


def test_app_ssl_context_next_to_sasl_without_tls_is_refused(context: ssl.SSLContext) -> None:
    creds = faust.SASLCredentials(username="a", password="b")
    with pytest.raises(ConfigurationError, match=r"ssl_context=context"):
        credentials_to_kwargs(creds, context)


def test_unsupported_credentials() -> None:
    with pytest.raises(ConfigurationError, match="not supported"):
        credentials_to_kwargs(object())


def test_security_kwargs_defaults(context: ssl.SSLContext) -> None:
    assert security_kwargs() == {}
    assert security_kwargs(ssl_context=context) == {
        "security_protocol": "SSL",
        "ssl_context": context,
    }
    out = security_kwargs(sasl_plain_username="u", sasl_plain_password="p", ssl_context=context)
    assert out["security_protocol"] == "SASL_SSL"
    assert out["sasl_mechanism"] == "PLAIN"
    tls = security_kwargs(
        security_protocol="sasl_ssl",
        sasl_mechanism="scram-sha-256",
        sasl_plain_username="u",
        sasl_plain_password="p",
    )
    assert tls["security_protocol"] == "SASL_SSL"
    assert tls["sasl_mechanism"] == "SCRAM-SHA-256"
    assert isinstance(tls["ssl_context"], ssl.SSLContext)  # the system trust store


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"security_protocol": "TLS"}, "security_protocol='TLS' is not one of"),
        (
            {"security_protocol": "SSL", "sasl_mechanism": "PLAIN"},
            "use security_protocol='SASL_SSL'",
        ),
        ({"security_protocol": "PLAINTEXT", "ssl_context": "ctx"}, "use security_protocol='SSL'"),
        ({"security_protocol": "SASL_SSL", "sasl_mechanism": "MD5"}, "sasl_mechanism='MD5'"),
        (
            {"security_protocol": "SASL_SSL", "sasl_plain_password": "p"},
            "sasl_plain_username is not set",
        ),
        ({"ssl_context": "not-a-context"}, "not an ssl.SSLContext"),
    ],
)
def test_invalid_combinations(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        security_kwargs(**kwargs)  # type: ignore[arg-type]


def test_spark_kafka_options_reach_the_client_config() -> None:
    opts = KafkaOptions.parse(
        {
            "bootstrap.servers": "h:1",
            "kafka.security.protocol": "sasl_ssl",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.plain.username": "u",
            "kafka.sasl.plain.password": "p",
        }
    )
    kwargs = opts.client_config("spark").client_kwargs()
    assert kwargs["security_protocol"] == "SASL_SSL"
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"kafka.security.protocol": "PLAINTEXT", "kafka.ssl.cafile": "/ca.pem"},
            "kafka.ssl.cafile",
        ),
        ({"kafka.sasl.plain.username": "u"}, "sasl_plain_password is not set"),
        ({"kafka.security.protocol": "SSL", "kafka.sasl.mechanism": "PLAIN"}, "SASL_SSL"),
    ],
)
def test_spark_kafka_options_invalid_combinations(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        KafkaOptions.parse({"bootstrap.servers": "h:1", **options})


# -- queueflow.auth.mode=auto: signed with a secret, refused unsigned on a secured cluster ------


@pytest.mark.parametrize("protocol", ["SSL", "SASL_PLAINTEXT", "SASL_SSL"])
def test_auto_without_a_secret_is_refused_on_a_secured_cluster(protocol: str) -> None:
    from queueflow.kafka.config import check_control_auth
    from queueflow.settings import ShareGroupSettings

    kafka = KafkaClientConfig("h:9093", extra={"security_protocol": protocol})
    with pytest.raises(ConfigurationError, match=r"queueflow\.auth\.secret") as info:
        check_control_auth(ShareGroupSettings(), kafka)
    assert protocol in str(info.value)
    assert "queueflow.auth.mode=none" in str(info.value)  # the way to accept the risk


@pytest.mark.parametrize(
    ("mode", "secret", "protocol", "expected"),
    [
        ("auto", "", "PLAINTEXT", "none"),
        ("auto", "kQ7v-2Lr9_XwN4pZtB8mYc3HsJ6dFgU1eRoV5aTi0", "PLAINTEXT", "hmac"),
        ("auto", "kQ7v-2Lr9_XwN4pZtB8mYc3HsJ6dFgU1eRoV5aTi0", "SASL_SSL", "hmac"),
        ("none", "", "SASL_SSL", "none"),  # explicitly accepted
        ("hmac", "kQ7v-2Lr9_XwN4pZtB8mYc3HsJ6dFgU1eRoV5aTi0", "PLAINTEXT", "hmac"),
    ],
)
def test_the_control_auth_mode_each_setting_resolves_to(
    mode: str, secret: str, protocol: str, expected: str
) -> None:
    from queueflow.kafka.config import check_control_auth
    from queueflow.settings import ShareGroupSettings

    settings = ShareGroupSettings(auth_mode=mode, auth_secret=secret)
    kafka = KafkaClientConfig("h:9093", extra={"security_protocol": protocol})
    assert check_control_auth(settings, kafka) == expected
    assert settings.control_auth_mode == expected


def test_a_share_consumer_on_a_secured_cluster_without_a_secret_fails_before_connecting() -> None:
    from queueflow import ShareConsumer

    with pytest.raises(ConfigurationError, match="SASL_SSL, a secured cluster"):
        ShareConsumer(
            "g",
            app_id="app",
            bootstrap_servers="127.0.0.1:1",
            security_protocol="SASL_SSL",
            sasl_mechanism="PLAIN",
            sasl_plain_username="u",
            sasl_plain_password="p",
            ssl_context=ssl.create_default_context(),
        )
