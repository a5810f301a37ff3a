"""Kafka client settings given by their Kafka names, as data-source options (``kafka.<name>``).

Spark's own Kafka source and sink take client settings as ``kafka.``-prefixed options;
queueflow's Spark formats do the same. :class:`KafkaOptions` validates them once (on the Spark
driver, so a wrong one fails the query with a clear error) and builds the aiokafka configuration
where the client runs (an SSL context cannot be pickled to executors).
"""

from __future__ import annotations

import ssl as _ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from queueflow.errors import ConfigurationError
from queueflow.kafka.config import KafkaClientConfig, bootstrap_servers
from queueflow.kafka.security import security_kwargs

__all__ = [
    "KAFKA_CLIENT_OPTIONS",
    "SECRET_OPTIONS",
    "KafkaOptions",
    "lower_options",
    "shown_value",
]

#: ``kafka.<name>`` client settings (the same names the ``queueflow`` source accepts) and how
#: each is parsed; ``kafka.a.b`` becomes aiokafka's ``a_b`` keyword argument, except
#: ``kafka.client.id`` (the client id) and ``kafka.ssl.*`` (arguments of
#: ``aiokafka.helpers.create_ssl_context``, building one ``ssl_context``).
KAFKA_CLIENT_OPTIONS: Final[Mapping[str, type]] = {
    "client.id": str,
    "security.protocol": str,
    "sasl.mechanism": str,
    "sasl.plain.username": str,
    "sasl.plain.password": str,
    "sasl.kerberos.service.name": str,
    "sasl.kerberos.domain.name": str,
    "ssl.cafile": str,
    "ssl.capath": str,
    "ssl.certfile": str,
    "ssl.keyfile": str,
    "ssl.password": str,
    "request.timeout.ms": int,
    "connections.max.idle.ms": int,
    "retry.backoff.ms": int,
    "metadata.max.age.ms": int,
}
#: Prefixes of the aiokafka security keyword arguments among the ``kafka.*`` options.
_SECURITY: Final = ("sasl_", "security_")
SECRET_OPTIONS: Final = ("sasl.plain.password", "ssl.password")
_SECURITY_PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER")


def shown_value(name: str, value: str) -> str:
    """``value`` of option ``name`` for an error message; secrets (also misspelt ones) are
    masked."""
    secret = name in SECRET_OPTIONS or any(
        word in name for word in ("password", "secret", "pasword", "token")
    )
    return "'***'" if secret else repr(value)


def lower_options(options: Mapping[str, Any]) -> dict[str, str]:
    """Spark passes options in a case-insensitive map: names in lower case, values as strings
    (None as an empty string)."""
    return {str(k).lower(): "" if v is None else str(v) for k, v in options.items()}


