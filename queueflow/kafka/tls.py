"""TLS on the direct member↔leader path (``queueflow.leader.listener.ssl.*``;
docs/operations.md, "TLS on the direct path").

The settings have the names and meaning of Kafka's ``ssl.*`` listener and client settings, PEM
only (https://kafka.apache.org/documentation/#security_ssl). The direct path uses TLS when
``queueflow.leader.listener.security.protocol`` says ``SSL``, or says ``auto`` (the default)
and the app's Kafka connection uses SSL (``SSL`` or ``SASL_SSL``).

* :func:`leader_ssl_context`: the leader's server context: its certificate and key from
  ``ssl.keystore.location`` (required: a TLS server needs one), and, for mutual TLS
  (``ssl.client.auth``), the CAs members' certificates must chain to.
* :func:`member_ssl_context`: the member's client context. With no ``ssl.*`` file set it is the
  Kafka connection's own SSL context (its CAs, its client certificate, its host-name check);
  otherwise one built like Kafka's (:func:`aiokafka.helpers.create_ssl_context`, as
  :class:`~queueflow.kafka.options.KafkaOptions` does).

Where no trust store is set, both trust the CA certificates of the Kafka connection's SSL
context (else the system's): one CA usually signs the brokers', the workers' and the members'
certificates.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from typing import Any

from queueflow.errors import ConfigurationError
from queueflow.kafka.config import KafkaClientConfig
from queueflow.settings import ListenerSecurityProtocol, ShareGroupSettings, SslClientAuth, lookup

__all__ = [
    "direct_path_tls",
    "kafka_listener_ssl_context",
    "kafka_ssl_context",
    "leader_ssl_context",
    "member_ssl_context",
    "tls_mismatch_hint",
]

_CLIENT_AUTH = {
    SslClientAuth.NONE: ssl.CERT_NONE,
    SslClientAuth.REQUESTED: ssl.CERT_OPTIONAL,
    SslClientAuth.REQUIRED: ssl.CERT_REQUIRED,
}
_PROTOCOL = lookup("leader_listener_security_protocol").name


def _name(attr: str) -> str:
    return lookup(attr).name


def kafka_ssl_context(kafka: KafkaClientConfig | None) -> ssl.SSLContext | None:
    """The SSL context of the app's Kafka connection, or ``None`` if it does not use SSL."""
    if kafka is None:
        return None
    protocol = str(kafka.extra.get("security_protocol", "PLAINTEXT")).upper()
    context = kafka.extra.get("ssl_context")
    if protocol not in ("SSL", "SASL_SSL") or not isinstance(context, ssl.SSLContext):
        return None
    return context


def direct_path_tls(settings: ShareGroupSettings, kafka: KafkaClientConfig | None) -> bool:
    """Whether the direct path uses TLS: ``queueflow.leader.listener.security.protocol``, with
    ``auto`` meaning "when the Kafka connection uses SSL"."""
    protocol = settings.leader_listener_security_protocol
    if protocol is ListenerSecurityProtocol.AUTO:
        return kafka_ssl_context(kafka) is not None
    return protocol is ListenerSecurityProtocol.SSL


def tls_mismatch_hint(tls: bool) -> str:
    """What to tell the operator when the peer of a direct connection seems to disagree about
    TLS (``tls``: whether this side uses it)."""
    ours = "SSL" if tls else "PLAINTEXT"
    other = "PLAINTEXT" if tls else "SSL"
    return (
        f"this side uses {_PROTOCOL}={ours} and the peer seems to use {other}: set "
        f"{_PROTOCOL} the same on every worker and member of the app (its default, auto, "
        "follows the Kafka connection: SSL when that uses SSL)"
    )


def _kafka_cas(kafka: KafkaClientConfig | None) -> bytes:
    """The CA certificates of the Kafka connection's SSL context (DER, concatenated; ``b""``:
    none, or only the system's)."""
    kafka_context = kafka_ssl_context(kafka)
    return b"".join([] if kafka_context is None else kafka_context.get_ca_certs(binary_form=True))


def _trust(
    context: ssl.SSLContext, settings: ShareGroupSettings, kafka: KafkaClientConfig | None
) -> None:
    """Load the CAs a leader trusts for members' certificates: ``ssl.truststore.location``,
    else the Kafka context's CA certificates, else the system's."""
    location = settings.leader_listener_ssl_truststore_location
    if location:
        _load(lambda: context.load_verify_locations(cafile=location), "truststore_location")
        return
    cadata = _kafka_cas(kafka)
    if cadata:
        context.load_verify_locations(cadata=cadata)
    else:
        context.load_default_certs(ssl.Purpose.CLIENT_AUTH)


def _load(action: Callable[[], Any], what: str, prefix: str = "leader_listener") -> Any:
    """Run ``action`` (loading a setting's file); its failure becomes a ConfigurationError
    naming the setting (``<prefix>_ssl_<what>``)."""
    attr = f"{prefix}_ssl_{what}"
    try:
        return action()
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigurationError(
            f"{_name(attr)}: cannot load it ({exc}); give a readable PEM file"
            + (
                f" (with the private key and certificate chain; an encrypted key needs "
                f"{_name(f'{prefix}_ssl_key_password')})"
                if what == "keystore_location"
                else " of CA certificates"
            )
        ) from exc


