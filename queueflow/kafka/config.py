"""One description of how to reach the cluster, for every aiokafka client queueflow creates."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from queueflow.errors import ConfigurationError

__all__ = ["KafkaClientConfig", "bootstrap_servers"]


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

    def client_kwargs(self, client_id: str | None = None) -> dict[str, Any]:
        """Keyword arguments for an aiokafka producer, consumer or admin client."""
        return {
            "bootstrap_servers": self.bootstrap,
            "client_id": client_id or self.client_id,
            **self.extra,
        }
