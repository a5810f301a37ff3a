"""The local 3-broker cluster (:mod:`queueflow.devtools.broker.cluster`; ``make chaos-cluster``
is the long scenario): every topic, queueflow's and Kafka's internal ones included, has 3
replicas and ``min.insync.replicas=2``, and a share group keeps delivering and loses nothing
while a broker is SIGKILLed under it.

The cluster is this module's own (4 JVMs with small heaps), started once for it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from test_share_groups import LEADER_SETTINGS, consumer

from queueflow import ACCEPT, ShareConsumer
from queueflow.devtools.broker import create_topic, find_free_ports
from queueflow.devtools.broker.cluster import LocalCluster
from queueflow.kafka.admin import admin_client
from queueflow.kafka.config import KafkaClientConfig
from queueflow.testing import LeaderWorker, produce

#: Seconds the cluster may take to serve (4 JVMs on a loaded machine).
CLUSTER_START_TIMEOUT_S = 150.0
RECORDS = 300
MIN_ISR = "min.insync.replicas"
PARTITIONS = 3
#: The leader's Faust group notices a lost coordinator quickly; its topics get 3 replicas.
LEADER_ENV = {
    "BROKER_SESSION_TIMEOUT": "6",
    "BROKER_HEARTBEAT_INTERVAL": "1",
    "TOPIC_REPLICATION_FACTOR": "3",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A KRaft controller and 3 brokers on free ports, for this module only."""
    *ports, controller_port = find_free_ports(4)
    c = LocalCluster(
        tmp_path_factory.mktemp("cluster"),
        3,
        broker_ports=ports,
        controller_port=controller_port,
        die_with_parent=True,
    )
    try:
        c.start(timeout_s=CLUSTER_START_TIMEOUT_S)
        yield c
    finally:
        c.stop()


async def replicas_and_min_isr(bootstrap: str, names: list[str]) -> dict[str, tuple[int, str]]:
    """topic -> (replicas of its first partition, its effective ``min.insync.replicas``)."""
    admin = admin_client(KafkaClientConfig(bootstrap))
    await admin.start()
    try:
        described = await admin.describe_topics(names)
        replicas = {t["topic"]: len(t["partitions"][0]["replicas"]) for t in described}
        configs = await admin.describe_configs(
            [
                ConfigResource(ConfigResourceType.TOPIC, n, {"min.insync.replicas": None})
                for n in names
            ]
        )
        isr: dict[str, str] = {}
        for response in configs:
            for resource in response.resources:
                entries: list[Any] = resource[4]
                isr[resource[3]] = next(e[1] for e in entries if e[0] == MIN_ISR)
        return {n: (replicas[n], isr[n]) for n in names}
    finally:
        await admin.close()


async def accept(
    c: ShareConsumer, seen: dict[str, int], done: Callable[[], bool], timeout_s: float
):
    """Poll and ACCEPT (counting deliveries by value) until ``done()``, within a timeout."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s: {len(seen)} seen"
        for record in await c.poll(timeout_ms=500):
            key = record.value.decode()
            seen[key] = seen.get(key, 0) + 1
            c.acknowledge(record, ACCEPT)


def test_a_share_group_loses_nothing_while_a_broker_is_killed(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    bootstrap = cluster.bootstrap
    topic = f"qf-cluster-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS, replication_factor=3)
    app_id = f"qf-cluster-{uuid.uuid4().hex[:8]}"
    values = [f"r{i}" for i in range(RECORDS)]
    first, second = values[: RECORDS // 2], values[RECORDS // 2 :]
    asyncio.run(produce(bootstrap, topic, first, partitions=PARTITIONS, acks="all"))
    leader = LeaderWorker(
        app_id, [topic], bootstrap, tmp_path / "leader", LEADER_SETTINGS, env=LEADER_ENV
    )

    async def scenario() -> tuple[dict[str, int], dict[Any, Exception | None]]:
        seen: dict[str, int] = {}
        c = consumer(bootstrap, app_id, "g")
        await c.subscribe([topic])
        try:
            await accept(c, seen, lambda: len(seen) >= 50, 60)
            # Broker 1 leads some partition of most topics; it goes for good, and the
            # group goes on with 2 of 3 replicas in sync (min.insync.replicas=2).
            await asyncio.to_thread(cluster.kill_broker, 1)
            await produce(bootstrap, topic, second, partitions=PARTITIONS, acks="all")
            await accept(c, seen, lambda: set(values) <= set(seen), 90)
            errors = await c.commit_sync()
        finally:
            await c.close()
        return seen, errors

    with leader:
        seen, errors = asyncio.run(scenario())
    assert set(seen) == set(values)
    assert {tp: e for tp, e in errors.items() if e is not None} == {}
    internal = asyncio.run(internal_topics(bootstrap, app_id))
    assert internal, "queueflow created no internal topics"
    names = [topic, "__consumer_offsets", *internal]
    settings = asyncio.run(replicas_and_min_isr(bootstrap, names))
    assert {name: v for name, v in settings.items() if v != (3, "2")} == {}


async def internal_topics(bootstrap: str, app_id: str) -> list[str]:
    """The topics of app ``app_id`` (queueflow's and Faust's)."""
    admin = admin_client(KafkaClientConfig(bootstrap))
    await admin.start()
    try:
        return sorted(t for t in await admin.list_topics() if app_id in t)
    finally:
        await admin.close()