@dataclass(frozen=True)
class KafkaOptions:
    """The connection options of a queueflow data source, validated on the driver and pickled
    to executors (an SSL context cannot be pickled, so it is built by :meth:`client_config`).

    Attributes:
        bootstrap: ``host:port[,host:port]``.
        extra: aiokafka keyword arguments (``security_protocol``, ``sasl_*``, ...).
        ssl: ``create_ssl_context`` arguments (``cafile``, ``capath``, ``certfile``,
            ``keyfile``, ``password``).
        client_id: ``kafka.client.id``, or None for the data source's own.
    """

    bootstrap: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    ssl: Mapping[str, str] = field(default_factory=dict)
    client_id: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], ignore: Iterable[str] = ()) -> KafkaOptions:
        """Read ``bootstrap.servers`` (or ``kafka.bootstrap.servers``) and the ``kafka.*``
        security options.

        Args:
            options: the data source's options (names are case-insensitive).
            ignore: further ``kafka.*`` option names the caller handles itself.

        Raises:
            ConfigurationError: ``bootstrap.servers`` is missing or names no ``host:port``, a
                ``kafka.*`` option is not one of the supported ones, or the security protocol
                or SASL mechanism is unknown.
        """
        opts = lower_options(options)
        raw = opts.get("bootstrap.servers") or opts.get("kafka.bootstrap.servers")
        if not raw:
            raise ConfigurationError(
                "missing option 'bootstrap.servers': set it to the Kafka cluster's host:port "
                "list, e.g. .option('bootstrap.servers', 'localhost:9092')"
            )
        skip = {"kafka.bootstrap.servers", *(n.lower() for n in ignore)}
        extra: dict[str, Any] = {}
        ssl: dict[str, str] = {}
        client_id: str | None = None
        for key, value in opts.items():
            if not key.startswith("kafka.") or key in skip:
                continue
            name = key.removeprefix("kafka.")
            kind = KAFKA_CLIENT_OPTIONS.get(name)
            shown = shown_value(name, value)
            if kind is None:
                raise ConfigurationError(
                    f"option {key!r}={shown} is not a supported Kafka client setting; allowed: "
                    + ", ".join(f"kafka.{n}" for n in KAFKA_CLIENT_OPTIONS)
                    + " (and kafka.bootstrap.servers)"
                )
            if kind is int:
                try:
                    number = int(value.strip())
                except ValueError:
                    number = 0
                if number < 1:
                    raise ConfigurationError(
                        f"option {key!r}={value!r} is not allowed; use a positive integer"
                    )
                extra[name.replace(".", "_")] = number
            elif name == "client.id":
                client_id = value
            elif name.startswith("ssl."):
                ssl[name.removeprefix("ssl.")] = value
            else:
                extra[name.replace(".", "_")] = value
        _upper_choice(extra, "security_protocol", _SECURITY_PROTOCOLS)
        _upper_choice(extra, "sasl_mechanism", _SASL_MECHANISMS)
        options_ = cls(bootstrap_servers(raw), extra, ssl, client_id)
        options_._security(_ssl.SSLContext(_ssl.PROTOCOL_TLS_CLIENT) if ssl else None)
        return options_

    def _security(self, context: _ssl.SSLContext | None) -> dict[str, Any]:
        """The checked security keyword arguments, with ``context`` as the SSL context.

        Raises:
            ConfigurationError: an invalid combination, named by its ``kafka.`` options.
        """
        try:
            return security_kwargs(**{**self.extra, "ssl_context": context})
        except ConfigurationError as exc:
            given = ", ".join(
                [
                    f"kafka.{k.replace('_', '.')}"
                    for k in self.extra
                    if k.startswith(("sasl", "sec"))
                ]
                + [f"kafka.ssl.{k}" for k in self.ssl]
            )
            raise ConfigurationError(
                f"the Kafka security options ({given}) do not fit together: {exc} (ssl_context "
                f"is built from kafka.ssl.*, the rest are kafka.<name with dots>)"
            ) from exc

    def client_config(self, client_id: str) -> KafkaClientConfig:
        """The :class:`KafkaClientConfig` for aiokafka clients (call it where the client runs).

        An SSL context is created (``aiokafka.helpers.create_ssl_context``) when SSL files are
        given or the protocol is ``SSL``/``SASL_SSL``.
        """
        context = None
        if self.ssl:
            from aiokafka.helpers import create_ssl_context

            context = create_ssl_context(**self.ssl)
        extra = {k: v for k, v in self.extra.items() if not k.startswith(("sasl_", "security_"))}
        extra.update(self._security(context))
        return KafkaClientConfig(self.bootstrap, client_id=self.client_id or client_id, extra=extra)


def _upper_choice(extra: dict[str, Any], key: str, allowed: Sequence[str]) -> None:
    """Upper-case ``extra[key]`` (an aiokafka keyword) if set, and check it is one of ``allowed``.

    Raises:
        ConfigurationError: it is not; the message names the ``kafka.`` option.
    """
    value = extra.get(key)
    if value is None:
        return
    extra[key] = value = value.upper()
    if value not in allowed:
        raise ConfigurationError(
            f"option 'kafka.{key.replace('_', '.')}'={value!r} is not one of {', '.join(allowed)}"
        )
