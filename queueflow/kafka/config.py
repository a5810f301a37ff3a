"""One description of how to reach the cluster, for every aiokafka client queueflow creates."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from queueflow.errors import ConfigurationError
from queueflow.settings import ShareGroupSettings

__all__ = ["KafkaClientConfig", "bootstrap_servers", "check_control_auth"]


def bootstrap_servers(broker: str | Iterable[Any]) -> str:
    """Turn Faust-style broker URLs (``kafka://h:p;h2:p``) into a bootstrap list ``h:p,h2:p``.

    Args:
        broker: one URL or ``host:port`` list, or an iterable of them (Faust's ``conf.broker``
            is a list of URLs).

    Raises:
        ConfigurationError: nothing of the form ``host:port`` was given.
    """
    items = [broker] if isinstance(broker, str) else [str(b) for b in broker]
    out: list[str] = []
    for item in items:
        for part in item.replace(";", ",").split(","):
            part = part.strip()
            if "://" in part:
                part = part.split("://", 1)[1]
            if part:
                out.append(part.rstrip("/"))
    if not out:
        raise ConfigurationError(
            f"broker={broker!r} names no host:port; e.g. kafka://localhost:9092"
        )
    return ",".join(out)


@dataclass(frozen=True, slots=True)
class KafkaClientConfig:
    """How queueflow's own aiokafka clients reach the cluster.

    Args:
        bootstrap: ``host:port[,host:port]`` (see :func:`bootstrap_servers`).
        client_id: the client id prefix shown by the broker and admin tools.
        extra: further aiokafka client keyword arguments, passed to every client.
        replication_factor: replication factor of the internal topics queueflow creates
            (Faust's ``topic_replication_factor``).
    """

    bootstrap: str
    client_id: str = "queueflow"
    extra: Mapping[str, Any] = field(default_factory=dict)
    replication_factor: int = 1

    @classmethod
    def from_broker(cls, broker: str | Iterable[Any], **kwargs: Any) -> KafkaClientConfig:
        """Build from a Faust broker URL (or list of them); keywords as for the class."""
        return cls(bootstrap_servers(broker), **kwargs)

    @property
    def principal(self) -> str:
        """The Kafka principal the clients authenticate as where that is known here: SASL
        PLAIN/SCRAM's ``User:<username>``; ``""`` otherwise (PLAINTEXT, SSL: the broker derives
        the principal from the certificate, GSSAPI, OAUTHBEARER)."""
        protocol = str(self.extra.get("security_protocol", "PLAINTEXT"))
        user = self.extra.get("sasl_plain_username")
        return f"User:{user}" if protocol.startswith("SASL") and user else ""

    def client_kwargs(self, client_id: str | None = None) -> dict[str, Any]:
        """Keyword arguments for an aiokafka producer, consumer or admin client."""
        return {
            "bootstrap_servers": self.bootstrap,
            "client_id": client_id or self.client_id,
            **self.extra,
        }


def check_control_auth(settings: ShareGroupSettings, kafka: KafkaClientConfig) -> str:
    """Refuse unauthenticated control messages on a secured cluster unless asked for.

    With ``queueflow.auth.mode=auto`` (the default) and no ``queueflow.auth.secret``, control
    messages go unsigned. On a PLAINTEXT cluster that is no weaker than the cluster itself (any
    client that reaches the broker can read and write every topic); on a SASL or SSL cluster,
    whose ACLs let the app's principals write the internal topics, anyone else with that right
    could drive share groups, so queueflow asks for a secret (or an explicit
    ``queueflow.auth.mode=none``; docs/operations.md "Threat model and attack matrix").

    Args:
        settings: the app's share-group settings.
        kafka: how queueflow's clients reach the cluster (``extra["security_protocol"]``).

    Returns:
        The authentication control messages will use: ``"hmac"`` or ``"none"``.

    Raises:
        ConfigurationError: ``auto`` without a secret on a SASL or SSL cluster.
    """
    protocol = str(kafka.extra.get("security_protocol", "PLAINTEXT")).upper()
    keyed = settings.auth_secret or settings.auth_member_credential
    if settings.auth_mode == "auto" and not keyed and protocol != "PLAINTEXT":
        raise ConfigurationError(
            f"this app reaches Kafka over {protocol}, a secured cluster, but its control "
            "messages would not be authenticated (queueflow.auth.mode=auto and no "
            "queueflow.auth.secret): any principal allowed to write queueflow's internal topics "
            "could acquire, acknowledge or fence. Set queueflow.auth.secret (or "
            "$QUEUEFLOW_AUTH_SECRET) to the same secret on every worker and admin of the app, "
            "and give members that or a member credential (queueflow.auth.member.credential, "
            "from `queueflow auth member-credential --app-id APP`), or set "
            "queueflow.auth.mode=none to accept that risk"
        )
    return settings.control_auth_mode
