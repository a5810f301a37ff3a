"""Kafka client plumbing shared by the server and member layers: client configuration,
admin calls (topic creation, partition counts) and retry policies.

Everything that builds an aiokafka client goes through :class:`KafkaClientConfig`, so the
cluster address and (later) security settings are given in one place.
"""

from __future__ import annotations

from queueflow.kafka.config import KafkaClientConfig, bootstrap_servers

__all__ = ["KafkaClientConfig", "bootstrap_servers"]