def leader_ssl_context(
    settings: ShareGroupSettings, kafka: KafkaClientConfig | None
) -> ssl.SSLContext | None:
    """The leader endpoint's TLS server context, or ``None`` when the direct path is plaintext.

    Raises:
        ConfigurationError: TLS is on but ``ssl.keystore.location`` is not set, or a file can't
            be loaded; the message names the setting.
    """
    if not settings.leader_listener or not direct_path_tls(settings, kafka):
        return None
    keystore = settings.leader_listener_ssl_keystore_location
    if not keystore:
        why = (
            "the app's Kafka connection uses SSL"
            if settings.leader_listener_security_protocol is ListenerSecurityProtocol.AUTO
            else f"{_PROTOCOL}=SSL"
        )
        raise ConfigurationError(
            f"the direct member↔leader path uses TLS ({why}), so the leader needs a "
            f"certificate: set {_name('leader_listener_ssl_keystore_location')} (and "
            f"${lookup('leader_listener_ssl_keystore_location').env}) to a PEM file with this "
            "worker's private key and a certificate for its advertised host "
            f"({_name('leader_advertised_host')}); or set {_PROTOCOL}=PLAINTEXT on workers and "
            f"members to keep the direct path in the clear, or {_name('leader_listener')}= "
            '(empty) to use the request topics only (docs/operations.md, "TLS on the direct '
            'path")'
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    password = settings.leader_listener_ssl_key_password
    _load(lambda: context.load_cert_chain(keystore, password=password), "keystore_location")
    context.verify_mode = _CLIENT_AUTH[settings.leader_listener_ssl_client_auth]
    if context.verify_mode != ssl.CERT_NONE:
        _trust(context, settings, kafka)
    return context


def member_ssl_context(
    settings: ShareGroupSettings, kafka: KafkaClientConfig | None
) -> ssl.SSLContext | None:
    """A member's TLS client context for the leaders' endpoints, or ``None`` when the direct
    path is plaintext.

    Raises:
        ConfigurationError: a file can't be loaded; the message names the setting.
    """
    if not direct_path_tls(settings, kafka):
        return None
    keystore = settings.leader_listener_ssl_keystore_location
    truststore = settings.leader_listener_ssl_truststore_location
    check_hostname = settings.leader_listener_ssl_endpoint_identification_algorithm == "https"
    kafka_context = kafka_ssl_context(kafka)
    if kafka_context is not None and not keystore and not truststore and check_hostname:
        return kafka_context  # the Kafka connection's, as it is (with its client certificate)
    from aiokafka.helpers import create_ssl_context

    password = settings.leader_listener_ssl_key_password
    cadata = _kafka_cas(kafka) if not truststore else None
    context: ssl.SSLContext = _load(
        lambda: create_ssl_context(  # as Kafka client contexts are built (KafkaOptions)
            cafile=truststore or None,
            cadata=cadata or None,
            certfile=keystore or None,
            password=password,
        ),
        "keystore_location" if keystore else "truststore_location",
    )
    context.check_hostname = check_hostname
    return context


def kafka_listener_ssl_context(
    settings: ShareGroupSettings, kafka: KafkaClientConfig | None
) -> ssl.SSLContext:
    """The TLS server context of the Kafka-protocol listener (``queueflow.kafka.listener``
    with ``SSL`` or ``SASL_SSL``; docs/kafka-listener.md "Security"): its certificate from
    ``queueflow.kafka.listener.ssl.keystore.location`` and, for mutual TLS
    (``ssl.client.auth``), the CAs clients' certificates must chain to
    (``ssl.truststore.location``, else the Kafka connection's CAs, else the system's).

    Raises:
        ConfigurationError: no key store set, or a file can't be loaded; the message names the
            setting.
    """
    prefix = "kafka_listener"
    keystore = settings.kafka_listener_ssl_keystore_location
    if not keystore:
        raise ConfigurationError(
            f"{_name('kafka_listener')}={settings.kafka_listener!r} uses TLS, so the listener "
            f"needs a certificate: set {_name('kafka_listener_ssl_keystore_location')} (or "
            f"${lookup('kafka_listener_ssl_keystore_location').env}) to a PEM file with this "
            "worker's private key and a certificate for the host clients connect to"
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    password = settings.kafka_listener_ssl_key_password
    _load(lambda: context.load_cert_chain(keystore, password=password), "keystore_location", prefix)
    context.verify_mode = _CLIENT_AUTH[settings.kafka_listener_ssl_client_auth]
    if context.verify_mode != ssl.CERT_NONE:
        location = settings.kafka_listener_ssl_truststore_location
        cadata = _kafka_cas(kafka)
        if location:
            _load(
                lambda: context.load_verify_locations(cafile=location),
                "truststore_location",
                prefix,
            )
        elif cadata:
            context.load_verify_locations(cadata=cadata)
        else:
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    return context
