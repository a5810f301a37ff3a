"""Creating a topic on a running cluster and waiting until it is usable."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import NoError, for_code

from queueflow.devtools.broker.blocking import run_blocking
from queueflow.errors import BrokerError, ConfigurationError
from queueflow.kafka.admin import ensure_topic
from queueflow.kafka.config import KafkaClientConfig

__all__ = ["create_topic"]

_CLIENT_ID = "queueflow-devtools"
#: Seconds between metadata polls while waiting for partition leaders.
_LEADER_POLL_S = 0.1


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 1,
    *,
    replication_factor: int = 1,
    config: Mapping[str, str] | None = None,
    exist_ok: bool = False,
    timeout_s: float = 30.0,
    client_kwargs: Mapping[str, Any] | None = None,
) -> None:
    """Create a topic (with :func:`queueflow.kafka.admin.ensure_topic`) and wait until every
    partition has a leader.

    Args:
        bootstrap: ``host:port[,host:port...]``.
        name: topic name.
        partitions: number of partitions (>= 1).
        replication_factor: replicas per partition (1 on the local broker).
        config: topic configs, e.g. ``{"retention.ms": "60000"}``.
        exist_ok: do not fail if the topic already exists.
        timeout_s: overall bound in seconds, creation plus waiting for metadata.
        client_kwargs: further aiokafka admin client arguments, e.g. the security settings of a
            secured cluster (``security_protocol``, ``sasl_*``, ``ssl_context``).

    Raises:
        BrokerError: the topic exists and not ``exist_ok``, the broker refused the topic, or it
            had no leaders within ``timeout_s``.
    """
    run_blocking(
        _create_topic(
            bootstrap,
            name,
            partitions,
            replication_factor,
            config,
            exist_ok,
            timeout_s,
            client_kwargs or {},
        )
    )


async def _create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    replication_factor: int,
    config: Mapping[str, str] | None,
    exist_ok: bool,
    timeout_s: float,
    client_kwargs: Mapping[str, Any],
) -> None:
    deadline = time.monotonic() + timeout_s
    timeout_ms = max(int(timeout_s * 1000), 1000)
    client = KafkaClientConfig(
        bootstrap,
        client_id=_CLIENT_ID,
        extra={"request_timeout_ms": timeout_ms, **client_kwargs},
        replication_factor=replication_factor,
    )
    admin = AIOKafkaAdminClient(**client.client_kwargs())
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        # list_topics, not describe_topics: a metadata request naming the topic would
        # auto-create it on brokers with auto.create.topics.enable=true.
        if not exist_ok and name in await asyncio.wait_for(admin.list_topics(), timeout_s):
            raise BrokerError(f"could not create topic {name!r}: it already exists")
        try:
            await asyncio.wait_for(
                ensure_topic(client, name, partitions, topic_config=config),
                max(deadline - time.monotonic(), 0.001),
            )
        except ConfigurationError as exc:
            raise BrokerError(str(exc)) from exc
        await _wait_for_leaders(admin, name, partitions, deadline, timeout_s)
    except asyncio.TimeoutError as exc:
        raise BrokerError(f"creating topic {name!r} took more than {timeout_s} s") from exc
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def _wait_for_leaders(
    admin: AIOKafkaAdminClient, name: str, partitions: int, deadline: float, timeout_s: float
) -> None:
    """Poll the topic's metadata until it has ``partitions`` partitions, each with a leader."""
    while (remaining := deadline - time.monotonic()) > 0:
        described: Any = (await asyncio.wait_for(admin.describe_topics([name]), remaining))[0]
        parts = described.get("partitions", [])
        if (
            for_code(described.get("error_code", -1)) is NoError
            and len(parts) >= partitions
            and all(p.get("leader", -1) >= 0 for p in parts)
        ):
            return
        await asyncio.sleep(_LEADER_POLL_S)
    raise BrokerError(f"topic {name!r} had no leader for every partition within {timeout_s} s")
